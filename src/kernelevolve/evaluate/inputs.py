"""Inputs and models for one spec on one device, built the same way for the reference and candidate.

Correctness trials draw inputs from two distributions:
- `spec`: `get_inputs(**params)` as written, under a trial's seed;
- `scaled`: the same, with every floating-point tensor multiplied by a factor drawn log-uniformly
  from the spec's `scaled_range` (default 1/4 to 4): other magnitudes, same signs and order, so
  constraints such as sorted boundaries or positive scales still hold.
Inputs are generated on the device itself (`get_inputs` runs under `torch.device(...)`), which is what
makes fresh inputs for every timed call affordable. Integer tensors (indices, offsets) change with the
seed only.

Models: the reference and the candidate are constructed under the same seed, and the reference's
parameters are copied into the candidate whenever their names and shapes match, so both compute
with the same weights.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kernelevolve.errors import SpecError
from kernelevolve.spec import ShapeSpec, Spec, call_get_init_inputs, call_get_inputs

DISTRIBUTIONS = ("spec", "scaled")


@dataclass(frozen=True)
class Case:
    """One correctness trial: a shape, a seed, a distribution."""

    shape: str
    seed: int
    distribution: str


def correctness_cases(spec: Spec, seeds: int) -> list[Case]:
    return [
        Case(shape.name, 1000 + 17 * i + 1, dist)
        for shape in spec.shapes
        for i in range(seeds)
        for dist in DISTRIBUTIONS
    ]


def make_inputs(
    spec: Spec, module: ModuleType, shape: ShapeSpec, seed: int, distribution: str, device: Any
) -> list[Any]:
    """Fresh inputs on `device`: deterministic in (seed, distribution), different across seeds."""
    import torch

    torch.manual_seed(seed)
    with torch.device(device):
        raw = call_get_inputs(spec, module, shape)
    rng = random.Random(seed * 7919 + 13)
    lo, hi = spec.scaled_range
    out: list[Any] = []
    for x in raw:
        if isinstance(x, torch.Tensor):
            x = x.to(device)
            if spec.dtype is not None and x.is_floating_point():
                x = x.to(getattr(torch, spec.dtype))
            if distribution == "scaled" and x.is_floating_point():
                x = x * math.exp(rng.uniform(math.log(lo), math.log(hi)))
        out.append(x)
    return out


def digest(values: list[Any]) -> list[tuple[object, ...]]:
    """A cheap fingerprint of tensor contents, to prove regenerated inputs are the ones the reference saw."""
    import torch

    out: list[tuple[object, ...]] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            d = v.detach().double()
            out.append((tuple(v.shape), str(v.dtype), float(d.sum()), float(d.abs().sum())))
        else:
            out.append((repr(v),))
    return out


def copy_into(dst: list[Any], src: list[Any]) -> None:
    """Overwrite persistent input buffers in place (their addresses do not change)."""
    import torch

    for d, s in zip(dst, src, strict=True):
        if isinstance(d, torch.Tensor):
            with torch.no_grad():
                d.copy_(s)


def make_model(
    spec: Spec, module: ModuleType, cls: type, shape: ShapeSpec, device: Any, seed: int = 42
) -> Any:
    """Construct `cls(*get_init_inputs())` on the device, with the spec's dtype."""
    import torch

    init = call_get_init_inputs(spec, module, shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(*init)
    model = model.to(device)
    if spec.dtype is not None:
        model = model.to(getattr(torch, spec.dtype))
    return model


def share_weights(reference: Any, candidate: Any) -> bool:
    """Copy the reference's parameters and buffers into the candidate where names and shapes match."""
    import torch

    ref_state = reference.state_dict()
    cand_state = candidate.state_dict()
    if not ref_state or set(ref_state) != set(cand_state):
        return False
    if any(ref_state[k].shape != cand_state[k].shape for k in ref_state):
        return False
    with torch.no_grad():
        candidate.load_state_dict(ref_state)
    return True


def check_footprint(spec: Spec, free_bytes: int, device: str) -> None:
    """Refuse shapes that cannot fit: inputs, outputs and parameters, about four times over
    (reference outputs, candidate outputs, pristine clones, baselines)."""
    for shape in spec.shapes:
        need = spec.footprint_bytes(shape.name)
        if need is not None and 4 * need > free_bytes:
            raise SpecError(
                f"{spec.path}: shape {shape.name!r} needs about {4 * need / 2**30:.1f} GiB on {device} "
                f"(inputs, outputs and parameters: {need / 2**30:.2f} GiB, held about four times over); "
                f"{free_bytes / 2**30:.1f} GiB are free",
                hint="use smaller shapes in KERNELEVOLVE['shapes'] or a device with more memory",
            )
