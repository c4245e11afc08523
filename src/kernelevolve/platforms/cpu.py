"""The CPU: C/C++ candidates compiled natively (kernelevolve.native, seconds per build) and timed with
perf_counter; Triton candidates run under the Triton interpreter for correctness only.

Interpreted Triton is orders of magnitude slower than compiled code and says nothing about GPU speed,
so its verdicts carry `timed: false` and no speedups: they are labelled, never timed as if real.
There is no datasheet for an arbitrary CPU; the roofline uses the measured profile only.
"""

from __future__ import annotations

import os
import platform as _pyplatform
from pathlib import Path
from typing import Any, ClassVar

from kernelevolve.platforms.base import Platform


class CpuPlatform(Platform):
    name = "cpu"
    description = "this machine's CPU: C/C++ kernels timed natively; Triton checked under the interpreter"
    kinds = frozenset({"c", "triton"})
    timed_kinds = frozenset({"c"})
    dsls: ClassVar[list[str]] = [
        "c/c++ (kernelevolve.native.compile_c)",
        "triton (interpreter: correctness only)",
    ]
    exclusive = True
    warmup_s = 0.25
    timing_precision = 0.0
    search_timing_precision = 0.0

    def present(self) -> tuple[bool, str]:
        try:
            import torch  # noqa: F401
        except ImportError:
            return False, "torch is not installed"
        return True, ""

    def worker_env(self) -> dict[str, str]:
        # torch.compile's C++ kernels: no precompiled header. A worker's temporary folder is its own,
        # so each would preprocess, hash and compile the header again (5-8 s of a 10 s cache hit).
        return {"TRITON_INTERPRET": "1", "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}

    def untimed_reason(self, kind: str) -> str:
        return (
            "triton under the interpreter: correctness only, never timed"
            if kind == "triton"
            else super().untimed_reason(kind)
        )

    def device_name(self, device: Any) -> str:
        model = ""
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        return f"{model or _pyplatform.processor() or 'cpu'} ({os.cpu_count()} cpus)"

    def target(self, device: Any) -> str:
        flags = ""
        try:
            text = Path("/proc/cpuinfo").read_text()
            flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
        except OSError:
            pass
        isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "base"
        return f"cpu:{_pyplatform.machine()}-{isa}"

    def make_timer(self, device: Any) -> Any:
        from kernelevolve.platforms.timers import CpuTimer

        _steady_heap()
        return CpuTimer(_llc_bytes())

    def _copy_size(self, device: Any) -> int:
        return 128 * 2**20

    def _gemm_size(self, device: Any) -> int:
        return 512


def _steady_heap() -> None:
    """From here on (the worker's timer is made after the reference's outputs are prepared), glibc's
    malloc keeps freed blocks in its heap for reuse instead of returning them to the kernel. By
    default it hands large blocks (an output of a few MiB) back when they are freed and maps them
    again, page fault by page fault, at the next call, depending on the heap's history: one process
    timed a 300 us kernel at 750 us and the next at 300. With fixed thresholds every callee (eager,
    compiled, the candidate) allocates the way a long-running process does. Not earlier: preparing
    a large spec that way would keep every freed block resident (a 640 MiB spec's preparation peaked
    at 4.3 times its tensors instead of under 4)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, ctypes.c_int(1 << 30))  # M_MMAP_THRESHOLD: blocks up to 1 GiB from the heap
        libc.mallopt(-1, ctypes.c_int(2**31 - 1))  # M_TRIM_THRESHOLD: never give the heap's top back
    except (OSError, AttributeError):  # not glibc: its allocator, its habits
        pass


def _llc_bytes() -> int:
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1)
        best = max(best, int(size.rstrip("KMG")) * mult)
    return best or 32 * 2**20
