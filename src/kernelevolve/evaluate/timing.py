"""Timing: the candidate interleaved with live baselines, fresh inputs every round, cold caches.

One shape is timed in rounds. Each round:
1. draws fresh inputs on the device (a new seed: contents differ from every earlier call, so caching
   by pointer or by value cannot win) and copies them into each callee's own persistent buffers
   (addresses never change, so a pointer cache would return stale results);
2. runs the callees (eager, compile, candidate) in a shuffled order, each after a cache flush
   (a write of a buffer larger than the L2 or last-level cache), timed by the platform's timer;
3. in a random ~10% of rounds, verifies the candidate's output from that very timed call against the
   reference on a pristine copy of the round's inputs: timed calls are checked, not just warm-ups.
On CUDA the flush before a timed call lasts at least about twice the host's recent enqueue time (it
writes more of its buffer when the host is slow): the device is still flushing when the call's
kernels arrive, so the host's launch overhead (tens of microseconds for a Triton launch, more on a
loaded host) is not timed as if it were the kernel's. What is timed is the device's time for the
call, as in steady state where the host runs ahead; shapes whose launches dominate are timed as CUDA
graphs. The flush is one kernel whose grid fills every SM, so work a candidate puts on another stream
of the same priority waits for the flush's blocks instead of running beside it unseen (a one-block
spin would leave the SMs free for exactly that); it starts as the flush drains, and is timed or shows
as a tail. (A higher-priority stream would be dispatched first; the static guards refuse streams.)
The timer records events around the call, snapshots the output right after the end event,
then synchronizes the whole device and records one more event: the gap ("tail") between the end
event and the device going idle shows work left running on another stream. A candidate whose tail
exceeds the baselines' by a wide margin is refused; and its snapshot, taken while that work still
ran, fails the output check.
Shapes whose baselines' single call is shorter than `graph_threshold_us` are timed as CUDA-graph
replays for every callee (launch overhead would otherwise dominate); the choice is recorded per shape.
It depends on the baselines only, and a caller can pin it (`TimingPlan.graphs`): the evaluator pool
pins each shape's first choice, so every candidate of a run is compared by the same method.
Statistics: the median over rounds, the interquartile range, and the spread (half-range of the
medians of 5 consecutive blocks of rounds, relative to the median).
How many rounds: as many as fit the shape's time budget (within min and max trials), or fewer where
every callee's median is pinned down sooner: with `precision` > 0 (a GPU's default, 0.5%), after the
minimum and every 10 rounds, the rounds end once the 95% confidence interval of each callee's median
(by order statistics, no assumption on the distribution) is within +-precision of it. The round where
they end is one more checked and audited call, at a point the candidate cannot foresee. A CPU times
its whole budget: its clock moves more than any interval taken early would show.

This module never decides correctness thresholds (see `correctness.py`); it calls back into the
worker for the reference and the comparison.
"""

from __future__ import annotations

import contextlib
import gc
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelevolve.evaluate.messages import WorkerSettings
from kernelevolve.evaluate.verdict import TimeStats, Violation

Outputs = list[Any]
# Bumped whenever a change alters what a timing measures: a bench never reuses a result measured
# under another method (`bench.runner.item_key`). 2: the flush lasts twice the host's enqueue time.
# 3: rounds end once every median is known within `precision`.
METHOD_VERSION = 3


class Timer(Protocol):
    """What a platform's timer does (`Platform.make_timer`; CUDA's and the CPU's: platforms/timers.py)."""

    name: str
    l2: str
    note: str  # how the method differs from a plain clock around the call ("" if it does not)

    def flush(self) -> None: ...
    def time_call(
        self, fn: Callable[[], Outputs], snapshot: bool
    ) -> tuple[float, float, Outputs, Outputs | None]: ...
    def sync(self) -> None: ...


class Callee:
    """One function timed at one shape, on its own persistent input buffers, optionally as a graph."""

    def __init__(self, name: str, fn: Callable[..., Outputs], buffers: list[Any]):
        self.name = name
        self.fn = fn
        self.buffers = buffers
        self.graph: Any = None
        self.graph_out: Outputs | None = None

    def call(self) -> Outputs:
        if self.graph is not None:
            self.graph.replay()
            assert self.graph_out is not None
            return self.graph_out
        return self.fn(*self.buffers)

    def capture(self, torch: Any) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn(*self.buffers)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.fn(*self.buffers)
        self.graph, self.graph_out = graph, out


@dataclass
class ShapeTiming:
    stats: dict[str, TimeStats] = field(default_factory=dict)
    # Per baseline, the noise of the candidate's speedup over it: the relative half-range of the
    # speedups of consecutive blocks of rounds (each the ratio of the two callees' block medians).
    # Rounds interleave the callees, so a drift of the machine moves both and cancels here.
    speedup_spread: dict[str, float] = field(default_factory=dict)
    cuda_graphs: bool = False
    checked: int = 0
    violations: list[Violation] = field(default_factory=list)
    failure: str | None = None  # a checked timed call was wrong: the message
    notes: list[str] = field(default_factory=list)
    # Host seconds by part (`warmup`: estimate rounds and graph capture; `gc`: the collection before the
    # rounds; `inputs`: fresh inputs drawn and copied; `calls`: flushes and timed calls, synchronised;
    # `checks`; `audits`). Rounds: `stats`' n.
    spent: dict[str, float] = field(default_factory=dict)


def block_medians(times: list[float], blocks: int = 5) -> list[float]:
    size = max(1, len(times) // blocks)
    return [statistics.median(times[i : i + size]) for i in range(0, len(times) - size + 1, size)]


def speedup_spread(baseline: list[float], candidate: list[float], blocks: int = 5) -> float:
    """Relative half-range of the per-block speedups baseline / candidate (rounds in order)."""
    ratios = [
        b / c for b, c in zip(block_medians(baseline, blocks), block_medians(candidate, blocks), strict=True)
    ]
    if len(ratios) < 2:
        return 0.0
    return (max(ratios) - min(ratios)) / (2 * statistics.median(ratios))


def summarize(times: list[float], blocks: int = 5) -> TimeStats:
    ordered = sorted(times)
    n = len(ordered)
    med = statistics.median(ordered)
    medians = block_medians(times, blocks)
    spread = (max(medians) - min(medians)) / (2 * med) if med > 0 and len(medians) > 1 else 0.0
    q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if n > 1 else (med, med, med)
    return TimeStats(
        median_s=med,
        p25_s=q1,
        p75_s=q3,
        min_s=ordered[0],
        n=n,
        spread=spread,
    )


@dataclass
class TimingPlan:
    budget_s: float
    min_trials: int
    max_trials: int
    warmup: int
    graph_threshold_s: float
    checked_fraction: float
    allow_graphs: bool
    seed: int = 0
    graphs: bool | None = None  # pinned by the caller (one method for every candidate of a run)
    warmup_s: float = 0.0  # warm-up rounds last at least this long (a CPU's clocks and caches settle)
    precision: float = 0.0  # end the rounds once every median's 95% CI is within this (0: the budget)

    @classmethod
    def from_settings(
        cls,
        settings: WorkerSettings,
        allow_graphs: bool,
        checked: bool = True,
        warmup_s: float = 0.0,
        precision: float = 0.0,
    ) -> TimingPlan:
        """`warmup_s`, `precision`: the platform's, where the settings leave them unset."""
        given = settings.timing_precision
        return cls(
            budget_s=settings.timing_budget_s,
            min_trials=settings.min_trials,
            max_trials=settings.max_trials,
            warmup=settings.warmup_trials,
            graph_threshold_s=settings.graph_threshold_us * 1e-6,
            checked_fraction=settings.checked_fraction if checked else 0.0,
            allow_graphs=allow_graphs,
            warmup_s=float(warmup_s if settings.warmup_s is None else settings.warmup_s),
            precision=float(precision if given is None else given),
        )


ESTIMATE_ROUNDS = 5
SETTLE_EVERY = 10  # rounds between two looks at the medians' intervals


def median_interval(times: list[float]) -> tuple[float, float]:
    """A distribution-free 95% confidence interval of the median of `times`: the order statistics
    n/2 -+ 0.98 sqrt(n) (the binomial's normal approximation)."""
    ordered = sorted(times)
    n = len(ordered)
    half = 0.98 * n**0.5
    lo = max(0, int(n / 2 - half))
    hi = min(n - 1, int(n / 2 + half + 0.999))
    return ordered[lo], ordered[hi]


def settled(times: dict[str, list[float]], precision: float) -> bool:
    """Whether every callee's median is known within +-`precision` of itself (95%)."""
    for ts in times.values():
        if not ts:
            return False
        lo, hi = median_interval(ts)
        med = statistics.median(ts)
        if med <= 0 or (hi - lo) / (2 * med) > precision:
            return False
    return True


def use_graphs(estimates: dict[str, list[float]], candidate: str | None, plan: TimingPlan) -> bool:
    """Whether a shape is timed as CUDA graphs: as pinned by the caller, else whether the fastest
    baseline's single call is under the threshold. Never from the candidate's time: a slow candidate
    must not change how the baselines it is compared against are timed."""
    if plan.graphs is not None:
        return plan.graphs
    baselines = [min(ts) for name, ts in estimates.items() if name != candidate and ts]
    fastest = min(baselines, default=min((min(ts) for ts in estimates.values() if ts), default=0.0))
    return fastest < plan.graph_threshold_s


def time_shape(
    callees: list[Callee],
    timer: Timer,
    plan: TimingPlan,
    fresh_inputs: Callable[[int], list[Any]],
    copy_into: Callable[[list[Any], list[Any]], None],
    check_round: Callable[[list[Any], Outputs], str | None],
    audit: Callable[[list[Any]], list[Violation]],
    torch: Any,
    has_candidate: bool = True,
) -> ShapeTiming:
    """Time `callees` at one shape; with `has_candidate`, the last one is the candidate, whose timed
    outputs are checked and whose calls are audited. See the module docstring."""
    result = ShapeTiming()
    rng = random.Random(plan.seed)
    candidate = callees[-1] if has_candidate else None

    def load(round_seed: int) -> list[Any]:
        """Fresh inputs copied into every callee's buffers (the baselines share one set); the fresh
        tensors themselves reach no callee, so they are the round's pristine copy."""
        inputs = fresh_inputs(round_seed)
        for buffers in {id(c.buffers): c.buffers for c in callees}.values():
            copy_into(buffers, inputs)
        return inputs

    # Warm-up, and a first estimate of each callee's time. At least ESTIMATE_ROUNDS rounds: the graph
    # decision rests on the fastest of them, and the first calls on a device that was idle (clocks
    # ramping up, kernels loaded lazily) measured tens of microseconds for a 7 us eager call on an H100.
    # Then rounds until `warmup_s` has passed: a CPU that was idle (its clocks low, its threads asleep)
    # ran a 300 us kernel up to 15% slower in the first second of a process.
    estimates: dict[str, list[float]] = {c.name: [] for c in callees}
    spent = result.spent
    started = time.perf_counter()
    warm_until = started + plan.warmup_s
    w = 0
    while (
        w < max(ESTIMATE_ROUNDS if plan.allow_graphs else 1, plan.warmup) or time.perf_counter() < warm_until
    ):
        load(plan.seed * 1000 + w)
        for c in callees:
            timer.flush()
            t, _, _, _ = timer.time_call(c.call, snapshot=False)
            estimates[c.name].append(t)
        w += 1
    if plan.allow_graphs and use_graphs(estimates, candidate.name if candidate else None, plan):
        try:
            for c in callees:
                c.capture(torch)
            result.cuda_graphs = True
        except Exception as exc:  # a callee that cannot be captured is timed eagerly, like all others
            for c in callees:
                c.graph = None
            result.notes.append(
                f"CUDA graph capture failed ({type(exc).__name__}: {exc}); timed without graphs"
            )
            torch.cuda.synchronize()
    t0 = time.perf_counter()
    load(plan.seed * 1000 + 99)
    for c in callees:
        timer.flush()
        timer.time_call(c.call, snapshot=False)
    timer.sync()
    per_round = max(time.perf_counter() - t0, 1e-6)
    spent["warmup"] = time.perf_counter() - started  # with the round that sized the others
    rounds = int(min(plan.max_trials, max(plan.min_trials, plan.budget_s / per_round)))
    checked_rounds: set[int] = set()
    audit_rounds: set[int] = set()
    first = min(rounds, plan.min_trials)  # rounds that run whether or not they end early
    if candidate is not None:
        n_checked = max(3, round(rounds * plan.checked_fraction))
        checked_rounds = set(rng.sample(range(rounds), min(rounds, n_checked)))
        checked_rounds |= set(rng.sample(range(first), min(first, 3)))  # at least 3 if they end early
        audit_rounds = {rng.randrange(first)}  # and the last round, whenever that is

    times: dict[str, list[float]] = {c.name: [] for c in callees}
    tails: dict[str, list[float]] = {c.name: [] for c in callees}

    def part(name: str, since: float) -> float:
        now = time.perf_counter()
        spent[name] = spent.get(name, 0.0) + now - since
        return now

    t = time.perf_counter()
    with _no_gc():
        part("gc", t)
        for r in range(rounds):
            last = r == rounds - 1 or (
                plan.precision > 0
                and r >= plan.min_trials
                and (r - plan.min_trials) % SETTLE_EVERY == 0
                and settled(times, plan.precision)
            )
            round_seed = plan.seed * 100_000 + r
            t = time.perf_counter()
            inputs = load(round_seed)
            t = part("inputs", t)
            check = candidate is not None and (r in checked_rounds or last)
            pristine = inputs if check else None
            order = list(callees)
            rng.shuffle(order)
            snap: Outputs | None = None
            # The allocator must not hand the candidate a block that still holds a baseline's answer
            # to this very round: every callee's outputs stay alive until the round ends, or, large
            # ones (that would multiply the footprint), are poisoned in place after their call.
            keep: list[Outputs] = []
            for c in order:
                timer.flush()
                elapsed, tail, outs, s = timer.time_call(c.call, snapshot=check and c is candidate)
                if c is candidate or not _poison_large(outs, c.buffers, torch):
                    keep.append(outs)
                times[c.name].append(elapsed)
                tails[c.name].append(tail)
                if c is candidate:
                    snap = s
            t = part("calls", t)
            if check:
                assert pristine is not None and snap is not None
                result.checked += 1
                failure = check_round(pristine, snap)
                t = part("checks", t)
                if failure:
                    result.failure = f"timed call {r + 1} of {rounds}: {failure}"
                    break
            # The round's draw is let go before the next one (or the audit's) is made: held across
            # it, a draw is a fourth set of inputs beside the callees' two (level 1's 51_Argmax, 8 GiB
            # of input, ran out of its worker's 35.6 GiB in timing).
            del keep, inputs, pristine
            if candidate is not None and (r in audit_rounds or last):
                # An audit call gets contents of its own: repeating the round's would hand a value cache a hit.
                copy_into(candidate.buffers, fresh_inputs(round_seed + 7_919_000))
                result.violations.extend(audit(candidate.buffers))
                part("audits", t)
                if result.violations:
                    break
            if last:
                break
    if result.failure or result.violations:
        return result
    result.stats = {name: summarize(ts) for name, ts in times.items()}
    if candidate is not None:
        _check_tails(result, tails, candidate.name)
        result.speedup_spread = {
            name: speedup_spread(ts, times[candidate.name])
            for name, ts in times.items()
            if name != candidate.name
        }
    return result


LARGE_OUTPUT_BYTES = 256 * 2**20  # outputs above this are poisoned after their call, not kept


def _poison_large(outs: Outputs, buffers: list[Any], torch: Any) -> bool:
    """Fill a baseline's large outputs with NaN / a sentinel in place (untimed), so the candidate can
    be handed their blocks only without the answer; True where done. Outputs that share storage with
    the input buffers (an identity op returns its input) are kept, never poisoned."""
    tensors = [o for o in outs if isinstance(o, torch.Tensor)]
    if sum(o.nbytes for o in tensors) <= LARGE_OUTPUT_BYTES:
        return False
    inputs = {b.untyped_storage().data_ptr() for b in buffers if isinstance(b, torch.Tensor)}
    if any(o.untyped_storage().data_ptr() in inputs for o in tensors):
        return False
    with torch.no_grad():
        for o in tensors:
            o.fill_(float("nan") if o.is_floating_point() else -7)
    return True


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The garbage collector off for the timed rounds (as `timeit` does): a collection inside a timed
    call is the harness's time, not the callee's. Collected once before."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _check_tails(result: ShapeTiming, tails: dict[str, list[float]], candidate: str) -> None:
    """Flag work that kept the device busy after the candidate's timed region ended."""
    if not any(tails[candidate]):
        return
    cand = statistics.median(tails[candidate])
    base = [statistics.median(ts) for name, ts in tails.items() if name != candidate and ts]
    ref = max(base) if base else 0.0
    cand_time = result.stats[candidate].median_s
    if cand > 3 * ref + 50e-6 and cand > 0.2 * cand_time:
        ts = tails[candidate]
        result.violations.append(
            Violation(
                "side-stream",
                f"the device stayed busy {cand * 1e6:.0f} us after the candidate's timed call ended "
                f"(baselines: {ref * 1e6:.0f} us): work continued outside the timed stream "
                f"(median of {len(ts)} calls, {min(ts) * 1e6:.0f}-{max(ts) * 1e6:.0f} us; its call "
                f"{cand_time * 1e6:.0f} us)",
            )
        )
