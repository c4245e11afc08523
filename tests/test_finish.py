"""The finish step's live measurements: one batch, each distinct kernel once, several at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kernelevolve.config import Settings
from kernelevolve.evaluate.verdict import Status, Verdict
from kernelevolve.search import learning
from kernelevolve.search.engine import Engine
from kernelevolve.search.finish import FinishStep
from kernelevolve.search.limits import Limits
from kernelevolve.search.policies import SearchConfig
from kernelevolve.search.tree import Node, Tree
from kernelevolve.store import Workspace

TUNED = 'TUNABLES = {"num_warps": [2, 4, 8]}\nCONFIG = {"num_warps": 4}\nbody = 1\n'
FASTER = TUNED.replace('"num_warps": 4}', '"num_warps": 8}')


def _node(i: int, source: str, fitness: float, parent: int | None = None) -> Node:
    shapes = [{"name": "a", "speedup_vs_eager": fitness}, {"name": "b", "speedup_vs_eager": fitness}]
    return Node(i, parent, None, "inherit", "evaluated", "ok", fitness, fitness, None, source,
                verdict={"fitness": fitness, "spread": 0.01, "shapes": shapes})  # fmt: skip


class _Spec:
    name, fingerprint = "softmax", "fp1"


def _step(
    tmp_path: Path, measure_all: Any, skills_verify: int = 2
) -> tuple[FinishStep, Workspace, list[Any]]:
    ws = Workspace.open(tmp_path / "ws")
    events: list[Any] = []
    ctx = SimpleNamespace(ws=ws, settings=Settings(skills=True, skills_verify=skills_verify))
    step = FinishStep(ctx, "run1", SearchConfig(), Limits(budget=2), "tuner", lambda e, d: events.append((e, d)),  # type: ignore[arg-type]
                      measure_all=measure_all, wall_s=lambda: 1.0, join_profiles=lambda: None,
                      index_docs=lambda docs: None)  # fmt: skip
    return step, ws, events


def _verdict(label: str, fitness: float) -> Verdict:
    return Verdict(Status.OK, label, correct=True, timed=True, fitness=fitness)


def test_the_best_that_is_a_skills_child_is_measured_once_with_the_skills_parent_in_one_batch(
    tmp_path: Path,
) -> None:
    batches: list[list[tuple[str, str]]] = []

    def measure_all(jobs: list[tuple[str, str]]) -> list[Verdict | Exception]:
        batches.append(jobs)
        return [_verdict(label, 1.3 if source == FASTER else 1.0) for source, label in jobs]

    step, ws, _ = _step(tmp_path, measure_all)
    parent, child = _node(1, TUNED, 1.0), _node(2, FASTER, 1.3, parent=1)
    skill = learning.skill_candidate(ws, "run1", _Spec(), "cuda", "cuda:sm90", "row", child, parent)
    tree = Tree([parent, child])
    finals, (checks, pairs) = step._measure(tree, child, {"a": 2, "b": 2})
    # one batch: the best (the skill's child) once, its parent once; not three evaluations
    assert batches == [[(FASTER, "node-2-final.py"), (TUNED, f"skill-{skill['id']}-parent.py")]]
    assert list(finals) == [2] and finals[2].fitness == 1.3
    assert [c.skill_id for c in checks] == [skill["id"]]
    assert [(p.fitness, c.fitness) for p, c in pairs] == [(1.0, 1.3)]  # type: ignore[union-attr]
    assert len(ws.evaluations()) == 1  # the winner's measurement stored once
    # the shared measurement serves the skill's check: recorded as reproduced
    step._record_skills(checks, pairs)
    assert ws.skill(skill["id"])["provenance"][0]["reproduced"] is True  # type: ignore[index]


def test_a_failed_skill_measurement_is_an_event_and_a_failed_winner_fails_the_run(tmp_path: Path) -> None:
    def measure_all(jobs: list[tuple[str, str]]) -> list[Verdict | Exception]:
        return [
            RuntimeError("worker lost") if "parent" in label else _verdict(label, 1.3) for _, label in jobs
        ]

    step, ws, events = _step(tmp_path, measure_all)
    parent, child = _node(1, TUNED, 1.0), _node(2, FASTER, 1.3, parent=1)
    learning.skill_candidate(ws, "run1", _Spec(), "cuda", "cuda:sm90", "row", child, parent)
    finals, skills = step._measure(Tree([parent, child]), child, {"a": 2})
    assert finals[2].fitness == 1.3
    assert step._record_skills(*skills) == []
    assert any(e == "learn_failed" and "worker lost" in d["error"] for e, d in events)

    def lost(jobs: list[tuple[str, str]]) -> list[Verdict | Exception]:
        return [RuntimeError("harness failure") for _ in jobs]

    step, ws, _ = _step(tmp_path / "b", lost, skills_verify=0)
    with pytest.raises(RuntimeError, match="harness failure"):
        step._measure(Tree([parent, child]), child, {"a": 2})


class _Pool:
    """A pool whose evaluations take a while and count how many ran at once."""

    def __init__(self, fail: str = "") -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.fail = fail
        self.aborted = threading.Event()

    def evaluate_one(self, source: str, label: str, **_: Any) -> Verdict:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            if label == "hang":
                self.aborted.wait(30)
                raise RuntimeError("aborted")
            time.sleep(0.3)
            if label == self.fail:
                raise RuntimeError(f"{label} failed")
            return _verdict(label, 1.0)
        finally:
            with self.lock:
                self.now -= 1

    def abort(self) -> None:
        self.aborted.set()


def _engine(pool: _Pool, workers: int) -> Any:
    fake = SimpleNamespace(pool=pool, interrupt=threading.Event(), ctx=SimpleNamespace(settings=SimpleNamespace(workers=workers), shapes=None),
                           parallel=lambda w: w, _abort_evaluations=pool.abort)  # fmt: skip
    return fake


def test_the_finish_measurements_run_as_many_at_once_as_the_search_did_in_order() -> None:
    pool = _Pool(fail="c")
    fake = _engine(pool, workers=2)
    out = Engine._measure_all(fake, [("x", "a"), ("y", "b"), ("z", "c"), ("w", "d")])
    assert pool.most == 2
    assert [v.message if isinstance(v, Verdict) else str(v) for v in out] == ["a", "b", "c failed", "d"]
    one = _Pool()
    Engine._measure_all(_engine(one, workers=1), [("x", "a"), ("y", "b")])
    assert one.most == 1


def test_an_interrupt_gives_up_the_finish_measurements_at_once() -> None:
    pool = _Pool()
    fake = _engine(pool, workers=2)
    threading.Timer(0.5, fake.interrupt.set).start()
    t = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        Engine._measure_all(fake, [("x", "hang"), ("y", "hang")])
    assert pool.aborted.is_set() and time.monotonic() - t < 10
