"""What a prepared worker holds, and the calls every phase of an evaluation shares: the contract
between the worker process (`worker.py`, which fills it before any candidate exists) and what runs in
it (`evaluation.py` for a candidate, `baselines.py` for the baselines alone).

- `Prepared`: the platform, device and settings (`messages.WorkerSettings`), the spec and its
  module, per shape the reference, the torch.compile baseline, the reference's outputs for every
  correctness trial (`ShapeState`, `CaseState`), the launch counter and the timer.
- `forward_backward`, `trainable_inputs`: one call of a model the way every phase calls it (forward,
  and for training specs the gradients, in a fixed order).
- `memory_mark`, `memory_peak`, `peak_memory`: the peak of memory a piece of work needed (the device
  allocator's on a GPU, the process's resident size on the CPU).
- `measure_noise`: how far torch.compile's outputs are from eager's, for the tolerance of an
  ill-conditioned output (`correctness.widened`), measured while the worker prepares.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelevolve.evaluate.messages import WorkerSettings


@dataclass
class CaseState:
    case: Any  # inputs.Case
    digest: list[Any]
    ref_outputs: list[Any]


@dataclass
class ShapeState:
    shape: Any  # spec.ShapeSpec
    reference: Any
    compiled: Any = None
    grad_outputs: list[Any] | None = None
    cases: list[CaseState] = field(default_factory=list)
    flops: int = 0
    bytes: int = 0
    # per output (and gradient): torch.compile's distance from eager on the probe inputs, relative
    # (`correctness.reference_noise`); None where it was not measured
    noise: list[float] | None = None


@dataclass
class Prepared:
    platform: Any
    device: Any
    settings: WorkerSettings
    notes: list[str]
    info: dict[str, Any]
    spec: Any = None
    module: Any = None
    shapes: list[ShapeState] = field(default_factory=list)
    baseline_errors: dict[str, str] = field(default_factory=dict)
    launches: Any = None
    timer: Any = None
    lease_key: str = ""  # the device lease's name (`Platform.lease_key`), given by the engine
    steps: dict[str, float] = field(default_factory=dict)  # seconds per start-up step (info["prepare_steps"])
    shared: str | None = None  # the file of reference outputs this worker wrote for its pool (`references`)


def flatten(out: Any) -> list[Any]:
    return list(out) if isinstance(out, list | tuple) else [out]


def forward_backward(
    model: Any,
    inputs: list[Any],
    grad_outputs: list[Any] | None,
    torch: Any,
    around_forward: Any = None,
    around_backward: Any = None,
) -> list[Any]:
    """Outputs of `model(*inputs)`, followed (for training specs) by gradients of the floating inputs
    and of the parameters, in a fixed order, for the given output gradients. `around_forward` and
    `around_backward` are context managers wrapped around each half (the runtime op recorders)."""
    fwd = around_forward if around_forward is not None else contextlib.nullcontext()
    bwd = around_backward if around_backward is not None else contextlib.nullcontext()
    if grad_outputs is None:
        with torch.no_grad(), fwd:
            return flatten(model(*inputs))
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    params = [p for _, p in sorted(model.named_parameters()) if p.requires_grad]
    with fwd:
        outs = flatten(model(*inputs))
    diff = [(o, g) for o, g in zip(outs, grad_outputs, strict=True) if o.requires_grad]
    with bwd:
        grads = torch.autograd.grad(
            [o for o, _ in diff], leaves + params, [g for _, g in diff], allow_unused=True
        )
    result = [o.detach() for o in outs]
    for g, t in zip(grads, leaves + params, strict=True):
        result.append(torch.zeros_like(t) if g is None else g)
    return result


def trainable_inputs(values: list[Any], torch: Any, backward: bool) -> list[Any]:
    if not backward:
        return values
    return [
        v.detach().requires_grad_(True) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for v in values
    ]


def memory_mark(state: Prepared, torch: Any) -> int:
    """Where a peak of memory is measured from: the device allocator's peak reset (a GPU), or the
    process's resident size now (the CPU, whose peak since then `memory_peak` reads)."""
    if state.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(state.device)
        return int(torch.cuda.memory_allocated(state.device))
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def memory_peak(state: Prepared, torch: Any, start: int) -> int:
    """Bytes the work since `memory_mark` needed at its peak, beyond what was held before."""
    return max(0, (peak_memory(state) or 0) - start)


def peak_memory(state: Prepared) -> int | None:
    """The peak so far (since the last `memory_mark` on a GPU): allocated device memory on a GPU, the
    process's resident size on the CPU."""
    try:
        if state.device.type == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated(state.device))
        return _resident_peak()
    except Exception:
        return None


def _resident_peak() -> int:
    """The process's own resident high-water mark (VmHWM). Not getrusage's ru_maxrss: a process
    started by vfork and exec (Python's subprocess, where it can) carries its parent's peak there, so
    a worker spawned by an engine that once held 6 GiB reported 6 GiB of its own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def measure_noise(state: Prepared, st: ShapeState, probe: list[Any], torch: Any) -> None:
    """How far torch.compile's outputs on the probe are from eager's (`correctness.reference_noise`),
    measured before any candidate exists (under the device's lease, as the reference's outputs are),
    and noted where an output is ill-conditioned (`NOISE_ILL`). Only for a reference that gives the
    same bits twice: a random one (dropout in training mode) or a nondeterministic one differs from
    its compiled form by more than rounding, and its tolerance stays as it is. Not for outputs above
    `NOISE_MAX_BYTES` in all (three copies are held)."""
    from kernelevolve.evaluate.correctness import (
        NOISE_FACTOR,
        NOISE_ILL,
        NOISE_MAX_BYTES,
        reference_noise,
        same_bits,
    )

    spec, name = state.spec, st.shape.name  # a training spec's outputs are its gradients too
    size = spec.footprint_bytes(name) if spec.backward else spec.output_bytes(name)
    if size is None or size > NOISE_MAX_BYTES:
        return  # not counted by the meta probe, or too large

    def run(model: Any) -> list[Any]:
        inputs = trainable_inputs(probe, torch, st.grad_outputs is not None)
        return forward_backward(model, inputs, st.grad_outputs, torch)

    try:
        first, again, compiled = run(st.reference), run(st.reference), run(st.compiled)
    except Exception as exc:  # out of memory, say: the tolerances stay as they are
        state.notes.append(f"shape {name}: the reference's noise was not measured ({type(exc).__name__})")
        return
    tensors = [(a, b) for a, b in zip(first, again, strict=True) if isinstance(a, torch.Tensor)]
    if not all(same_bits(a, b) for a, b in tensors):
        return
    st.noise = reference_noise(first, compiled)
    for j, noise in enumerate(st.noise):
        if noise >= NOISE_ILL:
            state.notes.append(
                f"shape {name}, output {j}: torch.compile's is {noise:.2g} (relative norm) from "
                f"eager's on the probe inputs, an ill-conditioned output; it is judged within "
                f"{NOISE_FACTOR:g}x that"
            )
