"""Triton templates for `row` graphs: elementwise ops and keepdim reductions over the last dim.

Two templates, each a [ROWS, width] tile per program:
- single pass (`looped=False`): the whole row in registers (BLOCK_C = next_power_of_2(cols), chosen
  in the forward); ops run in the graph's order and reductions are masked `tl.sum/max/min` over
  axis 1 (0 fill for sum and mean, -inf for amax, +inf for amin; mean divides by the true cols).
  ROWS and num_warps default to "auto", sized per shape in the forward; a fixed ROWS is a cap
  there (no tile beyond 16384 elements).
- looped (`looped=True`): for rows too long for registers. Values get a *stage*: tensors 0, an
  elementwise op the largest of its arguments', a reduction over a full/col value one more. Pass p
  loops over CHUNK-wide column chunks, recomputes the elementwise prefix it needs from the inputs,
  and accumulates the stage-p reductions in [ROWS, CHUNK] vectors (reduced across lanes after the
  loop; a sum's lanes, every FOLD chunks, into an fp64 per-row total: no fp32 accumulator takes more
  than FOLD terms); per-row ops run between passes; a last pass computes and stores the outputs. A sum of
  exp(g - amax(g)) (softmax, log-softmax) shares its max's pass by online rescaling, so softmax reads
  the input twice, not three times. Number of chunks is a constexpr (see triton_codegen).

Reductions over other dims than the last (`graph.reduce`) take the same two templates; only the
offsets, the wrapper's sizes and the stores of outputs of one value per row differ (`triton_reduce`).

A few very long rows (one program per ROWS rows would leave most SMs idle) take the split-row
template, `triton_split.py`: the looped template's stages, each pass a grid of (rows, SPLITS)
programs over slices of the rows, with partials combined per row; its forward falls back to this
module's looped kernel where the runtime shape has enough rows.

Not here: Welford-style fusion of mean and variance (layer norm takes three passes when looped).
"""

from __future__ import annotations

from kernelevolve.synth.tuner import triton_reduce
from kernelevolve.synth.tuner.ir import REDUCE_OPS, Op, OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_common import (
    NEG_INF,
    POS_INF,
    Names,
    Parts,
    forward_args,
    helpers_for,
    jit_function,
    kernel_params,
    launch_args,
    literal,
    load,
    op_expr,
    outputs_tuple,
    pick,
    pow2_at_least,
    prepare,
    prologue,
    source_expr,
    store,
)

MAX_SINGLE_PASS_COLS = 16384
# Rows longer than this are never given the single-pass template (nor the scalar one's single pass):
# a whole row in registers compiles for minutes and spills. On an H100 level 1's 23_Softmax (393216
# columns) and level 2's group/batch norms after a convolution (0.5-1M) timed out at the 180 s compile
# limit, spending a candidate and a worker each.
SINGLE_PASS_LIMIT_COLS = 65536
# Looped sums: each lane adds FOLD chunks in fp32, then the lanes' sum joins the row's fp64 total, so
# no fp32 accumulator takes more than FOLD terms (a row of 2**30 values summed lane by lane in fp32
# loses ~1e-4 of its sum).
FOLD = 16
_FILL = {"sum": "0.0", "mean": "0.0", "amax": NEG_INF, "amin": POS_INF}
_REDUCE = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}
_COMBINE = {
    "sum": "{a} + {v}",
    "mean": "{a} + {v}",
    "amax": "tl.maximum({a}, {v})",
    "amin": "tl.minimum({a}, {v})",
}
_WARPS = [1, 2, 4, 8, 16]
_MASKS = {"full": "mask", "col": "cmask", "row": "rmask"}
_PLAIN = triton_reduce.IndexPlan(False, [], [], [], {})


def build(graph: OpGraph, precision: str, looped: bool) -> Parts:
    names, tensors, ops = prepare(graph, "row")
    idx = triton_reduce.plan(graph) or _PLAIN
    kname = "_row_looped_kernel" if looped else "_row_kernel"
    width = "CHUNK" if looped else "BLOCK_C"
    params = [
        *kernel_params(tensors, graph, names),
        "rows",
        "cols",
        *idx.params(),
        "ROWS: tl.constexpr",
        f"{width}: tl.constexpr",
    ]
    params += ["NCHUNK: tl.constexpr"] if looped else []
    params += ["IDX64: tl.constexpr"]
    head = [
        "r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]",
        "if IDX64:",
        "    r = r.to(tl.int64)",
        "rmask = r < rows",
        *idx.row_lines(),
    ]
    body = head + (
        _looped_body(graph, names, ops, tensors, idx)
        if looped
        else _single_body(graph, names, ops, tensors, idx)
    )
    kernel = jit_function(kname, params, body)

    fwd = forward_head(graph, tensors, names, idx)
    if looped:
        fwd += [
            '_chunk = min(CONFIG["CHUNK"], triton.next_power_of_2(_cols))',
            '_r = CONFIG["ROWS"]',
        ]
        sizes = "ROWS=_r, CHUNK=_chunk, NCHUNK=triton.cdiv(_cols, _chunk)"
    else:
        fwd += single_pass_sizes()
        sizes = "ROWS=_r, BLOCK_C=_block_c"
    args = ", ".join([*launch_args(tensors, graph, names), "_rows", "_cols", *idx.args()])
    fwd += [
        "_progs = triton.cdiv(_rows, _r)",
        f"{kname}[(_progs,)](",
        f"    {args},",
        f"    {sizes}, IDX64=_progs * _r * _cols >= 2**31,",
        '    num_warps=CONFIG["num_warps"],' if looped else "    num_warps=_warps,",
        ")",
        f"return {outputs_tuple(graph)}",
    ]
    tunables, defaults = _knobs(graph, looped, idx)
    # The single-pass tile is ROWS x next_power_of_2(cols), sized per shape in the forward: no TILE.
    tile = ("ROWS", "CHUNK") if looped else ()
    return Parts([kernel], fwd, tunables, defaults, helpers_for(ops), tile=tile)


def forward_head(
    graph: OpGraph, tensors: list[TensorArg], names: Names, idx: triton_reduce.IndexPlan
) -> list[str]:
    """The forward's lines up to the launch: the tensors fetched, the outputs allocated, `_rows` and
    `_cols` (and an index plan's merged sizes `_s<i>`); an empty problem returns its outputs."""
    if graph.reduce is None:
        return [
            *prologue(graph, tensors, names, forward_args(graph)),
            "_n = _shape.numel()",
            "if _n == 0:",
            f"    return {outputs_tuple(graph)}",
            "_cols = _shape[-1] if len(_shape) else 1",
            "_rows = _n // _cols",
        ]
    # D's sizes, merged as the index plan has them
    fwd = [f"{names.local(t.name)} = {source_expr(t, forward_args(graph))}.contiguous()" for t in tensors]
    fwd += triton_reduce.wrapper_lines(graph, idx, tensors, names)
    fwd += ["if _rows * _cols == 0:", f"    return {outputs_tuple(graph)}"]
    return fwd


def single_pass_sizes() -> list[str]:
    """The forward's lines that size a single-pass tile per shape, from `_rows`, `_cols` and CONFIG's
    ROWS and num_warps (each "auto" or a value): `_block_c`, `_r` and `_warps`."""
    return [
        "_block_c = triton.next_power_of_2(_cols)",
        '_r = CONFIG["ROWS"]',
        'if _r == "auto":  # tiles of up to 4096 elements, yet two waves of programs on 132 SMs',
        "    _r = 1 << (max(1, min(4096 // _block_c, _rows // 264)).bit_length() - 1)",
        "_r = max(1, min(_r, 16384 // _block_c))  # a cap: no tile beyond 16384 elements",
        '_warps = CONFIG["num_warps"]',
        'if _warps == "auto":',
        "    _warps = 4 if _r * _block_c <= 2048 else 8 if _r * _block_c <= 8192 else 16",
        "# a floor: at most 64 values a thread (one warp over a 16384-wide tile compiled past 180 s)",
        "_warps = max(_warps, min(32, _r * _block_c // 2048))",
    ]


def _knobs(
    graph: OpGraph, looped: bool, idx: triton_reduce.IndexPlan
) -> tuple[dict[str, list[int | str]], dict[str, int | str]]:
    cols = pow2_at_least(max(graph.cols.values(), default=1024))
    if looped and idx.inner_kept():
        # Memory runs along the rows (a sum over dim 1 of [B, C, S]): tall, narrow tiles read
        # neighbouring rows together. Not yet measured on a GPU: the tuner searches the range.
        return (
            {"CHUNK": [16, 32, 64, 128, 256, 512, 1024, 2048], "ROWS": [1, 2, 4, 8, 16, 32, 64, 128, 256],
             "num_warps": list(_WARPS)},
            {"CHUNK": pick([16, 32, 64], cols), "ROWS": 32, "num_warps": 4},
        )  # fmt: skip
    if looped:
        chunk = pick([1024, 2048, 4096], cols)
        return (
            {"CHUNK": [512, 1024, 2048, 4096, 8192, 16384], "ROWS": [1, 2, 4, 8], "num_warps": list(_WARPS)},
            {"CHUNK": chunk, "ROWS": 1, "num_warps": 8 if chunk >= 4096 else 4},
        )
    # "auto" sizes each shape in the forward (tiles of up to 4096 elements, enough programs to fill
    # the GPU): one fixed value rarely suits both a 1024- and an 8192-column shape of the same spec.
    return (
        {"ROWS": ["auto", 1, 2, 4, 8, 16, 32], "num_warps": ["auto", *_WARPS]},
        {"ROWS": "auto", "num_warps": "auto"},
    )


# -- single pass ------------------------------------------------------------------------------------


def _single_body(
    graph: OpGraph, names: Names, ops: list[Op], tensors: list[TensorArg], idx: triton_reduce.IndexPlan
) -> list[str]:
    body = [
        "c = tl.arange(0, BLOCK_C)[None, :]",
        *idx.col_lines(),
        "cmask = c < cols",
        "mask = rmask & cmask",
    ]
    body += [_load(t, names, idx) for t in tensors]
    for op in ops:
        expr = _reduce_expr(op, graph, names) if op.op in REDUCE_OPS else op_expr(op, names)
        body.append(f"{names.var(op.out)} = {expr}")
    return body + _stores(graph, names, idx, "[ROWS, BLOCK_C]")


def _load(t: TensorArg, names: Names, idx: triton_reduce.IndexPlan) -> str:
    offsets: dict[str, str] = {t.layout: idx.offset(t.name, t.layout)} if t.layout != "scalar" else {}
    return load(t, names, offsets, _MASKS)


def _stores(graph: OpGraph, names: Names, idx: triton_reduce.IndexPlan, tile: str) -> list[str]:
    """Each output: D-shaped outputs at their offset in the tile, outputs of one value per row at r."""
    lines = []
    for i, out in enumerate(graph.outputs):
        if _per_row(graph):
            p = f"out{i}_ptr"
            lines.append(f"tl.store({p} + r, {names.var(out)}.to({p}.dtype.element_ty), mask=rmask)")
        else:
            lines.append(
                store(i, names.var(out), graph.layout_of(out), idx.offset(None, "full"), "mask", tile)
            )
    return lines


def _per_row(graph: OpGraph) -> bool:
    return graph.reduce is not None and graph.reduce.out_shape is not None


def _reduce_expr(op: Op, graph: OpGraph, names: Names) -> str:
    arg = op.args[0]
    if not isinstance(arg, str):  # a reduction of a constant is the constant
        return f"tl.full([], {literal(arg) if arg is not None else '0.0'}, tl.float32)"
    if not _over_columns(graph, arg):  # a row or scalar value is one element per row already
        return names.var(arg)
    red = f"{_REDUCE[op.op]}(tl.where(cmask, {names.var(arg)}, {_FILL[op.op]}), axis=1, keep_dims=True)"
    return f"({red} / cols)" if op.op == "mean" else red


def _over_columns(graph: OpGraph, name: str) -> bool:
    return graph.layout_of(name) in ("full", "col")


# -- looped -----------------------------------------------------------------------------------------


def _stages(graph: OpGraph, ops: list[Op]) -> tuple[dict[str, int], dict[str, str]]:
    """Each value's stage, and the online pairs {sum's name: its amax's name}."""
    producer = {op.out: op for op in ops}
    stage = {t.name: 0 for t in graph.tensors}
    online: dict[str, str] = {}
    for op in ops:
        refs = [a for a in op.args if isinstance(a, str)]
        s = max((stage[a] for a in refs), default=0)
        if op.op in REDUCE_OPS and refs and _over_columns(graph, refs[0]):
            partner = _online_partner(op, producer, graph)
            if partner is not None and partner not in online.values():
                online[op.out] = partner
                s = stage[partner]
            else:
                s += 1
        stage[op.out] = s
    return stage, online


def _online_partner(op: Op, producer: dict[str, Op], graph: OpGraph) -> str | None:
    """For S = sum(exp(g - M)) with M = amax(g): M's name, else None."""
    if op.op != "sum" or not isinstance(op.args[0], str):
        return None
    e = producer.get(op.args[0])
    if e is None or e.op != "exp" or not isinstance(e.args[0], str):
        return None
    d = producer.get(e.args[0])
    if d is None or d.op != "sub" or not all(isinstance(a, str) for a in d.args):
        return None
    g, m = d.args
    mop = producer.get(str(m))
    if mop is None or mop.op != "amax" or mop.args[0] != g or not _over_columns(graph, str(g)):
        return None
    return mop.out


def _looped_body(
    graph: OpGraph, names: Names, ops: list[Op], tensors: list[TensorArg], idx: triton_reduce.IndexPlan
) -> list[str]:
    stage, online = _stages(graph, ops)
    partners = set(online.values())
    # Reductions over columns run in chunk loops; everything per-row (or per-program) runs between.
    loop_reds = [
        op
        for op in ops
        if op.op in REDUCE_OPS and isinstance(op.args[0], str) and _over_columns(graph, op.args[0])
    ]
    red_names = {op.out for op in loop_reds}
    outside = {
        op.out for op in ops if op.out not in red_names and graph.layout_of(op.out) in ("row", "scalar")
    }
    outside |= red_names | {t.name for t in tensors if t.layout in ("row", "scalar")}
    producer = {op.out: op for op in ops}
    tile = "[ROWS, CHUNK]"

    def between(s: int) -> list[str]:
        lines = []
        for op in ops:
            if op.out in outside and op.out not in red_names and stage[op.out] == s:
                expr = _reduce_expr(op, graph, names) if op.op in REDUCE_OPS else op_expr(op, names)
                lines.append(f"{names.var(op.out)} = {expr}")
        return lines

    def chunk_loop(targets: list[str]) -> list[str]:
        inside = _closure(targets, producer, outside)
        lines = [
            "for i in range(NCHUNK):",
            "    c = i * CHUNK + tl.arange(0, CHUNK)[None, :]",
            *["    " + line for line in idx.col_lines()],
            "    cmask = c < cols",
            "    mask = rmask & cmask",
        ]
        lines += ["    " + _load(t, names, idx) for t in tensors if t.name in inside]
        lines += [f"    {names.var(op.out)} = {op_expr(op, names)}" for op in ops if op.out in inside]
        return lines

    body = [_load(t, names, idx) for t in tensors if t.layout in ("row", "scalar")]
    body += between(0)
    last = max((stage[op.out] for op in loop_reds), default=0)
    for p in range(1, last + 1):
        reds = [op for op in loop_reds if stage[op.out] == p and op.out not in online]
        targets: list[str] = []
        init: list[str] = []
        update: list[str] = []
        final: list[str] = []
        for op in reds:
            targets.append(str(op.args[0]))
            if op.out in partners:  # M = amax(g) carried with S = sum(exp(g - M))
                s_name = next(k for k, v in online.items() if v == op.out)
                m, s = online_accumulators(op, s_name, names, tile, init, update)
                final += [
                    f"{names.var(op.out)} = {m}",
                    f"{names.var(s_name)} = tl.sum({s}, axis=1, keep_dims=True)",
                ]
                continue
            red = chunk_accumulator(op, names, tile, init, update)
            if op.op in ("sum", "mean"):
                red = f"({red}).to(tl.float32)"
            final.append(f"{names.var(op.out)} = " + (f"{red} / cols" if op.op == "mean" else red))
        if reds:
            body += init + chunk_loop(targets) + ["    " + u for u in update] + final
        body += between(p)
    if _per_row(graph):  # computed between the passes: stored once
        return body + _stores(graph, names, idx, tile)
    body += chunk_loop(list(graph.outputs))
    return body + ["    " + line for line in _stores(graph, names, idx, tile)]


def online_accumulators(
    op: Op, s_name: str, names: Names, tile: str, init: list[str], update: list[str]
) -> tuple[str, str]:
    """The chunk loop's lines for an amax `op` carried with `s_name`, the sum of exp(g - max) (online
    rescaling: softmax's two reductions in one pass), added to `init` and `update`; returns the
    names of the running max ([ROWS, 1]) and of the lanes' rescaled sums ([ROWS, CHUNK])."""
    arg = names.var(str(op.args[0]))
    m, s, g = "m_" + names.ident(op.out), "s_" + names.ident(s_name), "g_" + names.ident(op.out)
    init += [f"{m} = tl.full([ROWS, 1], {NEG_INF}, tl.float32)", f"{s} = tl.zeros({tile}, tl.float32)"]
    update += [
        f"{g} = tl.where(cmask, {arg}, {NEG_INF})",
        f"{m}_new = tl.maximum({m}, tl.max({g}, axis=1, keep_dims=True))",
        f"{m}_live = {m}_new > {NEG_INF}  # an all -inf prefix contributes nothing, not NaN",
        f"{s} = {s} * tl.where({m}_live, tl.exp({m} - {m}_new), 0.0) + tl.where({m}_live, tl.exp({g} - {m}_new), 0.0)",
        f"{m} = {m}_new",
    ]
    return m, s


def chunk_accumulator(op: Op, names: Names, tile: str, init: list[str], update: list[str]) -> str:
    """The chunk loop's lines for one reduction `op` (sum, mean, amax, amin), added to `init` and
    `update`; returns the row's reduced value after the loop: for a sum or mean, the lanes' fp32 sums
    folded every FOLD chunks into an fp64 total (an fp64 expression), else the fp32 reduction."""
    acc, arg, fill = "acc_" + names.ident(op.out), names.var(str(op.args[0])), _FILL[op.op]
    init.append(f"{acc} = tl.full({tile}, {fill}, tl.float32)")
    update.append(f"{acc} = " + _COMBINE[op.op].format(a=acc, v=f"tl.where(cmask, {arg}, {fill})"))
    red = f"{_REDUCE[op.op]}({acc}, axis=1, keep_dims=True)"
    if op.op not in ("sum", "mean"):
        return red
    tot = "tot_" + names.ident(op.out)
    init.append(f"{tot} = tl.zeros([ROWS, 1], tl.float64)")
    update += [
        f"if i % {FOLD} == {FOLD - 1}:",
        f"    {tot} = {tot} + {red}.to(tl.float64)",
        f"    {acc} = tl.zeros({tile}, tl.float32)",
    ]
    return f"{tot} + {red}.to(tl.float64)"


def _closure(targets: list[str], producer: dict[str, Op], outside: set[str]) -> set[str]:
    """Values computed (or loaded) inside a chunk loop to produce `targets`."""
    seen: set[str] = set()
    stack = [t for t in targets if t not in outside]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in producer:
            stack.extend(a for a in producer[name].args if isinstance(a, str) and a not in outside)
    return seen


__all__ = [
    "FOLD",
    "MAX_SINGLE_PASS_COLS",
    "SINGLE_PASS_LIMIT_COLS",
    "build",
    "forward_head",
    "single_pass_sizes",
]
