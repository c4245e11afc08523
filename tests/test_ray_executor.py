"""The Ray executor on a local Ray cluster (CPU platform): the same verdicts as the local pool, an
actor lost mid-evaluation replaced and the candidate retried, and the engine, unchanged, driving a
whole search through it.

Eager's own time on a shared 2-core VM swings several-fold (Ray's processes share the cores), so an
honest kernel can cross the default 10x plausibility limit at one shape: the Ray evaluator and the
local pool it is compared with both use the limit of 50 that the CPU search tests use."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray

from kernelevolve.errors import HarnessError, SpecError, WorkspaceError
from kernelevolve.evaluate import EvaluatorPool, Status, Verdict
from kernelevolve.evaluate.executors import Request, get_executor
from kernelevolve.evaluate.ray_executor import RayEvaluator, ray_slots
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from tests.conftest import SPECS, cpu_settings
from tests.cpu_candidates import HONEST, candidate

pytestmark = pytest.mark.slow

SEGFAULT = candidate("""
    def forward(self, x):
        _lib.null_write()
        return x
""")
HALF_WRITTEN = candidate("""
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0] // 2, 0)
        return y
""")
TORCH_OP = HONEST.replace("_lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 0)", "y = torch.softmax(x, -1)")
# Seconds of work at import (the compile phase), then the honest kernel: long enough to be killed in.
SLOW_IMPORT = candidate(
    prelude='_slow = compile_c(r"""\n#include <stdint.h>\n'
    'void spin(int64_t n) { volatile int64_t i = 0; while (i < n) i++; }\n""")\n_slow.spin(2000000000)'
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def events() -> list[tuple[str, str, Any]]:
    return []


@pytest.fixture(scope="module")
def ray_eval(
    cluster: None, events: list[tuple[str, str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RayEvaluator]:
    request = Request(
        load_spec(SPECS / "softmax.py"),
        get_platform("cpu"),
        cpu_settings(tmp_path_factory.mktemp("ray"), executor="ray", suspicious_speedup=50.0),
        on_event=lambda event, label, detail: events.append((event, label, detail)),
    )
    with RayEvaluator(request) as evaluator:
        yield evaluator


@pytest.fixture(scope="module")
def local_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluatorPool]:
    settings = cpu_settings(tmp_path_factory.mktemp("local"), suspicious_speedup=50.0)
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cpu"), settings) as pool:
        yield pool


def _same(a: Verdict, b: Verdict) -> None:
    def key(v: Verdict) -> tuple[object, ...]:
        shapes = [(s.name, s.correct) for s in v.shapes]
        return v.status, v.correct, v.timed, shapes, v.candidate, v.candidate_hash, v.spec_fingerprint

    assert key(a) == key(b), (a.message, b.message)


def test_an_honest_candidate_gets_the_local_pools_verdict(
    ray_eval: RayEvaluator, local_pool: EvaluatorPool, events: list[tuple[str, str, Any]]
) -> None:
    remote = ray_eval.evaluate_one(HONEST, "honest.py")
    assert remote.status == Status.OK and remote.correct and remote.timed, remote.message
    assert all(s.candidate is not None and s.speedup_vs_eager for s in remote.shapes)
    assert any("evaluated on Ray node" in n for n in remote.method.notes)
    _same(remote, local_pool.evaluate_one(HONEST, "honest.py"))
    assert [e[:2] for e in events if e[1] == "honest.py"] == [("start", "honest.py"), ("done", "honest.py")]
    assert events[-1][2] is remote


@pytest.mark.parametrize(
    ("source", "status"),
    [
        (SEGFAULT, Status.CRASH),
        (HALF_WRITTEN, Status.INCORRECT),
        (TORCH_OP, Status.GUARD_VIOLATION),
    ],
    ids=["segfault", "half-written", "torch-op"],
)
def test_a_faulty_candidate_gets_the_local_pools_verdict(
    ray_eval: RayEvaluator, local_pool: EvaluatorPool, source: str, status: Status
) -> None:
    remote = ray_eval.evaluate_one(source, "faulty.py")
    local = local_pool.evaluate_one(source, "faulty.py")
    assert remote.status == status, remote.message
    _same(remote, local)
    assert remote.violations == local.violations


def test_a_spec_error_in_the_actor_is_raised_as_itself(ray_eval: RayEvaluator) -> None:
    with pytest.raises(SpecError, match="no shape 'huge'"):
        ray_eval.evaluate_one(HONEST, "shapes.py", shapes=["huge"])


def test_an_actor_killed_mid_evaluation_is_replaced_and_the_candidate_retried(
    ray_eval: RayEvaluator, events: list[tuple[str, str, Any]]
) -> None:
    (victim,) = ray_eval.actors
    stop = threading.Event()

    def kill_once_in_flight() -> None:  # not by the clock: a loaded machine starts the actor late
        while not stop.is_set() and ray_eval.in_flight() != [1]:
            time.sleep(0.05)
        if not stop.wait(1.0):  # the candidate's import spins for seconds
            ray.kill(victim)

    killer = threading.Thread(target=kill_once_in_flight, daemon=True)
    killer.start()
    try:
        v = ray_eval.evaluate_one(SLOW_IMPORT, "slow.py")
    finally:
        stop.set()
        killer.join()
    assert v.status == Status.OK and v.correct and v.timed, v.message
    retries = [detail for event, label, detail in events if event == "retry" and label == "slow.py"]
    assert len(retries) == 1 and "killed by `ray.kill`" in retries[0], retries
    assert ray_eval.actors[0] is not victim and ray_eval.in_flight() == [0]
    assert ray_eval.evaluate_one(HONEST, "after_kill.py").ok  # the fresh actor goes on serving


def test_the_engine_runs_a_search_on_the_ray_executor(cluster: None, tmp_path: Path) -> None:
    from kernelevolve.optimize import optimize
    from kernelevolve.search.limits import Limits
    from kernelevolve.search.policies import SearchConfig
    from kernelevolve.store import Workspace
    from kernelevolve.synth import SynthConfig

    settings = replace(
        cpu_settings(tmp_path, executor="ray", suspicious_speedup=50.0),
        warm_start=False,
        skills=False,
    )
    summary = optimize(
        SPECS / "softmax.py", settings, SearchConfig(draft=3), Limits(budget=3), SynthConfig("tuner")
    )
    assert summary["nodes_evaluated"] == 3 and summary["best_node"] is not None, summary["stop_reason"]
    with Workspace.open(settings.workspace) as ws:
        verdicts = [n["verdict"] for n in ws.nodes(summary["run_id"]) if n["verdict"]]
    assert len(verdicts) == 3
    assert all(any("evaluated on Ray node" in note for note in v["method"]["notes"]) for v in verdicts)
    assert ray.is_initialized()  # a connection the evaluator did not open stays open


def test_unknown_executors_and_a_cluster_without_gpus_are_refused(cluster: None, tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="unknown executor 'nope'") as err:
        get_executor("nope")
    assert err.value.hint is not None and "local" in err.value.hint and "ray" in err.value.hint
    assert get_executor("ray").build is RayEvaluator
    cuda = get_platform("cuda")
    settings = cpu_settings(tmp_path, executor="ray", workers=0)
    with pytest.raises(HarnessError, match="no GPU"):
        ray_slots(settings, cuda)
    request = Request(load_spec(SPECS / "softmax.py"), cuda, replace(settings, platform="cuda"))
    with pytest.raises(HarnessError, match="no GPU"), RayEvaluator(request):
        pass
    assert ray_slots(settings, get_platform("cpu")) == 1
