"""AMD GPUs (ROCm): Triton and HIP candidates, timed through torch's HIP-backed `torch.cuda` events.

Registered with its datasheets and kernel kinds; it has not been run by this project's CI or
benchmarks (no AMD device is available to us). Its workers use the CUDA timer, which torch maps to
HIP events on ROCm builds.
"""

from __future__ import annotations

from typing import Any, ClassVar

from kernelevolve.platforms.base import Platform
from kernelevolve.platforms.cuda import CudaPlatform

TB, TF = 1e12, 1e12
DATASHEETS: list[tuple[str, float, dict[str, float]]] = [
    ("MI325X", 6.0 * TB, {"fp32": 163.4 * TF, "tf32": 653.7 * TF, "bf16": 1307.4 * TF, "fp16": 1307.4 * TF}),
    ("MI300X", 5.3 * TB, {"fp32": 163.4 * TF, "tf32": 653.7 * TF, "bf16": 1307.4 * TF, "fp16": 1307.4 * TF}),
    ("MI250X", 3.2 * TB, {"fp32": 95.7 * TF, "bf16": 383 * TF, "fp16": 383 * TF}),
]


class RocmPlatform(CudaPlatform):
    name = "rocm"
    description = "AMD GPU (ROCm): Triton and HIP kernels; registered, not yet tested by this project"
    kinds = frozenset({"triton", "hip"})
    timed_kinds = frozenset({"triton", "hip"})
    dsls: ClassVar[list[str]] = ["triton", "hip-c++ (load_inline)"]

    def device_memory(self, index: int) -> tuple[int, int] | None:
        return None  # nvidia-smi does not see AMD GPUs: the memory plan leaves the settings as they are

    def present(self) -> tuple[bool, str]:
        try:
            import torch
        except ImportError:
            return False, "torch is not installed"
        if not getattr(torch.version, "hip", None):
            return False, "this torch is not a ROCm build"
        if not torch.cuda.is_available():
            return False, "no ROCm device visible to torch"
        return True, ""

    physical_lease_keys = False  # by index: nvidia-smi's UUIDs do not apply

    def lease_key(self, index: int) -> str:
        return Platform.lease_key(self, index)

    def target(self, device: Any) -> str:
        import torch

        arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "gfx?")
        return f"rocm:{arch.split(':')[0]}"

    def versions(self) -> dict[str, str | None]:
        import torch

        out = super(CudaPlatform, self).versions()
        out["hip"] = getattr(torch.version, "hip", None)
        return out

    def datasheet(self, device_name: str) -> tuple[float | None, dict[str, float]]:
        for key, bw, flops in DATASHEETS:
            if key in device_name:
                return bw, dict(flops)
        return None, {}
