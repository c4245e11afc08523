"""The harness's verdict on one candidate: one value, never an exception.

A verdict says what happened (`status`), whether the candidate computes the reference's function
(`correct`), how fast it is against live baselines per shape and overall, and how that was measured
(`method`). It crosses process boundaries as JSON (`to_dict` / `from_dict`) and is what the store
records and the CLI prints.

Speedups are time ratios measured in one worker, interleaved with the baselines. The overall speedup
is shape-weighted by traffic: sum(w * t_baseline) / sum(w * t_candidate), the ratio of the time a
production mix of shapes would take. Fitness is the overall speedup against the selected baseline,
0 for anything that is not `ok`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    GUARD_VIOLATION = "guard_violation"
    INCORRECT = "incorrect"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASH = "crash"
    OOM = "oom"
    SUSPICIOUS = "suspicious"


@dataclass
class Violation:
    """A broken rule, from the static guards (`line` set) or the runtime checks (`line` None)."""

    rule: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"[{self.rule}] {where}{self.message}"


@dataclass
class TimeStats:
    """Times of one callee at one shape, in seconds, over `n` interleaved trials.

    `spread` is the relative half-range of the medians of consecutive blocks of trials: how much the
    median moves between repeats. Two callees whose medians differ by less than their spreads are
    not distinguishable.
    """

    median_s: float
    p25_s: float
    p75_s: float
    min_s: float
    n: int
    spread: float


@dataclass
class ShapeResult:
    name: str
    weight: float
    correct: bool | None = None  # None: not checked (an earlier stage failed)
    failed_check: str | None = None
    trials: int = 0  # correctness trials that ran at this shape
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_norm_err: float | None = None
    candidate: TimeStats | None = None
    eager: TimeStats | None = None
    compile: TimeStats | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    cuda_graphs: bool = False
    bytes: int | None = None
    flops: int | None = None
    roofline_s: float | None = None
    roofline_fraction: float | None = None
    bound: str | None = None  # "memory" | "compute" | "launch"


@dataclass
class Method:
    """How a verdict was obtained: enough to reproduce or to refuse to compare two numbers."""

    platform: str = ""
    device: str = ""
    device_index: int | None = None  # which of the machine's devices (a search may use several)
    driver: str | None = None
    torch: str | None = None
    triton: str | None = None
    python: str | None = None
    kernelevolve: str | None = None
    timer: str = "none"  # "cuda_events" | "perf_counter" | "none (...reason...)"
    l2: str | None = None
    interleaved: bool = False
    warmup: int = 0
    baselines: list[str] = field(default_factory=list)
    baseline_errors: dict[str, str] = field(default_factory=dict)
    fitness_baseline: str = "compile"
    precision_policy: str = "strict_fp32"
    tolerance: dict[str, float] = field(default_factory=dict)
    seeds: int = 0
    distributions: list[str] = field(default_factory=list)
    checked_timed_calls: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    status: Status
    message: str = ""
    correct: bool = False
    timed: bool = False
    spec: str = ""
    spec_fingerprint: str = ""
    candidate: str = ""
    candidate_hash: str = ""
    candidate_kind: str | None = None
    platform: str = ""
    shapes: list[ShapeResult] = field(default_factory=list)
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    fitness: float = 0.0
    spread: float | None = None
    roofline_fraction: float | None = None
    violations: list[Violation] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    method: Method = field(default_factory=Method)
    phases: dict[str, float] = field(default_factory=dict)
    log_tail: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        data = dict(data)
        data["status"] = Status(data["status"])
        data["shapes"] = [_shape_from_dict(s) for s in data.get("shapes", [])]
        data["violations"] = [Violation(**v) for v in data.get("violations", [])]
        data["method"] = Method(**data.get("method", {}))
        return cls(**data)

    @classmethod
    def failure(cls, status: Status, message: str, **kw: Any) -> Verdict:
        return cls(status=status, message=message, correct=False, fitness=0.0, **kw)


def _shape_from_dict(data: dict[str, Any]) -> ShapeResult:
    data = dict(data)
    for key in ("candidate", "eager", "compile"):
        if data.get(key) is not None:
            data[key] = TimeStats(**data[key])
    return ShapeResult(**data)


def weighted_speedup(shapes: list[ShapeResult], baseline: str) -> float | None:
    """sum(w * t_baseline) / sum(w * t_candidate) over the shapes that have both times."""
    num = den = 0.0
    for s in shapes:
        base = getattr(s, baseline)
        if s.candidate is None or base is None:
            return None
        num += s.weight * base.median_s
        den += s.weight * s.candidate.median_s
    return num / den if den > 0 else None
