"""The search's pure parts: the tree and its noise rule, the policies, memory modes, limits, and the
store's node lifecycle (ids, states, cost counted once)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kernelevolve.errors import WorkspaceError
from kernelevolve.search.limits import Limits, stop_reason
from kernelevolve.search.memory import choose_mode, history
from kernelevolve.search.policies import SearchConfig, evolutionary, greedy, uct, uct_score
from kernelevolve.search.tree import Node, Tree
from kernelevolve.store import Workspace


def node(id: int, parent: int | None = None, fitness: float = 0.0, status: str = "ok", spread: float = 0.0,
         state: str = "evaluated", parent2: int | None = None, source: str | None = None) -> Node:  # fmt: skip
    return Node(
        id=id, parent=parent, parent2=parent2, mode="inherit", state=state, status=status,
        fitness=fitness if status == "ok" else 0.0, verdict={"spread": spread}, source=source,
    )  # fmt: skip


def test_noise_rule_keeps_the_old_best_within_the_spread() -> None:
    tree = Tree([node(1, fitness=1.00, spread=0.02), node(2, 1, fitness=1.015, spread=0.01)])
    assert tree.best().id == 1  # +1.5% is inside the 2% spread
    tree = Tree([node(1, fitness=1.00, spread=0.02), node(2, 1, fitness=1.03, spread=0.01)])
    assert tree.best().id == 2
    tree = Tree([node(1, fitness=1.00), node(2, 1, fitness=1.005)])
    assert tree.best(min_gain=0.01).id == 1


def test_stall_counts_evaluations_since_the_best() -> None:
    tree = Tree(
        [
            node(1, fitness=1.0),
            node(2, 1, fitness=2.0),
            node(3, 2, fitness=1.5),
            node(4, 2, status="incorrect"),
        ]
    )
    assert tree.best().id == 2
    assert tree.stall() == 2


def test_tree_queries() -> None:
    tree = Tree([node(1), node(2, 1), node(3, 1), node(4, 2), node(5)])
    assert [n.id for n in tree.ancestors(4)] == [2, 1]
    assert [n.id for n in tree.siblings(2)] == [3]
    assert [n.id for n in tree.siblings(1)] == [5]  # other roots
    assert tree.depth(4) == 2


def test_greedy_takes_the_best_and_debugs_when_nothing_is_correct() -> None:
    cfg = SearchConfig()
    rng = random.Random(0)
    tree = Tree([node(1, fitness=1.2), node(2, fitness=1.9), node(3, status="incorrect")])
    assert greedy(tree, rng, cfg) == [2]
    failed = Tree([node(1, status="compile_error"), node(2, status="incorrect")])
    assert greedy(failed, rng, cfg) == [2]  # the newest failure gets debugged
    debugged = Tree(
        [node(1, status="incorrect"), node(2, 1, status="incorrect"), node(3, 1, status="incorrect")]
    )
    assert greedy(debugged, rng, cfg) == [3]  # node 1 had its debug_children (2) already


def test_a_node_whose_children_were_declined_twice_is_left_alone() -> None:
    cfg = SearchConfig()
    nodes = [node(1, fitness=2.0), node(2, fitness=1.0)]
    nodes += [node(3, 1, status="exhausted", state="failed"), node(4, 1, status="exhausted", state="failed")]
    assert greedy(Tree(nodes), random.Random(0), cfg) == [2]


def test_uct_formula_and_exploration() -> None:
    n = node(1, fitness=1.0)
    assert uct_score(n, best_fitness=2.0, total=10, c=0.7) == pytest.approx(
        0.5 + 0.7 * (2.302585 / 1) ** 0.5, rel=1e-4
    )
    # a well-visited best vs an unvisited slightly-worse node: exploration wins
    nodes = [node(1, fitness=2.0), node(2, fitness=1.9)] + [node(i, 1, fitness=0.5) for i in range(3, 9)]
    assert uct(Tree(nodes), random.Random(0), SearchConfig(uct_c=0.7)) == [2]
    # with no exploration it is greedy
    assert uct(Tree(nodes), random.Random(0), SearchConfig(uct_c=0.0)) == [1]


def test_evolutionary_population_tournament_and_crossover() -> None:
    nodes = [node(i, fitness=float(i)) for i in range(1, 11)]
    cfg = SearchConfig(population=3, crossover=1.0)
    picks = [evolutionary(Tree(nodes), random.Random(s), cfg) for s in range(30)]
    assert all(len(p) == 2 and p[0] != p[1] for p in picks)
    assert {i for p in picks for i in p} <= {8, 9, 10}  # only the population breeds
    cfg = SearchConfig(population=3, crossover=0.0)
    assert all(len(evolutionary(Tree(nodes), random.Random(s), cfg)) == 1 for s in range(10))
    assert evolutionary(Tree([node(1, status="incorrect")]), random.Random(0), cfg) == [1]


def test_memory_modes_and_schedule() -> None:
    cfg = SearchConfig(draft=2, schedule=("inherit", "compare"), fresh_after=3)
    assert choose_mode(Tree([]), [], 1, cfg) == "draft"
    assert choose_mode(Tree([node(1), node(2), node(3)]), [], 4, cfg) == "fresh"
    tree = Tree([node(1, fitness=1.0), node(2, 1, status="incorrect")])
    assert choose_mode(tree, [2], 3, cfg) == "inherit"  # a failed parent is debugged with its trajectory
    assert choose_mode(tree, [1], 4, cfg) == "inherit"
    assert choose_mode(tree, [1], 5, cfg) == "compare"
    stalled = Tree([node(1, fitness=2.0)] + [node(i, 1, fitness=1.0) for i in range(2, 5)])
    assert stalled.stall() == 3
    assert choose_mode(stalled, [1], 6, cfg) == "fresh"

    tree = Tree([node(1, fitness=1.0), node(2, 1, fitness=1.5), node(3, 2, fitness=1.2), node(4, 2, fitness=1.8),
                 node(5, 1, fitness=1.1)])  # fmt: skip
    assert [n.id for n in history(tree, [4], "inherit")] == [2, 1]
    assert [n.id for n in history(tree, [2], "compare")] == [
        4,
        3,
        5,
    ]  # its children and siblings, fastest first
    assert {n.id for n in history(tree, [4], "combine")} == {2, 1, 3}
    assert history(tree, [4], "fresh") == []


def test_limits_each_stop_the_run() -> None:
    base = dict(spent=0, wall_s=0.0, tokens=0, usd=0.0, stall=0, best_fitness=1.0)
    assert stop_reason(Limits(budget=5), **base) is None
    assert "candidate budget" in stop_reason(Limits(budget=5), **{**base, "spent": 5})
    assert "wall-clock" in stop_reason(Limits(wall_s=10), **{**base, "wall_s": 10.5})
    assert "token" in stop_reason(Limits(max_tokens=100), **{**base, "tokens": 100})
    assert "USD" in stop_reason(Limits(max_usd=1.0), **{**base, "usd": 1.01})
    assert "patience" in stop_reason(Limits(patience=3), **{**base, "stall": 3})
    assert "target" in stop_reason(Limits(target=1.5), **{**base, "best_fitness": 1.6})
    with pytest.raises(WorkspaceError):
        Limits(budget=0).validate()
    with pytest.raises(WorkspaceError):
        SearchConfig(policy="random").validate()
    with pytest.raises(WorkspaceError):
        SearchConfig(schedule=("inherit", "sideways")).validate()


@pytest.fixture
def ws_with_run(tmp_path: Path) -> tuple[Workspace, str]:
    ws = Workspace.open(tmp_path / "ws")
    ws.record_spec("fp", "spec", "spec.py", "source", {})
    run_id = ws.create_run("fp", "spec.py", "cpu", "tuner", "uct", {"a": 1}, {"budget": 3})
    return ws, run_id


def test_node_lifecycle_and_costs_counted_once(ws_with_run: tuple[Workspace, str]) -> None:
    ws, run_id = ws_with_run
    a = ws.create_node(run_id, None, None, "draft")
    b = ws.create_node(run_id, a, None, "inherit")
    assert (a, b) == (1, 2)
    ws.propose_node(run_id, a, source="print(1)", note="n", prompt="p", response="r", tokens_in=10, tokens_out=5,
                    cost_usd=0.5)  # fmt: skip
    with pytest.raises(WorkspaceError):  # a node is proposed once: its cost cannot be counted twice
        ws.propose_node(run_id, a, source="print(2)", tokens_in=10, cost_usd=0.5)
    ws.propose_node(run_id, b, source=None, error="no code in the answer", status="synth_error", tokens_in=3)
    run = ws.run(run_id[:4])
    assert (run["tokens_in"], run["tokens_out"], run["cost_usd"]) == (13, 5, 0.5)
    verdict = {"status": "ok", "spec_fingerprint": "fp", "candidate_hash": ws.nodes(run_id)[0]["candidate_hash"],
               "fitness": 1.5, "speedup_vs_eager": 2.0}  # fmt: skip
    eid = ws.finish_node(run_id, a, verdict, 1.2)
    assert [e["id"] for e in ws.evaluations()] == [eid]
    with pytest.raises(WorkspaceError):  # evaluated once: a second verdict is refused, and not recorded
        ws.finish_node(run_id, a, {**verdict, "status": "incorrect"}, 1.0)
    assert [e["id"] for e in ws.evaluations()] == [eid]
    nodes = ws.nodes(run_id, text=True)
    assert [(n["id"], n["state"]) for n in nodes] == [(1, "evaluated"), (2, "failed")]
    assert (
        nodes[0]["source"] == "print(1)"
        and nodes[0]["prompt"] == "p"
        and nodes[0]["verdict"]["fitness"] == 1.5
    )
    assert nodes[1]["message"] == "no code in the answer" and nodes[1]["status"] == "synth_error"
    assert ws.runs()[0]["nodes"] == {"evaluated": 1, "failed": 1}


def test_concurrent_node_creation_never_collides(ws_with_run: tuple[Workspace, str], tmp_path: Path) -> None:
    ws, run_id = ws_with_run
    other = Workspace.open(tmp_path / "ws")  # a second connection, as a second process would have
    ids: list[int] = []
    lock = threading.Lock()

    def make(w: Workspace) -> None:
        for _ in range(20):
            i = w.create_node(run_id, None, None, "draft")
            with lock:
                ids.append(i)

    threads = [threading.Thread(target=make, args=(w,)) for w in (ws, other, ws, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ids) == list(range(1, 81))


def test_run_ids_resolve_by_prefix(ws_with_run: tuple[Workspace, str]) -> None:
    ws, run_id = ws_with_run
    assert ws.resolve_run(run_id[:3]) == run_id
    with pytest.raises(WorkspaceError, match="no run"):
        ws.resolve_run("zzzz")


def _final(shapes: list[tuple[str, float, float, float, float]], quartiles: float | None = None) -> Any:
    """A re-measured verdict: per shape (name, candidate us, eager us, compile us, spread); each time's
    quartiles `quartiles` (relative) from its median, the spread where not given."""
    from kernelevolve.evaluate.verdict import ShapeResult, Status, TimeStats, Verdict

    def stats(us: float, spread: float) -> TimeStats:
        q = spread if quartiles is None else quartiles
        return TimeStats(median_s=us * 1e-6, p25_s=us * (1 - q) * 1e-6, p75_s=us * (1 + q) * 1e-6,
                         min_s=us * (1 - q) * 1e-6, n=50, spread=spread)  # fmt: skip

    out = []
    for name, cand, eager, comp, spread in shapes:
        out.append(ShapeResult(name=name, weight=1.0, correct=True, candidate=stats(cand, spread),
                               eager=stats(eager, spread), compile=stats(comp, spread),
                               speedup_vs_eager=eager / cand, speedup_vs_compile=comp / cand))  # fmt: skip
    return Verdict(status=Status.OK, correct=True, timed=True, shapes=out)


def test_dispatch_uses_a_kernel_only_where_it_beats_eager_beyond_the_noise() -> None:
    from kernelevolve.search.tools import dispatch_table

    finals = {
        7: _final([("fast", 10.0, 30.0, 12.0, 0.01), ("noisy", 10.0, 10.4, 10.0, 0.05)]),
        # 1.4x faster than torch.compile, yet slower than eager: the export's fallback is eager
        9: _final([("trap", 100.0, 88.0, 140.0, 0.01)]),
    }
    table = dispatch_table(
        ["fast", "noisy", "trap", "unseen"], {"fast": 7, "noisy": 7, "trap": 9}, finals, 0.01
    )
    assert table["fast"]["node"] == 7
    assert table["noisy"]["node"] is None and table["noisy"]["candidate_node"] == 7  # +4% inside a 5% spread
    assert table["trap"]["node"] is None
    assert table["unseen"] == {"node": None}
    assert table["fast"]["fallback"] == "compile" and table["trap"]["fallback"] == "eager"


def test_dispatch_falls_back_to_the_compiled_reference_where_it_beats_eager() -> None:
    """Where torch.compile ran the reference faster than eager beyond the noise, a kernel must beat
    the compiled reference to be dispatched, and the fallback is the compiled reference."""
    from kernelevolve.search.tools import dispatch_table

    finals = {
        # 1.5x faster than eager, slower than torch.compile: the compiled reference runs
        3: _final([("beaten", 100.0, 150.0, 80.0, 0.01)]),
        # faster than both: the kernel
        4: _final([("wins", 60.0, 150.0, 80.0, 0.01)]),
        # torch.compile 1% faster than eager, inside a 3% spread: eager stays the fallback
        5: _final([("tie", 100.0, 150.0, 148.5, 0.03)]),
    }
    table = dispatch_table(["beaten", "wins", "tie"], {"beaten": 3, "wins": 4, "tie": 5}, finals, 0.01)
    assert table["beaten"]["node"] is None and table["beaten"]["fallback"] == "compile"
    assert table["wins"]["node"] == 4 and table["wins"]["fallback"] == "compile"
    assert table["tie"]["node"] == 5 and table["tie"]["fallback"] == "eager"


def test_one_disturbed_block_does_not_keep_eager_where_compile_is_clearly_faster() -> None:
    """swiglu's prefill on an H200: torch.compile 130 us, eager 219 us, a spread of 2.8 (one block of
    trials disturbed) with the quartiles 2% from the median: the compiled reference is the fallback.
    Quartiles that overlap keep eager (the control)."""
    from kernelevolve.search.tools import dispatch_table

    def fallback(quartiles: float) -> dict[str, Any]:
        final = _final([("prefill", 131.0, 219.0, 130.0, 2.8)], quartiles)
        return dispatch_table(["prefill"], {"prefill": 1}, {1: final}, 0.01)["prefill"]

    clear = fallback(0.02)
    assert clear["fallback"] == "compile" and clear["node"] is None
    assert fallback(0.3)["fallback"] == "eager"  # 130 * 1.3 > 219 * 0.7: the quartiles overlap


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_a_new_best_is_profiled_only_while_later_candidates_can_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    """A profile costs seconds of the device's lease and ~15 s of wall time: one that no later
    proposal reads is spent for nothing (it was most of a budget-2 bench's wall time on an H100).
    With one expansion at a time, the next candidate is being proposed while a profile runs, so a
    profile is taken only when at least two candidates are left after the new best."""
    from kernelevolve.optimize import drive, start
    from kernelevolve.search import profiling
    from kernelevolve.synth import SynthConfig
    from tests.conftest import SPECS, cpu_settings

    profiled: list[str] = []

    def fake_profile(spec: object, platform: object, source: str, settings: object, **kw: object) -> dict:
        profiled.append(source)
        return {}

    monkeypatch.setattr(profiling, "profile_candidate", fake_profile)
    settings = cpu_settings(tmp_path, profile="torch", baselines=["eager"], fitness_baseline="eager")
    run_id = start(SPECS / "softmax.py", settings, SearchConfig(draft=1, parallel=1), Limits(budget=budget),
                   SynthConfig("tuner"))  # fmt: skip
    drive(run_id, settings.workspace)
    with Workspace.open(settings.workspace) as ws:
        nodes = sorted(ws.nodes(run_id, text=True), key=lambda n: n["id"])
    assert len(nodes) == budget and nodes[0]["status"] == "ok", [(n["status"], n["message"]) for n in nodes]
    assert nodes[-1]["source"] not in profiled  # nothing was left to propose after it
    if budget > 2:  # the first candidate, a new best with two more to come, was profiled
        assert profiled and profiled[0] == nodes[0]["source"]
    else:
        assert profiled == []


def test_a_profile_runs_beside_the_search_where_the_device_allows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU a new best's profile runs on a thread of its own: `offer` returns at once, the newest
    best waiting meanwhile replaces an older one, and the diagnosis lands when the profile ends. On an
    exclusive device (the CPU) it runs in the caller, which waits: a profiled process starting beside
    another candidate's timing would disturb it."""
    from types import SimpleNamespace

    from kernelevolve.search import profiling

    started, release = threading.Event(), threading.Event()
    profiled: list[str] = []

    def slow_profile(spec: object, platform: object, source: str, settings: object, **kw: object) -> dict:
        profiled.append(source)
        started.set()
        assert release.wait(30)
        return {"shape": "small", "tools": ["torch.profiler"], "profiler": {"kernels_per_call": 1}}

    monkeypatch.setattr(profiling, "profile_candidate", slow_profile)
    monkeypatch.setattr(profiling, "diagnose", lambda verdict, metrics: {"metrics": metrics})
    written: list[tuple[int, dict[str, Any]]] = []
    ws = SimpleNamespace(set_node_diagnosis=lambda run, node, d: written.append((node, d)))
    settings = SimpleNamespace(profile="auto", profile_budget=3)
    ctx = SimpleNamespace(
        spec=None, platform=SimpleNamespace(name="cuda", exclusive=False), settings=settings, ws=ws
    )
    profiler = profiling.NewBestProfiler(ctx, "run", 2, 12, lambda: 2, lambda event, data: None)

    def node(i: int) -> Node:
        return Node(i, None, None, "draft", "evaluated", "ok", source=f"kernel {i}", verdict={})

    t0 = time.monotonic()
    profiler.offer(node(1))
    assert started.wait(10) and time.monotonic() - t0 < 5  # returned while the profile runs
    profiler.offer(node(2))
    profiler.offer(node(3))  # newer: node 2 is never profiled
    assert written == []
    release.set()
    deadline = time.monotonic() + 10
    while len(written) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    profiler.join()
    assert profiled == ["kernel 1", "kernel 3"] and [n for n, _ in written] == [1, 3]
    assert written[0][1]["metrics"]["tools"] == ["torch.profiler"]

    ctx.platform = SimpleNamespace(name="cpu", exclusive=True)
    settings.profile = "torch"
    inline = profiling.NewBestProfiler(ctx, "run", 1, 12, lambda: 2, lambda event, data: None)
    inline.offer(node(4))  # release is set: it returns once the profile has ended
    assert profiled[-1] == "kernel 4" and written[-1][0] == 4


def test_a_remeasure_apart_from_the_search_beyond_both_spreads_is_said() -> None:
    """The final re-measure (fresh workers) against the best node's search-time verdict: a 25% drop is
    said, with both figures; a 1.5% one inside the spreads is not; a noisy search (20% spread) widens
    what counts as agreement."""
    from types import SimpleNamespace

    from kernelevolve.search.finish import remeasure_disagreement

    def node(fitness: float, spread: float) -> SimpleNamespace:
        return SimpleNamespace(fitness=fitness, spread=spread)

    said = remeasure_disagreement(node(2.0, 0.01), node(1.5, 0.01))
    assert said is not None and "1.500x against 2.000x" in said and "-25.0%" in said
    assert remeasure_disagreement(node(2.0, 0.01), node(1.97, 0.01)) is None
    assert remeasure_disagreement(node(2.0, 0.2), node(1.5, 0.1)) is None
    assert remeasure_disagreement(None, node(1.5, 0.01)) is None
