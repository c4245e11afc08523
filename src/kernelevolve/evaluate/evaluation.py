"""One candidate in a prepared worker: its evaluation's phases, in order, to one verdict.

Phases (each announced to the parent, which applies that phase's timeout):
- `compile`: write the candidate's source (sent by the parent, the same text the static guards read)
  into the worker's directory, import it, and build `ModelNew` per shape with the reference's weights.
  No device lease is held: another candidate may be timed meanwhile.
- `first-run`: call each shape's model once on warm-up inputs. Triton compiles on first use, so a
  Triton candidate's first call starts in `compile` (compile errors surface there, still without the
  lease) and moves to `first-run` at its first kernel launch (a launch hook); other kinds move before
  the call. `first-run` holds the device lease and runs under the run limit: a kernel that never ends
  is stopped at `run_timeout_s`, and never runs beside another candidate's timing. A kernel compiled
  later in the call (a pipeline's next kernel) compiles in `compile` again, the lease given back once
  the device has finished what ran so far, and its launch takes it again (`_first_launch_starts_run`).
- `lease`: wait for the device lease (not timed against the candidate).
- `correctness`: every shape x seed x distribution (`trials.py`). Before each call the allocator is
  poisoned (blocks of the outputs' sizes filled with NaN and freed), inputs are cloned, and the call
  runs under the op recorder; after it: outputs compared to the reference outputs computed before the
  candidate was imported, inputs compared bit for bit, new Python threads and writes that land after
  the return detected, kernel launches counted, the harness's world checked for patches.
- `timing`: interleaved with the baselines (`timing.py`), outputs of timed calls checked
  (`trials.check_timed`, `trials.audit`).
Then speedups, the roofline, and the suspicious checks make the verdict (`scoring.py`).

This module owns the order of the phases, the device lease, and the first calls; it deliberately
leaves what a trial checks to `trials.py`, what the imported candidate is and how a phase ends the
evaluation to `candidate.py`, and the verdict's numbers and flags to `scoring.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kernelevolve.evaluate.baselines import baseline_callees, callee
from kernelevolve.evaluate.candidate import Candidate, Failed, classify
from kernelevolve.evaluate.correctness import Tolerance
from kernelevolve.evaluate.inputs import conform, copy_into, make_inputs, make_model, share_weights
from kernelevolve.evaluate.messages import EvaluateMsg
from kernelevolve.evaluate.prepared import Prepared, ShapeState, peak_memory
from kernelevolve.evaluate.protocol import Channel
from kernelevolve.evaluate.runtime import Integrity
from kernelevolve.evaluate.sandbox import descendants
from kernelevolve.evaluate.scoring import fail, score, start_verdict
from kernelevolve.evaluate.timing import Callee, ShapeTiming, TimingPlan, time_shape
from kernelevolve.evaluate.trials import audit, check_timed, correctness
from kernelevolve.evaluate.verdict import Status, Verdict, Violation


def evaluate(state: Prepared, msg: EvaluateMsg, chan: Channel) -> Verdict:
    ev = _Evaluation(state, msg, chan)
    try:
        ev.run()
    except Failed as f:
        fail(ev.verdict, f.status, f.message, f.violations)
    except Exception as exc:
        # Raised in the harness's own code after the candidate ran (a CUDA error surfacing at a later
        # synchronization, say): the candidate's doing, reported with the phase it surfaced in.
        status, message = classify(exc, "run", ev.candidate.file)
        fail(ev.verdict, status, f"during {ev._phase_name}: {message}", [])
    finally:
        if ev.lease is not None:
            ev.lease.release()
    ev.verdict.phases = ev.phases
    ev.verdict.method.peak_memory_bytes = peak_memory(state)
    return ev.verdict


class _Evaluation:
    def __init__(self, state: Prepared, msg: EvaluateMsg, chan: Channel):
        import torch

        self.torch, self.state, self.msg, self.chan = torch, state, msg, chan
        self.spec = state.spec
        self.kind = msg.kind
        self.lease: Any = None
        self.phases: dict[str, float] = {}
        self.tolerances: dict[str, Tolerance] = {}  # per shape, decided in correctness, used by timing
        self.candidate = Candidate(state, torch, msg.uses_load_inline)
        # `shapes` in the request narrows the evaluation to those spec shapes (a quick run, or tuning
        # one shape); the verdict then covers only them.
        only = set(msg.shapes)
        self.shapes = [st for st in state.shapes if not only or st.shape.name in only]
        if not self.shapes:
            raise ValueError(f"no spec shape among {sorted(only)}")
        self._phase_name = "start"
        self._phase_start = time.perf_counter()
        self.verdict = start_verdict(state, self.kind)

    # -- phases ------------------------------------------------------------------------------------

    def phase(self, name: str) -> None:
        self.chan.send("phase", phase=name)
        self._phase_start = time.perf_counter()
        self._phase_name = name

    def end_phase(self) -> None:
        spent = time.perf_counter() - self._phase_start
        self.phases[self._phase_name] = round(self.phases.get(self._phase_name, 0.0) + spent, 4)

    def run(self) -> None:
        exclusive = self.state.platform.exclusive
        if exclusive:
            self.take_lease()
        self.phase("compile")
        self.compile()
        self.first_calls()
        self.end_phase()
        self.phase("correctness")
        self.tolerances = correctness(self.candidate, self.shapes, self.verdict)
        self.end_phase()
        for st in self.shapes:  # what timing does not need: a large spec's reference outputs
            for cs in st.cases:
                cs.ref_outputs = []
        if self.kind not in self.state.platform.timed_kinds:
            self.verdict.method.timer = f"none ({self.state.platform.untimed_reason(self.kind)})"
            self.verdict.message = "correct; " + self.state.platform.untimed_reason(self.kind)
            return
        self.phase("timing")
        self.timing()
        self.end_phase()
        score(self.verdict, self.state, self.msg.profile)

    def take_lease(self) -> None:
        from kernelevolve.evaluate.lease import DeviceLease

        self.phase("lease")
        self.lease = DeviceLease(self.state.lease_key).acquire()
        self.end_phase()

    def start_first_run(self) -> None:
        """Enter `first-run` (taking the lease if it is not held); a no-op once there."""
        if self._phase_name == "first-run":
            return
        self.end_phase()
        if self.lease is None:
            self.take_lease()
        self.phase("first-run")

    def give_back_lease(self) -> None:
        """Release the lease for a compile in the middle of the first call, where the platform lets
        compiles run beside another candidate's timing: the device first finishes what was launched."""
        if self.lease is None or self.state.platform.exclusive:
            return
        self.state.timer.sync()
        self.lease.release()
        self.lease = None

    @contextlib.contextmanager
    def _first_launch_starts_run(self) -> Iterator[None]:
        """Triton compiles inside the call, before its launch: enter `first-run` at the first launch.

        A kernel compiled after that (a second kernel, an autotuner's next config) moves the phase
        back to `compile` while it compiles, so the compile limit applies to compiling and the run
        limit to running. Where the lease is not held throughout (`Platform.exclusive`), that compile
        also gives the lease back, after the device has finished what was launched so far (waited for
        in `first-run`, under the run limit): a pipeline whose second kernel compiled for the whole
        compile limit held every other evaluation on the device that long (level 2's
        19_ConvTranspose2d_GELU_GroupNorm: 180 s of another candidate's lease wait). The next launch
        takes the lease again. Without Triton's hooks (an old Triton) the call starts in `first-run`,
        compile included. A candidate that removes the hooks only keeps its first launch in
        `compile`: the lease is taken after the call, before correctness, as for all."""
        try:
            from triton import knobs

            runtime = knobs.runtime
            chain = runtime.launch_enter_hook
            chain.add  # noqa: B018 - a HookChain (Triton >= 3.4)
            before = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
        except Exception:
            self.start_first_run()
            yield
            return

        def launched(*_: Any) -> None:
            self.start_first_run()

        def compiling(*args: Any, **kwargs: Any) -> Any:
            if self._phase_name == "first-run":
                self.give_back_lease()
                self.end_phase()
                self.phase("compile")
            return before[0](*args, **kwargs) if before[0] else False

        def compiled(*args: Any, **kwargs: Any) -> Any:
            if self._phase_name == "compile" and self.lease is not None:
                self.end_phase()
                self.phase("first-run")
            return before[1](*args, **kwargs) if before[1] else None

        chain.add(launched)
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = compiling, compiled
        try:
            yield
        finally:
            chain.remove(launched)
            runtime.jit_cache_hook, runtime.jit_post_compile_hook = before

    def compile(self) -> None:
        cand = self.candidate
        workdir = Path.cwd()
        path = workdir / f"candidate_{self.msg.candidate_hash[:12]}.py"
        path.write_text(self.msg.source)
        cand.file = str(path)
        cand.integrity = Integrity()
        cand.children_before = set(descendants(os.getpid(), include_zombies=False))
        name = f"kernelevolve_candidate_{self.msg.candidate_hash[:12]}"
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except BaseException as exc:
            status, message = classify(exc, "import", cand.file)
            raise Failed(status, f"importing the candidate failed: {message}") from None
        cand.check_integrity()
        cls = getattr(module, "ModelNew", None)
        if cls is None:
            raise Failed(
                Status.GUARD_VIOLATION,
                "the candidate defines no ModelNew",
                [Violation("no-modelnew", "ModelNew missing")],
            )
        for st in self.shapes:
            try:
                model = make_model(self.spec, self.state.module, cls, st.shape, self.state.device)
            except Exception as exc:
                status, message = classify(exc, "construct", cand.file)
                raise Failed(
                    status, f"ModelNew(*get_init_inputs()) failed at shape {st.shape.name!r}: {message}"
                ) from None
            shared = share_weights(st.reference, model)
            if self.spec.backward and list(st.reference.parameters()) and not shared:
                raise Failed(
                    Status.INCORRECT,
                    "training spec: ModelNew's parameters must have the reference's names and shapes "
                    "so their gradients can be checked",
                )
            cand.models[st.shape.name] = model
        cand.check_integrity()

    def first_calls(self) -> None:
        """One call per shape on warm-up inputs; ends in `first-run` with the device lease held."""
        for k, st in enumerate(self.shapes):
            if k and not self.state.platform.exclusive:  # the next shape compiles without the lease
                self.end_phase()
                self.lease.release()
                self.lease = None
                self.phase("compile")
            if self.kind == "triton":
                starts: Any = self._first_launch_starts_run()
            else:  # native code compiled when it was loaded, at import or construction
                self.start_first_run()
                starts = contextlib.nullcontext()
            try:
                with starts:
                    self.candidate.call_fresh(st, seed=99)
            except BaseException as exc:
                status, message = classify(exc, "compile", self.candidate.file)
                raise Failed(status, f"first call at shape {st.shape.name!r}: {message}") from None
            self.start_first_run()
        self.candidate.check_integrity()
        self.candidate.check_processes()

    def timing(self) -> None:
        allow_graphs = self.state.device.type == "cuda" and not self.spec.backward
        platform = self.state.platform
        plan = TimingPlan.from_settings(
            self.state.settings, allow_graphs, warmup_s=platform.warmup_s, precision=platform.timing_precision
        )
        if self.msg.timing_budget_s:  # a quick run: a shorter look, same method
            plan = dataclasses.replace(plan, budget_s=self.msg.timing_budget_s)
        if self.msg.timing_precision is not None:  # the search's: ranks, the finish re-measures
            plan = dataclasses.replace(plan, precision=self.msg.timing_precision)
        m = self.verdict.method
        m.timer, m.l2, m.interleaved, m.warmup = self.state.timer.name, self.state.timer.l2, True, plan.warmup
        if self.state.timer.note:
            m.notes.append(self.state.timer.note)
        if plan.precision > 0:
            m.notes.append(
                f"rounds end once every median's 95% interval is within +-{plan.precision:.1%} "
                f"(at least {plan.min_trials}), else at the budget"
            )
        for k, (st, result) in enumerate(zip(self.shapes, self.verdict.shapes, strict=True)):
            pinned = self.msg.graphs.get(st.shape.name)
            timing = self._time_shape(st, dataclasses.replace(plan, seed=5000 + k, graphs=pinned))
            m.checked_timed_calls += timing.checked
            m.notes.extend(timing.notes)
            for part, seconds in timing.spent.items():  # where the timing phase went, summed over shapes
                key = f"timing:{part}"
                self.phases[key] = round(self.phases.get(key, 0.0) + seconds, 4)
            if timing.failure:
                raise Failed(Status.INCORRECT, f"shape {st.shape.name!r}: {timing.failure}")
            if timing.violations:
                raise Failed(Status.GUARD_VIOLATION, timing.violations[0].message, timing.violations)
            result.cuda_graphs = timing.cuda_graphs
            result.candidate = timing.stats["candidate"]
            result.eager = timing.stats.get("eager")
            result.compile = timing.stats.get("compile")
            result.speedups(timing.speedup_spread)
            self.candidate.check_integrity()

    def _time_shape(self, st: ShapeState, plan: TimingPlan) -> ShapeTiming:
        tol = self.tolerances[st.shape.name]

        callees = self._callees(st)

        def fresh(seed: int) -> list[Any]:  # in the buffers' sizes, for a jagged spec (`conform`)
            drawn = make_inputs(self.spec, self.state.module, st.shape, seed, "spec", self.state.device)
            return conform(drawn, callees[-1].buffers)

        def check(pristine: list[Any], snap: list[Any]) -> str | None:
            return check_timed(self.candidate, st, pristine, snap, tol)

        def audited(buffers: list[Any]) -> list[Violation]:
            return audit(self.candidate, st, buffers)

        return time_shape(callees, self.state.timer, plan, fresh, copy_into, check, audited, self.torch)

    def _callees(self, st: ShapeState) -> list[Callee]:
        return [
            *baseline_callees(self.state, st),
            callee("candidate", self.candidate.models[st.shape.name], self.state, st),
        ]
