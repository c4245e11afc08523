"""One candidate in a prepared worker: compile, correctness, timing, verdict.

Phases (each announced to the parent, which applies that phase's timeout):
- `compile`: write the candidate's source (sent by the parent, the same text the static guards read)
  into the worker's directory, import it, and build `ModelNew` per shape with the reference's weights.
  No device lease is held: another candidate may be timed meanwhile.
- `first-run`: call each shape's model once on warm-up inputs. Triton compiles on first use, so a
  Triton candidate's first call starts in `compile` (compile errors surface there, still without the
  lease) and moves to `first-run` at its first kernel launch (a launch hook); other kinds move before
  the call. `first-run` holds the device lease and runs under the run limit: a kernel that never ends
  is stopped at `run_timeout_s`, and never runs beside another candidate's timing.
- `lease`: wait for the device lease (not timed against the candidate).
- `correctness`: every shape x seed x distribution. Before each call the allocator is poisoned (blocks
  of the outputs' sizes filled with NaN and freed), inputs are cloned, and the call runs under the op
  recorder; after it: outputs compared to the reference outputs computed before the candidate was
  imported, inputs compared bit for bit, new Python threads and writes that land after the return
  detected, kernel launches counted, the harness's world checked for patches.
- `timing`: interleaved with the baselines (`timing.py`), outputs of timed calls checked.
Then speedups, the roofline, and the suspicious checks make the verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kernelevolve.evaluate.baselines import baseline_callees, callee
from kernelevolve.evaluate.correctness import compare, same_bits, tolerance_for
from kernelevolve.evaluate.inputs import (
    DISTRIBUTIONS,
    conform,
    copy_into,
    make_inputs,
    make_model,
    share_weights,
)
from kernelevolve.evaluate.inputs import digest as input_digest
from kernelevolve.evaluate.prepared import (
    Prepared,
    ShapeState,
    forward_backward,
    peak_memory,
    trainable_inputs,
)
from kernelevolve.evaluate.protocol import Channel
from kernelevolve.evaluate.runtime import Integrity, OpRecorder, new_threads, python_threads
from kernelevolve.evaluate.sandbox import descendants
from kernelevolve.evaluate.timing import LARGE_OUTPUT_BYTES, Callee, ShapeTiming, TimingPlan, time_shape
from kernelevolve.evaluate.verdict import Method, ShapeResult, Status, Verdict, Violation
from kernelevolve.roofline import flop_class, roofline

COMPILE_ERRORS = (
    "CompilationError",
    "CompileTimeAssertionFailure",
    "UnsupportedLanguageConstruct",
    "NativeCompileError",
)
BACKWARD_GLUE = {"aten.add", "aten.add_"}  # the autograd engine accumulates gradients with these


class Failed(Exception):
    """Ends the evaluation with a verdict (internal control flow, never leaves this module)."""

    def __init__(self, status: Status, message: str, violations: list[Violation] | None = None):
        super().__init__(message)
        self.status, self.message, self.violations = status, message, violations or []


def classify(exc: BaseException, phase: str, candidate_file: str) -> tuple[Status, str]:
    name = type(exc).__name__
    text = str(exc).strip()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == candidate_file]
    where = f" (candidate line {frames[-1].lineno})" if frames else ""
    message = f"{name}: {text[:3000]}{where}"
    lowered = text.lower()
    if (
        isinstance(exc, MemoryError)
        or name == "OutOfMemoryError"
        or any(k in lowered for k in ("out of memory", "can't allocate memory", "cannot allocate memory"))
    ):
        return Status.OOM, message
    if name in COMPILE_ERRORS or "error building extension" in lowered or phase == "import":
        return Status.COMPILE_ERROR, message
    if "illegal memory access" in lowered or "cuda error" in lowered or "misaligned address" in lowered:
        return (
            Status.RUNTIME_ERROR,
            message + " (the CUDA context is lost; the next candidate runs in a fresh worker)",
        )
    return Status.RUNTIME_ERROR, message


def evaluate(state: Prepared, msg: dict[str, Any], chan: Channel) -> Verdict:
    ev = _Evaluation(state, msg, chan)
    try:
        ev.run()
    except Failed as f:
        ev.fail(f.status, f.message, f.violations)
    except Exception as exc:
        # Raised in the harness's own code after the candidate ran (a CUDA error surfacing at a later
        # synchronization, say): the candidate's doing, reported with the phase it surfaced in.
        status, message = classify(exc, "run", ev.file)
        ev.fail(status, f"during {ev._phase_name}: {message}", [])
    finally:
        if ev.lease is not None:
            ev.lease.release()
    ev.verdict.phases = ev.phases
    ev.verdict.method.peak_memory_bytes = peak_memory(state)
    return ev.verdict


class _Evaluation:
    def __init__(self, state: Prepared, msg: dict[str, Any], chan: Channel):
        import torch

        self.torch, self.state, self.msg, self.chan = torch, state, msg, chan
        self.spec = state.spec
        self.settings = state.settings
        self.kind = msg.get("kind") or "triton"
        self.uses_load_inline = bool(msg.get("uses_load_inline"))
        self.lease: Any = None
        self.phases: dict[str, float] = {}
        self._tolerance: dict[str, Any] = {}  # per shape, decided in correctness, used by timing
        self.models: dict[str, Any] = {}
        self.integrity: Integrity | None = None
        self.children_before: set[int] = set()
        self.file = ""
        # `shapes` in the request narrows the evaluation to those spec shapes (a quick run, or tuning
        # one shape); the verdict then covers only them.
        only = set(msg.get("shapes") or ())
        self.shapes = [st for st in state.shapes if not only or st.shape.name in only]
        if not self.shapes:
            raise ValueError(f"no spec shape among {sorted(only)}")
        self._phase_name = "start"
        self._phase_start = time.perf_counter()
        v = state.info["versions"]
        self.verdict = Verdict(
            status=Status.OK,
            spec=self.spec.name,
            spec_fingerprint=self.spec.fingerprint,
            candidate_kind=self.kind,
            platform=state.platform.name,
            method=Method(
                platform=state.info["target"],
                device=state.info["device"],
                driver=v.get("driver"),
                torch=v.get("torch"),
                triton=v.get("triton"),
                python=v.get("python"),
                kernelevolve=state.info.get("kernelevolve"),
                baselines=[b for b in self.settings["baselines"] if b not in state.baseline_errors],
                baseline_errors=dict(state.baseline_errors),
                fitness_baseline=self.settings["fitness_baseline"],
                precision_policy=self.spec.precision,
                seeds=int(self.settings["seeds"]),
                distributions=list(DISTRIBUTIONS),
                notes=list(state.notes),
            ),
        )

    def fail(self, status: Status, message: str, violations: list[Violation]) -> None:
        self.verdict.status, self.verdict.message = status, message
        self.verdict.violations.extend(violations)
        self.verdict.correct = False
        self.verdict.timed = False
        self.verdict.fitness = 0.0

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
        self.correctness()
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
        self.finish()

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

    @contextlib.contextmanager
    def _first_launch_starts_run(self) -> Iterator[None]:
        """Triton compiles inside the call, before its launch: enter `first-run` at the first launch.

        A kernel compiled after that (a second kernel, an autotuner's next config) moves the phase
        back to `compile` while it compiles, the lease still held, so the compile limit applies to
        compiling and the run limit to running. Without Triton's hooks (an old Triton) the call starts
        in `first-run`, compile included. A candidate that removes the hooks only keeps its first
        launch in `compile`: the lease is taken after the call, before correctness, as for all."""
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
        workdir = Path.cwd()
        path = workdir / f"candidate_{self.msg['candidate_hash'][:12]}.py"
        path.write_text(self.msg["source"])
        self.file = str(path)
        self.integrity = Integrity()
        self.children_before = set(descendants(os.getpid(), include_zombies=False))
        name = f"kernelevolve_candidate_{self.msg['candidate_hash'][:12]}"
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except BaseException as exc:
            status, message = classify(exc, "import", self.file)
            raise Failed(status, f"importing the candidate failed: {message}") from None
        self._check_integrity()
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
                status, message = classify(exc, "construct", self.file)
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
            self.models[st.shape.name] = model
        self._check_integrity()

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
                    self._call_fresh(st, seed=99)
            except BaseException as exc:
                status, message = classify(exc, "compile", self.file)
                raise Failed(status, f"first call at shape {st.shape.name!r}: {message}") from None
            self.start_first_run()
        self._check_integrity()
        self._check_processes()

    def correctness(self) -> None:
        torch = self.torch
        threads_before = python_threads()
        total_launches = 0
        for st in self.shapes:
            held: list[Any] | None = None  # the first trial's inputs, refilled in place for the others
            tol = tolerance_for(st.cases[0].ref_outputs[0].dtype, self.spec.precision, self.spec.tolerance)
            self._tolerance[st.shape.name] = tol
            self.verdict.method.tolerance = {"rtol": tol.rtol, "atol": tol.atol, "rel_norm": tol.rel_norm}
            result = ShapeResult(name=st.shape.name, weight=st.shape.weight, flops=st.flops, bytes=st.bytes)
            self.verdict.shapes.append(result)
            for i, cs in enumerate(st.cases):
                inputs = make_inputs(
                    self.spec,
                    self.state.module,
                    st.shape,
                    cs.case.seed,
                    cs.case.distribution,
                    self.state.device,
                )
                if input_digest(inputs) != cs.digest:
                    raise Failed(
                        Status.GUARD_VIOLATION,
                        "inputs regenerated for a trial differ from the reference's: the random state was tampered with",
                        [Violation("patching", "input generation changed")],
                    )
                # Every trial after the first gets the first trial's buffers, refilled in place with
                # its own values: same addresses, new contents, so a cache keyed by the inputs'
                # addresses returns stale outputs. Timing does this too, but a platform that only
                # checks correctness (Triton under the CPU's interpreter) never times.
                refilled = held is not None and _refill(held, inputs, torch)
                if held is None:
                    held = inputs
                elif refilled:
                    inputs = held
                inputs = trainable_inputs(inputs, torch, self.spec.backward)
                pristine = _keepsake(inputs, torch)
                self._poison(cs.ref_outputs)
                launches0 = self.state.launches.total()
                recorders = self._recorders()
                try:
                    outs = forward_backward(
                        self.models[st.shape.name], inputs, st.grad_outputs, torch, *recorders
                    )
                    self.sync()
                except BaseException as exc:
                    status, message = classify(exc, "run", self.file)
                    raise Failed(status, f"shape {st.shape.name!r}, trial {i + 1}: {message}") from None
                snapshot = _keepsake(outs, torch) if i == 0 else None
                launched = self.state.launches.total() - launches0
                total_launches += launched
                violations = [v for v in (r.violation() for r in recorders) if v]
                if violations:
                    raise Failed(Status.GUARD_VIOLATION, violations[0].message, violations)
                self._check_processes()
                late = new_threads(threads_before)
                if late:
                    raise Failed(
                        Status.GUARD_VIOLATION,
                        f"{len(late)} thread(s) still running after forward returned",
                        [Violation("threads", "threads alive after return")],
                    )
                if snapshot is not None:
                    time.sleep(0.005)
                    self.sync()
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
                failure = self._compare(outs, cs.ref_outputs, tol, st, result)
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
            result.correct = True
            self._check_integrity()
        if total_launches == 0 and not self._profiled_kernels():
            raise Failed(
                Status.GUARD_VIOLATION,
                "no kernel of the candidate was launched during forward",
                [Violation("no-launch", "no kernel launched")],
            )
        self.verdict.correct = True

    def timing(self) -> None:
        allow_graphs = self.state.device.type == "cuda" and not self.spec.backward
        platform = self.state.platform
        plan = TimingPlan.from_settings(
            self.settings, allow_graphs, warmup_s=platform.warmup_s, precision=platform.timing_precision
        )
        if self.msg.get("timing_budget_s"):  # a quick run: a shorter look, same method
            plan = dataclasses.replace(plan, budget_s=float(self.msg["timing_budget_s"]))
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
            pinned = (self.msg.get("graphs") or {}).get(st.shape.name)
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
            self._check_integrity()

    def _time_shape(self, st: ShapeState, plan: TimingPlan) -> ShapeTiming:
        tol = self._tolerance[st.shape.name]

        callees = self._callees(st)

        def fresh(seed: int) -> list[Any]:  # in the buffers' sizes, for a jagged spec (`conform`)
            drawn = make_inputs(self.spec, self.state.module, st.shape, seed, "spec", self.state.device)
            return conform(drawn, callees[-1].buffers)

        def check(pristine: list[Any], snap: list[Any]) -> str | None:
            return self._check_timed(st, pristine, snap, tol)

        def audit(buffers: list[Any]) -> list[Violation]:
            return self._audit(st, buffers)

        return time_shape(callees, self.state.timer, plan, fresh, copy_into, check, audit, self.torch)

    def finish(self) -> None:
        v, settings = self.verdict, self.settings
        v.timed = True
        # A torch.compile that failed here leaves eager as the best baseline (or, asked for by name, as
        # the fitness baseline), and the message says why; the pool decides whether that is the spec's
        # failure (every worker) or this worker's (a retry).
        wanted = settings["fitness_baseline"]
        fallback_reason = self.state.baseline_errors.get("compile" if wanted == "best" else wanted)
        against = v.score("eager" if fallback_reason and wanted == "compile" else wanted)
        profile = self.msg.get("profile")
        flags: list[str] = []
        if profile:
            fractions = []
            for s in v.shapes:
                cls = flop_class(self.spec.dtype, self.spec.precision)
                t_roof, bound = roofline(
                    s.bytes or 0, s.flops or 0, profile["bandwidth"], profile["flops"].get(cls)
                )
                s.roofline_s, s.bound = t_roof, bound
                if s.candidate:
                    s.roofline_fraction = t_roof / s.candidate.median_s
                    fractions.append((s.weight, t_roof, s.candidate.median_s))
                sheet_bw = profile.get("datasheet_bandwidth")
                if sheet_bw and s.candidate:
                    t_sheet, _ = roofline(
                        s.bytes or 0, s.flops or 0, sheet_bw, (profile.get("datasheet_flops") or {}).get(cls)
                    )
                    if s.candidate.median_s * float(settings["roofline_margin"]) < t_sheet:
                        flags.append(
                            f"shape {s.name}: {s.candidate.median_s * 1e6:.1f} us is faster than the datasheet roofline "
                            f"allows ({t_sheet * 1e6:.1f} us for {s.bytes} bytes, {s.flops} FLOPs)"
                        )
            if fractions:
                v.roofline_fraction = sum(w * t for w, t, _ in fractions) / sum(
                    w * c for w, _, c in fractions
                )
        limit = float(settings["suspicious_speedup"])
        for s in v.shapes:
            for label, value in (("eager", s.speedup_vs_eager), ("compile", s.speedup_vs_compile)):
                if value is not None and value > limit:
                    flags.append(f"shape {s.name}: {value:.1f}x faster than {label} (above {limit:g}x)")
        v.flags = flags
        if flags:
            v.status = Status.SUSPICIOUS
            v.fitness = 0.0
            v.message = "correct, but the speedup is implausible and needs review: " + "; ".join(flags)
        else:
            v.message = f"correct; {v.fitness:.2f}x vs {against}" + (
                f" (spread {v.spread:.1%})" if v.spread is not None else ""
            )
        if fallback_reason:
            v.message += f" (fitness vs eager: {fallback_reason})"

    # -- helpers -----------------------------------------------------------------------------------

    def sync(self) -> None:
        if self.state.device.type == "cuda":
            self.torch.cuda.synchronize(self.state.device)

    def _check_integrity(self) -> None:
        assert self.integrity is not None
        problems = self.integrity.check()
        if problems:
            raise Failed(Status.GUARD_VIOLATION, problems[0].message, problems)

    def _check_processes(self) -> None:
        spawned = set(descendants(os.getpid(), include_zombies=False)) - self.children_before
        if spawned:
            raise Failed(
                Status.GUARD_VIOLATION,
                f"the candidate started {len(spawned)} process(es) that outlived the call; candidates may not create processes",
                [Violation("processes", f"{len(spawned)} processes started")],
            )

    def _poison(self, like: list[Any]) -> None:
        """Fill freed allocator blocks of the outputs' sizes with NaN / a sentinel, so stale memory
        handed to the candidate by the allocator never holds a plausible answer. Blocks of large
        outputs are filled one at a time (the allocator keeps them)."""
        torch = self.torch
        blocks = []
        for o in like:
            for _ in range(2 if _nbytes(o) <= LARGE_OUTPUT_BYTES else 1):
                t = torch.empty(o.shape, dtype=o.dtype, device=self.state.device)
                t.fill_(float("nan") if o.is_floating_point() else -7)
                blocks.append(t)
        del blocks

    def _compare(
        self, outs: list[Any], refs: list[Any], tol: Any, st: ShapeState, result: ShapeResult
    ) -> tuple[str, str] | None:
        if len(outs) != len(refs):
            return "output-count", f"{len(outs)} outputs, expected {len(refs)}"
        n_out = len(refs) if st.grad_outputs is None else len(st.grad_outputs)
        for j, (o, r) in enumerate(zip(outs, refs, strict=True)):
            what = f"output {j}" if j < n_out else f"gradient {j - n_out}"
            cmp = compare(o, r, tol, what)
            result.max_abs_err = max(result.max_abs_err or 0.0, cmp.max_abs_err)
            result.max_rel_err = max(result.max_rel_err or 0.0, cmp.max_rel_err)
            result.rel_norm_err = max(result.rel_norm_err or 0.0, cmp.rel_norm_err)
            if not cmp.passed:
                return cmp.check or "values", cmp.message
        return None

    def _callees(self, st: ShapeState) -> list[Callee]:
        return [
            *baseline_callees(self.state, st),
            callee("candidate", self.models[st.shape.name], self.state, st),
        ]

    def _check_timed(self, st: ShapeState, pristine: list[Any], snap: list[Any], tol: Any) -> str | None:
        torch = self.torch
        ref_outs = forward_backward(
            st.reference, trainable_inputs(pristine, torch, self.spec.backward), st.grad_outputs, torch
        )
        scratch = ShapeResult(name=st.shape.name, weight=0)
        failure = self._compare(snap, ref_outs, tol, st, scratch)
        return None if failure is None else failure[1]

    def _recorders(self) -> tuple[OpRecorder, OpRecorder]:
        """Op recorders for the forward and the backward half: gradient accumulation by the autograd
        engine (`aten.add`) is allowed in the backward only."""
        allowed = set(self.spec.allow_torch_ops)
        return OpRecorder(allowed), OpRecorder(allowed | BACKWARD_GLUE)

    def _audit(self, st: ShapeState, buffers: list[Any]) -> list[Violation]:
        launches0 = self.state.launches.total()
        recorders = self._recorders()
        forward_backward(self.models[st.shape.name], buffers, st.grad_outputs, self.torch, *recorders)
        self.sync()
        out = [v for v in (r.violation() for r in recorders) if v]
        if self.state.launches.total() == launches0 and not self.uses_load_inline:
            out.append(Violation("no-launch", "a timed call launched no kernel of the candidate's"))
        return out

    def _call_fresh(self, st: ShapeState, seed: int) -> None:
        """The candidate's model at `st` once (and its backward, for a training spec), on fresh
        inputs of `seed`, to the end of its device work."""
        inputs = make_inputs(self.spec, self.state.module, st.shape, seed, "spec", self.state.device)
        torch = self.torch
        model = self.models[st.shape.name]
        forward_backward(model, trainable_inputs(inputs, torch, self.spec.backward), st.grad_outputs, torch)
        self.sync()

    def _profiled_kernels(self) -> bool:
        """For load_inline candidates (whose calls are not counted): did any device kernel run?"""
        if not self.uses_load_inline:
            return False
        if self.state.device.type != "cuda":
            self.verdict.method.notes.append("load_inline on CPU: launches are not counted")
            return True
        torch = self.torch
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            self._call_fresh(self.shapes[0], seed=3)
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
