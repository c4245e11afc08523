"""NVIDIA GPUs: Triton and CUDA C++ candidates, timed with CUDA events.

Precision policies map to torch's global flags, set once per worker before anything runs:
`strict_fp32` turns TF32 off for matmuls and cuDNN (and matmul precision "highest"), `tf32` and `low`
turn it on. Baselines therefore run under the same policy the candidate is checked against.

Datasheet values (dense, no sparsity) are leads for the roofline check; the measured profile is what
fractions of roofline are reported against.
"""

from __future__ import annotations

import functools
import os
import subprocess
from typing import Any, ClassVar

from kernelevolve.platforms.base import Platform

TB, TF = 1e12, 1e12
# substring of torch's device name -> (bandwidth B/s, {class: FLOP/s}); first match wins.
DATASHEETS: list[tuple[str, float, dict[str, float]]] = [
    ("H200", 4.8 * TB, {"fp32": 67 * TF, "tf32": 494.7 * TF, "bf16": 989.4 * TF, "fp16": 989.4 * TF}),
    ("H100 NVL", 3.9 * TB, {"fp32": 60 * TF, "tf32": 417.5 * TF, "bf16": 835.5 * TF, "fp16": 835.5 * TF}),
    ("H100 PCIe", 2.0 * TB, {"fp32": 51.2 * TF, "tf32": 378 * TF, "bf16": 756 * TF, "fp16": 756 * TF}),
    ("H100", 3.35 * TB, {"fp32": 67 * TF, "tf32": 494.7 * TF, "bf16": 989.4 * TF, "fp16": 989.4 * TF}),
    ("A100-SXM4-40GB", 1.555 * TB, {"fp32": 19.5 * TF, "tf32": 156 * TF, "bf16": 312 * TF, "fp16": 312 * TF}),
    ("A100 80GB PCIe", 1.935 * TB, {"fp32": 19.5 * TF, "tf32": 156 * TF, "bf16": 312 * TF, "fp16": 312 * TF}),
    ("A100", 2.039 * TB, {"fp32": 19.5 * TF, "tf32": 156 * TF, "bf16": 312 * TF, "fp16": 312 * TF}),
    ("L40S", 0.864 * TB, {"fp32": 91.6 * TF, "tf32": 183 * TF, "bf16": 362 * TF, "fp16": 362 * TF}),
    ("L4", 0.3 * TB, {"fp32": 30.3 * TF, "tf32": 60 * TF, "bf16": 121 * TF, "fp16": 121 * TF}),
]


def cuda_datasheet(device_name: str) -> tuple[float | None, dict[str, float]]:
    for key, bw, flops in DATASHEETS:
        if key in device_name:
            return bw, dict(flops)
    return None, {}


class CudaPlatform(Platform):
    name = "cuda"
    description = "NVIDIA GPU: Triton and CUDA C++ kernels, CUDA-event timing, ncu where present"
    kinds = frozenset({"triton", "cuda"})
    timed_kinds = frozenset({"triton", "cuda"})
    dsls: ClassVar[list[str]] = ["triton", "cuda-c++ (kernelevolve.native.compile_cuda, load_inline)"]

    def present(self) -> tuple[bool, str]:
        try:
            import torch
        except ImportError:
            return False, "torch is not installed"
        if getattr(torch.version, "hip", None):
            return False, "this torch is a ROCm build"
        if not torch.cuda.is_available():
            return False, "no CUDA device visible to torch"
        return True, ""

    def device_string(self, index: int) -> str:
        return f"cuda:{index}"

    def device_count(self) -> int:
        import torch

        # NVML-based in recent torch: no CUDA context in the engine's process
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0

    def setup(self, device: Any, precision: str) -> None:
        import torch

        torch.cuda.set_device(device)
        tf32 = precision != "strict_fp32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")

    def device_name(self, device: Any) -> str:
        import torch

        return torch.cuda.get_device_name(device)

    def target(self, device: Any) -> str:
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda:sm{major}{minor}"

    def make_timer(self, device: Any) -> Any:
        import torch

        from kernelevolve.platforms.timers import CudaTimer

        props = torch.cuda.get_device_properties(device)
        return CudaTimer(device, int(getattr(props, "L2_cache_size", 50 * 2**20)), int(props.total_memory))

    def free_memory(self, device: Any) -> int:
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free)

    def device_memory(self, index: int) -> tuple[int, int] | None:
        """(free, total) from nvidia-smi: no CUDA context in the engine's process."""
        which = gpu_uuid(index, os.environ.get("CUDA_VISIBLE_DEVICES")) or str(index)
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits", "-i", which],
                capture_output=True, text=True, timeout=10, check=True,
            )  # fmt: skip
            free, total = (int(x.strip()) * 2**20 for x in out.stdout.strip().splitlines()[0].split(","))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None
        return free, total

    physical_lease_keys = True

    def lease_key(self, index: int) -> str:
        """Named after the GPU's UUID: processes with different CUDA_VISIBLE_DEVICES (a Ray actor
        sees its GPU as device 0) still agree on which lease is which GPU's."""
        uuid = gpu_uuid(index, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return f"{self.name}-{uuid}" if uuid else super().lease_key(index)

    def identity(self, index: int) -> dict[str, str | None]:
        out = super().identity(index)
        out["device"], out["driver"] = _nvml_identity(index)
        return out

    def versions(self) -> dict[str, str | None]:
        import torch

        out = super().versions()
        out["cuda"] = torch.version.cuda
        out["driver"] = _driver_version()
        return out

    def datasheet(self, device_name: str) -> tuple[float | None, dict[str, float]]:
        return cuda_datasheet(device_name)


@functools.lru_cache(maxsize=64)
def gpu_uuid(index: int, visible: str | None) -> str | None:
    """The UUID of visible device `index` (`visible`: CUDA_VISIBLE_DEVICES), or None if unknown.

    An entry of CUDA_VISIBLE_DEVICES that is a UUID already ("GPU-...", "MIG-...") is taken as it is;
    a physical index is looked up with nvidia-smi, which numbers GPUs physically (no CUDA context)."""
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible is not None else None
    if entries is not None and index >= len(entries):
        return None
    physical = entries[index] if entries is not None else str(index)
    if physical.startswith(("GPU-", "MIG-")):
        return physical
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", physical],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    first = (out.stdout.strip().splitlines() or [""])[0].strip()
    return first if first.startswith(("GPU-", "MIG-")) else None


@functools.cache
def _nvml_identity(index: int) -> tuple[str | None, str | None]:
    """(device name, driver) without creating a CUDA context in the engine's process. Asked once per
    device and process: a run's set-up keys its hardware profile and its compile cache by it."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", str(index)],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
        name, driver = (part.strip() for part in out.stdout.strip().splitlines()[0].split(","))
        return name, driver
    except Exception:
        import torch

        return torch.cuda.get_device_name(index), None


def _driver_version() -> str | None:
    """The NVIDIA driver's version: through NVML where the `nvml` extra (nvidia-ml-py, imported as
    pynvml) is installed, else from nvidia-smi."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
        return out.stdout.strip().splitlines()[0]
    except Exception:
        return None
