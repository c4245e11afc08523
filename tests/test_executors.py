"""The local executor: devices resolved and shared out, candidates spread over several devices' pools,
and a worker killed from outside mid-evaluation retried in a fresh worker (while a candidate that
kills itself gets no more than the retries allowed)."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kernelevolve.config import Settings
from kernelevolve.errors import WorkspaceError
from kernelevolve.evaluate import EvaluatorPool, Status
from kernelevolve.evaluate.executors import (
    DevicePools,
    Executor,
    Request,
    get_executor,
    local_slots,
    open_evaluator,
    resolve_devices,
    split,
)
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from tests.conftest import SPECS, cpu_settings, worker_processes
from tests.cpu_candidates import HONEST, candidate

OK = (Status.OK, Status.SUSPICIOUS)  # suspicious: a loaded 2-core VM's eager time can balloon


class FourGpus:
    """The device count of a machine with four GPUs; the rest of a real platform."""

    def __init__(self, name: str = "cuda", count: int = 4):
        self.name, self.count = name, count

    def device_count(self) -> int:
        return self.count


def test_split_shares_workers_out_as_evenly_as_they_go() -> None:
    assert split(8, [0, 1, 2]) == [(0, 3), (1, 3), (2, 2)]
    assert split(4, [2, 3]) == [(2, 2), (3, 2)]
    assert split(1, [0, 1]) == [(0, 1)]  # a device that gets no worker is not used


def test_devices_auto_is_every_visible_device_unless_one_is_chosen() -> None:
    gpus: Any = FourGpus()
    assert resolve_devices(Settings(), gpus) == [0, 1, 2, 3]
    assert resolve_devices(Settings(device=2), gpus) == [2]  # a device other than the first pins
    assert resolve_devices(Settings(devices="1,3"), gpus) == [1, 3]
    assert local_slots(Settings(), gpus) == 8  # two per GPU when workers = 0
    assert local_slots(Settings(), get_platform("cpu")) == 1
    with pytest.raises(WorkspaceError, match="4 visible device"):
        resolve_devices(Settings(devices="0,4"), gpus)
    for bad in ("0,0", "x", "-1", ""):
        with pytest.raises(WorkspaceError, match="distinct indices"):
            Settings(devices=bad).validate()
    with pytest.raises(WorkspaceError, match=r"executors: .*local"):
        get_executor("nope")


def _plugin_build(request: Request) -> Any:
    raise AssertionError("never built here")


PLUGIN = Executor(build=_plugin_build, slots=lambda settings, platform: 7)


def test_an_executor_registers_through_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """A third party adds an executor by naming it in the `kernelevolve.executors` group: loaded when
    a search asks for it by name, listed among the valid ones when a name is unknown."""
    import importlib.metadata

    from kernelevolve.evaluate import executors

    advertised = importlib.metadata.EntryPoint(
        name="mine", value="tests.test_executors:PLUGIN", group="kernelevolve.executors"
    )

    def entry_points(group: str) -> list[Any]:
        return [advertised] if group == "kernelevolve.executors" else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.delitem(executors.EXECUTORS, "mine", raising=False)
    with pytest.raises(WorkspaceError, match="unknown executor 'theirs'") as err:
        get_executor("theirs")
    assert err.value.hint is not None and "mine" in err.value.hint and "ray" in err.value.hint
    assert get_executor("mine") is PLUGIN
    assert executors.executor_slots(replace(Settings(), executor="mine"), get_platform("cpu")) == 7
    monkeypatch.delitem(executors.EXECUTORS, "mine")


@pytest.mark.slow
def test_candidates_spread_over_the_devices_pools(tmp_path: Path) -> None:
    """Two devices (the CPU platform's lease keys one per index, which is all a device is to the
    pool): concurrent candidates land on both, each with its own compile cache, and every verdict
    names the device it was measured on."""
    spec = load_spec(SPECS / "softmax.py")
    settings = cpu_settings(tmp_path, workers=2, spares=0)
    trusted = tmp_path / "cache" / "inductor"
    events: list[tuple[str, str]] = []
    pools = DevicePools(
        Request(spec, get_platform("cpu"), settings, trusted_cache=trusted,
                on_event=lambda e, label, d: events.append((e, label))),
        [0, 1],
    )  # fmt: skip
    assert [p.settings.device for p in pools.pools] == [0, 1]
    assert [p.settings.workers for p in pools.pools] == [1, 1]
    assert pools.pools[0].graphs is pools.pools[1].graphs  # one decision per shape, shared
    with pools, ThreadPoolExecutor(4) as ex:
        verdicts = list(ex.map(lambda i: pools.evaluate_one(HONEST, f"c{i}.py"), range(4)))
        assert pools.in_flight() == {0: 0, 1: 0}
    assert all(v.status in OK and v.correct for v in verdicts), [v.message for v in verdicts]
    assert {v.method.device_index for v in verdicts} == {0, 1}
    assert sorted(p.name for p in trusted.parent.iterdir()) == ["inductor-device0", "inductor-device1"]
    assert sum(e == "done" for e, _ in events) == 4


def test_the_local_executor_is_one_pool_on_one_device(tmp_path: Path) -> None:
    request = Request(load_spec(SPECS / "softmax.py"), get_platform("cpu"), cpu_settings(tmp_path))
    evaluator = open_evaluator(request)
    assert isinstance(evaluator, EvaluatorPool) and evaluator.settings.device == 0


# -- a worker killed mid-evaluation --------------------------------------------------------------------


def _workers() -> list[int]:
    return worker_processes(os.getpid())[0]  # the processes the pool spawned


@pytest.mark.slow
def test_a_worker_killed_from_outside_mid_evaluation_is_retried(tmp_path: Path) -> None:
    events: list[tuple[str, Any]] = []
    killed: list[int] = []
    lock = threading.Lock()

    def on_event(event: str, label: str, detail: Any) -> None:
        events.append((event, detail))
        with lock:
            if event == "phase" and detail == "correctness" and not killed:
                (pid,) = _workers()  # spares = 0 on the CPU: the one worker there is
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    settings = cpu_settings(tmp_path, spares=0)
    with EvaluatorPool(
        load_spec(SPECS / "softmax.py"), get_platform("cpu"), settings, on_event=on_event
    ) as pool:
        v = pool.evaluate_one(HONEST, "honest.py")
    assert killed, "the test never saw the worker's correctness phase"
    retries = [d for e, d in events if e == "retry"]
    assert len(retries) == 1 and "SIGKILL" in retries[0] and "correctness" in retries[0]
    assert v.status in OK and v.correct and v.timed, v.message


SELF_KILL = candidate(
    """
    def forward(self, x):
        os.kill(os.getpid(), signal.SIGKILL)
""",
    prelude="import os\nimport signal",
)


@pytest.mark.slow
def test_a_candidate_that_kills_itself_gets_only_the_allowed_retries(tmp_path: Path) -> None:
    """Retrying is not a loophole: the death repeats, and the verdict is the candidate's."""
    spec, cpu = load_spec(SPECS / "softmax.py"), get_platform("cpu")
    for retries in (1, 0):
        events: list[str] = []
        settings = replace(cpu_settings(tmp_path / str(retries), spares=0), eval_retries=retries)
        with EvaluatorPool(spec, cpu, settings, static_guards=False,
                           on_event=lambda e, label, d, seen=events: seen.append(e)) as pool:  # fmt: skip
            v = pool.evaluate_one(SELF_KILL, "self_kill.py")
        assert v.status == Status.OOM and "SIGKILL" in v.message and not v.correct, v.message
        assert events.count("retry") == retries
        assert ("fresh workers" in v.message) == (retries > 0)


# -- an evaluation out of memory under the harness's cap --------------------------------------------


def _oom_once(marker: Path) -> str:
    """Out of memory in torch's allocator in its first worker (as a spec too large for the first
    memory share is), honest in the next."""
    forward = f"""
    def forward(self, x):
        marker = pathlib.Path({str(marker)!r})
        if not marker.exists():
            marker.write_text("1")
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 978.00 MiB.")
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 0)
        return y
"""
    return candidate(forward, prelude="import pathlib")


@pytest.mark.slow
def test_out_of_memory_under_the_first_share_is_retried_with_the_larger_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap is the harness's: the first OOM under it raises the pool's share (once) and evaluates
    the candidate again, the pool solo from then on (its spare, prepared under the smaller share,
    closed and not replaced); an OOM under the larger share is the candidate's, and says what to
    change. (The CPU worker has no device cap to set; the shares stand in for a GPU's.)"""
    import kernelevolve.evaluate.pool as pool_mod

    monkeypatch.setattr(pool_mod, "gpu_shares", lambda settings, platform: (0.1, 0.3))
    events: list[tuple[str, Any]] = []
    settings = replace(cpu_settings(tmp_path, spares=1), sandbox_filesystem=False)
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cpu"), settings, static_guards=False,
                       on_event=lambda e, label, d: events.append((e, d))) as pool:  # fmt: skip
        v = pool.evaluate_one(_oom_once(tmp_path / "first"), "oom_once.py")
        retries = [d for e, d in events if e == "retry"]
        assert v.status in OK and v.correct and v.timed, v.message
        assert len(retries) == 1 and "out of memory under the harness's memory cap of 10.0%" in retries[0]
        assert "retrying with 30.0%" in retries[0] and pool.gpu_share == 0.3
        assert pool.solo and pool._spares == []  # no spare prepares beside a solo pool's evaluation
        # at the larger share the same OOM is the candidate's verdict: no second raise, no loop
        events.clear()
        v = pool.evaluate_one(_oom_once(tmp_path / "second"), "oom_again.py")
    assert v.status == Status.OOM and not v.correct, v.message
    assert not [e for e, _ in events if e == "retry"]
    assert "under the harness's memory cap of 30.0% of the device per worker" in v.message
    assert "all of the device's usable memory, one evaluation at a time" in v.message


def test_a_solo_pool_holds_one_evaluation_at_a_time(tmp_path: Path) -> None:
    """Two evaluations of a pool of two workers hold their workers at once; once the pool is solo
    (its memory share raised to all of it), the second waits for the first."""
    import time

    pool = EvaluatorPool(
        load_spec(SPECS / "softmax.py"), get_platform("cpu"), cpu_settings(tmp_path, workers=2)
    )
    together = threading.Barrier(2, timeout=10)
    inside: list[int] = []
    most = [0]

    def evaluation(meet: bool) -> None:
        with pool._slot():
            inside.append(1)
            most[0] = max(most[0], len(inside))
            if meet:
                together.wait()  # breaks (and raises) unless both hold a worker at once
            time.sleep(0.2)
            inside.pop()

    try:
        with ThreadPoolExecutor(2) as ex:
            list(ex.map(evaluation, [True, True]))
        assert most[0] == 2
        pool.solo, most[0] = True, 0
        with ThreadPoolExecutor(2) as ex:
            list(ex.map(evaluation, [False, False]))
        assert most[0] == 1
    finally:
        pool.close()


# -- a fitness baseline that fails in some workers only ----------------------------------------------

FLAKY_COMPILE_SPEC = '''
"""Test spec: row softmax whose torch.compile fails in a worker started once the marker exists
(while dynamo traces, the input is viewed in a shape none has); eager is unchanged."""

import os

import torch
import torch.nn as nn

BROKEN = os.path.exists({marker!r})


class Model(nn.Module):
    def forward(self, x):
        if BROKEN and torch.compiler.is_compiling():
            x = x.view(-1, 7)
        return torch.softmax(x, dim=-1)


def get_inputs(rows=16, cols=256):
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
'''


@pytest.mark.slow
def test_a_fitness_baseline_lost_in_one_worker_is_retried_and_never_replaced_by_eager(
    tmp_path: Path,
) -> None:
    """Fitness values on two baselines must not be compared within a run: once torch.compile has
    worked in a worker, its failure in a later worker is retried, and then unranked, not scored vs eager.
    A spec torch.compile never compiled falls back to eager, in every verdict alike."""
    marker = tmp_path / "break-compile"
    spec_path = tmp_path / "flaky_compile.py"
    spec_path.write_text(FLAKY_COMPILE_SPEC.format(marker=str(marker)))
    spec, cpu = load_spec(spec_path), get_platform("cpu")

    def settings(name: str) -> Settings:
        return cpu_settings(tmp_path / name, baselines=["eager", "compile"], fitness_baseline="compile",
                            spares=0, eval_retries=1)  # fmt: skip

    events: list[tuple[str, Any]] = []
    with EvaluatorPool(
        spec, cpu, settings("run"), on_event=lambda e, label, d: events.append((e, d))
    ) as pool:
        first = pool.evaluate_one(HONEST, "first.py")
        marker.touch()  # spares = 0 on the CPU: every later worker starts after this
        second = pool.evaluate_one(HONEST, "second.py")

    assert first.status == Status.OK and not first.method.baseline_errors, first.message
    assert first.method.fitness_baseline == "compile"
    assert first.fitness == pytest.approx(first.speedup_vs_compile)
    assert first.phases["start:compile_baseline"] > 0, first.phases  # the start-up step it took

    retries = [d for e, d in events if e == "retry"]
    assert len(retries) == 1 and "torch.compile failed in this worker" in retries[0], retries
    assert "earlier" in retries[0]
    assert second.status == Status.OK and second.correct and second.timed, second.message
    assert "compile" in second.method.baseline_errors
    assert second.fitness == 0.0 and second.speedup_vs_eager and second.speedup_vs_compile is None
    assert second.method.fitness_baseline == "compile"
    assert "torch.compile failed in this worker" in second.message, second.message
    assert "not ranked" in second.message and "2 fresh workers" in second.message, second.message

    # Control: a pool that never saw torch.compile work falls back to eager, as every worker would.
    events.clear()
    with EvaluatorPool(
        spec, cpu, settings("never"), on_event=lambda e, label, d: events.append((e, d))
    ) as pool:
        v = pool.evaluate_one(HONEST, "control.py")
    assert v.status == Status.OK and "compile" in v.method.baseline_errors, v.message
    assert not [e for e, _ in events if e == "retry"]
    assert v.method.fitness_baseline == "eager"
    assert v.fitness == pytest.approx(v.speedup_vs_eager) and v.fitness > 0
    assert "(fitness vs eager: torch.compile failed in this worker" in v.message, v.message


@pytest.mark.slow
def test_a_verdict_says_where_start_up_time_went(softmax_pool: EvaluatorPool) -> None:
    # A search bound by the host (GPUs busy 10-20% of the time) must show where the time went.
    v = softmax_pool.evaluate_one(HONEST, "honest_start_up.py")
    assert v.status == Status.OK, v.message
    steps = {k: t for k, t in v.phases.items() if k.startswith("start:")}
    # (no torch.compile baseline in these tests' settings, so no "start:compile_baseline" step)
    assert set(steps) == {"start:device", "start:spec", "start:reference_outputs", "start:reference_outputs_wait",
                          "start:timer"}, steps  # fmt: skip
    assert all(t >= 0 for t in steps.values()), steps
    assert steps["start:reference_outputs"] > 0, steps  # the reference run on every trial's inputs
    # of which the wait for the device's lease (none on a CPU, where start-up holds it throughout)
    assert steps["start:reference_outputs_wait"] <= steps["start:reference_outputs"], steps
    # spawn to ready: the worker's own steps, and before them the interpreter and torch's import
    own = sum(t for k, t in steps.items() if k != "start:reference_outputs_wait")
    assert v.phases["worker_start"] > own, v.phases
    assert v.phases["worker_wait"] >= 0
    assert {"compile", "correctness", "timing"} <= set(v.phases), v.phases  # the evaluation's own


# -- the search's timing precision ---------------------------------------------------------------------


def test_a_precision_asked_for_one_evaluation_ends_its_rounds_at_it(tmp_path: Path) -> None:
    """The search's evaluations rank candidates at a wider precision than the finish step's
    re-measures (`Platform.search_precision`): asked of the pool for one evaluation, the worker ends
    each shape's rounds once every median is known within it, and the verdict's method says so. On
    the CPU, which otherwise times its whole budget, a precision of 1000% ends every shape at the
    first look: the round after the minimum."""
    # 0.1-0.4 s a round on a CI machine: the budget holds more than the minimum's rounds and one,
    # which the CPU would time without the precision asked for
    settings = cpu_settings(tmp_path, timing_budget_s=3.0, min_trials=3, max_trials=300)
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cpu"), settings) as pool:
        wide = pool.evaluate_one(HONEST, "wide.py", timing_precision=10.0)
    assert wide.status == Status.OK, wide.message
    assert any("+-1000.0%" in n for n in wide.method.notes), wide.method.notes
    assert [s.candidate.n for s in wide.shapes if s.candidate] == [4, 4]  # rounds 0..3: the first look


def test_the_search_precision_is_its_own_setting_else_the_timing_one_else_the_platforms() -> None:
    from types import SimpleNamespace

    from kernelevolve.platforms.base import Platform
    from kernelevolve.platforms.cpu import CpuPlatform
    from kernelevolve.platforms.cuda import CudaPlatform

    assert (CudaPlatform.timing_precision, CudaPlatform.search_timing_precision) == (0.005, 0.01)
    assert CpuPlatform.search_timing_precision == 0.0  # the CPU times its whole budget, searching too
    gpu = SimpleNamespace(search_timing_precision=0.01)

    def precision(**given: float | None) -> float:
        settings = SimpleNamespace(**({"search_timing_precision": None, "timing_precision": None} | given))
        return Platform.search_precision(gpu, settings)  # type: ignore[arg-type]

    assert precision() == 0.01
    assert precision(timing_precision=0.002) == 0.002  # a user's precision holds for the search too
    assert precision(timing_precision=0.002, search_timing_precision=0.03) == 0.03
