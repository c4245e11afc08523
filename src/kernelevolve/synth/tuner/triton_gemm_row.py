"""A pipeline's GEMM stage and the row stage after it as one kernel: the row's ops in the GEMM's epilogue.

Where a GEMM's output rows are short (N <= ROW_MAX_COLS) and the next stage of the pipeline is a
`row` graph over them (an RMSNorm, a softmax, a layer norm: elementwise ops and reductions over the
last dim), one program can hold whole rows: BLOCK_N is the row (next_power_of_2(N), set per shape in
the forward), and after the K loop the accumulator tile runs the GEMM's epilogue, then the row
stage's ops, its reductions masked `tl.sum/max/min` over axis 1, before the one store. The
intermediate (the GEMM's output, fp32) never reaches memory: a [M, N] write and read saved, and one
launch (issue K: ffn_block's GEMM + RMSNorm, twice).

`fusable` says whether two stages fuse; `fuse` makes the one graph (pattern `gemm`, its ops the GEMM
epilogue's then the row stage's, renamed apart, the intermediate read as the GEMM's output); `build`
writes it with the GEMM template's pieces (`triton_gemm`). The pipeline offers the fused variant
beside the stage-by-stage one (`triton_stages.variants`); the search measures which is faster.

Registers bound the tile: the accumulator is BLOCK_M x BLOCK_N fp32, so the forward caps BLOCK_M at
ACC_PER_THREAD accumulators per thread (BLOCK_M <= ACC_PER_THREAD * 32 * num_warps / BLOCK_N).

Not here: rows longer than ROW_MAX_COLS (a looped row would need the tile twice), batched GEMMs,
row stages whose reductions run over other dims (`graph.reduce`), and a row stage's outputs of one
value per row; the `scalar` stage of a loss (linear_cross_entropy's logsumexp over the vocabulary
needs per-tile partials merged across programs, not whole rows).
"""

from __future__ import annotations

from dataclasses import replace

from kernelevolve.synth.tuner import triton_gemm, triton_row
from kernelevolve.synth.tuner.ir import ELEMENTWISE_OPS, REDUCE_OPS, Arg, Op, OpGraph
from kernelevolve.synth.tuner.triton_common import CodegenError, Parts, helpers_for, jit_function, op_expr

ROW_MAX_COLS = 1024
ACC_PER_THREAD = 128  # fp32 accumulators a thread holds: half its registers
SPAN = 2  # stages written as one (`triton_stages._FUSIONS`)
NAME = "triton-gemm-row"


def mid_name(k: int) -> str:
    """The name stage k's intermediate has in the stages after it (`stages.py`)."""
    return f"_mid{k}"


def fusable(gemm: OpGraph, row: OpGraph, k: int) -> bool:
    """Whether stage k (`gemm`) and stage k + 1 (`row`) of a pipeline fuse into one kernel."""
    gi = gemm.gemm
    if gemm.pattern != "gemm" or gi is None or gi.batched or len(gemm.outputs) != 1:
        return False
    if row.pattern != "row" or row.reduce is not None or row.cols != gemm.cols or row.rows != gemm.rows:
        return False
    if not gemm.cols or max(gemm.cols.values()) > ROW_MAX_COLS:
        return False
    mid = mid_name(k)
    tensors = {t.name: t for t in row.tensors}
    if mid not in tensors or tensors[mid].layout != "full":
        return False
    if set(tensors) & ({t.name for t in gemm.tensors} | {op.out for op in gemm.ops}):
        return False  # names the fused graph could not keep apart
    if row.forward_args[: len(gemm.forward_args)] != gemm.forward_args:
        return False
    if any(row.layout_of(o) != "full" for o in row.outputs):
        return False  # an output of one value per row has the row's shape, not the tile's
    return all(op.op in REDUCE_OPS or op.op in ELEMENTWISE_OPS for op in row.ops)


def fuse(gemm: OpGraph, row: OpGraph, k: int) -> OpGraph:
    """The one graph of stages k and k + 1: the GEMM's, with the row stage's tensors (but the
    intermediate) and ops (renamed `r_<name>`, the intermediate read as the GEMM's output) after its
    own, and the row stage's outputs and dtype."""
    if not fusable(gemm, row, k):
        raise CodegenError(f"stages {k + 1} and {k + 2} do not fuse into a GEMM with a row epilogue")
    mid, out = mid_name(k), gemm.outputs[0]
    renamed = {op.out: f"r_{op.out}" for op in row.ops}
    if set(renamed.values()) & ({t.name for t in gemm.tensors} | {op.out for op in gemm.ops}):
        raise CodegenError(f"stage {k + 2}'s values, renamed, would take names stage {k + 1} uses")

    def arg(a: Arg) -> Arg:
        if a == mid:
            return out
        return renamed.get(a, a) if isinstance(a, str) else a

    ops = [*gemm.ops, *(Op(renamed[op.out], op.op, tuple(arg(a) for a in op.args)) for op in row.ops)]
    return replace(
        gemm,
        tensors=[*gemm.tensors, *(t for t in row.tensors if t.name != mid)],
        ops=ops,
        outputs=[str(arg(o)) for o in row.outputs],
        dtype=row.dtype,
    )


def build_fused(gemm: OpGraph, row: OpGraph, k: int, precision: str) -> Parts:
    """Stages k and k + 1 as one kernel (`fuse`, then `build`)."""
    return build(fuse(gemm, row, k), precision)


def build(graph: OpGraph, precision: str) -> Parts:
    """The fused graph (`fuse`) as one kernel: the GEMM template's tile, K loop and epilogue, the
    row's reductions over the tile's columns, BLOCK_N the whole row."""
    g = triton_gemm.parse(graph, precision, reductions=True)

    def expr(op: Op) -> str:  # a row template's reductions, over the tile's columns (cmask, cols)
        return triton_row._reduce_expr(op, graph, g.names) if op.op in REDUCE_OPS else op_expr(op, g.names)

    params = [*g.ptrs, "M", "N", "K", *triton_gemm.STRIDES]
    params += [f"{k}: tl.constexpr" for k in ("BLOCK_M", "BLOCK_N", *triton_gemm.LOOP_CONSTS)]
    body = [
        *triton_gemm.tile_lines(g),
        *triton_gemm.k_loop(g),
        *triton_gemm.EDGE,
        "cmask = n2 < N  # the row's columns, as the row templates' reductions name them",
        "cols = N",
        *triton_gemm.finish_lines(g, expr),
    ]
    kernel = jit_function("_gemm_kernel", params, body)
    whole_rows = [
        '_bm, _bk = CONFIG["BLOCK_M"], CONFIG["BLOCK_K"]',
        "_bn = max(16, triton.next_power_of_2(_N))  # whole rows: the row's reductions run in the tile",
        f'_bm = max(16, min(_bm, {ACC_PER_THREAD * 32} * CONFIG["num_warps"] // _bn))  # the accumulators fit',
    ]
    fwd = triton_gemm.forward_setup(g, tile=whole_rows)
    fwd += triton_gemm.launch_lines(g)
    tunables, defaults = knobs(graph, g.dots, g.native, precision)
    return Parts(
        [kernel], fwd, tunables, defaults, helpers_for(g.ops, g.dots), (), _drafts(tunables, defaults)
    )


def knobs(
    graph: OpGraph, dots: list[str], native: bool, precision: str
) -> tuple[dict[str, list[int | str]], dict[str, int | str]]:
    """The GEMM's knobs without BLOCK_N (the row); BLOCK_M and BLOCK_K small enough for a whole row's
    tile and its K slices' stages in shared memory; the precision's fast dot by default (the fused
    kernel's point is the GEMM at tensor-core speed)."""
    tunables, defaults = triton_gemm.knobs(graph, dots, native)
    del tunables["BLOCK_N"], defaults["BLOCK_N"]
    wide = max(graph.cols.values(), default=0) > 512
    tunables["BLOCK_M"] = [16, 32, 64]
    tunables["BLOCK_K"] = [16, 32, 64]
    tunables["num_stages"] = [1, 2, 3]
    defaults.update({"BLOCK_M": 32, "BLOCK_K": 16 if wide else 32, "num_stages": 2, "num_warps": 8})
    triton_gemm.with_fast_dot(defaults, dots, native, precision)
    return tunables, defaults


def _drafts(
    tunables: dict[str, list[int | str]], defaults: dict[str, int | str]
) -> list[dict[str, int | str]]:
    """Two more tiles: taller (more rows share each panel of b) and shorter (more programs)."""
    out = []
    for preset in ({"BLOCK_M": 64, "num_warps": 8}, {"BLOCK_M": 16, "num_warps": 4}):
        cfg = {**defaults, **preset}
        if all(v in tunables[k] for k, v in cfg.items()) and cfg != defaults:
            out.append(cfg)
    return out


__all__ = [
    "ACC_PER_THREAD",
    "NAME",
    "ROW_MAX_COLS",
    "SPAN",
    "build",
    "build_fused",
    "fusable",
    "fuse",
    "knobs",
]
