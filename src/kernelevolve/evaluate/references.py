"""The reference's outputs for the correctness trials: computed in a worker before any candidate
exists, or loaded from the file an earlier worker of the same pool shared.

A worker holds, per shape and trial (`inputs.correctness_cases`), the reference's outputs (and
gradients) and the digest of the trial's inputs, and per shape the FLOPs and bytes of the roofline
and torch.compile's distance from eager (`prepared.measure_noise`). Computing them is device work,
done under the device's lease where timings could feel it (`prepare`). On a GPU shared by four
specs a worker waited 3.6 s (median) for that lease to spend 0.2 s with it, and a candidate waiting
for its prepared worker waited behind that wait (benchmarks/results/2026-11-27-h100-throughput-
prestart.md: `start:reference_outputs_wait`).

So the first workers of a pool also write what they computed to a file in their own folder
(`_share`: before their `ready` message, so before any candidate exists in them). The pool moves
the first such file into a folder of its own, which no worker may write, and hashes it, before it
hands that worker a candidate (`PoolShare`). Each worker the pool starts later reads
the file and its SHA-256 in its `prepare` message and loads it (`_load`): on the host (page-locked
on a GPU, so that the copy is fast), with no lease taken and no reference called; a trial's outputs
go to the device after the candidate's call, under the evaluation's lease (`on_device`, from
`trials`). A file whose hash or key (the spec's fingerprint, the device, the versions, the trials)
differs from what the worker would compute is not used: the worker computes its own and says why in
its notes.

Not shared: a spec whose kept outputs exceed `SHARE_MAX_BYTES` in all, or where a trial keeps a
sample of a large output (`_kept`): each worker draws its sample's positions at random, unknown in
advance, and a shared draw would be known to every later candidate of the spec. Nor, under the
`share_references` setting's default "auto", outputs that were cheaper to compute than a later worker
would find them to load (`worth_sharing`): measured on an H100, loading small specs' outputs made
their workers slower to start and the device no less busy.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelevolve.errors import SpecError
from kernelevolve.evaluate.prepared import (
    CaseState,
    Prepared,
    ShapeState,
    forward_backward,
    measure_noise,
    trainable_inputs,
)
from kernelevolve.evaluate.timing import LARGE_OUTPUT_BYTES

# The most kept output bytes a pool shares (in all its shapes and trials): a loading worker holds
# them twice on the host for a moment (the file's bytes, checked, then the tensors).
SHARE_MAX_BYTES = 2 * 2**30
FILE_NAME = "references.pt"  # in a worker's folder, where it writes the file it shares
# What loading shared outputs costs a worker (read, hashed, unpickled, page-locked), beside three
# others starting on the same host: on an H100 machine of 16 cores, the small suite specs' files took
# 2.5-6 s (a softmax spec's 1.2 GiB among them) where computing them had held the lease 0.3-0.4 s;
# their candidates' correctness phase, copying the outputs to the device, took 0.45 s instead of 0.2
# (benchmarks/results/2026-11-27-h100-throughput-shared-references.md). Under `share_references`
# "auto" a pool shares only outputs whose computation held the lease longer than this. The two
# figures are fitted to those observations (1.2 GiB in about 5 s), not measured per file size.
LOAD_SECONDS = 1.0
LOAD_BYTES_PER_S = 250e6


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Given:
    """The pool's shared file and its SHA-256, as the `prepare` message names them."""

    path: Path
    sha256: str


class PoolShare:
    """The pool's side: the first file a worker shared, taken before that worker sees any candidate
    (`take`, from `pool._take`, beside the trusted compile cache), moved out of the worker's folder
    (which it may write) into one of the pool's, read-only, and hashed there; `given` is what each
    worker started from then on loads. One file at a time, the pool's lock not held while a large
    file is hashed: a second worker's file is not needed."""

    def __init__(self) -> None:
        self.given: Given | None = None
        self._dir: Path | None = None
        self._lock = threading.Lock()
        self._removed = False

    def take(self, written: Path | None, worker_name: str) -> None:
        if written is None or self.given is not None or not self._lock.acquire(blocking=False):
            return
        try:
            if self.given is not None or self._removed:
                return
            self._dir = self._dir or Path(tempfile.mkdtemp(prefix="kernelevolve-references-"))
            target = self._dir / f"{worker_name}-{written.name}"
            shutil.move(written, target)
            target.chmod(0o444)
            self.given = Given(target, sha256_of(target))
        except OSError as exc:  # the workers compute their own, as before
            log.warning("reference outputs not shared: %s", exc)
        finally:
            self._lock.release()

    def remove(self) -> None:
        """The pool's folder, with the file (the pool is closing)."""
        with self._lock:
            self._removed = True
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)


def prepare(
    state: Prepared,
    probes: dict[str, list[Any]],
    cases: list[Any],
    torch: Any,
    lease: Callable[[], Any],
    given: Given | None = None,
    share_to: Path | None = None,
) -> None:
    """Fill every shape's trials (`ShapeState.cases`), FLOPs, bytes and noise: from `given` where it
    holds them for this worker, else computed here under `lease()` and, with `share_to`, written
    there for the pool (`state.shared` names the file then)."""
    t = time.perf_counter()
    if given is not None and _load(state, given, cases, torch):
        state.steps["reference_outputs"] = time.perf_counter() - t
        state.info["references"] = "loaded"
        return
    with lease():
        leased = time.perf_counter()
        state.steps["reference_outputs_wait"] = leased - t
        mark = len(state.notes)
        for st in state.shapes:
            compute(state, st, probes[st.shape.name], cases, torch)
            if st.compiled is not None:
                measure_noise(state, st, probes[st.shape.name], torch)
        held = time.perf_counter() - leased
        # device work: under the lease
        host = _on_host(state, torch) if share_to is not None and worth_sharing(state, held, torch) else None
    state.steps["reference_outputs"] = time.perf_counter() - t
    state.info["references"] = "computed"
    if host is not None and share_to is not None:
        _share(state, host, cases, state.notes[mark:], share_to, torch)


def worth_sharing(state: Prepared, held_s: float, torch: Any) -> bool:
    """Whether to share outputs whose computation held the device's lease `held_s` seconds: as the
    `share_references` setting says; under "auto", where that exceeds what loading them would cost a
    later worker (LOAD_SECONDS + their bytes at LOAD_BYTES_PER_S)."""
    mode = state.settings.share_references
    if mode != "auto":
        return mode == "always"
    kept = sum(o.nbytes for o in _trial_outputs(state) if isinstance(o, torch.Tensor))
    return held_s > LOAD_SECONDS + kept / LOAD_BYTES_PER_S


def on_device(refs: list[Any], device: Any) -> list[Any]:
    """A trial's reference outputs on `device` (those loaded from a shared file are on the host)."""
    import torch

    return [r.to(device) if isinstance(r, torch.Tensor) and r.device != device else r for r in refs]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


# -- computing -------------------------------------------------------------------------------------


def compute(state: Prepared, st: ShapeState, probe: list[Any], cases: list[Any], torch: Any) -> None:
    """The reference's outputs at one shape for each of its trials, its FLOPs and bytes."""
    from kernelevolve.evaluate.inputs import digest, make_inputs
    from kernelevolve.roofline import count_flops, tensor_bytes
    from kernelevolve.spec import flatten_outputs

    spec, module, shape, ref = state.spec, state.module, st.shape, st.reference
    for i, x in enumerate(probe):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() and not bool(x.any()):
            state.notes.append(f"shape {shape.name}: input {i} is all zeros; checks on zeros are weak")
    sampler = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))  # unknown in advance
    for case in (c for c in cases if c.shape == shape.name):
        inputs = make_inputs(spec, module, shape, case.seed, case.distribution, state.device)
        before = digest(inputs)  # not a clone: the inputs may be most of the device
        outs = forward_backward(ref, trainable_inputs(inputs, torch, spec.backward), st.grad_outputs, torch)
        flatten_outputs(spec, outs)
        if digest(inputs) != before:
            state.notes.append(f"shape {shape.name}: the reference itself modifies its inputs")
        _check_finite(spec, shape.name, case, outs, torch)
        full = case.distribution not in {c.case.distribution for c in st.cases}
        st.cases.append(CaseState(case, before, _kept(outs, inputs, torch, full, sampler)))
        del inputs, outs
    first = st.cases[0].ref_outputs
    if all(o.is_floating_point() and not bool(o.any()) for o in first):
        state.notes.append(
            f"shape {shape.name}: the reference output is all zeros; correctness checks are weak"
        )
    st.flops = (
        int(shape.flops)
        if shape.flops is not None
        else _flops(ref, probe, st, spec.backward, torch, count_flops)
    )
    params = list(ref.parameters()) + list(ref.buffers())
    out_bytes = tensor_bytes(first)
    st.bytes = (
        int(shape.bytes)
        if shape.bytes is not None
        else tensor_bytes(probe) + tensor_bytes(params) + out_bytes
    )


def _check_finite(spec: Any, shape: str, case: Any, outs: list[Any], torch: Any) -> None:
    """Refuse a reference that produced NaN or inf. Slab by slab, and in a function of its own: a
    loop variable left bound to the last output would keep a whole output alive into the next trial."""
    from kernelevolve.evaluate.inputs import slabs

    for j, o in enumerate(outs):
        if o.is_floating_point() and not all(bool(torch.isfinite(s).all()) for s in slabs(o)):
            raise SpecError(
                f"{spec.path}: the reference produced NaN/inf at shape {shape!r} "
                f"(seed {case.seed}, {case.distribution} inputs, output {j})",
                hint="inputs must keep the reference finite; narrow `scaled_range` if scaling breaks it",
            )


# A trial whose reference outputs exceed LARGE_OUTPUT_BYTES keeps them whole only for the first trial
# of each distribution; the others keep a sample (`correctness.Sampled`, SAMPLED_ELEMENTS positions
# and the norm): six trials of a 6 GiB output would otherwise hold 36 GiB of an 80 GB GPU for the
# worker's life.
SAMPLED_ELEMENTS = 1 << 22


def _kept(outs: list[Any], inputs: list[Any], torch: Any, full: bool, sampler: Any) -> list[Any]:
    """A trial's reference outputs as the worker keeps them: detached; copied where one is (a view
    of) an input (which is dropped) or a small view of a larger buffer (a loss's 0-dim result can be
    a view into an input-sized temporary: six trials of level 1's 96_HuberLoss held 24 GiB that way);
    sampled where they are large and `full` is not asked."""
    from kernelevolve.evaluate.correctness import Sampled

    if not full and sum(o.nbytes for o in outs) > LARGE_OUTPUT_BYTES:
        return [Sampled.of(o, SAMPLED_ELEMENTS, sampler) for o in outs]
    storages = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}

    def copied(o: Any) -> bool:
        storage = o.untyped_storage()
        return storage.data_ptr() in storages or storage.nbytes() > max(2 * o.nbytes, 1 << 20)

    return [o.detach().clone() if copied(o) else o.detach() for o in outs]


def _flops(ref: Any, probe: list[Any], st: ShapeState, backward: bool, torch: Any, count: Any) -> int:
    try:
        return count(
            lambda: forward_backward(ref, trainable_inputs(probe, torch, backward), st.grad_outputs, torch)
        )
    except Exception:
        return 0


# -- sharing ---------------------------------------------------------------------------------------


def _key(state: Prepared, cases: list[Any]) -> dict[str, Any]:
    """What a shared file must have been computed for, to stand for this worker's own computation."""
    return {
        "spec": state.spec.fingerprint,
        "device": state.info.get("device"),
        "target": state.info.get("target"),
        # plain strings: torch's version is a str subclass, which a weights-only load refuses
        "versions": {k: None if v is None else str(v) for k, v in (state.info.get("versions") or {}).items()},
        "trials": [[c.shape, c.seed, c.distribution] for c in cases],
    }


def _trial_outputs(state: Prepared) -> Iterator[Any]:
    """Every kept reference output of every shape's trials (tensors, or samples of large ones)."""
    return (o for st in state.shapes for cs in st.cases for o in cs.ref_outputs)


def _on_host(state: Prepared, torch: Any) -> list[list[list[Any]]] | None:
    """Every trial's outputs copied to the host, per shape; None where they may not be shared."""
    tensors = list(_trial_outputs(state))
    if not all(isinstance(o, torch.Tensor) for o in tensors):  # a sample (`_kept`): not shared
        return None
    if sum(o.nbytes for o in tensors) > SHARE_MAX_BYTES:
        return None
    return [[[o.to("cpu", copy=True) for o in cs.ref_outputs] for cs in st.cases] for st in state.shapes]


def _share(
    state: Prepared, host: list[list[list[Any]]], cases: list[Any], notes: list[str], path: Path, torch: Any
) -> None:
    shapes = [
        {
            "name": st.shape.name,
            "flops": int(st.flops),
            "bytes": int(st.bytes),
            "noise": None if st.noise is None else [float(n) for n in st.noise],
            "trials": [
                {"digest": cs.digest, "outputs": outs} for cs, outs in zip(st.cases, per, strict=True)
            ],
        }
        for st, per in zip(state.shapes, host, strict=True)
    ]
    try:
        torch.save({"key": _key(state, cases), "shapes": shapes, "notes": notes}, path)
    except Exception as exc:  # a full disk, say: this worker is still prepared; the pool waits for another
        path.unlink(missing_ok=True)
        state.notes.append(f"the reference's outputs were not shared ({type(exc).__name__})")
        return
    state.shared = str(path)


def _load(state: Prepared, given: Given, cases: list[Any], torch: Any) -> bool:
    def refused(why: str) -> bool:
        state.notes.append(f"the pool's shared reference outputs were not used ({why}); computed here")
        return False

    try:
        data = given.path.read_bytes()
    except OSError as exc:
        return refused(f"{type(exc).__name__}: {exc}")
    if hashlib.sha256(data).hexdigest() != given.sha256:
        return refused("the file is not the one the pool hashed")
    try:
        blob = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        return refused(f"unreadable: {type(exc).__name__}")
    del data
    if blob.get("key") != _key(state, cases):  # the same trials, in the same order, as `cases`
        return refused("computed for another spec, device, versions or trials")
    saved = {s["name"]: s for s in blob["shapes"]}
    filled = []
    for st in state.shapes:
        own = [c for c in cases if c.shape == st.shape.name]
        trials = saved[st.shape.name]["trials"] if st.shape.name in saved else []
        if len(trials) != len(own):
            return refused(f"shape {st.shape.name}: another number of trials")
        filled.append([CaseState(c, t["digest"], t["outputs"]) for c, t in zip(own, trials, strict=True)])
    for st, states in zip(state.shapes, filled, strict=True):  # every check passed: now the copies
        for cs in states:
            cs.ref_outputs = _pinned(cs.ref_outputs, state)
        s = saved[st.shape.name]
        st.cases, st.flops, st.bytes, st.noise = states, int(s["flops"]), int(s["bytes"]), s["noise"]
    state.notes.extend(blob["notes"])
    return True


def _pinned(outputs: list[Any], state: Prepared) -> list[Any]:
    """Host outputs in page-locked memory where the device is a GPU: their copies to the device, made
    under the evaluation's lease, then run at the bus's speed rather than through a staging buffer
    (a softmax spec's 1.2 GiB of trials). Where the memory cannot be locked, as they are."""
    if state.device.type != "cuda":
        return outputs
    try:
        return [o.pin_memory() for o in outputs]
    except Exception:  # out of lockable memory, say: pageable copies are slower, not wrong
        return outputs
