"""Compare a candidate's output with the reference's: tolerance by dtype and precision policy.

A float output passes when all three hold:
- every element is finite (NaN and inf never pass);
- elementwise, |out - ref| <= atol * rms(ref) + rtol * |ref|: the absolute part is scaled by the
  reference's magnitude, so an output of magnitude 1e-4 gets an absolute tolerance of that order
  rather than a fixed 1e-2 that an all-zeros answer would pass;
- in norm, ||out - ref|| / ||ref|| <= rel_norm: this is what separates precisions. fp32 arithmetic in
  a different order lands around 1e-7..1e-5, TF32 around 3e-4, bf16 around 3e-3, so a strict-fp32
  spec (rel_norm 5e-5) refuses a candidate that computed in TF32 or bf16.
Integer and boolean outputs must match exactly. The policy `tf32` or `low` relaxes fp32 outputs to
those precisions; a spec's `tolerance` overrides all three numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    rel_norm: float


TOLERANCES = {
    "float64": Tolerance(1e-6, 1e-7, 1e-9),
    "fp32": Tolerance(1e-3, 1e-4, 5e-5),
    "tf32": Tolerance(1e-2, 5e-3, 1e-3),
    "float16": Tolerance(1e-2, 5e-3, 3e-3),
    "bfloat16": Tolerance(5e-2, 2e-2, 1.6e-2),
}


def tolerance_for(dtype: Any, policy: str, override: dict[str, float] | None = None) -> Tolerance:
    name = str(dtype).replace("torch.", "")
    if name == "float32":
        key = {"strict_fp32": "fp32", "tf32": "tf32", "low": "bfloat16"}[policy]
    else:
        key = name if name in TOLERANCES else "fp32"
    tol = TOLERANCES[key]
    if override:
        tol = Tolerance(
            override.get("rtol", tol.rtol),
            override.get("atol", tol.atol),
            override.get("rel_norm", tol.rel_norm),
        )
    return tol


@dataclass
class Comparison:
    passed: bool
    check: str | None = None  # the failed check's name
    message: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    rel_norm_err: float = 0.0


def compare(out: Any, ref: Any, tol: Tolerance, what: str = "output") -> Comparison:
    import torch

    if type(out) is not torch.Tensor:
        kind = "a tensor subclass" if isinstance(out, torch.Tensor) else type(out).__name__
        return Comparison(False, "output-type", f"{what} is {kind}; outputs must be plain torch.Tensor")
    if out.shape != ref.shape:
        return Comparison(
            False, "output-shape", f"{what} has shape {list(out.shape)}, expected {list(ref.shape)}"
        )
    if out.dtype != ref.dtype:
        return Comparison(False, "output-dtype", f"{what} has dtype {out.dtype}, expected {ref.dtype}")
    if out.device != ref.device:
        return Comparison(False, "output-device", f"{what} is on {out.device}, expected {ref.device}")
    if not (out.is_floating_point() or out.is_complex()):
        mismatches = int((out != ref).sum())
        if mismatches:
            return Comparison(
                False,
                "values",
                f"{what}: {mismatches} of {out.numel()} elements differ (exact match required)",
            )
        return Comparison(True)
    # Differences of two floats of one dtype are exact enough in that dtype (fp32 at least); only the
    # norms need a wider accumulator.
    work = torch.float64 if out.dtype == torch.float64 else torch.float32
    o = out.detach().to(work)
    r = ref.detach().to(work)
    if not bool(torch.isfinite(r).all()):  # every comparison with NaN is False: nothing would fail
        return Comparison(False, "reference-nan-inf", f"the reference's {what} has NaN/inf: it cannot judge")
    if not bool(torch.isfinite(o).all()):
        bad = int((~torch.isfinite(o)).sum())
        return Comparison(False, "nan-inf", f"{what} has {bad} NaN/inf elements of {o.numel()}")
    n = max(1, r.numel())
    ref_norm = float(torch.linalg.vector_norm(r, dtype=torch.float64))
    rms = ref_norm / math.sqrt(n)
    diff = (o - r).abs_()
    diff_norm = float(torch.linalg.vector_norm(diff, dtype=torch.float64))
    max_abs = float(diff.max()) if diff.numel() else 0.0
    ref_abs = r.abs()
    rel = torch.where(ref_abs > 1e-3 * rms, diff / ref_abs, torch.zeros((), dtype=work, device=r.device))
    max_rel = float(rel.max()) if rel.numel() else 0.0
    del rel
    rel_norm = diff_norm / ref_norm if ref_norm > 0 else diff_norm
    cmp = Comparison(True, max_abs_err=max_abs, max_rel_err=max_rel, rel_norm_err=rel_norm)
    over = diff > ref_abs.mul_(tol.rtol).add_(tol.atol * rms)
    n_over = int(over.sum())
    if n_over:
        cmp.passed, cmp.check = False, "values"
        cmp.message = (
            f"{what}: {n_over} of {o.numel()} elements outside atol={tol.atol:g}*rms + rtol={tol.rtol:g}*|ref| "
            f"(max abs err {max_abs:.3g}, max rel err {max_rel:.3g}, rel norm err {rel_norm:.3g})"
        )
    elif rel_norm > tol.rel_norm:
        cmp.passed, cmp.check = False, "precision"
        cmp.message = (
            f"{what}: relative norm error {rel_norm:.3g} exceeds {tol.rel_norm:g} "
            f"(max abs err {max_abs:.3g}); this is the signature of lower-precision arithmetic"
        )
    return cmp


def same_bits(a: Any, b: Any) -> bool:
    """Bitwise equality (NaN-safe) of two tensors of one shape and dtype, 0-dim ones (a mean loss)
    included."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():  # compared as bytes; reshape(-1) because a 0-dim tensor has no byte view
        return bool(
            torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))
        )
    return bool(torch.equal(a, b))
