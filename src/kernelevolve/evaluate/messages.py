"""The engine's messages as the worker reads them: typed, frozen values built once from the dicts.

The wire format is `protocol.py`'s: the engine (`handle.py`, `pool.py`) sends plain dicts, and this
module is the worker's side only. Each message the worker receives (`prepare`, then one of
`evaluate`, `baselines`, `profile`) becomes a value here as it arrives, so that what the worker reads
is an attribute with a type, converted the way the worker has always converted it (`int`, `float`),
and a key the engine did not send fails where the message is read, not in the middle of a phase.

- `WorkerSettings`: the fields of `config.Settings` that a worker reads (the rest of the dict, the
  engine's own settings, is dropped here).
- `PrepareMsg`, `EvaluateMsg`, `BaselinesMsg`, `ProfileMsg`: one per message (`job_from_dict`:
  the job after `prepare`); `Ceilings`: the hardware profile an `evaluate` message carries, as far as
  the roofline reads it.

Deliberately not here: the messages the worker sends (`ready`, `phase`, `result`, ...; the engine
reads them as dicts), validation of values (`kernelevolve.config` validates the settings before they are
sent), and anything that imports torch: the worker imports this before taking its device lease.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class WorkerSettings:
    """The settings a worker reads, from `config.Settings.to_dict()` (the `prepare` message's)."""

    baselines: tuple[str, ...]  # "eager", and "compile" unless it is turned off
    fitness_baseline: str  # "best" | "eager" | "compile"
    seeds: int  # correctness seeds per shape and distribution
    timing_budget_s: float
    min_trials: int
    max_trials: int
    warmup_trials: int
    graph_threshold_us: float
    checked_fraction: float
    warmup_s: float | None  # None: the platform's
    timing_precision: float | None  # None: the platform's
    roofline_margin: float
    suspicious_speedup: float
    share_references: str = "auto"  # "auto" | "always" | "never" (`references.worth_sharing`)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerSettings:
        return cls(
            # the defaults a worker preparing a spec has always assumed where the engine sent none
            baselines=tuple(data.get("baselines", ("eager", "compile"))),
            fitness_baseline=data["fitness_baseline"],
            seeds=int(data.get("seeds", 3)),
            timing_budget_s=float(data["timing_budget_s"]),
            min_trials=int(data["min_trials"]),
            max_trials=int(data["max_trials"]),
            warmup_trials=int(data["warmup_trials"]),
            graph_threshold_us=float(data["graph_threshold_us"]),
            checked_fraction=float(data["checked_fraction"]),
            warmup_s=_float_or_none(data.get("warmup_s")),
            timing_precision=_float_or_none(data.get("timing_precision")),
            roofline_margin=float(data["roofline_margin"]),
            suspicious_speedup=float(data["suspicious_speedup"]),
            share_references=str(data.get("share_references", "auto")),
        )


@dataclass(frozen=True)
class PrepareMsg:
    """`prepare`: what to prepare for (`worker.prepare`), before any candidate exists."""

    platform: str
    lease_key: str  # the device lease's name, given by the engine (`Platform.lease_key`)
    settings: WorkerSettings
    spec_path: str | None = None  # None: a worker without a spec (measuring the hardware profile)
    device_index: int = 0
    precision: str = "strict_fp32"
    gpu_memory_fraction: float | None = None  # as sent: the ready info reports it unchanged
    report_modules: bool = False  # list the modules imported so far (`bytecode.py`)
    harness_digest: str | None = None  # the engine's harness (`integrity`): the worker's must be the same
    # The pool's shared reference outputs (`references.py`): the file and its SHA-256, to load; or
    # where this worker writes its own for the pool (in its folder)
    references: str | None = None
    references_sha256: str | None = None
    share_references: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrepareMsg:
        return cls(
            platform=data["platform"],
            lease_key=data["lease_key"],
            settings=WorkerSettings.from_dict(data["settings"]),
            spec_path=data.get("spec_path"),
            device_index=int(data.get("device_index", 0)),
            precision=data.get("precision", "strict_fp32"),
            gpu_memory_fraction=data.get("gpu_memory_fraction"),
            report_modules=bool(data.get("report_modules")),
            harness_digest=data.get("harness_digest"),
            references=data.get("references"),
            references_sha256=data.get("references_sha256"),
            share_references=data.get("share_references"),
        )


@dataclass(frozen=True)
class Ceilings:
    """The hardware profile's ceilings (`platforms.HardwareProfile`) that the roofline reads."""

    bandwidth: float  # bytes/s, measured
    flops: dict[str, float]  # FLOP class -> FLOP/s, measured
    datasheet_bandwidth: float | None = None
    datasheet_flops: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ceilings:
        return cls(
            bandwidth=data["bandwidth"],
            flops=data["flops"],
            datasheet_bandwidth=data.get("datasheet_bandwidth"),
            datasheet_flops=data.get("datasheet_flops") or {},
        )


@dataclass(frozen=True)
class EvaluateMsg:
    """`evaluate`: one candidate (`evaluation.evaluate`)."""

    source: str  # the candidate's text, the same the static guards read
    candidate_hash: str
    kind: str = "triton"  # the candidate's kind ("triton", "cuda", "c", ...)
    uses_load_inline: bool = False
    profile: Ceilings | None = None  # None: no roofline (no hardware profile known)
    graphs: dict[str, bool] = field(default_factory=dict)  # per shape, CUDA graphs pinned by the pool
    gpu_memory_fraction: float | None = None  # the pool's current share (it may have grown)
    shapes: tuple[str, ...] = ()  # the spec shapes to evaluate (empty: all)
    timing_budget_s: float | None = None  # a quick run's shorter timing budget (None: the settings')
    # the search's evaluations: a wider precision than the settings' (None: the settings', else the
    # platform's; see `Settings.search_timing_precision`)
    timing_precision: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluateMsg:
        profile = data.get("profile")
        return cls(
            source=data["source"],
            candidate_hash=data["candidate_hash"],
            kind=data.get("kind") or "triton",
            uses_load_inline=bool(data.get("uses_load_inline")),
            profile=Ceilings.from_dict(profile) if profile else None,
            graphs=dict(data.get("graphs") or {}),
            gpu_memory_fraction=data.get("gpu_memory_fraction"),
            shapes=tuple(data.get("shapes") or ()),
            timing_budget_s=_float_or_none(data.get("timing_budget_s")),
            timing_precision=_float_or_none(data.get("timing_precision")),
        )


@dataclass(frozen=True)
class BaselinesMsg:
    """`baselines`: time the baselines alone (`baselines.time_baselines`); it carries no fields."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BaselinesMsg:
        return cls()


@dataclass(frozen=True)
class ProfileMsg:
    """`profile`: measure the hardware profile (`Platform.measure_profile`); it carries no fields."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProfileMsg:
        return cls()


def job_from_dict(data: dict[str, Any]) -> EvaluateMsg | BaselinesMsg | ProfileMsg | None:
    """The job a message after `prepare` asks for; None for an op that is no job (the worker says so)."""
    op = data["op"]
    if op == "evaluate":
        return EvaluateMsg.from_dict(data)
    if op == "baselines":
        return BaselinesMsg.from_dict(data)
    if op == "profile":
        return ProfileMsg.from_dict(data)
    return None
