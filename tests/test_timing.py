"""The timing loop (`evaluate/timing.py`) with a scripted clock: warm-up lasts its seconds, the
garbage collector is off while rounds are timed, and the noise figure of a speedup cancels a drift of
the machine that moves candidate and baseline together (issue N: CPU timings that hold still)."""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest
import torch

from kernelevolve.evaluate.timing import Callee, TimingPlan, speedup_spread, time_shape


class ScriptedTimer:
    """Reports for each call the time its callee's script gives (no clock is read), optionally
    drifting upward with the call count, as a machine that slows down would."""

    name, l2, note = "scripted", "none", ""

    def __init__(self, base: dict[str, float], drift: float = 0.0):
        self.base, self.drift, self.calls = base, drift, 0
        self.current = ""
        self.log: list[tuple[float, str, bool]] = []  # (wall clock, callee, gc enabled)

    def flush(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def time_call(self, fn: Any, snapshot: bool) -> tuple[float, float, list[Any], list[Any] | None]:
        outs = fn()
        self.calls += 1
        self.log.append((time.perf_counter(), self.current, gc.isenabled()))
        t = self.base[self.current] * (1 + self.drift * self.calls)
        return t, 0.0, outs, [o.clone() for o in outs] if snapshot else None


def _callees(timer: ScriptedTimer, names: list[str], sleep_s: float = 0.0) -> list[Callee]:
    def make(name: str) -> Any:
        def fn(x: torch.Tensor) -> list[torch.Tensor]:
            timer.current = name
            if sleep_s:
                time.sleep(sleep_s)
            return [x * 1.0]

        return fn

    return [Callee(name, make(name), [torch.zeros(4)]) for name in names]


def _run(timer: ScriptedTimer, callees: list[Callee], **plan: Any) -> Any:
    defaults: dict[str, Any] = {"budget_s": 0.05, "min_trials": 20, "max_trials": 40, "warmup": 1,
                                "graph_threshold_s": 0.0, "checked_fraction": 0.0, "allow_graphs": False}  # fmt: skip
    return time_shape(
        callees, timer, TimingPlan(**(defaults | plan)), lambda seed: [torch.full((4,), float(seed))],
        lambda buffers, inputs: buffers[0].copy_(inputs[0]), lambda pristine, snap: None, lambda buffers: [], torch,
    )  # fmt: skip


def test_warm_up_rounds_last_their_seconds_before_any_round_is_timed() -> None:
    timer = ScriptedTimer({"eager": 1e-3, "candidate": 1e-3})
    start = time.perf_counter()
    result = _run(timer, _callees(timer, ["eager", "candidate"], sleep_s=0.002), warmup_s=0.3)
    timed_calls = 2 * result.stats["candidate"].n
    first_timed = timer.log[len(timer.log) - timed_calls][0]
    assert first_timed - start >= 0.3  # the rounds before it were warm-up (and the one estimate round)
    assert len(timer.log) - timed_calls >= 0.3 / (2 * 0.002) * 0.5  # many warm-up calls, not one


def test_the_garbage_collector_is_off_while_rounds_are_timed_and_on_after() -> None:
    timer = ScriptedTimer({"eager": 1e-3, "candidate": 1e-3})
    assert gc.isenabled()
    result = _run(timer, _callees(timer, ["eager", "candidate"]))
    timed = timer.log[len(timer.log) - 2 * result.stats["candidate"].n :]
    assert timed and not any(enabled for _, _, enabled in timed)
    assert all(enabled for _, _, enabled in timer.log[: len(timer.log) - len(timed)])  # warm-up: on
    assert gc.isenabled()


def test_a_drift_that_moves_every_callee_cancels_in_the_speedups_noise() -> None:
    """The machine slows by 60% over the rounds: each callee's own spread shows it, the speedup's does not."""
    timer = ScriptedTimer({"eager": 300e-6, "candidate": 250e-6}, drift=0.005)
    result = _run(timer, _callees(timer, ["eager", "candidate"]), min_trials=60, max_trials=60)
    assert result.stats["candidate"].spread > 0.1 and result.stats["eager"].spread > 0.1
    assert result.speedup_spread["eager"] < 0.01
    assert result.stats["eager"].median_s / result.stats["candidate"].median_s > 1.15


def test_speedup_spread_is_the_half_range_of_block_speedups() -> None:
    baseline = [2.0] * 10 + [2.2] * 10  # blocks of 4: speedups 2, 2, 2.1 (mixed block), 2.2, 2.2
    candidate = [1.0] * 20
    assert speedup_spread(baseline, candidate, blocks=5) == (2.2 - 2.0) / (2 * 2.1)


# -- rounds that end once the medians are known (issue G: timing that takes what it needs) -------------


class JitteryTimer(ScriptedTimer):
    """Each call's time drawn around its callee's script: +-`jitter` (uniform), seeded."""

    def __init__(self, base: dict[str, float], jitter: float):
        super().__init__(base)
        import random

        self.jitter, self.rng = jitter, random.Random(3)

    def time_call(self, fn: Any, snapshot: bool) -> tuple[float, float, list[Any], list[Any] | None]:
        t, tail, outs, snap = super().time_call(fn, snapshot)
        return t * (1 + self.rng.uniform(-self.jitter, self.jitter)), tail, outs, snap


def test_steady_timings_end_after_the_minimum_and_noisy_ones_take_the_budget() -> None:
    from kernelevolve.evaluate.timing import median_interval, settled

    long = {"budget_s": 60.0, "min_trials": 20, "max_trials": 300}
    steady = JitteryTimer({"eager": 1e-3, "candidate": 5e-4}, jitter=0.002)
    result = _run(steady, _callees(steady, ["eager", "candidate"]), precision=0.01, **long)
    assert result.stats["candidate"].n == 21  # the minimum, and the round that ends them
    assert result.stats["eager"].median_s / result.stats["candidate"].median_s == pytest.approx(2, rel=0.01)
    noisy = JitteryTimer({"eager": 1e-3, "candidate": 5e-4}, jitter=0.5)
    result = _run(noisy, _callees(noisy, ["eager", "candidate"]), precision=0.01, **long)
    assert result.stats["candidate"].n == 300  # +-50% per call: +-1% is not reached within 300
    fixed = JitteryTimer({"eager": 1e-3, "candidate": 5e-4}, jitter=0.002)
    result = _run(fixed, _callees(fixed, ["eager", "candidate"]), precision=0.0, **long)
    assert result.stats["candidate"].n == 300  # precision 0: the whole budget, as before
    # the interval itself: order statistics around the median, wider for fewer or noisier values
    lo, hi = median_interval([float(v) for v in range(100)])
    assert 35 <= lo < 49.5 < hi <= 64
    assert settled({"a": [1.0] * 30}, 0.01) and not settled({"a": [1.0, 2.0] * 15}, 0.01)


def test_a_candidate_that_turns_wrong_when_the_rounds_could_have_ended_is_checked_there() -> None:
    """The round where the timing ends is always a checked call: a candidate that answers right for the
    first `min_trials` timed calls (where every other check may fall) and wrong after is caught."""
    timer = ScriptedTimer({"eager": 1e-3, "candidate": 5e-4})
    calls = [0]

    def cheat(x: torch.Tensor) -> list[torch.Tensor]:
        timer.current = "candidate"
        calls[0] += 1
        return [x * 1.0 if calls[0] <= 2 + 20 else x * 0.0]  # 2 untimed calls, then 20 timed right

    def eager(x: torch.Tensor) -> list[torch.Tensor]:
        timer.current = "eager"
        return [x * 1.0]

    callees = [Callee("eager", eager, [torch.zeros(4)]), Callee("candidate", cheat, [torch.zeros(4)])]
    plan = TimingPlan(budget_s=60.0, min_trials=20, max_trials=300, warmup=1, graph_threshold_s=0.0,
                      checked_fraction=0.0, allow_graphs=False, precision=0.01)  # fmt: skip
    result = time_shape(
        callees, timer, plan, lambda seed: [torch.full((4,), float(seed) + 1)],
        lambda buffers, inputs: buffers[0].copy_(inputs[0]),
        lambda pristine, snap: None if torch.equal(snap[0], pristine[0]) else "wrong answer",
        lambda buffers: [], torch,
    )  # fmt: skip
    assert result.failure is not None and "timed call 21" in result.failure


def test_baselines_alone_end_early_too_and_check_nothing() -> None:
    """Without a candidate (`kernelevolve baseline`), the rounds end as they would with one, and no
    round is a checked call: there is no candidate's output to check."""
    timer = JitteryTimer({"eager": 1e-3, "compile": 5e-4}, jitter=0.002)
    callees = _callees(timer, ["eager", "compile"])
    plan = TimingPlan(budget_s=60.0, min_trials=20, max_trials=300, warmup=1, graph_threshold_s=0.0,
                      checked_fraction=0.1, allow_graphs=False, precision=0.01)  # fmt: skip
    result = time_shape(
        callees, timer, plan, lambda seed: [torch.full((4,), float(seed))],
        lambda buffers, inputs: buffers[0].copy_(inputs[0]), lambda pristine, snap: "never called",
        lambda buffers: [], torch, has_candidate=False,
    )  # fmt: skip
    assert result.failure is None and result.checked == 0
    assert result.stats["eager"].n == result.stats["compile"].n == 21


def test_the_time_a_shape_took_is_told_by_part() -> None:
    """`spent` says where a shape's timing went (the verdict's `timing:*` phases): here a slow input
    draw shows as `inputs`, slow calls as `calls`, and the parts add up to the whole."""
    timer = ScriptedTimer({"eager": 1e-3, "candidate": 1e-3})
    draws = 0

    def slow_inputs(seed: int) -> list[torch.Tensor]:
        nonlocal draws
        draws += 1
        time.sleep(0.004)
        return [torch.full((4,), float(seed))]

    plan = TimingPlan(budget_s=0.05, min_trials=10, max_trials=10, warmup=1, graph_threshold_s=0.0,
                      checked_fraction=0.0, allow_graphs=False)  # fmt: skip
    start = time.perf_counter()
    result = time_shape(
        _callees(timer, ["eager", "candidate"], sleep_s=0.002), timer, plan, slow_inputs,
        lambda buffers, inputs: buffers[0].copy_(inputs[0]), lambda pristine, snap: None, lambda buffers: [], torch,
    )  # fmt: skip
    whole = time.perf_counter() - start
    spent = result.spent
    assert set(spent) >= {"warmup", "gc", "inputs", "calls", "checks", "audits"}
    assert spent["inputs"] >= 10 * 0.004  # ten rounds, each drawing its inputs
    assert spent["calls"] >= 10 * 2 * 0.002  # two callees a round
    assert spent["warmup"] >= 2 * (0.004 + 2 * 0.002)  # the estimate round and the sizing round
    assert sum(spent.values()) == pytest.approx(whole, rel=0.1, abs=0.01)


def test_no_round_holds_its_draw_while_the_next_is_made() -> None:
    """A round's fresh inputs are let go before the next draw and before the audit's: with the
    callees' buffers, a draw held across the next one is a fourth set of inputs on the device (level
    1's 51_Argmax ran out of memory in timing that way). Every draw but the newest is gone when a new
    one is made, checked rounds and the audit included."""
    import weakref

    timer = ScriptedTimer({"eager": 1e-3, "candidate": 1e-3})
    alive: list[weakref.ref[torch.Tensor]] = []
    held_at_draw: list[int] = []

    def fresh(seed: int) -> list[torch.Tensor]:
        gc.collect()
        held_at_draw.append(sum(ref() is not None for ref in alive))
        t = torch.full((4,), float(seed))
        alive.append(weakref.ref(t))
        return [t]

    plan = TimingPlan(budget_s=0.05, min_trials=12, max_trials=12, warmup=1, graph_threshold_s=0.0,
                      checked_fraction=0.5, allow_graphs=False)  # fmt: skip
    result = time_shape(
        _callees(timer, ["eager", "candidate"]), timer, plan, fresh,
        lambda buffers, inputs: buffers[0].copy_(inputs[0]), lambda pristine, snap: None,
        lambda buffers: [], torch,
    )  # fmt: skip
    assert result.failure is None and result.checked >= 3
    assert len(held_at_draw) >= 12 + 2  # the rounds, the warm-up's and the audits' draws
    assert max(held_at_draw) == 0, held_at_draw


def test_work_after_the_timed_call_is_flagged_with_its_spread() -> None:
    """The side-stream check: a candidate whose calls leave the device busy well past the baselines'
    (median over calls) is flagged, its message giving the calls' range and its own time, so a false
    alarm can be told from a trick; one slow tail among many is no flag."""
    from kernelevolve.evaluate.timing import ShapeTiming, _check_tails, summarize

    def timing(cand_tails: list[float]) -> ShapeTiming:
        result = ShapeTiming()
        result.stats = {"cand": summarize([400e-6] * 9), "eager": summarize([500e-6] * 9)}
        _check_tails(result, {"cand": cand_tails, "eager": [20e-6] * 9}, "cand")
        return result

    busy = timing([300e-6] * 8 + [900e-6])
    (violation,) = busy.violations
    assert violation.rule == "side-stream"
    assert (
        "300 us after" in violation.message
        and "median of 9 calls, 300-900 us; its call 400 us" in violation.message
    )
    assert timing([20e-6] * 8 + [900e-6]).violations == []  # one slow tail: the median is the baselines'
