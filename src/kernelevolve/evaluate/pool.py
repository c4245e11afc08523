"""The evaluator pool: static guards in the engine, then one fresh, already-prepared worker per candidate.

Start-up (python + torch + the device, ~4 s on a GPU machine; the reference outputs and the
torch.compile baseline on top) never sits on a candidate's critical path: the pool keeps `spares`
workers preparing ahead of need, and starts a replacement the moment one is taken. With `workers` > 1,
candidates are evaluated concurrently; their compile phases overlap while the device lease keeps their
first runs, correctness and timing phases one at a time per device.

`evaluate_one` returns a `Verdict` for anything a candidate does. It raises only for what is not the
candidate's fault and would fail every candidate: a bad spec (`SpecError`) or a harness that cannot
start (`HarnessError`).

Why one module (over 450 lines): the pool's rules on a verdict (retries in fresh workers, the
memory share raised once, a lost fitness baseline, spares kept ahead) all act on the same
worker handles under one lock; the worker process itself is `handle.py`'s.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kernelevolve import integrity
from kernelevolve.config import Settings
from kernelevolve.errors import HarnessError, SpecError
from kernelevolve.evaluate import compile_cache
from kernelevolve.evaluate.guards import StaticReport, check_source
from kernelevolve.evaluate.handle import Outcome, WorkerHandle
from kernelevolve.evaluate.references import PoolShare
from kernelevolve.evaluate.verdict import Method, Status, Verdict
from kernelevolve.platforms import Platform
from kernelevolve.spec import Spec
from kernelevolve.store.blobs import candidate_hash

Event = Callable[[str, str, Any], None]  # (event, candidate label, detail)


def gpu_shares(settings: Settings, platform: str) -> tuple[float, float] | None:
    """(first, most): the share of device memory each of a pool's worker processes may take on a GPU.
    A set `gpu_memory_fraction` is both. Else a worker first gets 0.9 / `device_share` of the device
    (the part a bench granted this run: `bench.schedule`) split over the pool's workers and spares;
    a spec that needs more (an evaluation out of memory under that cap) gets all of it, 0.9 /
    `device_share`, one evaluation at a time and no spare preparing beside it (the pool's `solo`):
    the memory plan's estimate is not a measurement, and level 1's 96_HuberLoss (T = 8 GiB, planned
    at 34 GiB a worker, two workers on an H100) ran out in every candidate at 32.7 GiB of its 35.6.
    None on the CPU. (Without spares a pool holds at most `workers` processes: a worker starts when
    one is needed.)"""
    if settings.gpu_memory_fraction is not None:
        return settings.gpu_memory_fraction, settings.gpu_memory_fraction
    if platform in ("cuda", "rocm"):
        share, workers = max(1, settings.device_share), max(1, settings.workers)
        first = round(0.9 / (share * (workers + max(0, settings.spares))), 3)
        return first, max(first, round(0.9 / share, 3))
    return None


def _under_the_cap(verdict: Verdict) -> bool:
    """An evaluation that ran out of device memory in torch's allocator, whose cap is the harness's
    share (a host OOM or a kill is another story)."""
    return verdict.status == Status.OOM and "OutOfMemoryError" in verdict.message


def _note_start_up(verdict: Verdict, waited: float, info: dict[str, Any]) -> None:
    """Where an evaluation's time went before its candidate ran, beside its phases: `worker_wait`,
    how long it waited for a prepared worker (part of its wall time); `worker_start`, how long that
    worker took from spawn to ready (mostly before, overlapping other evaluations); and the worker's
    own start-up steps (`start:device`, `start:spec`, `start:compile_baseline`,
    `start:reference_outputs`, of which `start:reference_outputs_wait` waited for the device's lease,
    `start:timer`). A search bound by the host shows it here."""
    verdict.phases["worker_wait"] = round(waited, 3)
    if info.get("start_s") is not None:
        verdict.phases["worker_start"] = float(info["start_s"])
    for step, seconds in (info.get("prepare_steps") or {}).items():
        verdict.phases[f"start:{step}"] = float(seconds)


class EvaluationAborted(Exception):
    """The pool was aborted (its run interrupted) while this evaluation waited or ran: no verdict."""


class EvaluatorPool:
    def __init__(
        self,
        spec: Spec,
        platform: Platform,
        settings: Settings,
        *,
        profile: dict[str, Any] | None = None,
        trusted_cache: Path | None = None,
        on_event: Event | None = None,
        static_guards: bool = True,
    ):
        self.spec = spec
        self.platform = platform
        self.settings = settings
        self.profile = profile
        self.trusted_cache = trusted_cache
        self.on_event = on_event or (lambda *a: None)
        self.static_guards = static_guards
        self._lock = threading.Lock()
        self._spares: list[WorkerHandle] = []
        self._busy: set[WorkerHandle] = set()  # evaluating a candidate now
        self._closed = False
        self._aborted = False
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, settings.workers), thread_name_prefix="kernelevolve-eval"
        )
        self.device_info: dict[str, Any] | None = None
        # Per shape, whether it is timed as CUDA graphs: the first timed verdict decides, and every
        # later candidate is timed the same way (see timing.py).
        self.graphs: dict[str, bool] = {}
        # The baselines prepared in some worker of this pool (shared by a run's device pools): once
        # the fitness baseline has worked, its failure in a later worker is that worker's, not the spec's.
        self.baselines_seen: set[str] = set()
        # The device memory share of each worker, raised once to `gpu_share_max` for a spec whose
        # evaluations run out of memory under the first (`gpu_shares`); from then on the pool is
        # `solo`: one evaluation at a time (`_slot`), no spare.
        shares = gpu_shares(settings, platform.name)
        self.gpu_share: float | None = shares[0] if shares else None
        self.gpu_share_max: float | None = shares[1] if shares else None
        self.solo = False
        self._slots = threading.Condition()
        self._running = 0  # evaluations holding a worker now
        # The hardware profile is measured again, once per pool, when a verdict's only flags are that
        # it is above the measured roofline: a peak measured low (a busy machine, an old profile) is
        # not believed over a kernel. The owner stores the new one (event "remeasured").
        self._profile_lock = threading.Lock()
        self._profile_remeasured = False
        self._profile_again: dict[str, Any] | None = None  # the re-measured profile, once there is one
        # The reference outputs the first worker to share them wrote, which later workers load
        self._references = PoolShare()

    # -- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> EvaluatorPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        integrity.check()  # a modified installed harness evaluates nothing
        with self._lock:
            self._top_up(self.settings.spares or 1)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
        self._executor.shutdown(wait=True, cancel_futures=True)
        for w in spares:
            w.close()
        self._references.remove()

    def abort(self) -> None:
        """Stop now (the run was interrupted): kill the workers evaluating candidates, whose
        evaluations raise `EvaluationAborted` rather than give a verdict, and the spares. Without
        this an interrupted run would wait for every evaluation in flight, up to its timeouts."""
        with self._lock:
            self._aborted = self._closed = True
            busy, spares, self._spares = list(self._busy), self._spares, []
        for w in busy:
            w.kill()
        for w in spares:
            w.close()

    def _new_worker(self) -> WorkerHandle:
        return WorkerHandle(
            platform=self.platform,
            settings=self.settings,
            spec_path=self.spec.path,
            precision=self.spec.precision,
            device_index=self.settings.device,
            gpu_memory_fraction=self.gpu_share,
            trusted_cache=self.trusted_cache if self.trusted_cache and self.trusted_cache.is_dir() else None,
            references=self._references.given,
            share_references=self.settings.share_references != "never",
        ).start()

    def _top_up(self, count: int) -> None:
        while not self._closed and len(self._spares) < count:
            self._spares.append(self._new_worker())

    def _take(self) -> WorkerHandle:
        """A prepared worker (waiting for one if needed), with a replacement started behind it."""
        with self._lock:
            if self._aborted:
                raise EvaluationAborted("the evaluator pool was aborted")
            if self._closed:
                raise HarnessError("the evaluator pool is closed")
            self._top_up(1)
            ready = [w for w in self._spares if w.ready]
            worker = ready[0] if ready else self._spares[0]
            self._spares.remove(worker)
            if not self.platform.exclusive:
                self._top_up(self._spare_count())
        try:
            info = worker.wait_ready()
        except BaseException:
            worker.close()
            raise
        self._save_trusted_cache(worker)
        self._references.take(worker.shared, worker.dir.name)
        self.device_info = info
        return worker

    def _release(self, worker: WorkerHandle) -> None:
        """End a worker's life. Where nothing may run beside a timing (the CPU), its replacement
        starts only now: even a spare's interpreter start-up would disturb the timing."""
        worker.close()
        if self.platform.exclusive:
            with self._lock:
                self._top_up(self._spare_count())

    def _spare_count(self) -> int:
        return 0 if self.solo else self.settings.spares

    @contextmanager
    def _slot(self) -> Iterator[None]:
        """Held while an evaluation has a worker: in a `solo` pool, only once no other holds it."""
        with self._slots:
            while self.solo and self._running:
                self._slots.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._slots:
                self._running -= 1
                self._slots.notify_all()

    def _save_trusted_cache(self, worker: WorkerHandle) -> None:
        """The first prepared worker's compile cache, taken before it sees any candidate; from later
        ones, the Triton kernels they compiled that it lacks (`compile_cache.merge_new`)."""
        target = self.trusted_cache
        if target is None or not worker.inductor_cache.is_dir():
            return
        if target.is_dir():
            compile_cache.merge_new(worker.inductor_cache / "triton", target / "triton")
            return
        tmp = target.with_name(target.name + f".tmp{time.monotonic_ns()}")
        try:
            shutil.copytree(worker.inductor_cache, tmp, symlinks=True)
            tmp.rename(target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- evaluation --------------------------------------------------------------------------------

    def submit(self, source: str, label: str = "candidate.py", **options: Any) -> Future[Verdict]:
        return self._executor.submit(self.evaluate_one, source, label, **options)

    def evaluate_many(self, items: Iterable[tuple[str, str]]) -> Iterator[Verdict]:
        """(source, label) pairs in; verdicts out, in submission order."""
        futures = [self.submit(src, label) for src, label in items]
        for f in futures:
            yield f.result()

    def evaluate_one(
        self,
        source: str,
        label: str = "candidate.py",
        *,
        shapes: list[str] | None = None,
        timing_budget_s: float | None = None,
        timing_precision: float | None = None,
    ) -> Verdict:
        """The verdict on one candidate. `shapes` narrows it to those spec shapes,
        `timing_budget_s` shortens the timing (a quick run while a candidate is being written), and
        `timing_precision` overrides the settings' (the search's evaluations: `Platform.search_precision`)."""
        unknown = sorted(set(shapes or ()) - set(self.spec.names))
        if unknown:
            raise SpecError(
                f"{self.spec.name} has no shape {', '.join(map(repr, unknown))}",
                hint="shapes: " + ", ".join(self.spec.names),
            )
        digest = candidate_hash(source)
        self.on_event("start", label, None)
        base = {"candidate": label, "candidate_hash": digest, "spec": self.spec.name,
                "spec_fingerprint": self.spec.fingerprint, "platform": self.platform.name}  # fmt: skip
        report = self._static(source)
        kind = _primary_kind(report, self.platform)
        if report.syntax_error:
            verdict = Verdict.failure(Status.COMPILE_ERROR, f"syntax error: {report.syntax_error}", **base)
        elif report.violations:
            first = report.violations[0]
            more = f" (and {len(report.violations) - 1} more)" if len(report.violations) > 1 else ""
            verdict = Verdict.failure(
                Status.GUARD_VIOLATION,
                f"{first}{more}",
                violations=report.violations,
                candidate_kind=kind,
                **base,
            )
        else:
            options = {"shapes": shapes, "timing_budget_s": timing_budget_s,
                       "timing_precision": timing_precision}  # fmt: skip
            verdict = self._run(source, digest, kind, label, base, options)
        verdict.method = verdict.method if verdict.method.device else self._method()
        verdict.method.device_index = self.settings.device
        self.on_event("done", label, verdict)
        return verdict

    def _static(self, source: str) -> StaticReport:
        report = static_report(source, self.spec, self.platform)
        if not self.static_guards and report.syntax_error is None:
            report.violations = []
            report.kinds = report.kinds or set(self.platform.kinds)
        return report

    def _run(
        self,
        source: str,
        digest: str,
        kind: str | None,
        label: str,
        base: dict[str, Any],
        options: dict[str, Any],
    ) -> Verdict:
        retries = 0
        while True:
            profile = self.profile
            with self._slot():
                outcome, waited, share, info = self._in_a_worker(
                    source, digest, kind, label, profile, options
                )
            if self._aborted:  # killed by `abort`: what it reported is not the candidate's verdict
                raise EvaluationAborted("the evaluator pool was aborted")
            verdict = self._verdict_from(outcome, base, kind)
            _note_start_up(verdict, waited, info)
            self.baselines_seen.update(verdict.method.baselines)
            if share is not None and _under_the_cap(verdict):
                if self._raise_share(share) and not self._closed:
                    # The harness's cap, not the device, was short: the same candidate again, with the
                    # larger share (not counted as a retry; it happens once per pool).
                    self.on_event("retry", label, self._share_text(share, "out of memory under") +
                                  f"; retrying with {self.gpu_share:.1%}")  # fmt: skip
                    continue
                verdict.message += f" ({self._share_text(share, 'under')}, {self._share_remedy()})"
            if _above_measured_roofline_only(verdict) and not self._closed:
                if self._remeasure_profile(profile):  # the ceilings changed: judged again against them
                    self.on_event("retry", label, "above the measured roofline; the hardware profile was "
                                  "measured again, evaluating again against it")  # fmt: skip
                    continue
                if profile is not None and profile is self._profile_again:  # judged by the new one
                    verdict.message += (
                        " (the hardware profile, measured again in this run, still puts it above)"
                    )
            lost = self._lost_fitness_baseline(verdict)
            if killed_from_outside(outcome):
                # Someone else's kill (an operator, a node's OOM killer reaping the biggest process) is
                # not the candidate's doing; a death that repeats in a fresh worker is.
                reason = f"{outcome.detail} during phase {outcome.phase}"
            elif lost:
                reason = f"{lost} though it worked in earlier ones"
            else:
                break
            if retries >= self.settings.eval_retries or self._closed:
                break
            retries += 1
            self.on_event("retry", label, f"{reason}; retrying in a fresh worker")
        if lost:
            # Its fitness fell back to eager (the message already says why), which would not compare
            # with the run's other verdicts: correct and measured, but not ranked.
            verdict.method.fitness_baseline = self.settings.fitness_baseline
            verdict.fitness = 0.0
            verdict.message += (
                "; not ranked: compile worked in earlier workers of this run, so a fitness vs eager alone "
                "would not compare" + (f" (the same in {retries + 1} fresh workers)" if retries else "")
            )
        elif retries and not verdict.ok:
            verdict.message += f" (the same in {retries + 1} fresh workers)"
        return verdict

    def _in_a_worker(
        self,
        source: str,
        digest: str,
        kind: str | None,
        label: str,
        profile: dict[str, Any] | None,
        options: dict[str, Any],
    ) -> tuple[Outcome, float, float | None, dict[str, Any]]:
        """One evaluation in a prepared worker, which ends with it: (its outcome, how long the wait
        for the worker took, the memory share it had, the worker's start-up info)."""
        asked = time.monotonic()
        try:
            worker = self._take()
        except BaseException as exc:  # a spare killed while it was awaited, say
            if self._aborted:
                raise EvaluationAborted("the evaluator pool was aborted") from exc
            raise
        waited = time.monotonic() - asked
        share = self.gpu_share
        with self._lock:
            self._busy.add(worker)
        try:
            outcome = worker.run_job(
                "evaluate",
                {
                    "source": source,
                    "candidate_hash": digest,
                    "kind": kind,
                    "uses_load_inline": "load_inline" in source,
                    "profile": profile,
                    "graphs": dict(self.graphs),
                    "gpu_memory_fraction": share,  # a spare prepared under a smaller one
                    **{k: v for k, v in options.items() if v is not None},
                },
                on_phase=lambda phase: self.on_event("phase", label, phase),
            )
        finally:
            with self._lock:
                self._busy.discard(worker)
            self._release(worker)
        return outcome, waited, share, worker.info or {}

    def _remeasure_profile(self, used: dict[str, Any] | None) -> bool:
        """Measure the hardware profile again (once per pool, in a trusted worker under the device's
        lease); True when the profile now differs from `used`, the one a verdict was judged by."""
        with self._profile_lock:
            if not self._profile_remeasured:
                self._profile_remeasured = True
                try:
                    self.profile = self._profile_again = measure_profile(self.platform, self.settings)
                except HarnessError as exc:
                    self.on_event("note", "hardware profile", f"measuring it again failed: {exc.message}")
                    return False
                self.on_event("remeasured", "hardware profile", self.profile)
            return self.profile is not used

    def _raise_share(self, used: float) -> bool:
        """Give workers the larger memory share, if `used` was below it: True when it is larger now
        (another evaluation may have raised it already). The pool is `solo` from then on: the spares
        prepared under the smaller share are closed (they hold its start-up's memory) and none is
        started again, and evaluations take the device's share one at a time (`_slot`)."""
        with self._lock:
            if self.gpu_share_max is None or used >= self.gpu_share_max:
                return False
            self.gpu_share = max(self.gpu_share or 0.0, self.gpu_share_max)
            self.solo = True
            spares, self._spares = self._spares, []
        for w in spares:
            w.close()
        return True

    def _share_text(self, share: float, what: str) -> str:
        return f"{what} the harness's memory cap of {share:.1%} of the device per worker"

    def _share_remedy(self) -> str:
        s = self.settings
        if s.gpu_memory_fraction is not None:
            return "the `gpu_memory_fraction` setting; if the reference needs about as much, raise it"
        if s.device_share > 1:
            return (
                "all of the part of the device this bench run was granted, one evaluation at a time; if "
                "the reference needs about as much, run it with `--per-device 1`, smaller shapes or more memory"
            )
        return (
            "all of the device's usable memory, one evaluation at a time; if the reference needs about "
            "as much, use smaller shapes in KERNELEVOLVE['shapes'] or a device with more memory"
        )

    def _lost_fitness_baseline(self, verdict: Verdict) -> str | None:
        """Why a timed verdict's fitness baseline failed in its worker, when it has worked in another
        worker of this run; None otherwise (a spec torch.compile cannot compile falls back to eager
        in every worker, consistently)."""
        name = "compile" if self.settings.fitness_baseline == "best" else self.settings.fitness_baseline
        error = verdict.method.baseline_errors.get(name)
        return error if verdict.timed and error and name in self.baselines_seen else None

    def _verdict_from(self, outcome: Outcome, base: dict[str, Any], kind: str | None) -> Verdict:
        verdict = self._outcome_verdict(outcome, base, kind)
        verdict.method.harness = integrity.harness().label
        return verdict

    def _outcome_verdict(self, outcome: Outcome, base: dict[str, Any], kind: str | None) -> Verdict:
        s = self.settings
        if outcome.kind == "result" and outcome.message and "verdict" in outcome.message:
            verdict = Verdict.from_dict(outcome.message["verdict"])
            verdict.candidate, verdict.candidate_hash = base["candidate"], base["candidate_hash"]
            if verdict.timed:
                with self._lock:
                    for shape in verdict.shapes:
                        if shape.candidate is not None:
                            self.graphs.setdefault(shape.name, shape.cuda_graphs)
            return verdict
        if outcome.kind == "timeout":
            limit = s.compile_timeout_s if outcome.phase in ("start", "compile") else s.run_timeout_s
            what = "compiling" if outcome.phase in ("start", "compile") else "running"
            message = (
                f"timed out while {what} (phase {outcome.phase}, limit {limit:.0f} s); the worker was killed"
            )
            if kind in self.platform.kinds - self.platform.timed_kinds:
                message += (
                    f" ({self.platform.untimed_reason(kind)}: interpreted code is orders of magnitude slower; "
                    "check it at smaller shapes)"
                )
            return Verdict.failure(
                Status.TIMEOUT, message, candidate_kind=kind, log_tail=outcome.log_tail, **base
            )
        if outcome.kind == "crash":
            status = Status.OOM if "SIGKILL" in outcome.detail else Status.CRASH
            if "CPU-time" in outcome.detail:
                status = Status.TIMEOUT
            message = f"{outcome.detail} during phase {outcome.phase}"
            return Verdict.failure(status, message, candidate_kind=kind, log_tail=outcome.log_tail, **base)
        detail = (outcome.message or {}).get("message", "no message")
        return Verdict.failure(
            Status.RUNTIME_ERROR,
            f"the harness failed while running the candidate (phase {outcome.phase}): {detail}",
            candidate_kind=kind,
            log_tail=((outcome.message or {}).get("traceback") or outcome.log_tail)[-3000:],
            **base,
        )

    def _method(self) -> Method:
        info = self.device_info or {}
        versions = info.get("versions", {})
        return Method(
            platform=info.get("target", self.platform.name),
            device=info.get("device", ""),
            driver=versions.get("driver"),
            torch=versions.get("torch"),
            triton=versions.get("triton"),
            python=versions.get("python"),
            kernelevolve=info.get("kernelevolve"),
            precision_policy=self.spec.precision,
            fitness_baseline=self.settings.fitness_baseline,
        )

    # -- jobs without a candidate ------------------------------------------------------------------

    def run_trusted(self, op: str) -> dict[str, Any]:
        """`baselines` or `profile` in a prepared worker that never sees a candidate."""
        worker = self._take()
        try:
            outcome = worker.run_job(op, {})
        finally:
            self._release(worker)
        if outcome.kind != "result" or outcome.message is None:
            detail = (outcome.message or {}).get("message") or outcome.detail
            raise HarnessError(
                f"the {op} job failed ({outcome.kind}): {detail}", hint=outcome.log_tail[-1500:]
            )
        return outcome.message


def killed_from_outside(outcome: Outcome) -> bool:
    """A worker ended by a signal that only another process sends (the candidate's own faults are
    SIGSEGV, SIGABRT, exits and timeouts)."""
    return outcome.kind == "crash" and outcome.returncode in (
        -signal.SIGKILL,
        -signal.SIGTERM,
        -signal.SIGHUP,
    )


def static_report(source: str, spec: Spec, platform: Platform) -> StaticReport:
    """The static guards as the pool applies them: the platform's kernels, the spec's allowances."""
    return check_source(
        source,
        accepted_kinds=platform.kinds,
        platform=platform.name,
        allow_imports=spec.allow_imports,
        allow_torch_ops=spec.allow_torch_ops,
    )


def _primary_kind(report: StaticReport, platform: Platform) -> str | None:
    kinds = report.kinds & set(platform.kinds)
    untimed = kinds - set(platform.timed_kinds)
    if untimed:
        return sorted(untimed)[0]
    return sorted(kinds)[0] if kinds else (sorted(report.kinds)[0] if report.kinds else None)


def _above_measured_roofline_only(verdict: Verdict) -> bool:
    """Whether the verdict's flags are all that a shape is above the measured roofline."""
    from kernelevolve.evaluate.scoring import MEASURED_ROOFLINE

    return bool(verdict.flags) and all(MEASURED_ROOFLINE in flag for flag in verdict.flags)


def measure_profile(platform: Platform, settings: Settings) -> dict[str, Any]:
    """Measure the hardware profile in a trusted worker (no spec, no candidate)."""
    handle = WorkerHandle(platform=platform, settings=settings, spec_path=None, precision="strict_fp32",
                          device_index=settings.device).start()  # fmt: skip
    try:
        handle.wait_ready()
        outcome = handle.run_job("profile", {})
    finally:
        handle.close()
    if outcome.kind != "result" or outcome.message is None or "profile" not in outcome.message:
        detail = (outcome.message or {}).get("message") or outcome.detail
        raise HarnessError(
            f"measuring the hardware profile failed ({outcome.kind}): {detail}", hint=outcome.log_tail[-1500:]
        )
    return dict(outcome.message["profile"])
