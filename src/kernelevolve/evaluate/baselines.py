"""Eager and torch.compile as timed callees, and `kernelevolve baseline`: their times alone.

A callee runs its model (forward, and backward for a training spec) on its own persistent input
buffers, whose contents the timing loop overwrites each round (`timing.py`). The evaluation times the
candidate beside these same callees; `time_baselines` times them without a candidate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kernelevolve.evaluate.inputs import PROBE_SEED, conform, copy_into, make_inputs
from kernelevolve.evaluate.messages import BaselinesMsg
from kernelevolve.evaluate.prepared import Prepared, ShapeState, forward_backward, trainable_inputs
from kernelevolve.evaluate.protocol import Channel
from kernelevolve.evaluate.timing import Callee, TimingPlan, time_shape


def callee(
    name: str, model: Any, state: Prepared, st: ShapeState, buffers: list[Any] | None = None
) -> Callee:
    """`model` at shape `st`, timed on its own buffers (or on `buffers`, shared)."""
    import torch

    if buffers is None:
        buffers = trainable_inputs(
            make_inputs(state.spec, state.module, st.shape, PROBE_SEED, "spec", state.device),
            torch,
            state.spec.backward,
        )
    return Callee(name, lambda *xs: forward_backward(model, list(xs), st.grad_outputs, torch), buffers)


def baseline_callees(state: Prepared, st: ShapeState) -> list[Callee]:
    """Eager, and torch.compile where it compiled: trusted, so they share one set of input buffers
    (the candidate has its own), which keeps a large spec's timing at two copies of its inputs."""
    models = [("eager", st.reference)] + ([("compile", st.compiled)] if st.compiled is not None else [])
    first = callee(*models[0], state, st)
    return [first] + [callee(name, model, state, st, first.buffers) for name, model in models[1:]]


def time_baselines(state: Prepared, msg: BaselinesMsg, chan: Channel) -> list[dict[str, Any]]:
    """Eager and torch.compile times per shape, interleaved, for `kernelevolve baseline`."""
    import torch

    from kernelevolve.evaluate.lease import DeviceLease

    allow_graphs = state.device.type == "cuda" and not state.spec.backward
    plan = TimingPlan.from_settings(
        state.settings,
        allow_graphs,
        checked=False,
        warmup_s=state.platform.warmup_s,
        precision=state.platform.timing_precision,
    )
    chan.send("phase", phase="lease")
    out = []
    with DeviceLease(state.lease_key):
        chan.send("phase", phase="timing")
        for k, st in enumerate(state.shapes):
            callees = baseline_callees(state, st)

            def fresh(seed: int, st: ShapeState = st, like: list[Any] = callees[0].buffers) -> list[Any]:
                drawn = make_inputs(state.spec, state.module, st.shape, seed, "spec", state.device)
                return conform(drawn, like)  # a jagged spec's draws vary in size

            timing = time_shape(
                callees,
                state.timer,
                dataclasses.replace(plan, seed=5000 + k),
                fresh,
                copy_into,
                lambda pristine, snap: None,
                lambda buffers: [],
                torch,
                has_candidate=False,
            )
            stats = {name: vars(s) for name, s in timing.stats.items()}
            out.append({"shape": st.shape.name, "weight": st.shape.weight, "cuda_graphs": timing.cuda_graphs,
                        "flops": st.flops, "bytes": st.bytes, **stats})  # fmt: skip
    return out
