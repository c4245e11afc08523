"""The platform interface and the hardware profile every roofline is computed against.

A hardware profile holds the measured ceilings (a large device-to-device copy, counting bytes read
plus bytes written; a large library GEMM per precision) beside the datasheet's, because datasheets
are leads, not limits: the fraction of roofline a kernel reaches is reported against the measured
ceilings, and a kernel faster than the datasheet's roofline is flagged as impossible.
"""

from __future__ import annotations

import platform as _pyplatform
import statistics
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

# Precision classes for peak FLOP/s: what a GEMM of that kind runs at.
FLOP_CLASSES = ("fp32", "tf32", "bf16", "fp16")


@dataclass
class HardwareProfile:
    platform: str
    device: str
    bandwidth: float  # bytes/s, measured
    flops: dict[str, float]  # class -> FLOP/s, measured
    datasheet_bandwidth: float | None = None
    datasheet_flops: dict[str, float] = field(default_factory=dict)
    method: str = ""
    measured_at: str = ""
    versions: dict[str, str | None] = field(default_factory=dict)
    target: str = ""  # e.g. "cuda:sm90", "cpu:x86_64-avx2": what hardware documents are matched on

    def peak_flops(self, cls: str, datasheet: bool = False) -> float | None:
        table = self.datasheet_flops if datasheet else self.flops
        return table.get(cls)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareProfile:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


class Platform(ABC):
    name: str = ""
    description: str = ""
    kinds: frozenset[str] = frozenset()  # kernel kinds a candidate may carry here
    timed_kinds: frozenset[str] = frozenset()  # kinds whose timings are real here
    dsls: ClassVar[list[str]] = []
    # True where any concurrent work disturbs timings (the CPU): workers then hold the device lease
    # while preparing and compiling too, not only while checking and timing.
    exclusive: bool = False
    # Seconds of warm-up rounds per shape before timing, where `warmup_s` is not set: a CPU that was
    # idle runs the first second of a process slower; a GPU's first rounds (ESTIMATE_ROUNDS) suffice.
    warmup_s: float = 0.0
    # Where `timing_precision` is not set: a shape's rounds end once every median is known within
    # +-0.5% (95%), as a GPU's event timings of a steady kernel soon are (ten such medians then range
    # over about 1%, inside the harness's fidelity target of 2%); the CPU sets 0 and times its whole
    # budget.
    timing_precision: float = 0.005
    # The search's evaluations (`search_timing_precision`): +-1%. They rank candidates; the winners
    # are re-measured at `timing_precision` before any number is reported. Microsecond kernels timed
    # as CUDA graphs took 120-365 rounds to know their medians within +-0.5% (event ticks of 32 ns
    # against an 8 us call); at +-1% an evaluation of four suite specs' three shapes took 218 rounds
    # where it had taken 489 (H100, 2026-11-27-h100-throughput-search-precision.md).
    search_timing_precision: float = 0.01

    def search_precision(self, settings: Any) -> float:
        """The precision of the search's evaluations under `settings` (see `search_timing_precision`)."""
        if settings.search_timing_precision is not None:
            return float(settings.search_timing_precision)
        if settings.timing_precision is not None:
            return float(settings.timing_precision)
        return self.search_timing_precision

    # -- engine side (cheap, no device initialization) ---------------------------------------------

    @abstractmethod
    def present(self) -> tuple[bool, str]:
        """Whether this machine has the platform's device, and why not."""

    def worker_env(self) -> dict[str, str]:
        """Variables a worker needs on this platform."""
        return {}

    def device_string(self, index: int) -> str:
        return "cpu"

    def device_count(self) -> int:
        """Devices of this platform on this machine, counted without initializing them."""
        return 1

    # Whether `lease_key` names the physical device whatever devices a process sees; where it does
    # not, processes that see different devices under one index need a lease directory each.
    physical_lease_keys: bool = False

    def lease_key(self, index: int) -> str:
        """The name of device `index`'s lease (`evaluate/lease.py`), read without initializing the
        device: the same in every process that uses the device, so that two timings never share it."""
        return f"{self.name}-{index}"

    def identity(self, index: int) -> dict[str, str | None]:
        """Device name and software versions, read without initializing the device (engine side):
        the key under which a hardware profile and cached baselines are stored."""
        from importlib.metadata import PackageNotFoundError, version

        def ver(pkg: str) -> str | None:
            try:
                return version(pkg)
            except PackageNotFoundError:
                return None

        return {
            "device": self.device_name(None),
            "driver": None,
            "torch": ver("torch"),
            "triton": ver("triton"),
        }

    def untimed_reason(self, kind: str) -> str:
        return f"{kind} kernels are checked for correctness only on {self.name}"

    # -- worker side (device initialized) ----------------------------------------------------------

    def setup(self, device: Any, precision: str) -> None:  # noqa: B027 - optional hook
        """Select the device and set the precision flags for the policy, once per worker."""

    @abstractmethod
    def device_name(self, device: Any) -> str: ...

    def target(self, device: Any) -> str:
        """Device kind and generation, e.g. `cuda:sm90`, `rocm:gfx942`, `cpu:x86_64-avx512`."""
        return self.name

    @abstractmethod
    def make_timer(self, device: Any) -> Any: ...

    def versions(self) -> dict[str, str | None]:
        import sys

        import torch

        try:
            import triton

            triton_version: str | None = triton.__version__
        except Exception:
            triton_version = None
        return {
            "torch": torch.__version__,
            "triton": triton_version,
            "python": sys.version.split()[0],
            "driver": None,
            "os": _pyplatform.platform(),
        }

    def datasheet(self, device_name: str) -> tuple[float | None, dict[str, float]]:
        return None, {}

    def free_memory(self, device: Any) -> int:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

    def device_memory(self, index: int) -> tuple[int, int] | None:
        """(free, total) bytes of device `index`, asked from the engine without initializing the
        device (the memory plan's input); None where unknown. The host's memory by default."""
        import os

        try:
            page = os.sysconf("SC_PAGE_SIZE")
            return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
        except (ValueError, OSError):
            return None

    def measure_profile(self, device: Any) -> HardwareProfile:
        """Measure memory bandwidth and GEMM rates with torch on `device`. The bandwidth is the faster
        of a copy (bytes read + written) and a sum (bytes read): a kernel that only reads can beat a
        copy's rate, and the roofline is a ceiling no honest kernel passes (`evaluate/scoring.py`)."""
        import torch

        timer = self.make_timer(device)
        copy_bytes = self._copy_size(device)
        src = torch.empty(copy_bytes // 4, dtype=torch.float32, device=device).uniform_()
        t_copy = _copy_time(timer, src)
        t_read = _median_time(timer, lambda src=src: [src.sum()], repeats=10)
        bandwidth = max(2 * copy_bytes / t_copy, copy_bytes / t_read)
        flops: dict[str, float] = {}
        n = self._gemm_size(device)
        for cls in FLOP_CLASSES:
            dtype = {
                "fp32": torch.float32,
                "tf32": torch.float32,
                "bf16": torch.bfloat16,
                "fp16": torch.float16,
            }[cls]
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)
            saved = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = cls == "tf32"
            try:
                t = _median_time(timer, lambda a=a, b=b: [a @ b], repeats=5)
                flops[cls] = 2 * n**3 / t
            except RuntimeError:
                pass  # a dtype the device's library cannot multiply
            finally:
                torch.backends.cuda.matmul.allow_tf32 = saved
        name = self.device_name(device)
        sheet_bw, sheet_flops = self.datasheet(name)
        return HardwareProfile(
            platform=self.name,
            target=self.target(device),
            device=name,
            bandwidth=bandwidth,
            flops=flops,
            datasheet_bandwidth=sheet_bw,
            datasheet_flops=sheet_flops,
            method=(
                f"the faster of a copy of {copy_bytes // 2**20} MiB (bytes read + written) and a sum of it "
                "(bytes read), medians of 10; "
                f"{n}x{n}x{n} GEMM per precision through torch, median of 5; timer {timer.name}"
            ),
            measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            versions=self.versions(),
        )

    def _copy_size(self, device: Any) -> int:
        return 1 << 30

    def _gemm_size(self, device: Any) -> int:
        return 8192


def _copy_time(timer: Any, src: Any) -> float:
    dst = src.clone()
    return _median_time(timer, lambda: [dst.copy_(src)], repeats=10)


def _median_time(timer: Any, fn: Any, repeats: int) -> float:
    fn()
    timer.sync()
    times = []
    for _ in range(repeats):
        t, _, _, _ = timer.time_call(fn, snapshot=False)
        times.append(t)
    return statistics.median(times)
