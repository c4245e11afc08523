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

An ill-conditioned output is judged no stricter than torch.compile would be. Before any candidate
exists, the worker measures how far the compiled reference's output is from eager's on the probe
inputs (`reference_noise`: ||compiled - eager|| / ||eager||, per output); where that is 1e-3 or more
(`NOISE_ILL`), `widened` raises atol and rel_norm to `NOISE_FACTOR` (10) times it for that output. An
fp32 output that is all rounding (level 2's 23_Conv3d_GroupNorm_Mean: the mean of a group-normalized
tensor, 0 in exact arithmetic, |ref| about 3e-8) has a noise near 1, and a correct kernel passes it
while a value off by far more than the rounding still fails; an output of a well-conditioned op has
a noise near 1e-7 and is judged as before (a TF32 or bf16 kernel is still refused there). A reference
that does not give the same bits twice (dropout in training mode draws other masks in eager and in
torch.compile) is not measured: its distance is no rounding, and its tolerance stays as it is.
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


# An output at least this far from itself under another rounding (`reference_noise`) is ill-conditioned:
# no well-conditioned op comes near it in fp32 (its noise is about 1e-7), so a lower precision is still
# told apart elsewhere. Such an output may be `NOISE_FACTOR` times its noise from the reference.
NOISE_ILL = 1e-3
NOISE_FACTOR = 10.0
# Outputs whose reference noise is measured: up to this many bytes in all (two copies are held).
NOISE_MAX_BYTES = 256 * 2**20


def reference_noise(eager: list[Any], compiled: list[Any]) -> list[float]:
    """Per output, ||compiled - eager|| / ||eager|| (at most 1; 0 for an exact output, an integer
    one, or an eager output of norm 0, whose tolerance stays as it is)."""
    import torch

    out: list[float] = []
    for e, c in zip(eager, compiled, strict=True):
        if not (isinstance(e, torch.Tensor) and isinstance(c, torch.Tensor)) or not e.is_floating_point():
            out.append(0.0)
            continue
        norm = float(torch.linalg.vector_norm(e.detach(), dtype=torch.float64))
        if e.shape != c.shape or norm == 0.0 or not math.isfinite(norm):
            out.append(0.0)
            continue
        diff = e.detach().double() - c.detach().to(e.device, torch.float64)
        out.append(min(1.0, float(torch.linalg.vector_norm(diff)) / norm))
    return out


def widened(tol: Tolerance, noise: float | None) -> Tolerance:
    """`tol` for an output whose reference noise is `noise`: where that is ill-conditioned (at least
    `NOISE_ILL`), atol (relative to the reference's rms) and rel_norm at least `NOISE_FACTOR` times
    it; else `tol` as it is."""
    if noise is None or noise < NOISE_ILL:
        return tol
    floor = NOISE_FACTOR * noise
    return Tolerance(tol.rtol, max(tol.atol, floor), max(tol.rel_norm, floor))


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
class Sampled:
    """A large reference output kept as a sample: its values at `indices` (flat positions drawn at
    random before any candidate exists), with the whole tensor's L2 norm. Trials beyond the first of
    each distribution keep this instead of the whole output where the outputs are large: judged on
    millions of positions it cannot know in advance, a wrong answer still fails, and the norm error is
    estimated from the sample. `shape` and `dtype` stand for the output's."""

    shape: tuple[int, ...]
    dtype: Any
    device: Any
    indices: Any  # int64, on `device`
    values: Any  # the reference's values there, on `device`
    norm: float

    @classmethod
    def of(cls, ref: Any, k: int, generator: Any) -> Sampled:
        import torch

        from kernelevolve.evaluate.inputs import slabs

        flat = ref.detach().reshape(-1)
        idx = torch.randint(0, max(1, flat.numel()), (min(k, flat.numel()),), generator=generator)
        idx = idx.to(ref.device)
        norm = math.sqrt(
            sum(float(torch.linalg.vector_norm(s, dtype=torch.float64)) ** 2 for s in slabs(ref))
        )
        return cls(tuple(ref.shape), ref.dtype, ref.device, idx, flat[idx], norm)  # a gather: a copy

    def is_floating_point(self) -> bool:
        return bool(self.dtype.is_floating_point)


@dataclass
class Comparison:
    passed: bool
    check: str | None = None  # the failed check's name
    message: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    rel_norm_err: float = 0.0


def compare(out: Any, ref: Any, tol: Tolerance, what: str = "output", device: Any = None) -> Comparison:
    """Judge `out` against `ref`. `ref` may be held elsewhere (the host, for a large output): `device`
    is then where `out` must be. Large tensors are compared slab by slab (`inputs.slabs`), so the
    comparison's temporaries stay bounded whatever the output's size."""
    import torch

    from kernelevolve.evaluate.inputs import slabs

    if type(out) is not torch.Tensor:
        kind = "a tensor subclass" if isinstance(out, torch.Tensor) else type(out).__name__
        return Comparison(False, "output-type", f"{what} is {kind}; outputs must be plain torch.Tensor")
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(
            False, "output-shape", f"{what} has shape {list(out.shape)}, expected {list(ref.shape)}"
        )
    if out.dtype != ref.dtype:
        return Comparison(False, "output-dtype", f"{what} has dtype {out.dtype}, expected {ref.dtype}")
    expected = torch.device(device) if device is not None else ref.device
    if out.device != expected:
        return Comparison(False, "output-device", f"{what} is on {out.device}, expected {expected}")
    if isinstance(ref, Sampled):
        return _compare_sampled(out, ref, tol, what)
    pairs = list(zip(slabs(out.detach()), slabs(ref.detach()), strict=True))
    if not (out.is_floating_point() or out.is_complex()):
        mismatches = sum(int((o != r.to(o.device)).sum()) for o, r in pairs)
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
    ref_sq = 0.0
    for _, r_slab in pairs:
        r = r_slab.to(out.device, work)
        if not bool(torch.isfinite(r).all()):  # every comparison with NaN is False: nothing would fail
            return Comparison(
                False, "reference-nan-inf", f"the reference's {what} has NaN/inf: it cannot judge"
            )
        ref_sq += float(torch.linalg.vector_norm(r, dtype=torch.float64)) ** 2
    n = max(1, ref.numel())
    ref_norm = math.sqrt(ref_sq)
    rms = ref_norm / math.sqrt(n)
    bad = n_over = 0
    diff_sq = max_abs = max_rel = 0.0
    for o_slab, r_slab in pairs:
        o, r = o_slab.to(work), r_slab.to(out.device, work)
        finite = torch.isfinite(o)
        bad += int((~finite).sum())
        if bad:
            continue  # counted; the values are judged only where every element is finite
        diff = (o - r).abs_()
        diff_sq += float(torch.linalg.vector_norm(diff, dtype=torch.float64)) ** 2
        max_abs = max(max_abs, float(diff.max()) if diff.numel() else 0.0)
        ref_abs = r.abs()
        rel = torch.where(ref_abs > 1e-3 * rms, diff / ref_abs, torch.zeros((), dtype=work, device=r.device))
        max_rel = max(max_rel, float(rel.max()) if rel.numel() else 0.0)
        del rel
        n_over += int((diff > ref_abs.mul_(tol.rtol).add_(tol.atol * rms)).sum())
    if bad:
        return Comparison(False, "nan-inf", f"{what} has {bad} NaN/inf elements of {out.numel()}")
    diff_norm = math.sqrt(diff_sq)
    rel_norm = diff_norm / ref_norm if ref_norm > 0 else diff_norm
    return _judged(what, tol, n_over, f"{out.numel()} elements", max_abs, max_rel, rel_norm, "")


def _judged(
    what: str,
    tol: Tolerance,
    n_over: int,
    of: str,
    max_abs: float,
    max_rel: float,
    rel_norm: float,
    about: str,
) -> Comparison:
    """The verdict on the measured errors: elements outside the tolerance fail as `values`, a norm
    error above it as `precision`. `of` names what was judged (all elements, or a sample), `about`
    qualifies an estimated norm error."""
    cmp = Comparison(True, max_abs_err=max_abs, max_rel_err=max_rel, rel_norm_err=rel_norm)
    if n_over:
        cmp.passed, cmp.check = False, "values"
        cmp.message = (
            f"{what}: {n_over} of {of} outside atol={tol.atol:g}*rms + rtol={tol.rtol:g}*|ref| "
            f"(max abs err {max_abs:.3g}, max rel err {max_rel:.3g}, rel norm err {about}{rel_norm:.3g})"
        )
    elif rel_norm > tol.rel_norm:
        cmp.passed, cmp.check = False, "precision"
        cmp.message = (
            f"{what}: relative norm error {about}{rel_norm:.3g} exceeds {tol.rel_norm:g} "
            f"(max abs err {max_abs:.3g}); this is the signature of lower-precision arithmetic"
        )
    return cmp


def _compare_sampled(out: Any, ref: Sampled, tol: Tolerance, what: str) -> Comparison:
    """`compare` against a sampled reference: the same checks at the sampled positions, the whole
    output checked for NaN/inf, and the norm error estimated from the sample."""
    import torch

    from kernelevolve.evaluate.inputs import slabs

    bad = sum(int((~torch.isfinite(s)).sum()) for s in slabs(out.detach())) if out.is_floating_point() else 0
    if bad:
        return Comparison(False, "nan-inf", f"{what} has {bad} NaN/inf elements of {out.numel()}")
    flat = out.detach().reshape(-1)
    o, r = flat[ref.indices], ref.values
    k = max(1, r.numel())
    if not ref.is_floating_point():
        mismatches = int((o != r).sum())
        if mismatches:
            return Comparison(
                False, "values", f"{what}: {mismatches} of {k} sampled elements differ (exact match required)"
            )
        return Comparison(True)
    work = torch.float64 if out.dtype == torch.float64 else torch.float32
    o, r = o.to(work), r.to(work)
    rms = ref.norm / math.sqrt(max(1, out.numel()))
    diff = (o - r).abs_()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    ref_abs = r.abs()
    rel = torch.where(ref_abs > 1e-3 * rms, diff / ref_abs, torch.zeros((), dtype=work, device=r.device))
    max_rel = float(rel.max()) if rel.numel() else 0.0
    # ||out - ref|| estimated from the sample: its mean square, over every element
    diff_norm = math.sqrt(float(torch.linalg.vector_norm(diff, dtype=torch.float64)) ** 2 * out.numel() / k)
    rel_norm = diff_norm / ref.norm if ref.norm > 0 else diff_norm
    n_over = int((diff > ref_abs.mul_(tol.rtol).add_(tol.atol * rms)).sum())
    return _judged(
        what, tol, n_over, f"{k} sampled elements", max_abs, max_rel, rel_norm, f"about (from {k} samples) "
    )


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
