"""The correctness trials of one candidate, and the same checks on the calls that timing makes.

`correctness` runs every shape x seed x distribution (the cases `worker.py` computed the reference's
outputs for, before the candidate was imported). One trial:
1. regenerate the case's inputs and check them against the reference's (same digest: nobody has
   touched the random state); after the first trial of a shape, refill the first trial's buffers in
   place with them (same addresses, new contents: a result cached by address is stale);
2. keep what proves the inputs unchanged (copies, or digests of large ones: `_keepsake`), poison the
   allocator (blocks of the outputs' sizes filled with NaN and freed), and call the candidate under
   the op recorders, to the end of its device work;
3. refuse forbidden ops, processes or threads alive after the return, writes to the outputs that land
   after it (first trial), and modified inputs; then compare the outputs to the reference's
   (`correctness.compare`, tolerance by dtype and precision policy, widened for an output whose
   reference is ill-conditioned: `correctness.widened`).
A candidate whose trials launched no kernel of its own fails too (a load_inline one is profiled).

For timing (`evaluation.py`), `check_timed` compares a timed call's output with the reference on a
pristine copy of its inputs, and `audit` repeats the op and launch checks on a timed call.

Deliberately not here: the tolerances and the comparison itself (`correctness.py`), what the
recorders and the integrity check see (`runtime.py`), the order of the phases (`evaluation.py`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from kernelevolve.evaluate.candidate import Candidate, Failed, classify
from kernelevolve.evaluate.correctness import Tolerance, compare, same_bits, tolerance_for, widened
from kernelevolve.evaluate.inputs import digest as input_digest
from kernelevolve.evaluate.inputs import make_inputs
from kernelevolve.evaluate.prepared import CaseState, ShapeState, forward_backward, trainable_inputs
from kernelevolve.evaluate.references import on_device
from kernelevolve.evaluate.runtime import Threads, new_threads, python_threads
from kernelevolve.evaluate.timing import LARGE_OUTPUT_BYTES
from kernelevolve.evaluate.verdict import Method, ShapeResult, Status, Verdict, Violation


def correctness(cand: Candidate, shapes: list[ShapeState], verdict: Verdict) -> dict[str, Tolerance]:
    """The `correctness` phase: every trial at every shape, each shape's result appended to the
    verdict as it starts. Returns the tolerance per shape name (timing checks its calls with it);
    raises `Failed` at the first trial that fails."""
    threads_before = python_threads()
    total_launches = 0
    tolerances: dict[str, Tolerance] = {}
    for st in shapes:
        tol = tolerance_for(st.cases[0].ref_outputs[0].dtype, cand.spec.precision, cand.spec.tolerance)
        tolerances[st.shape.name] = tol
        verdict.method.tolerance = {"rtol": tol.rtol, "atol": tol.atol, "rel_norm": tol.rel_norm}
        result = ShapeResult(name=st.shape.name, weight=st.shape.weight, flops=st.flops, bytes=st.bytes)
        verdict.shapes.append(result)
        total_launches += _shape_trials(cand, st, tol, result, threads_before)
        result.correct = True
        cand.check_integrity()
    if total_launches == 0 and not _profiled_kernels(cand, shapes[0], verdict.method):
        raise Failed(
            Status.GUARD_VIOLATION,
            "no kernel of the candidate was launched during forward",
            [Violation("no-launch", "no kernel launched")],
        )
    verdict.correct = True
    return tolerances


def _shape_trials(
    cand: Candidate, st: ShapeState, tol: Tolerance, result: ShapeResult, threads_before: Threads
) -> int:
    """Every trial at one shape, counted in `result`; returns the kernel launches they made."""
    torch = cand.torch
    held: list[Any] | None = None  # the first trial's inputs, refilled in place for the others
    launches = 0
    for i, cs in enumerate(st.cases):
        inputs = make_inputs(
            cand.spec, cand.state.module, st.shape, cs.case.seed, cs.case.distribution, cand.state.device
        )
        if input_digest(inputs) != cs.digest:
            raise Failed(
                Status.GUARD_VIOLATION,
                "inputs regenerated for a trial differ from the reference's: the random state was tampered with",
                [Violation("patching", "input generation changed")],
            )
        # Every trial after the first gets the first trial's buffers, refilled in place with its own
        # values: same addresses, new contents, so a cache keyed by the inputs' addresses returns
        # stale outputs. Timing does this too, but a platform that only checks correctness (Triton
        # under the CPU's interpreter) never times.
        refilled = held is not None and _refill(held, inputs, torch)
        if held is None:
            held = inputs
        elif refilled:
            inputs = held
        inputs = trainable_inputs(inputs, torch, cand.spec.backward)
        outs, launched = _checked_call(cand, st, i, cs, inputs, threads_before)
        launches += launched
        failure = check_outputs(outs, on_device(cs.ref_outputs, cand.state.device), tol, st, result)
        result.trials = i + 1
        if failure:
            result.correct, result.failed_check = False, failure[0]
            same = (
                " (the inputs were the previous trial's buffers refilled in place: a result "
                "cached by input address is stale)"
                if refilled
                else ""
            )
            raise Failed(
                Status.INCORRECT,
                f"shape {st.shape.name!r}, seed {cs.case.seed}, {cs.case.distribution} inputs: "
                f"{failure[1]}{same}",
            )
    return launches


def _checked_call(
    cand: Candidate, st: ShapeState, i: int, cs: CaseState, inputs: list[Any], threads_before: Threads
) -> tuple[list[Any], int]:
    """Trial `i`'s call on `inputs`, poisoned before and checked after (ops, processes, threads, late
    writes, the inputs); returns its outputs and the kernel launches it made."""
    torch = cand.torch
    pristine = _keepsake(inputs, torch)
    _poison(cand, cs.ref_outputs)
    launches0 = cand.state.launches.total()
    recorders = cand.recorders()
    try:
        outs = forward_backward(cand.models[st.shape.name], inputs, st.grad_outputs, torch, *recorders)
        cand.sync()
    except BaseException as exc:
        status, message = classify(exc, "run", cand.file)
        raise Failed(status, f"shape {st.shape.name!r}, trial {i + 1}: {message}") from None
    snapshot = _keepsake(outs, torch) if i == 0 else None
    launched = cand.state.launches.total() - launches0
    violations = [v for v in (r.violation() for r in recorders) if v]
    if violations:
        raise Failed(Status.GUARD_VIOLATION, violations[0].message, violations)
    cand.check_processes()
    late = new_threads(threads_before)
    if late:
        raise Failed(
            Status.GUARD_VIOLATION,
            f"{len(late)} thread(s) still running after forward returned",
            [Violation("threads", "threads alive after return")],
        )
    if snapshot is not None:
        time.sleep(0.005)
        cand.sync()
        if _changed_at(outs, snapshot, torch):
            raise Failed(
                Status.GUARD_VIOLATION,
                "the output changed after forward returned: work continued in the background",
                [Violation("late-write", "output changed after return")],
            )
    for j in _changed_at(inputs, pristine, torch):
        raise Failed(
            Status.INCORRECT,
            f"shape {st.shape.name!r}: input {j} was modified by the candidate",
            [Violation("input-mutation", f"input {j} modified")],
        )
    return outs, launched


def check_outputs(
    outs: list[Any], refs: list[Any], tol: Tolerance, st: ShapeState, result: ShapeResult
) -> tuple[str, str] | None:
    """The first output (or gradient) outside the tolerance, as (check, message); the largest errors
    seen go to `result`."""
    if len(outs) != len(refs):
        return "output-count", f"{len(outs)} outputs, expected {len(refs)}"
    n_out = len(refs) if st.grad_outputs is None else len(st.grad_outputs)
    for j, (o, r) in enumerate(zip(outs, refs, strict=True)):
        what = f"output {j}" if j < n_out else f"gradient {j - n_out}"
        cmp = compare(o, r, widened(tol, st.noise[j] if st.noise and j < len(st.noise) else None), what)
        result.max_abs_err = max(result.max_abs_err or 0.0, cmp.max_abs_err)
        result.max_rel_err = max(result.max_rel_err or 0.0, cmp.max_rel_err)
        result.rel_norm_err = max(result.rel_norm_err or 0.0, cmp.rel_norm_err)
        if not cmp.passed:
            return cmp.check or "values", cmp.message
    return None


def check_timed(
    cand: Candidate, st: ShapeState, pristine: list[Any], snap: list[Any], tol: Tolerance
) -> str | None:
    """A timed call's outputs `snap` against the reference on `pristine` (its inputs): what is wrong."""
    torch = cand.torch
    ref_outs = forward_backward(
        st.reference, trainable_inputs(pristine, torch, cand.spec.backward), st.grad_outputs, torch
    )
    scratch = ShapeResult(name=st.shape.name, weight=0)
    failure = check_outputs(snap, ref_outs, tol, st, scratch)
    return None if failure is None else failure[1]


def audit(cand: Candidate, st: ShapeState, buffers: list[Any]) -> list[Violation]:
    """One more call on the timed buffers under the op recorders, its launches counted."""
    launches0 = cand.state.launches.total()
    recorders = cand.recorders()
    forward_backward(cand.models[st.shape.name], buffers, st.grad_outputs, cand.torch, *recorders)
    cand.sync()
    out = [v for v in (r.violation() for r in recorders) if v]
    if cand.state.launches.total() == launches0 and not cand.uses_load_inline:
        out.append(Violation("no-launch", "a timed call launched no kernel of the candidate's"))
    return out


def _poison(cand: Candidate, like: list[Any]) -> None:
    """Fill freed allocator blocks of the outputs' sizes with NaN / a sentinel, so stale memory
    handed to the candidate by the allocator never holds a plausible answer. Blocks of large
    outputs are filled one at a time (the allocator keeps them)."""
    torch = cand.torch
    blocks = []
    for o in like:
        for _ in range(2 if _nbytes(o) <= LARGE_OUTPUT_BYTES else 1):
            t = torch.empty(o.shape, dtype=o.dtype, device=cand.state.device)
            t.fill_(float("nan") if o.is_floating_point() else -7)
            blocks.append(t)
    del blocks


def _profiled_kernels(cand: Candidate, first: ShapeState, method: Method) -> bool:
    """For load_inline candidates (whose calls are not counted): did any device kernel run?"""
    if not cand.uses_load_inline:
        return False
    if cand.state.device.type != "cuda":
        method.notes.append("load_inline on CPU: launches are not counted")
        return True
    torch = cand.torch
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        cand.call_fresh(first, seed=3)
    return any(getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA for e in prof.events())


def _refill(held: list[Any], fresh: list[Any], torch: Any) -> bool:
    """Copy `fresh` into `held` in place where every tensor matches in shape, dtype and device (a
    jagged spec's inputs may not); returns whether it did."""
    pairs = list(zip(held, fresh, strict=True))
    for h, f in pairs:
        if isinstance(h, torch.Tensor) != isinstance(f, torch.Tensor):
            return False
        if not isinstance(h, torch.Tensor) and h != f:  # a scalar input that varies by trial
            return False
        if isinstance(h, torch.Tensor) and (h.shape != f.shape or h.dtype != f.dtype or h.device != f.device):
            return False
    with torch.no_grad():
        for h, f in pairs:
            if isinstance(h, torch.Tensor):
                h.copy_(f)
    return True


def _nbytes(o: Any) -> int:
    """Bytes of a tensor or of what a `Sampled` reference stands for."""
    return math.prod(o.shape) * o.dtype.itemsize


@dataclasses.dataclass
class _Digests:
    """A keepsake of large values: their digests (`inputs.digest`)."""

    digests: list[Any]


def _keepsake(values: list[Any], torch: Any) -> list[Any] | _Digests:
    """What proves later that `values` did not change: their copies, or where they are large (a whole
    copy would double their footprint on the device) their digests, which a change of any value, a
    permutation included, alters."""
    if sum(v.nbytes for v in values if isinstance(v, torch.Tensor)) > LARGE_OUTPUT_BYTES:
        return _Digests(input_digest(values))
    return [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in values]


def _changed_at(values: list[Any], keepsake: list[Any] | _Digests, torch: Any) -> list[int]:
    """The indices of the tensors among `values` that differ from their keepsake."""
    if isinstance(keepsake, _Digests):
        now = input_digest(values)
        return [
            j for j, v in enumerate(values) if isinstance(v, torch.Tensor) and now[j] != keepsake.digests[j]
        ]
    return [
        j
        for j, (v, k) in enumerate(zip(values, keepsake, strict=True))
        if isinstance(v, torch.Tensor) and not same_bits(v.detach(), k)
    ]
