"""The roofline: the least time a spec's work can take on a device.

Bytes are the fewest a kernel must move through device memory: every input tensor read once, every
parameter and buffer read once, every output written once (plus, for a training op, the output
gradient read and the input and parameter gradients written). FLOPs are counted from the reference's
own ops by torch's FlopCounterMode (matrix products, convolutions, attention; elementwise work is not
counted, which only matters for ops that are memory-bound anyway). A shape may override both.

The bound is whichever of bytes/bandwidth and FLOPs/peak is larger; below 5 us the launch itself
dominates and the bound is "launch".
"""

from __future__ import annotations

from typing import Any

LAUNCH_FLOOR_S = 5e-6


def tensor_bytes(values: Any) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def count_flops(fn: Any) -> int:
    """FLOPs of the ops `fn()` dispatches (matmul-like ops only)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def flop_class(dtype: str | None, precision: str) -> str:
    if dtype in ("bfloat16", "torch.bfloat16"):
        return "bf16"
    if dtype in ("float16", "torch.float16"):
        return "fp16"
    return {"strict_fp32": "fp32", "tf32": "tf32", "low": "bf16"}[precision]


def ceiling_flops(flops: dict[str, float], cls: str) -> float | None:
    """The most FLOP/s an honest kernel of class `cls` can reach: strict fp32 may be computed as three
    TF32 products (3xTF32 keeps fp32 accuracy) and so reach a third of the TF32 rate, above fp32's."""
    peak = flops.get(cls)
    if cls == "fp32" and flops.get("tf32"):
        return max(peak or 0.0, flops["tf32"] / 3)
    return peak


def roofline(nbytes: float, flops: float, bandwidth: float, peak_flops: float | None) -> tuple[float, str]:
    """(least time in seconds, bound) for `nbytes` moved and `flops` done."""
    t_mem = nbytes / bandwidth
    t_compute = flops / peak_flops if peak_flops and flops else 0.0
    t = max(t_mem, t_compute)
    if t < LAUNCH_FLOOR_S:
        return t, "launch"
    return t, "compute" if t_compute > t_mem else "memory"
