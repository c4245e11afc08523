"""Executors: where a search's candidates are evaluated. The engine asks one object for verdicts
(`evaluate_one`, from several threads at once) and never learns which executor answers.

- `local` (the default): worker processes on this machine. With one device it is an `EvaluatorPool`;
  with several (`devices = "auto"` on a multi-GPU machine, or "0,1"), one pool per device, each
  candidate sent to the device with the fewest evaluations in flight. Each device's workers have their
  own compile caches and the device's lease, so two timings never share a GPU.
- `ray`: evaluation requests sent to actors on a Ray cluster (`kernelevolve.evaluate.ray_executor`,
  the `ray` extra), one per GPU (`num_gpus=1`). Each actor runs the same pool on the node Ray placed
  it on; the verdicts are the same values.

Executors register by name: a package names an `Executor` under the entry-point group
`kernelevolve.executors` (as platforms and model providers do: one file and one line of its
pyproject.toml), loaded when a search asks for that name; a test registers one with
`register_executor`. This module imports no executor but its own (`local`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from kernelevolve.config import Settings, parse_devices
from kernelevolve.errors import HarnessError, WorkspaceError
from kernelevolve.evaluate.pool import EvaluatorPool, Event
from kernelevolve.evaluate.verdict import Verdict
from kernelevolve.platforms import Platform
from kernelevolve.spec import Spec


class Evaluator(Protocol):
    """What the engine needs of an executor: verdicts, concurrently, inside a `with` block."""

    def __enter__(self) -> Evaluator: ...

    def __exit__(self, *exc: object) -> None: ...

    def abort(self) -> None:
        """Stop now: evaluations in flight raise `EvaluationAborted` instead of giving verdicts.
        Optional: the engine waits for the evaluations of an executor without it."""

    def evaluate_one(
        self,
        source: str,
        label: str = "candidate.py",
        *,
        shapes: list[str] | None = None,
        timing_budget_s: float | None = None,
        timing_precision: float | None = None,
    ) -> Verdict: ...


@dataclass
class Request:
    """Everything an executor is built from: one spec's evaluations on one platform."""

    spec: Spec
    platform: Platform
    settings: Settings
    profile: dict[str, Any] | None = None
    trusted_cache: Path | None = None  # the torch.compile cache of workers that saw no candidate
    on_event: Event | None = None


@dataclass(frozen=True)
class Executor:
    """A registered executor: how to build it, and how many candidates it evaluates at once when
    `workers` is 0 (auto): what sizes the engine's expansions in flight."""

    build: Callable[[Request], Evaluator]
    slots: Callable[[Settings, Platform], int]


EXECUTORS: dict[str, Executor] = {}
GROUP = "kernelevolve.executors"
# The built-ins' entry points, for a source tree that was never installed (pyproject.toml names them).
BUILTIN = {"ray": "kernelevolve.evaluate.ray_executor:RAY"}


def register_executor(name: str, executor: Executor) -> None:
    EXECUTORS[name] = executor


def _advertised() -> dict[str, str]:
    """Executor names to their entry points ("module:attribute"), the installed ones over the built-ins."""
    from importlib.metadata import entry_points

    return {**BUILTIN, **{ep.name: ep.value for ep in entry_points(group=GROUP)}}


def get_executor(name: str) -> Executor:
    if name not in EXECUTORS:
        target = _advertised().get(name)
        if target is None:
            raise WorkspaceError(
                f"unknown executor {name!r}",
                hint="executors: " + ", ".join(sorted({*EXECUTORS, *_advertised()})),
            )
        import importlib

        module, _, attribute = target.partition(":")
        register_executor(name, getattr(importlib.import_module(module), attribute))  # Ray: the extra
    return EXECUTORS[name]


def open_evaluator(request: Request) -> Evaluator:
    """The evaluator of `request.settings.executor`, not yet started (use it in a `with` block)."""
    return get_executor(request.settings.executor).build(request)


def executor_slots(settings: Settings, platform: Platform) -> int:
    return get_executor(settings.executor).slots(settings, platform)


# -- local ------------------------------------------------------------------------------------------


def resolve_devices(settings: Settings, platform: Platform) -> list[int]:
    """The device indices a search uses here: `devices` as given; for "auto", every visible device, or
    the `device` setting alone where it names one other than the first (an explicit choice)."""
    if settings.devices != "auto":
        found = parse_devices(settings.devices)
        count = platform.device_count()
        missing = [d for d in found if d >= count]
        if missing:
            raise WorkspaceError(
                f"devices {settings.devices}: {platform.name} has {count} visible device(s) here, "
                f"so no index {', '.join(map(str, missing))}",
                hint="devices = auto uses every visible device; a run started on another machine "
                "resumes here with `kernelevolve resume RUN --devices auto`",
            )
        return found
    if settings.device != 0:
        return [settings.device]
    return list(range(max(1, platform.device_count())))


def _per_gpu(platform: Platform) -> int:
    """Candidates in flight per device when `workers` is auto: two on a GPU (one compiles while the
    other is checked and timed), one on the CPU, whose timings any concurrent work would disturb."""
    return 2 if platform.name in ("cuda", "rocm") else 1


def local_slots(settings: Settings, platform: Platform) -> int:
    return _per_gpu(platform) * len(resolve_devices(settings, platform))


def split(workers: int, devices: list[int]) -> list[tuple[int, int]]:
    """(device, workers) for each device that gets any: `workers` spread as evenly as they go."""
    n = len(devices)
    shares = [workers // n + (1 if i < workers % n else 0) for i in range(n)]
    return [(d, w) for d, w in zip(devices, shares, strict=True) if w > 0]


class LeastLoaded:
    """Evaluations in flight per slot (a device, an actor): `take` counts one in on the least loaded
    slot (the lowest index on a tie) and returns it; `give` counts it out. Thread-safe."""

    def __init__(self, slots: int = 0):
        self._counts = [0] * slots
        self._lock = threading.Lock()

    def reset(self, slots: int) -> None:
        with self._lock:
            self._counts = [0] * slots

    def take(self) -> int:
        with self._lock:
            if not self._counts:
                raise HarnessError("the evaluator is closed")
            slot = min(range(len(self._counts)), key=lambda k: (self._counts[k], k))
            self._counts[slot] += 1
            return slot

    def give(self, slot: int) -> None:
        with self._lock:
            if slot < len(self._counts):
                self._counts[slot] -= 1

    def counts(self) -> list[int]:
        with self._lock:
            return list(self._counts)


class DevicePools:
    """One `EvaluatorPool` per device behind one `evaluate_one`. A candidate goes to the device with
    the fewest evaluations in flight (the lowest index on a tie); its verdict's numbers all come from
    that device, eager and torch.compile measured beside it there. Whether a shape is timed as CUDA
    graphs is decided once, by the first timed verdict on any device, and shared; so is which
    baselines have worked in some worker (see `EvaluatorPool._run`)."""

    def __init__(self, request: Request, devices: list[int]):
        s = request.settings
        plan = split(s.workers or _per_gpu(request.platform) * len(devices), devices)
        graphs: dict[str, bool] = {}
        baselines_seen: set[str] = set()
        self.devices = [d for d, _ in plan]
        self.pools: list[EvaluatorPool] = []
        for device, workers in plan:
            pool = EvaluatorPool(
                request.spec,
                request.platform,
                replace(s, device=device, workers=workers),
                profile=request.profile,
                trusted_cache=_device_cache(request.trusted_cache, device),
                on_event=request.on_event,
            )
            pool.graphs, pool.baselines_seen = graphs, baselines_seen
            self.pools.append(pool)
        self._load = LeastLoaded(len(self.pools))

    def __enter__(self) -> DevicePools:
        started: list[EvaluatorPool] = []
        try:
            for pool in self.pools:
                pool.start()
                started.append(pool)
        except BaseException:
            for pool in started:
                pool.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for pool in self.pools:
            pool.close()

    def abort(self) -> None:
        for pool in self.pools:
            pool.abort()

    def evaluate_one(
        self,
        source: str,
        label: str = "candidate.py",
        *,
        shapes: list[str] | None = None,
        timing_budget_s: float | None = None,
        timing_precision: float | None = None,
    ) -> Verdict:
        i = self._load.take()
        try:
            timing = {"timing_budget_s": timing_budget_s, "timing_precision": timing_precision}
            return self.pools[i].evaluate_one(source, label, shapes=shapes, **timing)
        finally:
            self._load.give(i)

    def in_flight(self) -> dict[int, int]:
        """Evaluations in flight per device index."""
        return dict(zip(self.devices, self._load.counts(), strict=True))


def _device_cache(trusted: Path | None, device: int) -> Path | None:
    """Each device's own trusted compile cache beside the first one's: never written by two
    devices' workers at once."""
    return None if trusted is None else trusted.with_name(f"{trusted.name}-device{device}")


def _build_local(request: Request) -> Evaluator:
    devices = resolve_devices(request.settings, request.platform)
    if len(devices) == 1:
        r = request
        return EvaluatorPool(
            r.spec, r.platform, replace(r.settings, device=devices[0]), profile=r.profile,
            trusted_cache=r.trusted_cache, on_event=r.on_event,
        )  # fmt: skip
    return DevicePools(request, devices)


register_executor("local", Executor(build=_build_local, slots=local_slots))
