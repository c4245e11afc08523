"""Triton template for `row` graphs over a few very long rows: the split-row schedule
(`triton-row-split`).

The row templates (`triton_row.py`) give one program per ROWS rows, so 16 rows of 4M values (a layer
norm over [C, H, W]) keep 16 SMs busy and leave the rest idle. Here each row is cut into SPLITS
slices of NCHUNK chunks, and every pass over the data is a grid of (rows, splits) programs, one row
and one slice each. The looped template's stages (`triton_row._stages`: values get a stage, pass p
needs the stage-p reductions) give the passes; a graph with k reduction stages takes k + 1 kernels:
- pass p (1..k): each program first *combines* the partials of the earlier stages' reductions (all
  its row's, from the workspace, in a fixed order: every program of a row gets the same value) and
  runs the per-row ops between stages, then loops over its slice's chunks as the looped template
  does (recomputing the elementwise prefix from the inputs) and stores one partial per stage-p
  reduction in an fp64 workspace `[slots, rows, splits]`: a sum's or mean's partial is its lanes'
  fp32 sums folded every FOLD chunks into an fp64 total (`triton_row.FOLD`: no fp32 accumulator
  takes more than FOLD terms), combined in fp64; amax and amin partials are exact; softmax's
  max and sum of exp(g - max) are carried together (the online rescaling), each slice's pair
  (m_i, s_i) combined as M = max m_i, S = sum s_i * exp(m_i - M);
- the output pass: the same prologue for every stage, then the slice's outputs (a D-shaped output),
  or, for outputs of one value per row, one program per row that stores them (grid (rows, 1)).
The per-row combination happens in each later pass's prologue (no separate combine kernel: at most
SPLITS partials per reduction, SPLITS <= 1024, read by each program of the row).

One candidate serves every shape: the forward decides from the runtime shape. SPLITS "auto" asks for
about PROGRAMS_PER_SM programs per SM over all the rows (`_sm_count`; 4 SMs off CUDA, the
interpreter) with at least MIN_CHUNKS chunks per slice; a fixed SPLITS is used as given (at least
one chunk per slice). Where that leaves one slice (many rows, or short ones), the forward launches
the looped template's kernel, unchanged, with its own knobs (CHUNK and num_warps are shared).

`applies` offers the template (first, ahead of the looped one) where some spec shape has rows longer
than the single-pass template holds and the auto rule splits them on an H100 (132 SMs); never for
short rows. Refused: graphs with no reduction over the columns (nothing to split), and index plans
whose innermost dim is kept (memory runs along the rows: a sum over dim 1 of [B, C, S] reads a
row's elements S apart, and one row per program would read them one by one; the looped template's
tall tiles serve those).

Not here: atomics (partials are combined in a fixed order: results do not depend on scheduling),
several rows per program in the split passes, the single-pass template's whole-row registers.
"""

from __future__ import annotations

from kernelevolve.synth.tuner import triton_reduce, triton_row
from kernelevolve.synth.tuner.ir import REDUCE_OPS, Op, OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_common import (
    NEG_INF,
    POS_INF,
    CodegenError,
    Names,
    Parts,
    jit_function,
    kernel_params,
    launch_args,
    needed,
    op_expr,
    outputs_tuple,
    prepare,
)

PROGRAMS_PER_SM = 8  # "auto": programs per SM over all the rows (64 warps of 8-warp programs)
MIN_CHUNKS = 4  # "auto": chunks per slice at least, so a program's prologue and partials amortize
MAX_SPLITS = 1024  # the prologue reads all of a row's partials as one vector
H100_SMS = 132  # `applies` judges the spec's shapes for an H100
_SPLITS: list[int | str] = ["auto", 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
_TILE = "[ROWS, CHUNK]"
_FILL64 = {"sum": "0.0", "mean": "0.0", "amax": NEG_INF, "amin": POS_INF}


def auto_splits(rows: int, cols: int, chunk: int, sms: int) -> int:
    """The slices per row SPLITS "auto" gives (the generated forward computes the same)."""
    want = -(-PROGRAMS_PER_SM * sms // max(1, rows))
    return max(1, min(want, -(-cols // (MIN_CHUNKS * chunk)), MAX_SPLITS))


def refusal(graph: OpGraph) -> str:
    """Why the split template cannot generate `graph`; empty where it can."""
    if graph.pattern != "row":
        return f"a {graph.pattern!r} graph is not a row graph"
    live = needed(graph, graph.outputs)
    if not _loop_reductions(graph, [op for op in graph.ops if op.out in live]):
        return "no reduction over the columns: nothing to split"
    idx = triton_reduce.plan(graph)
    if idx is not None and idx.inner_kept():
        return (
            "memory runs along the rows (the innermost dim is kept): one row per program would read "
            "its elements one by one; the looped template's tall tiles serve it"
        )
    return ""


def applies(graph: OpGraph) -> bool:
    """Whether to offer the template: some spec shape has rows too long for the single-pass
    template, and few enough that the auto rule splits them on an H100 (a shape whose row count is
    not known is not judged)."""
    if refusal(graph):
        return False
    chunk = int(_default_chunk(graph))
    return any(
        cols > triton_row.MAX_SINGLE_PASS_COLS
        and graph.rows.get(shape, 0) > 0
        and auto_splits(graph.rows[shape], cols, chunk, H100_SMS) > 1
        for shape, cols in graph.cols.items()
    )


def _default_chunk(graph: OpGraph) -> int | str:
    idx = triton_reduce.plan(graph) or triton_row._PLAIN
    return triton_row._knobs(graph, True, idx)[1]["CHUNK"]


def _loop_reductions(graph: OpGraph, ops: list[Op]) -> list[Op]:
    return [
        op
        for op in ops
        if op.op in REDUCE_OPS and isinstance(op.args[0], str) and triton_row._over_columns(graph, op.args[0])
    ]


def build(graph: OpGraph, precision: str) -> Parts:
    why = refusal(graph)
    if why:
        raise CodegenError(f"the split-row template does not apply: {why}")
    looped = triton_row.build(graph, precision, looped=True)
    names, tensors, ops = prepare(graph, "row")
    idx = triton_reduce.plan(graph) or triton_row._PLAIN
    head = triton_row.forward_head(graph, tensors, names, idx)
    if looped.forward[: len(head)] != head:
        raise CodegenError("the looped template's forward does not start with the row head")
    sched = _Schedule(graph, names, ops, tensors, idx)
    kernels = [sched.kernel(p) for p in range(1, sched.last + 2)]
    forward = head + sched.dispatch() + looped.forward[len(head) :]
    tunables = {**looped.tunables, "SPLITS": list(_SPLITS)}
    defaults = {**looped.defaults, "SPLITS": "auto"}
    return Parts(
        looped.kernels + kernels, forward, tunables, defaults, looped.helpers | {"sm_count"}, tile=looped.tile
    )


class _Schedule:
    """The passes of one graph: its values' stages, the workspace slot of each reduction over the
    columns, and each kernel's body."""

    def __init__(
        self,
        graph: OpGraph,
        names: Names,
        ops: list[Op],
        tensors: list[TensorArg],
        idx: triton_reduce.IndexPlan,
    ):
        self.graph, self.names, self.ops, self.tensors, self.idx = graph, names, ops, tensors, idx
        self.stage, self.online = triton_row._stages(graph, ops)
        self.partners = set(self.online.values())
        self.reds = _loop_reductions(graph, ops)
        red_names = {op.out for op in self.reds}
        outside = {
            op.out for op in ops if op.out not in red_names and graph.layout_of(op.out) in ("row", "scalar")
        }
        self.outside = outside | red_names | {t.name for t in tensors if t.layout in ("row", "scalar")}
        self.red_names = red_names
        self.producer = {op.out: op for op in ops}
        self.slots = {op.out: k for k, op in enumerate(self.reds)}
        self.last = max(self.stage[op.out] for op in self.reds)
        self.per_row = triton_row._per_row(graph)

    # -- the forward ---------------------------------------------------------------------------------

    def dispatch(self) -> list[str]:
        """The forward's split path, before the looped template's launch (its fallback)."""
        base = [
            *launch_args(self.tensors, self.graph, self.names),
            "_part",
            "_rows",
            "_cols",
            "_splits",
            *self.idx.args(),
        ]
        lines = [
            '_chunk = min(CONFIG["CHUNK"], triton.next_power_of_2(_cols))',
            '_splits = CONFIG["SPLITS"]',
            f'if _splits == "auto":  # about {PROGRAMS_PER_SM} programs per SM, {MIN_CHUNKS} chunks a slice at least',
            '    _sms = _sm_count(_device.index) if _device.type == "cuda" else 4',
            f"    _splits = min(triton.cdiv({PROGRAMS_PER_SM} * _sms, _rows), triton.cdiv(_cols, {MIN_CHUNKS} * _chunk))",
            f"_nchunk = triton.cdiv(_cols, max(1, min(_splits, {MAX_SPLITS})) * _chunk)  # chunks per slice",
            "_splits = triton.cdiv(_cols, _nchunk * _chunk)",
            "if _splits > 1:  # a few long rows: (rows, splits) programs per pass",
            f"    _part = torch.empty(({len(self.slots)}, _rows, _splits), device=_device, dtype=torch.float64)",
            "    _sizes = dict(ROWS=1, CHUNK=_chunk, NCHUNK=_nchunk, SPLITS_P2=triton.next_power_of_2(_splits))",
            "    _big = _rows * _splits * _nchunk * _chunk >= 2**31",
        ]
        for p in range(1, self.last + 2):
            grid = "(_rows, 1)" if p == self.last + 1 and self.per_row else "(_rows, _splits)"
            lines += [
                f"    {self._kname(p)}[{grid}](",
                f"        {', '.join(base)},",
                '        **_sizes, IDX64=_big, num_warps=CONFIG["num_warps"],',
                "    )",
            ]
        return [*lines, f"    return {outputs_tuple(self.graph)}"]

    # -- the kernels ---------------------------------------------------------------------------------

    def _kname(self, p: int) -> str:
        return "_split_out_kernel" if p == self.last + 1 else f"_split_pass{p}_kernel"

    def kernel(self, p: int) -> str:
        """Pass p's kernel (p = last + 1: the outputs')."""
        params = [
            *kernel_params(self.tensors, self.graph, self.names),
            "part_ptr",
            "rows",
            "cols",
            "nsplit",
            *self.idx.params(),
            "ROWS: tl.constexpr",
            "CHUNK: tl.constexpr",
            "NCHUNK: tl.constexpr",
            "SPLITS_P2: tl.constexpr",
            "IDX64: tl.constexpr",
        ]
        body = [
            "r = tl.program_id(0) + tl.zeros([ROWS, 1], tl.int32)",
            "sp = tl.program_id(1)",
            "if IDX64:",
            "    r = r.to(tl.int64)",
            "    sp = sp.to(tl.int64)",
            "rmask = r < rows",
            *self.idx.row_lines(),
            "o = tl.arange(0, SPLITS_P2)[None, :]",
            "omask = o < nsplit",
        ]
        body += [
            triton_row._load(t, self.names, self.idx) for t in self.tensors if t.layout in ("row", "scalar")
        ]
        body += self._between(0)
        for q in range(1, p):
            body += self._combine(q) + self._between(q)
        if p <= self.last:
            return jit_function(self._kname(p), params, body + self._partials(p))
        if self.per_row:
            return jit_function(
                self._kname(p), params, body + triton_row._stores(self.graph, self.names, self.idx, _TILE)
            )
        body += self._chunk_loop(list(self.graph.outputs))
        body += ["    " + line for line in triton_row._stores(self.graph, self.names, self.idx, _TILE)]
        return jit_function(self._kname(p), params, body)

    def _between(self, s: int) -> list[str]:
        """The per-row ops of stage s (as the looped template runs them between its passes)."""
        lines = []
        for op in self.ops:
            if op.out in self.outside and op.out not in self.red_names and self.stage[op.out] == s:
                expr = (
                    triton_row._reduce_expr(op, self.graph, self.names)
                    if op.op in REDUCE_OPS
                    else op_expr(op, self.names)
                )
                lines.append(f"{self.names.var(op.out)} = {expr}")
        return lines

    def _slot(self, name: str, at: str) -> str:
        return f"part_ptr + ({self.slots[name]} * rows + r) * nsplit + {at}"

    def _combine(self, q: int) -> list[str]:
        """The stage-q reductions' values from their partials: a fixed-order fp64 sum (a mean then
        divided by the row's length), a max or min; an online pair's maxima and rescaled sums."""
        lines = []
        for op in self.reds:
            if self.stage[op.out] != q or op.out in self.online:
                continue
            v, w = self.names.var(op.out), "w_" + self.names.ident(op.out)
            if op.out in self.partners:  # M = max m_i, S = sum s_i * exp(m_i - M)
                s_name = next(k for k, m in self.online.items() if m == op.out)
                ws = "w_" + self.names.ident(s_name)
                lines += [
                    f"{w} = tl.load({self._slot(op.out, 'o')}, mask=omask, other={NEG_INF}).to(tl.float32)",
                    f"{ws} = tl.load({self._slot(s_name, 'o')}, mask=omask, other=0.0)",
                    f"{v} = tl.max({w}, axis=1, keep_dims=True)",
                    f"{w}_scale = tl.where({v} > {NEG_INF}, tl.exp({w} - {v}), 0.0)  # all -inf: no NaN",
                    f"{self.names.var(s_name)} = tl.sum({ws} * {w}_scale.to(tl.float64), axis=1, keep_dims=True).to(tl.float32)",
                ]
                continue
            lines.append(f"{w} = tl.load({self._slot(op.out, 'o')}, mask=omask, other={_FILL64[op.op]})")
            red = f"{triton_row._REDUCE[op.op]}({w}, axis=1, keep_dims=True)"
            if op.op == "mean":
                red = f"({red} / cols)"
            lines.append(f"{v} = {red}.to(tl.float32)")
        return lines

    def _chunk_loop(self, targets: list[str]) -> list[str]:
        """`for i in range(NCHUNK)` over this program's slice, loading and computing what `targets`
        need (the looped template's loop, offset to the slice)."""
        inside = triton_row._closure(targets, self.producer, self.outside)
        lines = [
            "for i in range(NCHUNK):",
            "    c = (sp * NCHUNK + i) * CHUNK + tl.arange(0, CHUNK)[None, :]",
            *["    " + line for line in self.idx.col_lines()],
            "    cmask = c < cols",
            "    mask = rmask & cmask",
        ]
        lines += [
            "    " + triton_row._load(t, self.names, self.idx) for t in self.tensors if t.name in inside
        ]
        lines += [
            f"    {self.names.var(op.out)} = {op_expr(op, self.names)}" for op in self.ops if op.out in inside
        ]
        return lines

    def _partials(self, p: int) -> list[str]:
        """Pass p's chunk loop over the slice and its stage-p partials, stored in the workspace."""
        names = self.names
        reds = [op for op in self.reds if self.stage[op.out] == p and op.out not in self.online]
        targets: list[str] = []
        init: list[str] = []
        update: list[str] = []
        final: list[str] = []
        for op in reds:
            targets.append(str(op.args[0]))
            if op.out in self.partners:  # the slice's max m and sum s of exp(g - m), rescaled online
                s_name = next(k for k, v in self.online.items() if v == op.out)
                m, s = triton_row.online_accumulators(op, s_name, names, _TILE, init, update)
                final += [
                    f"tl.store({self._slot(op.out, 'sp')}, {m}.to(tl.float64), mask=rmask)",
                    f"tl.store({self._slot(s_name, 'sp')}, tl.sum({s}, axis=1, keep_dims=True).to(tl.float64), mask=rmask)",
                ]
                continue
            red = triton_row.chunk_accumulator(op, names, _TILE, init, update)
            final.append(f"tl.store({self._slot(op.out, 'sp')}, ({red}).to(tl.float64), mask=rmask)")
        return init + self._chunk_loop(targets) + ["    " + u for u in update] + final


__all__ = ["MAX_SPLITS", "applies", "auto_splits", "build", "refusal"]
