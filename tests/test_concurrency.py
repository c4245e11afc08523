"""Many expansions of one tree in flight: the engine, unchanged, driven with 12 expansions at once
against an executor registered for this test whose verdicts land in a random order after random
delays. The tree's invariants hold: no lost node, no duplicated node, no candidate evaluated twice,
exactly the budget spent, and every child created after its parents' verdicts landed (the policy
sees results as they land).

The executor is a test double of the evaluation (its verdicts are drawn, not measured): what is under
test is the engine's bookkeeping, which the real pool's seconds per candidate would make too slow to
push this hard. The real pool under concurrency is covered by test_executors.py.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from kernelevolve.evaluate.executors import EXECUTORS, Executor, Request, register_executor
from kernelevolve.evaluate.verdict import Method, ShapeResult, Status, Verdict
from kernelevolve.optimize import drive, start
from kernelevolve.search.limits import Limits
from kernelevolve.search.policies import SearchConfig
from kernelevolve.store import Workspace
from kernelevolve.synth import SynthConfig
from tests.conftest import SPECS, cpu_settings


class Ledger:
    """What the test executor saw: when each evaluation started and ended, and the most at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clock = 0
        self.started: dict[str, int] = {}
        self.ended: dict[str, int] = {}
        self.calls: Counter[str] = Counter()
        self.precisions: dict[str, float | None] = {}  # the timing precision each evaluation was asked
        self.inflight = self.peak = 0

    def tick(self) -> int:
        self.clock += 1
        return self.clock


LEDGER = Ledger()


class DrawnVerdicts:
    """Verdicts drawn from the candidate's hash, after a random delay; one in eight fails."""

    def __init__(self, request: Request):
        self.request = request

    def __enter__(self) -> DrawnVerdicts:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def evaluate_one(self, source: str, label: str = "candidate.py", *, shapes: list[str] | None = None,
                     timing_budget_s: float | None = None, timing_precision: float | None = None) -> Verdict:  # fmt: skip
        with LEDGER.lock:
            LEDGER.calls[label] += 1
            LEDGER.precisions[label] = timing_precision
            LEDGER.started[label] = LEDGER.tick()
            LEDGER.inflight += 1
            LEDGER.peak = max(LEDGER.peak, LEDGER.inflight)
        time.sleep(random.uniform(0.05, 0.25))  # longer than a proposal takes, even on a loaded VM
        digest = hashlib.sha256(source.encode()).digest()
        spec = self.request.spec
        base = {"candidate": label, "candidate_hash": digest.hex(), "spec": spec.name,
                "spec_fingerprint": spec.fingerprint, "platform": "cpu",
                "method": Method(platform="cpu", device="test double", fitness_baseline="eager")}  # fmt: skip
        if digest[0] % 8 == 0:
            verdict = Verdict.failure(Status.RUNTIME_ERROR, "drawn failure", **base)
        else:
            speedup = 0.5 + digest[1] / 128
            shape_results = [ShapeResult(s.name, s.weight, correct=True, trials=6, speedup_vs_eager=speedup)
                             for s in spec.shapes]  # fmt: skip
            verdict = Verdict(Status.OK, "drawn", correct=True, timed=True, shapes=shape_results,
                              speedup_vs_eager=speedup, fitness=speedup, spread=0.01, **base)  # fmt: skip
        with LEDGER.lock:
            LEDGER.inflight -= 1
            LEDGER.ended[label] = LEDGER.tick()
        return verdict


def test_twelve_expansions_in_flight_keep_the_tree_whole(tmp_path: Path) -> None:
    register_executor("drawn-verdicts", Executor(build=DrawnVerdicts, slots=lambda s, p: 12))
    try:
        settings = replace(cpu_settings(tmp_path), executor="drawn-verdicts", workers=0, skills=False,
                           warm_start=False, fitness_baseline="eager", search_timing_precision=0.02)  # fmt: skip
        budget = 60
        run_id = start(SPECS / "softmax.py", settings, SearchConfig(draft=4, parallel=12),
                       Limits(budget=budget), SynthConfig("tuner"))  # fmt: skip
        summary = drive(run_id, settings.workspace)
    finally:
        EXECUTORS.pop("drawn-verdicts")
    with Workspace.open(settings.workspace) as ws:
        nodes = ws.nodes(run_id)
    ids = [n["id"] for n in nodes]
    assert ids == list(range(1, len(nodes) + 1))  # none lost, none duplicated
    assert all(n["state"] in ("evaluated", "failed") for n in nodes)
    spent = [n for n in nodes if n["status"] not in ("exhausted", "unavailable")]
    assert len(spent) == budget, summary["stop_reason"]
    assert LEDGER.peak >= 4, LEDGER.peak  # the expansions did overlap (11-12 idle, 7 on a loaded VM)
    searched = {k: v for k, v in LEDGER.calls.items() if not k.endswith("-final.py")}
    assert all(c == 1 for c in searched.values()), [k for k, c in searched.items() if c > 1]
    evaluated = [n for n in nodes if n["state"] == "evaluated"]
    assert {f"node-{n['id']}.py" for n in evaluated} == set(searched)
    # the search ranks at its own precision; the finish step re-measures at the settings' (None)
    finals = {k: v for k, v in LEDGER.precisions.items() if k.endswith("-final.py")}
    assert finals and set(finals.values()) == {None}
    assert {LEDGER.precisions[k] for k in searched} == {0.02}
    by_id = {n["id"]: n for n in nodes}
    for n in nodes:
        for parent in (n["parent"], n["parent2"]):
            if parent is None:
                continue
            assert parent < n["id"] and by_id[parent]["state"] == "evaluated"
            # the parent's verdict had landed before the child's candidate went to be evaluated
            child = f"node-{n['id']}.py"
            if child in LEDGER.started:
                assert LEDGER.ended[f"node-{parent}.py"] < LEDGER.started[child]
    children = [n for n in nodes if n["parent"] is not None]
    print(
        f"{len(nodes)} nodes, peak {LEDGER.peak} in flight, {len(children)} children, stop: {summary['stop_reason']}"
    )
    assert len(children) > budget // 2  # feedback-driven expansion, not only drafts
    ok = [n for n in evaluated if n["status"] == "ok"]
    best = max(ok, key=lambda n: (n["fitness"], -n["id"]))
    assert (
        summary["best_node"] is not None and by_id[summary["best_node"]]["fitness"] >= best["fitness"] - 0.05
    )
