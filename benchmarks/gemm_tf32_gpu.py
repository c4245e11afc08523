"""TF32 GEMM kernels written three ways, against cuBLAS's TF32 at the suites' Linear shapes (issue K).

    python benchmarks/gemm_tf32_gpu.py [--rounds 10] [--out FILE.json]

Not the harness's verdict: a minutes-long look at what Triton's TF32 products reach on this GPU
before a template takes a shape. For each problem (M, N, K; b given as a Linear weight [N, K]), one
kernel in three forms, each at a few tiles:
- `ptr`: the triton-gemm template's pointer loads (its K loop, as the tutorial writes it);
- `ptr+rnd`: the same with a and b rounded to the nearest TF32 value in registers before the dot
  (Triton's TF32 dot truncates its fp32 operands; `triton_common.HELPERS["tf32_round"]`);
- `tma`: a and b read through host-made TMA descriptors (`TensorDescriptor`), and `tma+rnd` with the
  descriptors' own rounding (`round_f32_to_tf32`) where this Triton has it.
Each is run once and its relative norm error taken against the float64 product, then timed in
`--rounds` rounds interleaved with cuBLAS (`F.linear`, TF32 allowed, and once more without: fp32),
L2 flushed before each call; the median of time ratios. Prints one line per row and a table last.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

PROBLEMS = {  # name -> (M, N, K): the suites' Linear products and level 1's square one
    "square_4096": (4096, 4096, 4096),
    "ffn_train_up": (16384, 512, 256),
    "ffn_train_down": (16384, 256, 512),
    "lce_medium": (2048, 50304, 1024),
    "mlp_gpt2_up": (4096, 3072, 768),
}
TILES = [(128, 128, 32, 4, 8), (128, 256, 32, 3, 8), (64, 128, 32, 4, 4)]  # BM, BN, BK, stages, warps


@triton.jit
def _tf32_round(x):
    i = x.to(tl.int32, bitcast=True)
    rounded = ((i + ((i >> 13) & 1) + 0xFFF) & -8192).to(tl.float32, bitcast=True)
    return tl.where((i & 0x7F800000) == 0x7F800000, x, rounded)


@triton.jit
def _tile(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    return first_m + ((pid % in_group) % size_m), (pid % in_group) // size_m


@triton.jit
def ptr_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               GROUP_M: tl.constexpr, ROUND: tl.constexpr):  # fmt: skip
    pid_m, pid_n = _tile(M, N, BM, BN, GROUP_M)
    rm = (pid_m * BM + tl.arange(0, BM)) % M
    rn = (pid_n * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + rn[None, :] * K + rk[:, None]  # b is [N, K]: read as [K, N] through strides
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(tl.cdiv(K, BK)):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        if ROUND:
            a = _tf32_round(a)
            b = _tf32_round(b)
        acc = tl.dot(a, b, acc, input_precision="tf32")
        a_ptrs += BK
        b_ptrs += BK
    om = pid_m * BM + tl.arange(0, BM)
    on = pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + om[:, None] * N + on[None, :], acc, mask=(om[:, None] < M) & (on[None, :] < N))


@triton.jit
def tma_kernel(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               GROUP_M: tl.constexpr, ROUND: tl.constexpr):  # fmt: skip
    pid_m, pid_n = _tile(M, N, BM, BN, GROUP_M)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(tl.cdiv(K, BK)):
        a = a_desc.load([pid_m * BM, k * BK])
        b = b_desc.load([pid_n * BN, k * BK])
        if ROUND:
            a = _tf32_round(a)
            b = _tf32_round(b)
        acc = tl.dot(a, b.T, acc, input_precision="tf32")
    c_desc.store([pid_m * BM, pid_n * BN], acc)


def descriptor_rounds() -> bool:
    from triton.tools.tensor_descriptor import TensorDescriptor

    return "round_f32_to_tf32" in inspect.signature(TensorDescriptor).parameters


def make_call(form: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tile: tuple[int, ...]) -> Any:
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, stages, warps = tile
    (m, k), n = a.shape, b.shape[0]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    opts = {"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8, "num_stages": stages, "num_warps": warps}
    if form.startswith("ptr"):
        return lambda: ptr_kernel[grid](a, b, c, m, n, k, ROUND=form == "ptr+rnd", **opts)
    extra = {"round_f32_to_tf32": True} if form == "tma+rnd" else {}
    round_in_registers = form == "tma+rndreg"

    def call() -> None:  # descriptors made per call, as a forward would
        ad = TensorDescriptor(a, [m, k], [k, 1], [bm, bk], **extra)
        bd = TensorDescriptor(b, [n, k], [k, 1], [bn, bk], **extra)
        cd = TensorDescriptor(c, [m, n], [n, 1], [bm, bn])
        tma_kernel[grid](ad, bd, cd, m, n, k, ROUND=round_in_registers, **opts)

    return call


def timed(fn: Any, flush: torch.Tensor) -> float:
    flush.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def run(name: str, shape: tuple[int, int, int], rounds: int, flush: torch.Tensor) -> list[dict[str, Any]]:
    m, n, k = shape
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda") / k**0.5
    want = torch.nn.functional.linear(a.double(), b.double())
    flops = 2.0 * m * n * k

    def cublas(tf32: bool) -> Any:
        def call() -> torch.Tensor:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            return torch.nn.functional.linear(a, b)

        return call

    def err(got: torch.Tensor) -> float:
        return float(((got.double() - want).norm() / want.norm()).item())

    rows = []
    forms = ["ptr", "ptr+rnd", "tma", "tma+rndreg"] + (["tma+rnd"] if descriptor_rounds() else [])
    entries: list[tuple[str, str, Any, torch.Tensor]] = []
    out32 = torch.empty(m, n, device="cuda")
    entries.append(("cublas", "fp32", cublas(False), out32))
    for form in forms:
        for tile in TILES:
            if tile[1] > n:
                continue
            c = torch.empty(m, n, device="cuda")
            entries.append((form, "x".join(map(str, tile)), make_call(form, a, b, c, tile), c))
    base = cublas(True)
    for form, tile_label, call, c in entries:
        row: dict[str, Any] = {"problem": name, "form": form, "tile": tile_label}
        try:
            got = call()
            torch.cuda.synchronize()
            row["rel_err"] = float(f"{err(got if isinstance(got, torch.Tensor) else c):.3g}")
            for _ in range(2):
                timed(base, flush), timed(call, flush)
            pairs = [(timed(base, flush), timed(call, flush)) for _ in range(rounds)]
            row["vs_cublas_tf32"] = round(statistics.median(r / t for r, t in pairs), 3)
            row["ms"] = round(statistics.median(t for _, t in pairs), 4)
            row["cublas_tf32_ms"] = round(statistics.median(r for r, _ in pairs), 4)
            row["tflops"] = round(flops / (row["ms"] * 1e-3) / 1e12, 1)
        except Exception as exc:  # a form this Triton cannot build is a row, not the end
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:140] if str(exc) else ''}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    torch.backends.cuda.matmul.allow_tf32 = True
    got = base()
    rows.append({"problem": name, "form": "cublas", "tile": "tf32", "rel_err": float(f"{err(got):.3g}"),
                 "tflops": None, "vs_cublas_tf32": 1.0})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--problems", nargs="*", default=list(PROBLEMS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    t0 = time.perf_counter()
    rows = [r for name in args.problems for r in run(name, PROBLEMS[name], args.rounds, flush)]
    print(f"\ndescriptor rounding available: {descriptor_rounds()}")
    print(
        f"{'problem':<16} {'form':<11} {'tile':<14} {'ms':>8} {'cuBLAS ms':>9} {'vs cuBLAS':>9} {'TFLOP/s':>8} {'rel err':>9}"
    )
    for r in rows:
        print(
            f"{r['problem']:<16} {r['form']:<11} {r['tile']:<14} {r.get('ms', ''):>8} {r.get('cublas_tf32_ms', ''):>9} "
            f"{r.get('vs_cublas_tf32', ''):>9} {r.get('tflops') or '':>8} {r.get('rel_err', ''):>9} {r.get('error', '')[:50]}"
        )
    if args.out:
        doc = {
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
            "seconds": round(time.perf_counter() - t0, 1),
            "rows": rows,
        }
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
