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


# The draw whose sizes a shape is counted (FLOPs, bytes) and timed at: for a jagged spec every seed's
# sizes differ, and the roofline's bytes are those of the timed calls (`conform`).
PROBE_SEED = 7


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
    raw = list(raw)
    for i, x in enumerate(raw):
        raw[i] = None  # the original goes as soon as its scaled copy exists (a large input: twice the memory)
        if isinstance(x, torch.Tensor):
            x = x.to(device)
            if spec.dtype is not None and x.is_floating_point():
                x = x.to(getattr(torch, spec.dtype))
            if distribution == "scaled" and x.is_floating_point():
                # a new tensor, not in place: get_inputs may hand out one tensor twice
                x = x * math.exp(rng.uniform(math.log(lo), math.log(hi)))
        out.append(x)
    return out


CHUNK_ELEMENTS = 1 << 24  # work on large tensors in slabs of about this many elements


def slabs(t: Any, elements: int = CHUNK_ELEMENTS) -> Any:
    """Consecutive slabs of `t` along its first dimension (views), each about `elements` long: a
    reduction over a 6 GiB tensor never materializes a widened copy of the whole of it."""
    if t.dim() == 0 or t.numel() <= elements:
        yield t
        return
    rows = max(1, elements // max(1, t.numel() // t.shape[0]))
    for i in range(0, t.shape[0], rows):
        yield t[i : i + rows]


DIGEST_ELEMENTS = 1 << 22  # a digest's slabs: its float64 temporaries stay near 100 MiB
_WEIGHTS: dict[tuple[int, str], Any] = {}


def _weights(n: int, device: Any) -> Any:
    """Fixed pseudo-random float64 weights for a slab of `n` elements (made once per size and device)."""
    import torch

    key = (n, str(device))
    if key not in _WEIGHTS:
        if len(_WEIGHTS) > 8:
            _WEIGHTS.clear()
        gen = torch.Generator(device=device).manual_seed(0x5EED + n)
        _WEIGHTS[key] = torch.rand(n, dtype=torch.float64, device=device, generator=gen)
    return _WEIGHTS[key]


def digest(values: list[Any]) -> list[tuple[object, ...]]:
    """A fingerprint of tensor contents: shape, dtype, and in float64 the sum, the absolute sum and a
    sum weighted by position (fixed pseudo-random weights, so that a permutation of the values, a
    sort in place say, changes it too), accumulated slab by slab: a float64 copy of a large tensor is
    never made. Proves that regenerated inputs are the ones the reference saw, and that large inputs
    and outputs did not change where a whole copy would cost too much memory."""
    import torch

    out: list[tuple[object, ...]] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            sums = [0.0, 0.0, 0.0]
            for slab in slabs(v.detach(), DIGEST_ELEMENTS):
                d = (torch.view_as_real(slab) if slab.is_complex() else slab).to(torch.float64).reshape(-1)
                sums[0] += float(d.sum())
                sums[1] += float(d.abs().sum())  # not in place: a float64 input's slab is itself
                sums[2] += float(torch.dot(d, _weights(d.numel(), d.device)))
            out.append((tuple(v.shape), str(v.dtype), *sums))
        else:
            out.append((repr(v),))
    return out


def conform(values: list[Any], like: list[Any]) -> list[Any]:
    """A fresh draw in the sizes of `like`, the buffers it will be copied into. A jagged spec's draws
    differ in size from seed to seed (lengths drawn at random, values sized by their sum); a timed
    round still needs new contents at the same addresses. So where any size differs, every integer
    tensor (the structure: lengths, offsets, indices, even those whose size did not change) keeps
    `like`'s values, consistent with the sizes of the rest, and every floating one is `like`'s shape
    filled with the draw's own values (cut, or repeated where the draw is shorter): new contents every
    round, from the spec's own distribution."""
    import torch

    pairs = list(zip(values, like, strict=True))
    tensors = [(v, r) for v, r in pairs if isinstance(v, torch.Tensor) and isinstance(r, torch.Tensor)]
    if all(v.shape == r.shape for v, r in tensors):
        return list(values)
    out = []
    for v, ref in pairs:
        if isinstance(v, torch.Tensor) and isinstance(ref, torch.Tensor) and v.shape != ref.shape:
            if v.is_floating_point() and v.numel() > 0 and ref.numel() > 0:
                flat = v.detach().reshape(-1)
                times = -(-ref.numel() // flat.numel())
                v = (flat.repeat(times) if times > 1 else flat)[: ref.numel()].reshape(ref.shape)
            else:
                v = ref.detach().clone()
        elif isinstance(v, torch.Tensor) and isinstance(ref, torch.Tensor) and not v.is_floating_point():
            v = ref.detach().clone()  # the structure: `like`'s, consistent with the sizes kept
        out.append(v)
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


def footprint_need(spec: Spec, device: str) -> int:
    """Bytes a worker needs for the spec's largest shape: its inputs, outputs and parameters,
    `memory.factor` times over (0 where the shapes' tensors are not known)."""
    from kernelevolve.evaluate.memory import factor

    times = factor("cpu" if str(device).startswith("cpu") else "cuda")
    return max((times * (spec.footprint_bytes(s.name) or 0) for s in spec.shapes), default=0)


def check_footprint(spec: Spec, free_bytes: int, device: str) -> None:
    """Refuse shapes this worker cannot hold: inputs, outputs and parameters, about
    `memory.factor` times over (see `evaluate/memory.py`, whose plan the engine made before
    the worker started; this is the worker's own check against what it was given)."""
    from kernelevolve.evaluate.memory import factor

    times = factor("cpu" if str(device).startswith("cpu") else "cuda")
    for shape in spec.shapes:
        need = spec.footprint_bytes(shape.name)
        if need is not None and times * need > free_bytes:
            raise SpecError(
                f"{spec.path}: shape {shape.name!r} needs about {times * need / 2**30:.1f} GiB on "
                f"{device} (inputs, outputs and parameters: {need / 2**30:.2f} GiB, held about "
                f"{times} times over); this worker has {free_bytes / 2**30:.1f} GiB",
                hint="use smaller shapes in KERNELEVOLVE['shapes'], fewer workers, or a device with more memory",
            )
