"""A pipeline's GEMM stage and the mean cross-entropy after it as three kernels, the logits never stored.

`F.cross_entropy(x @ W^T, targets)` traces to a pipeline of two stages: the GEMM writing the [M, V]
logits (412 MiB for 2048 tokens over a 50304 vocabulary), then a `scalar` stage reading them back
(log-softmax, the target's column, the mean over the rows whose target is not ignored). Here:
1. the GEMM kernel (the GEMM template's tile, K loop and epilogue, `triton_gemm`) reduces each
   BLOCK_M x BLOCK_N tile of logits, before any store, to three values per row: the tile's max, the
   sum of exp(logit - max) over its columns, and the target's logit where the target's column is in
   the tile (0 elsewhere); [M, tiles] of each, in fp32;
2. a merge kernel, one program per MERGE_ROWS rows, combines a row's tiles (the max of the maxes, the
   sums rescaled to it, the one target logit), takes loss = max + log(sum) - target logit, zero where
   the target is the ignore index, and stores the program's sum of losses and count of counted rows;
3. a final kernel, one program, adds the programs' sums and counts in a fixed order and divides.
No atomics: the result is the same from run to run.

`fusable` recognizes the scalar stage as exactly the cross-entropy the tracer makes of
`F.cross_entropy(logits, targets)` (mean reduction, an ignore index, no weights, no label smoothing):
its ops, renamed by position, must equal `_CROSS_ENTROPY`. The pipeline offers it beside the
stage-by-stage variant (`triton_stages`); the search measures both.

The forward is the GEMM template's (`triton_gemm.forward_setup`: a given transposed, PAD_K and the
B_KMAJOR copy as there), without the [M, V] output it would allocate.

Not here: batched GEMMs, other reductions ('sum', 'none'), class weights.
"""

from __future__ import annotations

from kernelevolve.synth.tuner import triton_gemm
from kernelevolve.synth.tuner.ir import OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_common import CodegenError, Parts, helpers_for, jit_function, source_expr

SPAN = 2  # stages written as one (`triton_stages._FUSIONS`)
NAME = "triton-gemm-ce"
MERGE_ROWS = 32
MERGE_CHUNK = 64
FINAL_BLOCK = 1024

# The scalar stage of F.cross_entropy(X, T) as the tracer writes it, each op's name replaced by its
# position ("#i"), the logits by "X", the targets by "T" and the ignore index by "I".
_CROSS_ENTROPY: list[tuple[str, tuple[object, ...]]] = [
    ("amax", ("X",)),
    ("sub", ("X", "#0")),
    ("exp", ("#1",)),
    ("sum", ("#2",)),
    ("log", ("#3",)),
    ("sub", ("#1", "#4")),
    ("ne", ("T", "I")),
    ("where_nz", ("#6", "T", 0.0)),
    ("where_col", ("#7", "#5")),
    ("sum", ("#8",)),
    ("neg", ("#9",)),
    ("where_nz", ("#6", "#10", 0.0)),
    ("total_sum", ("#6",)),
    ("total_sum", ("#11",)),
    ("div", ("#13", "#12")),
]


def _match(loss: OpGraph, mid: str) -> tuple[TensorArg, int] | None:
    """(the targets, the ignore index) where `loss` is the cross-entropy of `mid`, else None."""
    if loss.pattern != "scalar" or loss.reduce is not None or len(loss.outputs) != 1 or len(loss.ops) != 15:
        return None
    tensors = {t.name: t for t in loss.tensors}
    others = [t for t in loss.tensors if t.name != mid]
    if mid not in tensors or tensors[mid].layout != "full" or len(others) != 1:
        return None
    targets = others[0]
    if targets.layout != "row" or not targets.dtype.startswith("int"):
        return None
    ignore = loss.ops[6].args[1] if len(loss.ops[6].args) == 2 else None
    if not isinstance(ignore, int) or isinstance(ignore, bool):
        return None
    position = {op.out: f"#{i}" for i, op in enumerate(loss.ops)}

    def norm(a: object) -> object:
        if a == mid:
            return "X"
        if a == targets.name:
            return "T"
        if isinstance(a, str):
            return position.get(a, a)
        return float(a) if isinstance(a, int | float) and not isinstance(a, bool) else a

    ops = [(op.op, tuple(norm(a) for a in op.args)) for op in loss.ops]
    ops[6] = (ops[6][0], (ops[6][1][0], "I"))  # `ne(targets, ignore index)`: any index
    if ops != _CROSS_ENTROPY or loss.outputs[0] != loss.ops[-1].out:
        return None
    return targets, ignore


def _pair(gemm: OpGraph, loss: OpGraph, k: int) -> tuple[TensorArg, int] | None:
    """(the targets, the ignore index) where stage k (`gemm`) and stage k + 1 (`loss`) are a GEMM and
    the cross-entropy of its output, else None."""
    gi = gemm.gemm
    if gemm.pattern != "gemm" or gi is None or gi.batched or len(gemm.outputs) != 1:
        return None
    if loss.forward_args[: len(gemm.forward_args)] != gemm.forward_args:
        return None
    found = _match(loss, f"_mid{k}")
    return found if found is not None and found[0].source.startswith("input:") else None


def fusable(gemm: OpGraph, loss: OpGraph, k: int) -> bool:
    """Whether stage k (`gemm`) and stage k + 1 (`loss`) are a GEMM and the cross-entropy of its output."""
    return _pair(gemm, loss, k) is not None


def build_fused(gemm: OpGraph, loss: OpGraph, k: int, precision: str) -> Parts:
    """Stages k and k + 1 as the three kernels; the forward returns the mean loss."""
    found = _pair(gemm, loss, k)
    if found is None:
        raise CodegenError(f"stages {k + 1} and {k + 2} are not a GEMM and the cross-entropy of its output")
    targets, ignore = found
    g = triton_gemm.parse(gemm, precision)
    names = g.names
    out = names.var(gemm.outputs[0])
    lead = [names.ptr(g.a.name), names.ptr(g.b.name)]
    lead += [names.ptr(g.bias.name)] if g.bias else []
    lead += [names.ptr(t.name) for t in g.epilogue]
    params = [*lead, "tgt_ptr", "pm_ptr", "ps_ptr", "pp_ptr", "M", "N", "K", *triton_gemm.STRIDES]
    params += [f"{c}: tl.constexpr" for c in ("BLOCK_M", "BLOCK_N", *triton_gemm.LOOP_CONSTS)]
    body = [
        *triton_gemm.tile_lines(g),
        *triton_gemm.k_loop(g),
        *triton_gemm.EDGE,
        *triton_gemm.epilogue_lines(g),
        "# the tile's share of each row's logsumexp and target logit; the logits are not stored",
        "inside = n2 < N",
        f'logit = tl.where(inside, {out}, float("-inf"))',
        "tile_max = tl.max(logit, axis=1)",
        "tile_sum = tl.sum(tl.exp(logit - tile_max[:, None]), axis=1)",
        "t = tl.load(tgt_ptr + rm, mask=rm < M, other=-1)",
        f"tile_pick = tl.sum(tl.where(inside & (n2 == t[:, None]), {out}, 0.0), axis=1)",
        "at = rm.to(tl.int64) * num_pid_n + pid_n",
        "tl.store(pm_ptr + at, tile_max, mask=rm < M)",
        "tl.store(ps_ptr + at, tile_sum, mask=rm < M)",
        "tl.store(pp_ptr + at, tile_pick, mask=rm < M)",
    ]
    merge = [
        "r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)",
        "rmask = r < M",
        "c = tl.arange(0, CHUNK)",
        'best = tl.full([ROWS], float("-inf"), tl.float32)',
        "total = tl.zeros([ROWS], tl.float32)",
        "pick = tl.zeros([ROWS], tl.float32)",
        "for c0 in range(0, TILES, CHUNK):",
        "    cm = rmask[:, None] & (c0 + c[None, :] < TILES)",
        "    at = r[:, None].to(tl.int64) * TILES + c0 + c[None, :]",
        '    m = tl.load(pm_ptr + at, mask=cm, other=float("-inf"))',
        "    s = tl.load(ps_ptr + at, mask=cm, other=0.0)",
        "    pick += tl.sum(tl.load(pp_ptr + at, mask=cm, other=0.0), axis=1)",
        "    new = tl.maximum(best, tl.max(m, axis=1))",
        "    safe = tl.where(new == float('-inf'), 0.0, new)  # rows past M: no NaN from -inf - -inf",
        "    total = total * tl.exp(best - safe) + tl.sum(s * tl.exp(m - safe[:, None]), axis=1)",
        "    best = new",
        "t = tl.load(tgt_ptr + r, mask=rmask, other=IGNORE)",
        "counted = rmask & (t != IGNORE)",
        "loss = tl.where(counted, best + tl.log(total) - pick, 0.0)",
        "tl.store(part_ptr + tl.program_id(0), tl.sum(loss, axis=0))",
        "tl.store(part_ptr + PROGS + tl.program_id(0), tl.sum(counted.to(tl.float32), axis=0))",
    ]
    final = [
        "i = tl.arange(0, BLOCK)",
        "loss = tl.zeros([BLOCK], tl.float32)",
        "count = tl.zeros([BLOCK], tl.float32)",
        "for p0 in range(0, PROGS, BLOCK):",
        "    loss += tl.load(part_ptr + p0 + i, mask=p0 + i < PROGS, other=0.0)",
        "    count += tl.load(part_ptr + PROGS + p0 + i, mask=p0 + i < PROGS, other=0.0)",
        "tl.store(out_ptr, (tl.sum(loss, axis=0) / tl.sum(count, axis=0)).to(out_ptr.dtype.element_ty))",
    ]
    merge_params = ["pm_ptr", "ps_ptr", "pp_ptr", "tgt_ptr", "part_ptr", "M", "TILES", "PROGS"]
    merge_params += ["IGNORE: tl.constexpr", "ROWS: tl.constexpr", "CHUNK: tl.constexpr"]
    kernels = [
        jit_function("_gemm_ce_kernel", params, body),
        jit_function("_ce_merge_kernel", merge_params, merge),
        jit_function("_ce_final_kernel", ["part_ptr", "out_ptr", "PROGS", "BLOCK: tl.constexpr"], final),
    ]
    tunables, defaults = triton_gemm.knobs(gemm, g.dots, g.native)
    triton_gemm.with_fast_dot(defaults, g.dots, g.native, precision)
    drafts = triton_gemm.gemm_drafts(tunables, defaults, precision, g.native)
    fwd = _forward(loss, g, targets, ignore)
    helpers = helpers_for(g.ops, g.dots)
    smem = triton_gemm.smem_terms(g)
    return Parts(kernels, fwd, tunables, defaults, helpers, ("BLOCK_M", "BLOCK_N"), drafts, smem)


def _forward(loss: OpGraph, g: triton_gemm.Gemm, targets: TensorArg, ignore: int) -> list[str]:
    """The GEMM template's forward up to its launch (a and b as views, their copies where PAD_K or
    B_KMAJOR ask, no output of the GEMM's shape), then the partials, the three launches, the loss."""
    extra = [*([g.bias] if g.bias else []), *g.epilogue]
    return [
        *triton_gemm.forward_setup(g, outputs=False),
        f"_tgt = {source_expr(targets, loss.forward_args)}.reshape(-1).contiguous()",
        f"_out0 = torch.empty((), device=_device, dtype=torch.{loss.dtype})",
        "_tiles = triton.cdiv(_N, _bn)",
        "_pm, _ps, _pp = (torch.empty((_M, _tiles), device=_device, dtype=torch.float32) for _ in range(3))",
        "_kt = triton.cdiv(_K, _bk)",
        triton_gemm.fold_line("_kt"),
        "_gemm_ce_kernel[(triton.cdiv(_M, _bm) * _tiles, 1)](",
        f"    {', '.join(['_a', '_b', *(g.names.local(t.name) for t in extra)])}, _tgt, _pm, _ps, _pp,",
        "    _M, _N, _K, _saz, _sam, _sak, _sbz, _sbk, _sbn,",
        '    BLOCK_M=_bm, BLOCK_N=_bn, BLOCK_K=_bk, GROUP_M=CONFIG["GROUP_M"],',
        '    K_TILES=_kt, EVEN_K=_K % _bk == 0, DOT=CONFIG["DOT"], FOLD=_fold,',
        '    num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"],',
        ")",
        f"_progs = triton.cdiv(_M, {MERGE_ROWS})",
        "_part = torch.empty((2, _progs), device=_device, dtype=torch.float32)",
        f"_ce_merge_kernel[(_progs,)](_pm, _ps, _pp, _tgt, _part, _M, _tiles, _progs, IGNORE={ignore}, "
        f"ROWS={MERGE_ROWS}, CHUNK={MERGE_CHUNK}, num_warps=4)",
        f"_ce_final_kernel[(1,)](_part, _out0, _progs, BLOCK={FINAL_BLOCK}, num_warps=4)",
        "return _out0",
    ]


__all__ = ["NAME", "SPAN", "build_fused", "fusable"]
