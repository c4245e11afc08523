"""Triton template for `gemm` graphs with few output tiles and a long K: split-K
(`triton-gemm-splitk`).

The GEMM template (`triton_gemm.py`) gives one program per output tile, each looping over all of K:
a 256 x 256 product with K = 2**19 (KernelBench 1/6) is 4 programs of 16384 K slices on 132 SMs.
Here K is cut into SPLIT_K contiguous ranges, and the product takes two kernels:
- pass 1, a grid of (tiles, batch, splits): each program runs `triton_gemm`'s K loop over its
  range (K_TILES slices of BLOCK_K, the last range shorter and masked where K does not divide; the
  loop's two-level FOLD summation within the range) and stores its fp32 partial tile to a workspace
  [splits, batch, M, N] the forward allocates;
- pass 2, a grid of (small tiles, batch): each program sums its tile's partials over the splits in
  order (no atomics: the result does not depend on scheduling; the loop unrolled, so the loads are
  issued ahead of the chain of adds), then adds the bias, runs the epilogue and stores the outputs
  exactly as the one-pass kernel does (`triton_gemm.finish_lines`): the epilogue only ever sees
  the full sum.
The dot precisions (`DOT`) are the one-pass kernel's (`triton_common.dot_lines`).

One candidate serves every shape: the forward decides from the runtime shape. SPLIT_K "auto" asks
for about PROGRAMS_PER_SM programs per SM over the tiles (`_sm_count`; 4 SMs off CUDA, the
interpreter) with at least MIN_K_TILES slices per range, rounded down to a power of two (so that a
K of a power of two cuts into equal ranges and no load needs a mask: KernelBench 1/6 on an H100
takes 64 ranges of 256 slices, 256 programs); a fixed SPLIT_K is used as given (at least one slice
per range). Either way the workspace stays within MAX_WORKSPACE fp32 values. Where that
leaves one range (many tiles, or a short K), the forward launches the one-pass kernel, unchanged,
with the same knobs; SPLIT_K 1 always does.

`applies` offers the template (first, ahead of `triton-gemm`) where some spec shape has few output
tiles at the default tile (at most half an H100's SMs) and a long K (at least LONG_K_TILES slices of
BLOCK_K): there the one-pass grid leaves most SMs idle for a long loop. Never for the square GEMMs
(4096^3: 1024 tiles), whose drafts stay `triton-gemm`'s.

A pipeline's GEMM stage (a Linear, then a softmax) is a gemm graph like any other: where its shapes
qualify, its default takes this template (`triton_stages` renames the three kernels apart).

Not here: atomics, stream-K (a persistent grid sharing the K loops), split-K for convolutions'
implicit GEMMs (`triton_conv.py`).
"""

from __future__ import annotations

from kernelevolve.synth.tuner import triton_gemm
from kernelevolve.synth.tuner.ir import OpGraph
from kernelevolve.synth.tuner.triton_common import CodegenError, Parts, helpers_for, jit_function
from kernelevolve.synth.tuner.triton_gemm import (
    EDGE,
    LOOP_CONSTS,
    STRIDES,
    Gemm,
    finish_args,
    finish_lines,
    fold_line,
    forward_setup,
    k_loop,
    launch_lines,
    tile_lines,
)

PROGRAMS_PER_SM = 2  # "auto": two 128 x 128 fp32 programs share an SM (96 KB of shared memory each)
MIN_K_TILES = 8  # "auto": K slices per range at least, so a partial tile's store amortizes
MAX_WORKSPACE = 1 << 26  # fp32 partial values at most (256 MB)
LONG_K_TILES = 128  # `applies`: K slices of the one-pass loop at least (K >= 4096 in fp32's 32-wide)
H100_SMS = 132  # `applies` judges the spec's shapes for an H100
SUM_TILE, SUM_N = 512, 64  # pass 2: values per program, columns at most
_SPLIT_K: list[int | str] = ["auto", 1, 2, 4, 8, 16, 32, 64, 128]


def split_count_lines() -> list[str]:
    """The forward's lines that choose the number of K ranges `_split` and the K slices per range
    `_kps`, from CONFIG's SPLIT_K, `_tiles` (per batch), `_batch`, `_kt` (K slices), `_M`, `_N` and
    `_device` (the SM count through `_sm_count`)."""
    return [
        '_split = CONFIG["SPLIT_K"]',
        f'if _split == "auto":  # about {PROGRAMS_PER_SM} programs per SM, {MIN_K_TILES}+ K slices per range',
        '    _sms = _sm_count(_device.index) if _device.type == "cuda" else 4',
        f"    _split = max(1, min(triton.cdiv({PROGRAMS_PER_SM} * _sms, _tiles * _batch), _kt // {MIN_K_TILES}))",
        "    _split = 1 << (_split.bit_length() - 1)  # a power of two: ranges that divide a K of one",
        f"_split = max(1, min(_split, _kt, {MAX_WORKSPACE} // (_batch * _M * _N)))",
        "_kps = triton.cdiv(_kt, _split)  # K slices per range",
        "_split = triton.cdiv(_kt, _kps)  # no empty range",
    ]


def _shape_tiles(graph: OpGraph, shape: str, config: dict[str, int | str]) -> tuple[int, int]:
    """(output tiles over all batches, K slices) of spec shape `shape` at `config`'s tile."""
    batch = max(1, graph.batch.get(shape, 1))
    m, n, k = graph.rows[shape] // batch, graph.cols[shape], graph.inner.get(shape, 0)
    bm, bn, bk = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    return batch * -(-m // bm) * -(-n // bn), -(-k // bk)


def applies(graph: OpGraph) -> bool:
    """Whether to offer (and draft first) the template: some spec shape has at most H100_SMS / 2
    output tiles at the default tile and at least LONG_K_TILES K slices (a shape whose sizes are not
    known is not judged)."""
    if graph.pattern != "gemm" or graph.gemm is None:
        return False
    try:
        gemm = triton_gemm.parse(graph, "strict_fp32")
    except CodegenError:
        return False
    defaults = triton_gemm.knobs(graph, gemm.dots, gemm.native)[1]
    for shape in graph.rows:
        if shape not in graph.cols or graph.inner.get(shape, 0) <= 0:
            continue
        tiles, k_tiles = _shape_tiles(graph, shape, defaults)
        if tiles <= H100_SMS // 2 and k_tiles >= LONG_K_TILES:
            return True
    return False


def build(graph: OpGraph, precision: str) -> Parts:
    one_pass = triton_gemm.build(graph, precision)
    g = triton_gemm.parse(graph, precision)
    if len(one_pass.kernels) != 1:
        raise CodegenError("split-K expects the GEMM template's one kernel")
    kernels = [one_pass.kernels[0], _partial_kernel(g), _sum_kernel(g)]
    fwd = forward_setup(g) + _split_lines(g)
    tunables = {**one_pass.tunables, "SPLIT_K": list(_SPLIT_K)}
    defaults = {**one_pass.defaults, "SPLIT_K": "auto"}
    drafts = triton_gemm.gemm_drafts(tunables, defaults, precision, g.native)
    helpers = helpers_for(g.ops, g.dots) | {"sm_count"}
    return Parts(kernels, fwd, tunables, defaults, helpers, one_pass.tile, drafts, one_pass.smem)


def _partial_kernel(g: Gemm) -> str:
    """Pass 1: program (tile, z, s) sums K range s of tile (tile, z) into the workspace."""
    params = [*g.ptrs[:2], "ws_ptr", "M", "N", "K", *STRIDES]
    params += [f"{k}: tl.constexpr" for k in ("BLOCK_M", "BLOCK_N", *LOOP_CONSTS)]
    body = [
        *tile_lines(g),
        "k0 = tl.program_id(2).to(tl.int64) * (K_TILES * BLOCK_K)  # this range's first k",
        "a_ptrs += k0 * stride_ak",
        "b_ptrs += k0 * stride_bk",
        *k_loop(g, left="(K - k0)"),
        *EDGE,
        "part = (tl.program_id(2) * tl.num_programs(1) + z) * M * N  # [split, batch, M, N]",
        "tl.store(ws_ptr + part + m2 * N + n2, acc, mask=mask)",
    ]
    return jit_function("_gemm_partial_kernel", params, body)


def _sum_kernel(g: Gemm) -> str:
    """Pass 2: program (tile, z) sums the splits' partials of its tile in order, then finishes as
    the one-pass kernel does."""
    params = [*g.ptrs[2:], "ws_ptr", "M", "N", "split_stride"]
    params += [f"{k}: tl.constexpr" for k in ("BLOCK_M", "BLOCK_N", "SPLITS")]
    body = [
        "pid = tl.program_id(0)",
        "z = tl.program_id(1).to(tl.int64)",
        "num_pid_n = tl.cdiv(N, BLOCK_N)",
        "rm = (pid // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rn = (pid % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)",
        *EDGE,
        "part_ptrs = ws_ptr + z * M * N + m2 * N + n2",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "for s in tl.static_range(SPLITS):  # in order; unrolled, so the loads need not wait on the adds",
        "    acc += tl.load(part_ptrs, mask=mask, other=0.0)",
        "    part_ptrs += split_stride",
        *finish_lines(g),
    ]
    return jit_function("_gemm_sum_kernel", params, body)


def _split_lines(g: Gemm) -> list[str]:
    """The forward after `forward_setup`: the number of K ranges, then the one-pass launch where it
    is one, else the two passes."""
    one_pass = launch_lines(g)
    return [
        "_kt = triton.cdiv(_K, _bk)",
        "_tiles = triton.cdiv(_M, _bm) * triton.cdiv(_N, _bn)",
        *split_count_lines(),
        "if _split == 1:  # the one-pass kernel, as triton-gemm launches it",
        *["    " + line for line in one_pass],
        "_ws = torch.empty((_split, _batch, _M, _N), device=_device, dtype=torch.float32)",
        fold_line("_kps"),
        "_gemm_partial_kernel[(_tiles, _batch, _split)](",
        "    _a, _b, _ws, _M, _N, _K, _saz, _sam, _sak, _sbz, _sbk, _sbn,",
        '    BLOCK_M=_bm, BLOCK_N=_bn, BLOCK_K=_bk, GROUP_M=CONFIG["GROUP_M"],',
        '    K_TILES=_kps, EVEN_K=_K % (_kps * _bk) == 0, DOT=CONFIG["DOT"], FOLD=_fold,',
        '    num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"],',
        ")",
        f"_sn = min({SUM_N}, triton.next_power_of_2(_N))",
        f"_sm = {SUM_TILE} // _sn",
        "_gemm_sum_kernel[(triton.cdiv(_M, _sm) * triton.cdiv(_N, _sn), _batch)](",
        f"    {', '.join([*finish_args(g), '_ws'])}, _M, _N, _batch * _M * _N,",
        "    BLOCK_M=_sm, BLOCK_N=_sn, SPLITS=_split, num_warps=4,",
        ")",
        one_pass[-1],
    ]


__all__ = ["H100_SMS", "LONG_K_TILES", "MIN_K_TILES", "applies", "build", "split_count_lines"]
