"""The Ray executor: a search's candidates evaluated on a Ray cluster (the `ray` extra).

    kernelevolve optimize SPEC --executor ray --ray-address auto

The engine does not change. It opens an evaluator (`RayEvaluator`, through `open_evaluator`) and asks
it for verdicts from several threads; the evaluator sends each candidate to a Ray actor and hands the
actor's verdict back. The verdicts are the same values a local run gives, because each actor runs the
same harness: an `EvalActor` owns a local `EvaluatorPool` on the node Ray placed it on, with its own
prepared spare worker, its own compile caches and its own device lease. Candidates are still judged by
fresh, sandboxed worker processes; Ray only decides on which node they start.

How it fits together:

- **Connecting.** `ray.init(address=ray_address or None)`: "auto" (or "ray://head:10001") joins a
  running cluster, an empty address starts a local one for this process. A connection that is already
  open (a notebook, a test) is reused and left open; one this module opened is shut down when the
  evaluator closes.
- **Actors.** One per GPU on the cuda and rocm platforms (`num_gpus=1`: Ray sets CUDA_VISIBLE_DEVICES,
  so the actor's pool uses device 0, and its two workers compile one candidate while the other is
  timed), one worker per actor on the CPU (`num_cpus=1`; timings there tolerate nothing beside them).
  `ceil(workers / workers per actor)` actors, at most as many as the cluster has GPUs (or CPUs): an
  actor Ray cannot place would wait forever. A cluster without a GPU is refused at once for a GPU
  platform.
- **The spec.** Each actor gets the spec file's text, writes it into its own temporary directory and
  loads it there, and refuses to start if its fingerprint differs from the engine's (another torch
  version on that node, say). The spec must therefore be self-contained: a spec that imports a file
  beside it works locally but not on a cluster node. kernelevolve itself (with torch and a compiler)
  must be installed on every node.
- **Routing.** A candidate goes to the actor with the fewest candidates in flight.
- **Faults.** A candidate's own failure is a verdict inside the actor, never an error here. An actor
  that dies (killed, its node lost) is replaced by a fresh one and the candidate is sent again, once
  (a `retry` event); a second death is the candidate's verdict, `crash`. Errors that are no
  candidate's fault (a bad spec, a harness that cannot start, a cluster with no room) are raised as
  the local pool raises them.

The static guards run inside the actor's pool, like everything else about a verdict. Phase events
(compile, correctness, timing) stay on the node; the engine sees `start`, `retry` and `done`.

Why one module (over 450 lines): the actor (`EvalActor`, on the cluster) and the evaluator that
talks to it (`RayEvaluator`, in the engine) share one request format and the placement rules; it is
imported only with the `ray` extra.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from kernelevolve.config import Settings
from kernelevolve.errors import HarnessError, KernelevolveError, SpecError, WorkspaceError
from kernelevolve.evaluate.executors import Executor, LeastLoaded, Request
from kernelevolve.evaluate.pool import EvaluationAborted, EvaluatorPool
from kernelevolve.evaluate.verdict import Status, Verdict
from kernelevolve.platforms import Platform, get_platform
from kernelevolve.spec import load_spec
from kernelevolve.store.blobs import candidate_hash

try:
    import ray
    import ray.exceptions
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this is tested
    raise WorkspaceError("the ray executor needs Ray", hint='pip install "kernelevolve[ray]"') from exc

GPU_PLATFORMS = ("cuda", "rocm")

# An actor that is gone, or cannot be reached: not the candidate's doing (on its own).
ACTOR_LOST: tuple[type[BaseException], ...] = tuple(
    getattr(ray.exceptions, name)
    for name in ("RayActorError", "NodeDiedError", "ObjectLostError", "WorkerCrashedError")
    if hasattr(ray.exceptions, name)
)


def workers_per_actor(platform: str) -> int:
    """Candidates one actor evaluates at once: two per GPU (one compiles while the other is timed),
    one on the CPU."""
    return 2 if platform in GPU_PLATFORMS else 1


# -- the actor (runs on a cluster node) ------------------------------------------------------------


class EvalActor:
    """One node's share of the work: a local `EvaluatorPool` for one spec, on the device Ray gave it.

    Created through Ray (`ray.remote(EvalActor)`), never by the engine directly. An error that is no
    candidate's fault is kept and raised by `ready` and `evaluate`, so the engine gets it as the
    project's own exception (a `SpecError` stays a `SpecError`)."""

    def __init__(
        self,
        spec_source: str,
        spec_file: str,
        fingerprint: str,
        platform: str,
        settings: dict[str, Any],
        profile: dict[str, Any] | None,
        workers: int,
    ):
        self.dir = Path(tempfile.mkdtemp(prefix="kernelevolve-ray-"))
        self.pool: EvaluatorPool | None = None
        self.error: KernelevolveError | None = None
        self.where = f"Ray node {ray.util.get_node_ip_address()}"
        try:
            self.pool = self._open(spec_source, spec_file, fingerprint, platform, settings, profile, workers)
        except KernelevolveError as exc:
            self.error = exc

    def _open(
        self,
        spec_source: str,
        spec_file: str,
        fingerprint: str,
        platform_name: str,
        settings: dict[str, Any],
        profile: dict[str, Any] | None,
        workers: int,
    ) -> EvaluatorPool:
        path = self.dir / "spec" / Path(spec_file).name  # the same name: a spec's default name is its stem
        path.parent.mkdir()
        path.write_text(spec_source)
        spec = load_spec(path)
        if spec.fingerprint != fingerprint:
            raise SpecError(
                f"{spec_file} has fingerprint {spec.fingerprint} on {self.where}, not the engine's "
                f"{fingerprint}: the same file defines another problem there",
                hint="install the same torch and kernelevolve versions on every node, and keep the spec "
                "self-contained (no imports of files beside it)",
            )
        platform = get_platform(platform_name)
        _restore_thread_count()
        gpus = [str(g) for g in ray.get_gpu_ids()] if platform_name in GPU_PLATFORMS else []
        if gpus:
            self.where += f", GPU {','.join(gpus)}"
        if gpus and not platform.physical_lease_keys:
            # Every actor's device is its index 0; where leases are named by index (ROCm), actors on
            # one node would share one lease across different GPUs. Each GPU gets its own directory.
            from kernelevolve.evaluate.lease import lease_dir

            own = lease_dir() / f"ray-gpu{'-'.join(gpus)}"
            own.mkdir(parents=True, exist_ok=True)
            os.environ["KERNELEVOLVE_LEASE_DIR"] = str(own)
        known = {f.name for f in dataclasses.fields(Settings)}
        fields = {k: v for k, v in settings.items() if k in known and k != "workspace"}
        local = Settings(**{
            **fields, "workspace": self.dir / "workspace", "executor": "local", "devices": "0",
            "device": 0, "workers": workers, "spares": 1,
        }).validate()  # fmt: skip
        pool = EvaluatorPool(
            spec, platform, local, profile=profile, trusted_cache=self.dir / "compile" / "inductor"
        )
        pool.start()
        return pool

    def ready(self) -> str:
        """Where this actor runs; raises the error that kept it from opening its pool."""
        if self.error is not None:
            raise self.error
        return self.where

    def evaluate(
        self, source: str, label: str, shapes: list[str] | None, timing: dict[str, float | None]
    ) -> dict[str, Any]:
        """`timing`: `timing_budget_s` and `timing_precision`, as `EvaluatorPool.evaluate_one` takes them."""
        if self.error is not None:
            raise self.error
        assert self.pool is not None
        verdict = self.pool.evaluate_one(source, label, shapes=shapes, **timing)
        verdict.method.notes.append(f"evaluated on {self.where}")
        return verdict.to_dict()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        shutil.rmtree(self.dir, ignore_errors=True)


def _restore_thread_count() -> None:
    """Ray sets OMP_NUM_THREADS to the actor's `num_cpus` (1) where the node did not set it. The
    pool's workers inherit this process's environment, and torch's eager baseline would then run on
    one thread where a local run uses every core: undo what Ray alone set."""
    try:
        initial = Path("/proc/self/environ").read_bytes().split(b"\0")
    except OSError:
        return
    if not any(v.startswith(b"OMP_NUM_THREADS=") for v in initial):
        os.environ.pop("OMP_NUM_THREADS", None)


_RemoteEvalActor: Any = ray.remote(EvalActor)


# -- the connection --------------------------------------------------------------------------------


class _Connection:
    """Whether this module opened Ray's connection (then it closes it too), and how many evaluators
    use it now."""

    lock = threading.Lock()
    owned = False
    users = 0


def connect(address: str, use: bool = False) -> None:
    """Connect to Ray unless this process already is: `address` as ray.init takes it ("auto",
    "ray://host:10001"), empty for a local cluster of this process. `use`: count one more user of the
    connection, until `_release_connection`."""
    with _Connection.lock:
        _Connection.users += int(use)
        if ray.is_initialized():
            return
        options: dict[str, Any] = {"log_to_driver": False}  # actors' output would mix with ours
        if not address:
            options["include_dashboard"] = False
        try:
            ray.init(address=address or None, **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            _Connection.users -= int(use)
            raise HarnessError(
                f"cannot connect to the Ray cluster at {address or '(a new local cluster)'}: {exc}",
                hint="start one with `ray start --head` (then --ray-address auto), or leave ray_address "
                "empty for a local cluster",
            ) from exc
        _Connection.owned = True


def _release_connection() -> None:
    with _Connection.lock:
        _Connection.users -= 1
        if _Connection.owned and _Connection.users == 0:
            _Connection.owned = False
            ray.shutdown()


def ray_slots(settings: Settings, platform: Platform) -> int:
    """Candidates in flight when `workers` is 0 (auto): two per GPU of the cluster on a GPU platform,
    one on the CPU platform."""
    if settings.workers:
        return settings.workers
    if platform.name not in GPU_PLATFORMS:
        return 1
    connect(settings.ray_address)
    return workers_per_actor(platform.name) * _cluster_gpus(platform.name)


def _cluster_gpus(platform: str) -> int:
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus < 1:
        raise HarnessError(
            f"the Ray cluster has no GPU, and the {platform} platform evaluates each candidate on one",
            hint="start the cluster's GPU nodes (`ray start --num-gpus N` on each), or use --platform cpu",
        )
    return gpus


# -- the evaluator (in the engine's process) -------------------------------------------------------


class RayEvaluator:
    """The engine's evaluator on a Ray cluster: verdicts from `EvalActor`s, one `with` block long."""

    def __init__(self, request: Request):
        self.request = request
        self.actors: list[Any] = []  # Ray actor handles; a replaced actor takes its slot
        self._load = LeastLoaded()
        self._lock = threading.Lock()  # guards `actors` while one is replaced
        self._connected = False
        self._aborted = False
        s = request.settings
        self.per_actor = workers_per_actor(request.platform.name)
        if s.workers:
            self.per_actor = min(self.per_actor, s.workers)
        self.ready_timeout_s = s.prepare_timeout_s

    # -- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> RayEvaluator:
        s, platform = self.request.settings, self.request.platform
        connect(s.ray_address, use=True)
        self._connected = True
        try:
            wanted = max(1, math.ceil((s.workers or ray_slots(s, platform)) / self.per_actor))
            if platform.name in GPU_PLATFORMS:
                count = min(wanted, _cluster_gpus(platform.name))
            else:
                count = min(wanted, max(1, int(ray.cluster_resources().get("CPU", 1))))
            self.actors = [self._new_actor() for _ in range(count)]
            self._load.reset(count)
            self._wait_ready(self.actors)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        actors, self.actors = self.actors, []
        self._load.reset(0)  # from now on, a request is told the evaluator is closed
        if actors:
            try:
                ray.get([a.close.remote() for a in actors], timeout=60)
            except Exception:  # closing is best effort: a dead actor has nothing left to close
                pass
            for actor in actors:
                _kill(actor)
        if self._connected:
            self._connected = False
            _release_connection()

    def abort(self) -> None:
        """Stop now: kill the actors; their evaluations in flight raise `EvaluationAborted`."""
        self._aborted = True
        with self._lock:
            actors = list(self.actors)
        for actor in actors:
            _kill(actor)

    def _new_actor(self) -> Any:
        r = self.request
        options: dict[str, Any] = {"max_concurrency": self.per_actor + 2, "max_restarts": 0}
        if r.platform.name in GPU_PLATFORMS:
            options["num_gpus"] = 1
        else:
            options.update(num_cpus=1, num_gpus=0, scheduling_strategy="SPREAD")
        settings = {k: v for k, v in r.settings.to_dict().items() if k != "workspace"}
        return _RemoteEvalActor.options(**options).remote(
            r.spec.source, r.spec.path.name, r.spec.fingerprint, r.platform.name, settings, r.profile,
            self.per_actor,
        )  # fmt: skip

    def _wait_ready(self, actors: list[Any]) -> None:
        """Every actor placed and its pool open, or a `HarnessError` (never a wait without end for
        resources the cluster does not have)."""
        refs = [a.ready.remote() for a in actors]
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=self.ready_timeout_s)
        if pending:
            raise HarnessError(
                f"Ray placed {len(done)} of {len(refs)} evaluation actors within {self.ready_timeout_s:.0f} s",
                hint=f"the cluster has {_resources(ray.cluster_resources())}, "
                f"{_resources(ray.available_resources())} free; lower --workers, or free the cluster",
            )
        for ref in refs:
            try:
                ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                _raise_cause(exc)
            except ACTOR_LOST as exc:
                raise HarnessError(
                    f"a Ray evaluation actor could not start: {_last_lines(exc)}",
                    hint="kernelevolve (with torch) must be installed on every node of the cluster",
                ) from exc

    # -- evaluation --------------------------------------------------------------------------------

    def evaluate_one(
        self,
        source: str,
        label: str = "candidate.py",
        *,
        shapes: list[str] | None = None,
        timing_budget_s: float | None = None,
        timing_precision: float | None = None,
    ) -> Verdict:
        self._event("start", label, None)
        slot = self._load.take()  # a HarnessError once the evaluator is closed
        timing = {"timing_budget_s": timing_budget_s, "timing_precision": timing_precision}
        try:
            verdict = self._evaluate(slot, source, label, shapes, timing)
        finally:
            self._load.give(slot)
        self._event("done", label, verdict)
        return verdict

    def _evaluate(
        self, slot: int, source: str, label: str, shapes: list[str] | None, timing: dict[str, float | None]
    ) -> Verdict:
        actor = self.actors[slot]
        try:
            return self._call(actor, source, label, shapes, timing)
        except ACTOR_LOST as exc:
            if self._aborted:
                raise EvaluationAborted("the Ray evaluator was aborted") from exc
            first = exc
        self._event(
            "retry", label, f"the Ray actor was lost ({_last_lines(first)}); retrying on a fresh actor"
        )
        actor = self._replace(slot, actor)
        try:
            return self._call(actor, source, label, shapes, timing)
        except ACTOR_LOST as exc:
            r = self.request
            return Verdict.failure(
                Status.CRASH,
                f"the Ray actor died twice while evaluating this candidate, on two fresh actors: "
                f"{_last_lines(exc)}",
                candidate=label, candidate_hash=candidate_hash(source), spec=r.spec.name,
                spec_fingerprint=r.spec.fingerprint, platform=r.platform.name,
            )  # fmt: skip

    def _call(
        self, actor: Any, source: str, label: str, shapes: list[str] | None, timing: dict[str, float | None]
    ) -> Verdict:
        try:
            return Verdict.from_dict(ray.get(actor.evaluate.remote(source, label, shapes, timing)))
        except ray.exceptions.RayTaskError as exc:
            _raise_cause(exc)
            raise  # unreachable: _raise_cause always raises

    def _replace(self, slot: int, dead: Any) -> Any:
        """A fresh actor in `slot` (once, however many requests saw `dead` die), started and ready."""
        with self._lock:
            if slot < len(self.actors) and self.actors[slot] is dead:
                _kill(dead)
                self.actors[slot] = self._new_actor()
            fresh = self.actors[slot]
        self._wait_ready([fresh])
        return fresh

    def _event(self, event: str, label: str, detail: Any) -> None:
        if self.request.on_event is not None:
            self.request.on_event(event, label, detail)

    def in_flight(self) -> list[int]:
        """Evaluations in flight per actor."""
        return self._load.counts()


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone
        pass


def _raise_cause(exc: Any) -> None:
    """The project's own exception raised in an actor, as itself; anything else as a HarnessError."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, KernelevolveError):
        raise cause from None
    raise HarnessError(f"a Ray evaluation actor failed: {_last_lines(exc)}") from exc


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _last_lines(exc: BaseException, count: int = 3) -> str:
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()]
    return " | ".join(lines[-count:])[-600:] or type(exc).__name__


def _resources(res: dict[str, float]) -> str:
    return ", ".join(f"{res.get(k, 0):g} {k}" for k in ("GPU", "CPU"))


# Named by the entry point `ray` of the group `kernelevolve.executors` (pyproject.toml).
RAY = Executor(build=RayEvaluator, slots=ray_slots)
