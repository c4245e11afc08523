"""A small built-in knowledge set: specific, checkable advice for writing kernels, searched by keyword.

Each snippet is short and concrete (numbers, API names, error messages and their fixes), because the
operator's prompt has room for a few of them, not for a textbook. Hardware numbers are datasheet
values for orientation; the run's measured hardware profile is what fitness is judged against.

`search` scores snippets by keyword overlap with the query (tags count most, then title words, then
the text), after a crude normalization (lower case, a trailing plural "s" dropped). It is not a
retriever: the knowledge base with a full-text index replaces it and keeps its signature.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernelevolve.synth.base import Snippet


@dataclass(frozen=True)
class _Doc:
    id: str
    title: str
    platforms: tuple[str, ...] | None  # None: any platform
    tags: tuple[str, ...]
    text: str


DOCS: tuple[_Doc, ...] = (
    _Doc(
        "triton-row-reduction",
        "Row reductions in Triton (softmax, layernorm, RMSNorm, sum, max)",
        ("cuda", "rocm", "cpu"),
        ("triton", "reduction", "softmax", "row", "sum", "max", "online", "wide", "narrow"),
        "One program per row while the row fits in registers: BLOCK = triton.next_power_of_2(n_cols), "
        "load with mask= and a neutral other= (-inf before a max, 0.0 before a sum), reduce with "
        "tl.max / tl.sum(axis=0). A 16384-wide fp32 row is 64 KB spread over num_warps*32 threads; use "
        "num_warps 4 up to BLOCK 2048, 8 up to 8192, 16 beyond. Wider rows: loop over BLOCK-sized tiles "
        "with an online max and sum (m_new = max(m, max(tile)); s = s*exp(m - m_new) + sum(exp(tile - "
        "m_new))), then one more pass writes exp(x - m)/s: two reads and one write instead of three "
        "reads. Many short rows (n_cols <= 256): give each program several rows as a [ROWS, BLOCK] tile "
        "reduced along axis=1, so each program moves at least 4-8 KB. Reduce in fp32 even for bf16.",
    ),
    _Doc(
        "triton-coalescing",
        "Coalesced and vectorized memory access in Triton",
        ("cuda", "rocm"),
        ("triton", "coalescing", "memory", "bandwidth", "stride", "contiguous", "vectorize", "alignment"),
        "A warp's loads coalesce when consecutive lanes touch consecutive addresses: let tl.arange run "
        "along the stride-1 dimension and pass strides as arguments instead of assuming them. Triton "
        "emits 128-bit loads (4 fp32 or 8 bf16 per thread) when it can prove 16-byte alignment and "
        "contiguity; it specializes integer arguments divisible by 16 and 16-byte-aligned pointers on "
        "its own, and for computed offsets the hints tl.multiple_of(offs, 16) and "
        "tl.max_contiguous(offs, BLOCK) help. Walking a tensor across its stride-1 dimension wastes most "
        "of each 32-byte sector: load [BM, BK] tiles with the contiguous dimension last and use tl.trans "
        "in registers. x.contiguous() on a strided input is a full extra read and write: take strides.",
    ),
    _Doc(
        "hopper-occupancy",
        "Block sizes and occupancy on Hopper (H100, H200)",
        ("cuda",),
        (
            "occupancy",
            "hopper",
            "h100",
            "h200",
            "sm90",
            "registers",
            "shared",
            "grid",
            "num_warps",
            "num_stages",
            "block",
        ),
        "H100 SXM: 132 SMs; per SM 65,536 32-bit registers, at most 2,048 resident threads (64 warps) "
        "and 32 blocks, 228 KB shared memory (227 KB per block: Triton's limit reads 232448 bytes); "
        "50 MB L2; HBM3 about 3.35 TB/s. H200: same SMs, HBM3e about 4.8 TB/s, 141 GB. Registers cap "
        "occupancy: at 128 registers/thread a 256-thread block takes 32K registers, so 2 blocks (16 "
        "warps) fit per SM; at 255 registers only 8 warps. Memory-bound kernels want 2-4 resident blocks "
        "per SM and a grid of at least ~4x132 programs, or a persistent grid of 132 (or 264) programs "
        "looping over tiles. Fewer than 132 programs leaves SMs idle: split the work. num_warps 4 is the "
        "default, 8 for tiles of 128x128 and up or wide rows; num_stages 3-4 for K loops (each stage "
        "keeps one set of tiles in shared memory).",
    ),
    _Doc(
        "fusion",
        "Fuse elementwise chains, reductions and epilogues",
        None,
        ("fusion", "fuse", "elementwise", "epilogue", "activation", "bias", "memory", "bandwidth"),
        "k elementwise ops in eager PyTorch read and write the whole tensor k times; one kernel that "
        "loads once, computes all k in registers and stores once moves about 2 tensor sizes of bytes "
        "instead of 2k. Its floor is bytes / bandwidth: a 64 MiB fp32 read plus a 64 MiB write takes at "
        "least ~40 us on an H100 (3.35 TB/s). Fuse a reduction with its consumer (normalize in the kernel "
        "that computed the statistic) and bias, activation and residual into a matmul's epilogue before "
        "the store. Elementwise: 1-D programs of 1024-4096 elements, num_warps 4-8; recompute cheap "
        "values instead of storing intermediates. torch.compile already fuses plain elementwise chains, "
        "so against the compile baseline the gain is in what it does not fuse or tile well.",
    ),
    _Doc(
        "dot-precision",
        "tl.dot precision: fp32, TF32, bf16 (strict_fp32 policy)",
        ("cuda", "rocm"),
        ("precision", "tf32", "fp32", "ieee", "dot", "matmul", "bf16", "strict", "accumulate", "tolerance"),
        "On NVIDIA GPUs tl.dot on fp32 inputs uses TF32 tensor cores by default (input_precision='tf32'): "
        "a 10-bit mantissa, relative error around 1e-3, which fails a strict_fp32 spec (relative-norm "
        "tolerance 5e-5). Under strict_fp32 write tl.dot(a, b, input_precision='ieee') (older Triton: "
        "allow_tf32=False): CUDA cores, roughly 1/7 of TF32's peak on H100 (67 vs ~495 TFLOP/s dense). "
        "'tf32x3' (three TF32 products) comes close to fp32 accuracy at about 3x the TF32 cost; check it "
        "against the tolerance. Under the tf32 policy plain tl.dot is allowed. Always accumulate in fp32 "
        "(acc = tl.zeros((BM, BN), dtype=tl.float32)) and cast once at the store "
        "(acc.to(c_ptr.dtype.element_ty)). Casting fp32 inputs to bf16/fp16 is a precision downgrade "
        "unless the spec's policy is 'low'.",
    ),
    _Doc(
        "triton-masking",
        "Masking pitfalls in Triton: tails, neutral values, int32 overflow",
        ("cuda", "rocm", "cpu"),
        ("mask", "masking", "triton", "tail", "bounds", "other", "overflow", "int64", "nan", "arange"),
        "Every tl.load / tl.store whose offsets can pass the end needs mask=: declared shapes are rarely "
        "multiples of BLOCK. other= must be neutral for what follows: -inf before a max, 0.0 before a sum, "
        "1.0 before a product (a padded 0 corrupts the max of an all-negative row). 2-D: mask = "
        "(rm[:, None] < M) & (rn[None, :] < N). tl.arange(0, N) needs N a power of 2 and a constexpr: "
        "round up with triton.next_power_of_2 and mask. Offsets are int32: when numel can reach 2**31 "
        "(or row * stride can overflow) compute them in int64: pid = tl.program_id(0).to(tl.int64). "
        "Masked lanes still compute: exp(-inf) is 0 but (-inf) - (-inf) is NaN, so guard fully masked "
        "rows with tl.where.",
    ),
    _Doc(
        "triton-compile-errors",
        "Common Triton compile errors and their fixes",
        ("cuda", "rocm", "cpu"),
        (
            "error",
            "compile",
            "triton",
            "constexpr",
            "arange",
            "shared",
            "resources",
            "global",
            "break",
            "dtype",
        ),
        '- "arange\'s range must be a power of 2": BLOCK = triton.next_power_of_2(n) as a tl.constexpr, '
        "mask the tail.\n"
        '- "Cannot access global variable X from within @jit\'ed function": pass X as an argument, or '
        "define it as X = tl.constexpr(4) at module level.\n"
        '- "unsupported AST node type: Break" (or Continue): no break/continue in kernels; use masks or '
        "a computed loop bound.\n"
        '- tl.dot "... must be >= 16": BLOCK_M, BLOCK_N and BLOCK_K of at least 16.\n'
        '- "out of resources: shared memory, Required: N, Hardware limit: 232448": smaller BLOCK_K or '
        "BLOCK_N, or fewer num_stages.\n"
        '- a recompilation on every call, or "... is not a constexpr": block sizes are tl.constexpr '
        "parameters given Python ints at launch, never tensors.\n"
        "- dtype mismatches at tl.store or tl.where: cast explicitly, x.to(tl.float32) for math and "
        ".to(y_ptr.dtype.element_ty) at the store.\n"
        "- inside a kernel: no Python lists, dicts, print or calls to plain Python functions; helpers "
        "need @triton.jit too.",
    ),
    _Doc(
        "openmp-c",
        "C kernels on the CPU: OpenMP threads and SIMD",
        ("cpu",),
        (
            "openmp",
            "simd",
            "schedule",
            "parallel",
            "vectorize",
            "restrict",
            "threads",
            "compile_c",
            "c",
            "cpu",
        ),
        "kernelevolve.native.compile_c builds with -O3 -march=native -fopenmp, never -ffast-math unless "
        "flags=[...] asks. Threads: `#pragma omp parallel for schedule(static)` over rows, so each thread "
        "owns a contiguous block and no two threads write one cache line. SIMD: `#pragma omp simd "
        "reduction(max:m)` or `reduction(+:s)` on the inner loop; without it gcc keeps an fp reduction "
        "in source order and scalar. Declare `const float *restrict x, float *restrict y` so the compiler "
        "knows they do not alias. gcc vectorizes expf only with -ffast-math (glibc's libmvec), which also "
        "relaxes IEEE semantics: under strict precision keep expf scalar or write a range-reduction plus "
        "polynomial exp and check the tolerance. A parallel region costs a few microseconds: below ~64K "
        "elements add `if(n > 65536)` to the pragma or stay serial. schedule(dynamic) pays only when "
        "iterations cost unequal time. Use int64_t for sizes and indices.",
    ),
    _Doc(
        "cpu-memory",
        "C on the CPU: passes over memory, caches and blocking",
        ("cpu",),
        ("cache", "blocking", "tiling", "bandwidth", "cpu", "c", "passes", "l2", "prefetch"),
        "A CPU kernel over a large tensor is usually bound by DRAM bandwidth (tens of GB/s per socket, "
        "far less per core): count passes over memory first. Keep a row's working set in L1/L2 (tens of "
        "KB to ~1-2 MB per core) and do all its passes while it is hot: for softmax, the max, exp-and-sum "
        "and scale passes over one row cost one DRAM read and one write if the row fits in cache. For "
        "matmul-like loops, block by tiles that fit L1/L2 and keep the innermost loop over the contiguous "
        "index so it vectorizes. Write outputs once; do not zero a buffer that is fully overwritten.",
    ),
    _Doc(
        "launch-overhead",
        "Launch overhead and small shapes",
        ("cuda", "rocm"),
        ("launch", "overhead", "small", "latency", "decode", "graphs", "sync", "allocation", "tiny"),
        "Every kernel costs a few microseconds on the GPU even when it does nothing useful, and a Python "
        "launch costs several more on the host. The harness times shapes whose call takes under ~50 us "
        "with CUDA graphs, which hides host overhead but not the per-kernel cost: for small shapes the "
        "number of kernels is what counts, so one fused kernel beats three fast ones. In forward, avoid "
        "extra allocations, .contiguous() copies, .item() or .cpu() (a device sync) and Python loops over "
        "launches. Size the grid to the work: a decode-sized problem may want one program per row, or "
        "several rows per program so that each program does enough work to hide its start-up.",
    ),
    _Doc(
        "triton-matmul",
        "Tiled matmul in Triton",
        ("cuda", "rocm"),
        ("matmul", "gemm", "dot", "tile", "tiling", "group", "l2", "swizzle", "linear", "bmm"),
        "One program per (BLOCK_M, BLOCK_N) output tile, looping over K in BLOCK_K steps: load an A tile "
        "and a B tile (masked at the edges), acc += tl.dot(a, b) with an fp32 accumulator. Starting points "
        "on Hopper: bf16/fp16 128x128x64 with num_warps 8 and num_stages 3-4; fp32 under strict "
        "precision (input_precision='ieee') 64x64x32 with num_warps 4. Order program ids in groups "
        "(GROUP_M = 8) so consecutive programs share rows of A and columns of B in L2. Fuse the bias and "
        "activation into the epilogue. Declare the tile sizes in TUNABLES and CONFIG so the tuner can "
        "search them instead of guessing.",
    ),
    _Doc(
        "roofline",
        "Memory-bound or compute-bound: reading the roofline",
        None,
        ("roofline", "bound", "intensity", "memory", "compute", "flops", "bandwidth", "diagnosis"),
        "Arithmetic intensity = FLOPs / bytes moved, counting each input read once and each output written "
        "once. H100 SXM ridge points: bf16 tensor cores (~989 TFLOP/s dense) / 3.35 TB/s = ~295 FLOP/byte; "
        "TF32 (~495) ~148; fp32 CUDA cores (~67) ~20. Softmax, norms, elementwise ops and most reductions "
        "are below 10: memory-bound, with time near bytes / bandwidth as the target, so the fix is fewer "
        "passes over memory, not fewer FLOPs. Large GEMMs and convolutions are compute-bound: tensor "
        "cores, tile reuse and pipelining. 80-90% of measured bandwidth is excellent; a kernel far below "
        "it while memory-bound has a coalescing, occupancy or extra-pass problem.",
    ),
    _Doc(
        "atomics-determinism",
        "Split reductions: atomics versus two-stage",
        ("cuda", "rocm"),
        ("atomic", "atomics", "split", "reduction", "determinism", "deterministic", "split-k", "partial"),
        "tl.atomic_add lets many programs add into one output (split-K, column sums), but the order of "
        "additions changes from run to run, so results differ in the last bits between calls; the output "
        "must also be zeroed first (torch.zeros is glue, but it is one more kernel). fp32 atomics are "
        "fast on Hopper; bf16 atomics are slow or missing. A two-stage reduction (each program writes a "
        "partial to a small buffer, a second tiny kernel reduces the partials) is deterministic and often "
        "as fast when the partials number in the thousands.",
    ),
    _Doc(
        "tunables",
        "Declaring knobs for the tuner: TUNABLES and CONFIG",
        None,
        ("tunables", "config", "autotune", "knobs", "block", "num_warps", "tuner", "search"),
        "A candidate declares its knobs as two module-level literal dicts, and its kernels read CONFIG: "
        "TUNABLES = {'BLOCK': [256, 512, 1024, 2048], 'num_warps': [2, 4, 8]} and CONFIG = {'BLOCK': "
        "1024, 'num_warps': 4}. Every CONFIG value must be one of its choices. The offline tuner rewrites "
        "only the CONFIG line and lets the harness time each configuration, so prefer this to "
        "@triton.autotune (which benchmarks inside the first timed call). Keep choices valid for every "
        "declared shape, or derive them from the shape in forward (e.g. BLOCK = max(CONFIG['BLOCK'], "
        "triton.next_power_of_2(cols)) when a row must fit).",
    ),
)

_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "the",
        "of",
        "in",
        "on",
        "for",
        "to",
        "with",
        "is",
        "are",
        "how",
        "what",
        "why",
        "when",
        "use",
        "using",
        "not",
        "do",
        "does",
        "it",
    ]
)


def _terms(text: str) -> set[str]:
    words = re.findall(r"[a-z0-9_]+", text.lower())
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words if w not in _STOP}


def search(query: str, platform: str | None = None, limit: int = 5) -> list[Snippet]:
    """The best-matching built-in snippets for `query`, on `platform` (None: any), best first."""
    wanted = _terms(query)
    if not wanted or limit <= 0:
        return []
    scored: list[tuple[float, str, _Doc]] = []
    for doc in DOCS:
        if platform is not None and doc.platforms is not None and platform not in doc.platforms:
            continue
        tags = _terms(" ".join(doc.tags))
        title = _terms(doc.title)
        body = _terms(doc.text)
        score = sum(3.0 * (t in tags) + 2.0 * (t in title) + 1.0 * (t in body) for t in wanted)
        if score > 0:
            scored.append((score, doc.id, doc))
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [Snippet(doc=f"builtin:{d.id}", title=d.title, text=d.text, score=s) for s, _, d in scored[:limit]]


__all__ = ["DOCS", "search"]
