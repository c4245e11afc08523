"""The harness's verdict on one candidate: one value, never an exception.

A verdict says what happened (`status`), whether the candidate computes the reference's function
(`correct`), how fast it is against live baselines per shape and overall, and how that was measured
(`method`). It crosses process boundaries as JSON (`to_dict` / `from_dict`) and is what the store
records and the CLI prints.

Speedups are time ratios measured in one worker, interleaved with the baselines. The overall speedup
is shape-weighted by traffic: sum(w * t_baseline) / sum(w * t_candidate), the ratio of the time a
production mix of shapes would take. Each shape's best baseline is the faster of eager and
torch.compile in that very measurement (on a CPU, torch.compile can be twice as slow as eager), and
`speedup_vs_best` is the candidate's speedup over it. Fitness is the overall speedup against the
selected baseline (`fitness_baseline`: "best", the default, is each shape's best baseline), 0 for
anything that is not `ok`; `spread` is the noise of that speedup.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
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
    best_baseline: str | None = None  # the faster baseline at this shape, in this measurement
    speedup_vs_best: float | None = None
    speedup_spread: float | None = None  # noise of speedup_vs_best (half-range over blocks)
    speedup_spreads: dict[str, float] = field(default_factory=dict)  # per baseline
    cuda_graphs: bool = False
    bytes: int | None = None
    flops: int | None = None
    roofline_s: float | None = None
    roofline_fraction: float | None = None
    bound: str | None = None  # "memory" | "compute" | "launch"

    def speedups(self, spreads: dict[str, float]) -> None:
        """The candidate's speedups at this shape from its and the baselines' times, and the best
        baseline: the faster of the two in this very measurement. `spreads`: per baseline, the noise
        of the speedup over it (`timing.ShapeTiming.speedup_spread`)."""
        if self.candidate is None:
            return
        self.speedup_spreads = dict(spreads)
        if self.eager:
            self.speedup_vs_eager = self.eager.median_s / self.candidate.median_s
        if self.compile:
            self.speedup_vs_compile = self.compile.median_s / self.candidate.median_s
        measured = [(n, t) for n, t in (("eager", self.eager), ("compile", self.compile)) if t]
        if measured:
            self.best_baseline, best = min(measured, key=lambda nt: nt[1].median_s)
            self.speedup_vs_best = best.median_s / self.candidate.median_s
            self.speedup_spread = spreads.get(self.best_baseline)


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
    fitness_baseline: str = "best"  # "best" (each shape's faster baseline) | "eager" | "compile"
    precision_policy: str = "strict_fp32"
    tolerance: dict[str, float] = field(default_factory=dict)
    seeds: int = 0
    distributions: list[str] = field(default_factory=list)
    checked_timed_calls: int = 0
    notes: list[str] = field(default_factory=list)
    # the worker's peak: allocated device memory on a GPU, resident memory on the CPU (the memory
    # plan's check: `evaluate/memory.py`)
    peak_memory_bytes: int | None = None
    # what the verdict stands for besides the kernel and the spec (`reuse.reuse_key`), set by the engine
    # that recorded it: a later evaluation under the same key may reuse it ("" where none was set)
    key: str = ""
    reused_from: int | None = None  # a reused verdict: the evaluation it is the verdict of
    # the harness that judged it (`integrity.Harness.label`): installed and intact, or a working tree
    # at a commit, dirty or not, with the digest of its files
    harness: str | None = None


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
    speedup_vs_best: float | None = None
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

    def score(self, base: str) -> str:
        """Overall speedups, and fitness against `base` ("best": each shape's best baseline; "eager";
        "compile"), with `spread` the noise of that speedup: its own spread over blocks of rounds,
        in which a drift of the machine moves candidate and baseline together and cancels. Returns
        what fitness is against, in words, for messages."""
        self.speedup_vs_eager = weighted_speedup(self.shapes, "eager")
        self.speedup_vs_compile = weighted_speedup(self.shapes, "compile")
        self.speedup_vs_best = weighted_speedup(self.shapes, "best")
        self.method.fitness_baseline = base
        fitness = {"best": self.speedup_vs_best, "compile": self.speedup_vs_compile}.get(
            base, self.speedup_vs_eager
        )
        self.fitness = fitness or 0.0
        spreads = [s.speedup_spread if base == "best" else s.speedup_spreads.get(base) for s in self.shapes]
        self.spread = max((x for x in spreads if x is not None), default=None)
        if base != "best":
            return base
        return f"{best_baseline_label(s.best_baseline for s in self.shapes)} (the faster baseline)"

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


def best_baseline_label(names: Iterable[str | None]) -> str | None:
    """What the best baseline was, from each shape's: one baseline's name where it was every shape's,
    "the faster baseline per shape" where they differ, None where no shape was timed."""
    found = {n for n in names if n}
    return found.pop() if len(found) == 1 else "the faster baseline per shape" if found else None


def weighted_speedup(shapes: list[ShapeResult], baseline: str) -> float | None:
    """sum(w * t_baseline) / sum(w * t_candidate) over the shapes that have both times; `baseline`
    "best" takes each shape's best baseline."""
    num = den = 0.0
    for s in shapes:
        name = s.best_baseline if baseline == "best" else baseline
        base = getattr(s, name) if name in ("eager", "compile") else None
        if s.candidate is None or base is None:
            return None
        num += s.weight * base.median_s
        den += s.weight * s.candidate.median_s
    return num / den if den > 0 else None
