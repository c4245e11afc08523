"""Run reports: both files written, the numbers in them, the tree at 200 nodes, and escaping of the
untrusted text (sources, notes, messages) that a model or generated code wrote."""

from __future__ import annotations

import random
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kernelevolve.evaluate.verdict import Method, ShapeResult, Status, TimeStats, Verdict
from kernelevolve.report import write_report
from kernelevolve.report.fmt import fence, fmt_time, fmt_x, md
from kernelevolve.report.render import ancestry, find_best, gather
from kernelevolve.report.svg import tree_layout

ROOT_SOURCE = (
    "import torch\n\nclass ModelNew:\n    def forward(self, x):\n        return torch.softmax(x, -1)\n"
)


def _stats(median: float) -> TimeStats:
    return TimeStats(
        median_s=median, p25_s=median * 0.98, p75_s=median * 1.02, min_s=median * 0.95, n=50, spread=0.01
    )


def _verdict(speedup: float) -> dict[str, Any]:
    shapes = [
        ShapeResult(
            name="decode",
            weight=0.5,
            correct=True,
            candidate=_stats(12e-6 / speedup),
            eager=_stats(12e-6),
            compile=_stats(10e-6),
            speedup_vs_eager=speedup,
            speedup_vs_compile=speedup * 10 / 12,
            roofline_fraction=0.42,
            bound="memory",
        ),
        ShapeResult(name="wide", weight=0.5, correct=True, candidate=_stats(2.5e-3), eager=_stats(3e-3)),
    ]
    method = Method(platform="cuda", device="NVIDIA H100", torch="2.5.1", triton="3.1.0", timer="cuda_events")
    return Verdict(
        status=Status.OK,
        correct=True,
        timed=True,
        shapes=shapes,
        speedup_vs_eager=speedup,
        speedup_vs_compile=speedup * 10 / 12,
        fitness=speedup * 10 / 12,
        method=method,
    ).to_dict()


def make_run(n: int = 12, seed: int = 0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A synthetic run: seeds, mutations and crossovers with a mix of outcomes."""
    rng = random.Random(seed)
    statuses = ["ok", "ok", "ok", "incorrect", "compile_error", "runtime_error", "timeout"]
    nodes: list[dict[str, Any]] = []
    for i in range(1, n + 1):
        parent = None if i <= 2 else rng.randrange(1, i)
        parent2 = rng.randrange(1, i) if i > 4 and rng.random() < 0.1 else None
        state = "created" if i == n else rng.choice(["evaluated", "evaluated", "evaluated", "failed"])
        status = None if state == "created" else rng.choice(statuses) if state == "evaluated" else "crash"
        fit = round(rng.uniform(0.5, 2.5), 3) if status == "ok" else 0.0
        nodes.append(
            {
                "id": i,
                "parent": parent,
                "parent2": parent2,
                "mode": "seed" if parent is None else "crossover" if parent2 else "mutate",
                "state": state,
                "status": status,
                "fitness": fit,
                "speedup_vs_eager": fit * 1.2 if status == "ok" else None,
                "speedup_vs_compile": fit if status == "ok" else None,
                "note": f"try tile {16 * i}",
                "message": "" if status == "ok" else f"{status}: something went wrong",
                "source": ROOT_SOURCE + f"# node {i}\nBLOCK = {16 * i}\n",
                "verdict": _verdict(fit * 1.2) if status == "ok" else None,
                "tokens_in": 1000,
                "tokens_out": 300,
                "cost_usd": 0.01,
                "synth_s": 2.0,
                "eval_s": 1.5,
                "created_at": "2025-01-01T00:00:00+00:00",
            }
        )
    ok = [nd for nd in nodes if nd["status"] == "ok"]
    best = max(ok, key=lambda nd: nd["fitness"]) if ok else None
    run = {
        "run_id": "r-1",
        "spec_name": "row_softmax",
        "spec_path": "examples/softmax/spec.py",
        "platform": "cuda",
        "device": "NVIDIA H100",
        "synthesizer": "fake",
        "policy": "beam",
        "status": "done",
        "created_at": "2025-01-01T12:30:00+00:00",
        "limits": {"max_nodes": n, "max_usd": 5.0},
        "config": {"beam": 4},
        "best_node": best["id"] if best else None,
        "tokens_in": 1000 * n,
        "tokens_out": 300 * n,
        "cost_usd": 0.01 * n,
        "wall_s": 754.0,
        "method": _verdict(1.0)["method"],
        "final": _verdict(best["fitness"] * 1.2) if best else None,
        "baseline": "compile",
    }
    return run, nodes


def _outside_fences(text: str) -> str:
    return re.sub(r"^(`{3,})[^\n]*\n.*?^\1$", "", text, flags=re.S | re.M)


def test_writes_both_reports_with_the_run_facts(tmp_path: Path) -> None:
    run, nodes = make_run(12)
    paths = write_report(run, nodes, tmp_path)
    assert {p.name for p in paths.values()} == {"report.md", "report.html", "best_so_far.svg", "tree.svg"}
    page = paths["html"].read_text()
    text = paths["markdown"].read_text()
    for doc in (page, text):
        assert "row_softmax" in doc and "NVIDIA H100" in doc and "torch 2.5.1" in doc and "beam" in doc
        assert "max_nodes=12" in doc and "2025-01-01 12:30:00 UTC" in doc and "12m 34s" in doc
        assert "decode" in doc and "10 us" in doc and "42%" in doc and "memory" in doc
        assert "$0.1200" in doc and "12,000" in doc  # cost and tokens
        assert "18.0" in doc  # GPU-seconds: 12 nodes x 1.5 s
    assert "<script" not in page.lower() and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert page.count("<svg") == 2
    for svg in (paths["curve_svg"], paths["tree_svg"]):
        ET.fromstring(svg.read_text())  # standalone, well-formed SVG


def test_the_times_say_what_they_are(tmp_path: Path) -> None:
    """Issue I: an agent run's report gave "wall time 23.7 s" for six minutes (the engine's time in
    its last call) and "GPU-seconds" on a CPU run. An agent run shows the time from its start to its
    last record; the evaluations' seconds are named for the device."""
    run, nodes = make_run(4)
    text = write_report(run, nodes, tmp_path / "search")["markdown"].read_text()
    assert "GPU-seconds" in text and "wall time" in text and "elapsed" not in text
    agent = {**run, "synthesizer": "agent", "platform": "cpu", "updated_at": "2025-01-01T12:36:10+00:00"}
    text = write_report(agent, nodes, tmp_path / "agent")["markdown"].read_text()
    assert "CPU-seconds" in text and "GPU-seconds" not in text
    assert "wall time" not in text and "12m 34s" not in text  # the engine's sessions: not the run's time
    assert "elapsed (start to last record)" in text and "6m 10s" in text


def test_missing_values_render_as_dashes(tmp_path: Path) -> None:
    run: dict[str, Any] = {"run_id": "bare", "final": None, "method": {}, "best_node": None}
    nodes: list[dict[str, Any]] = [
        {"id": 1, "parent": None, "state": "created"},
        {"id": 2, "parent": 1, "state": "failed", "status": "crash"},
    ]
    paths = write_report(run, nodes, tmp_path)
    page = paths["html"].read_text()
    assert "none: no candidate was correct" in page and "No per-shape results." in page
    assert "<td>-</td>" in page
    assert "nan" not in paths["markdown"].read_text().lower()
    write_report({}, [], tmp_path / "empty")  # nothing at all still renders


def test_best_falls_back_to_the_fittest_ok_node_and_its_verdict(tmp_path: Path) -> None:
    run, nodes = make_run(30, seed=3)
    run["best_node"], run["final"] = None, None
    best = find_best(run, nodes)
    assert best is not None and best["fitness"] == max(n["fitness"] for n in nodes if n["status"] == "ok")
    facts = gather(run, nodes)
    assert facts.final_from == "the best node's verdict from the search"
    assert facts.shape_rows[0][0] == "decode" and facts.shape_rows[0][6] == fmt_x(best["fitness"] * 1.2)
    path = ancestry(best, nodes)
    assert path[-1] == best["id"] and nodes[path[0] - 1]["parent"] is None
    # the curve is a running maximum over evaluated nodes only
    bests = [p.best for p in facts.curve]
    assert bests == sorted(bests) and len(facts.curve) == sum(n["state"] != "created" for n in nodes)
    assert facts.curve[-1].best == best["fitness"]


def test_winning_diff_against_root_and_parent(tmp_path: Path) -> None:
    nodes: list[dict[str, Any]] = [
        {
            "id": 1,
            "parent": None,
            "state": "evaluated",
            "status": "ok",
            "fitness": 1.0,
            "source": "a = 1\nb = 2\n",
        },
        {
            "id": 2,
            "parent": 1,
            "state": "evaluated",
            "status": "ok",
            "fitness": 1.5,
            "source": "a = 1\nb = 3\n",
        },
        {
            "id": 3,
            "parent": 2,
            "state": "evaluated",
            "status": "ok",
            "fitness": 2.0,
            "source": "a = 9\nb = 3\n",
        },
    ]
    paths = write_report({"best_node": 3}, nodes, tmp_path)
    text = paths["markdown"].read_text()
    assert "--- node 1 (root)" in text and "+++ node 3 (best)" in text and "-b = 2" in text
    assert "--- node 2 (parent)" in text
    page = paths["html"].read_text()
    assert '<span class="add">+a = 9</span>' in page and '<span class="del">-a = 1</span>' in page
    seed_only = write_report({"best_node": 1}, nodes[:1], tmp_path / "seed")["markdown"].read_text()
    assert "it is a seed" in seed_only


def test_tree_of_200_nodes_stays_legible(tmp_path: Path) -> None:
    run, nodes = make_run(200, seed=7)
    placed, roots, rows = tree_layout(nodes)
    assert len(placed) == 200 and roots == [1, 2]
    # every node sits right of its parent and inside its children's span; leaves have distinct rows
    for p in placed.values():
        parent = p.node["parent"]
        if parent is not None:
            assert placed[parent].depth == p.depth - 1
    parents = {n["parent"] for n in nodes}
    leaf_rows = [p.row for p in placed.values() if p.node["id"] not in parents]
    assert len(set(leaf_rows)) == len(leaf_rows) == rows
    paths = write_report(run, nodes, tmp_path)
    svg = paths["tree_svg"].read_text()
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f".//{ns}a")) == 200  # one linked node each
    assert 'stroke-dasharray="4 3"' in svg  # crossover edges
    assert float(root.get("height", 0)) < 200 * 18 + 100  # one row per leaf at most
    best = run["best_node"]
    assert f'<a href="#node-{best}">' in svg and f'id="node-{best}"' in paths["html"].read_text()


def test_deep_chain_needs_no_recursion(tmp_path: Path) -> None:
    nodes = [
        {
            "id": i,
            "parent": i - 1 if i > 1 else None,
            "state": "evaluated",
            "status": "ok",
            "fitness": 1 + i / 3000,
        }
        for i in range(1, 3001)
    ]
    placed, _, rows = tree_layout(nodes)
    assert rows == 1 and placed[3000].depth == 2999
    # a bogus parent (later or unknown) makes a root instead of a cycle
    cyclic = [{"id": 1, "parent": 2}, {"id": 2, "parent": 1}, {"id": 3, "parent": 99}]
    assert tree_layout(cyclic)[1] == [1, 3]
    assert ancestry(cyclic[1], cyclic) == [1, 2]


def test_untrusted_text_comes_out_escaped(tmp_path: Path) -> None:
    """Adversarial: markup in a message, note, source, mode and the spec name must never become markup."""
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    source = f'"""</pre>{evil}"""\n```\n{evil}\n```\nx = 1 & 2\n'
    run, nodes = make_run(6, seed=4)  # the best (node 5) descends from node 1
    run["spec_name"] = f"softmax {evil}"
    run["config"] = {"prompt": evil}
    best = next(n for n in nodes if n["id"] == run["best_node"])
    best.update(message=evil, note=f"| [click](javascript:alert(1)) {evil}", source=source, mode=evil)
    nodes[0]["message"] = "</td></tr></table>" + evil
    paths = write_report(run, nodes, tmp_path)
    page = paths["html"].read_text()
    assert "<script" not in page.lower() and "<img" not in page.lower()
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "x = 1 &amp; 2" in page
    for svg in (paths["tree_svg"].read_text(), paths["curve_svg"].read_text()):
        assert "<script" not in svg.lower()
        ET.fromstring(svg)
    text = paths["markdown"].read_text()
    prose = _outside_fences(text)
    assert "<script" not in prose.lower() and "<img" not in prose.lower() and "</td>" not in prose
    assert not re.search(r"(?<!\\)\]\(javascript", prose) and "\\[click\\]" in prose
    # the source is inside a fence that its own ``` cannot close
    assert "````diff" in text and "````python" in text and evil in text


def test_formatting() -> None:
    assert fmt_time(None) == "-" and fmt_time(float("nan")) == "-" and fmt_time(12.3e-6) == "12.3 us"
    assert fmt_time(450e-9) == "450 ns" and fmt_time(2.5e-3) == "2.5 ms" and fmt_time(3.0) == "3 s"
    assert fmt_x(1.234) == "1.23x" and fmt_x(float("inf")) == "-" and fmt_x(True) == "-"
    assert md("a|b\n<c>") == "a\\|b &lt;c&gt;"
    assert md("compile_error _x_ [a](b)") == "compile_error \\_x\\_ \\[a\\](b)"
    assert fence("x ```` y").startswith("`````")


@pytest.mark.parametrize("n", [1, 2])
def test_tiny_runs_render(tmp_path: Path, n: int) -> None:
    run, nodes = make_run(n)
    write_report(run, nodes, tmp_path)
    assert (tmp_path / "report.html").stat().st_size > 0


def test_curve_over_time_follows_the_clock_not_creation_order() -> None:
    from kernelevolve.report.svg import CurvePoint, curve_svg

    # node 2 finished first (2 s) with 1.5x, node 1 later (30 s) with 1.2x: best so far over time
    # is 1.5x from 2 s on, never 1.2x.
    points = [CurvePoint(1, 1, 1.2, 1.2, "ok", at_s=30.0), CurvePoint(2, 2, 1.5, 1.5, "ok", at_s=2.0)]
    svg = curve_svg(points, "eager", by_time=True)
    ET.fromstring(svg)
    assert "seconds since the run started" in svg and "best 1.50x" in svg
    path = re.search(r'<path d="M([\d.]+),([\d.]+)H([\d.]+)V([\d.]+)"', svg)
    assert path is not None
    x0, y0, x1, y1 = map(float, path.groups())
    assert x0 < x1 and y1 == y0  # starts at 1.5x (node 2, first in time) and stays there
    assert "no node was evaluated" in curve_svg([CurvePoint(1, 1, 1.0, 1.0, "ok")], "eager", by_time=True)


def test_bench_bars_grow_from_one_on_a_log_axis_and_escape_labels() -> None:
    from kernelevolve.report.svg import Series, bars_svg, row_svg

    svg = bars_svg(
        "speedup", ["fast", "<b>slow</b>"], [Series("vs eager", [4.0, 0.5])], "speedup", log=True, unit="x"
    )
    root = ET.fromstring(svg)
    assert "<b>" not in svg and "&lt;b&gt;slow&lt;/b&gt;" in svg
    ns = "{http://www.w3.org/2000/svg}"
    bars = [r for r in root.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    fast, slow = (float(b.get("y") or 0) + float(b.get("height") or 0) / 2 for b in bars)
    one = float(next(ln.get("y1") or 0 for ln in root.iter(f"{ns}line") if ln.get("stroke") == "#333"))
    assert fast < one < slow  # 4x above the 1x line, 0.5x below it
    assert "nothing to plot yet" in bars_svg("empty", [], [], "y")
    both = ET.fromstring(row_svg("two", [(svg, 400.0, 300.0), (svg, 400.0, 300.0)]))
    assert both.get("width") == "800" and len(list(both)) == 2  # one standalone file of two panels
