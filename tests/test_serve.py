"""The live view (`kernelevolve serve`) without a browser: a real server on an ephemeral port over a
workspace written through the store's own API (what a search writes, without evaluating anything),
its pages and JSON, a node written while it serves showing up in the next poll, escaping of hostile
kernel text, read-only access, and the command line."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kernelevolve.cli import app
from kernelevolve.errors import WorkspaceError
from kernelevolve.evaluate.verdict import Method, ShapeResult, Status, TimeStats, Verdict
from kernelevolve.serve import LiveServer, make_server, to_json
from kernelevolve.store import Workspace

SPEC_FP = "f" * 16
SEED = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
BETTER = SEED.replace("return x * 2", "return x + x  # fused")
HOSTILE = "</script><script>alert(1)</script>"
EVIL = SEED.replace("return x * 2", f"return x * 2  # {HOSTILE}")
EVIL_NOTE = '<img src=x onerror="alert(2)"> unroll'


def verdict(fitness: float, status: Status = Status.OK) -> dict[str, Any]:
    stats = TimeStats(
        median_s=1e-5 / max(fitness, 0.1), p25_s=1e-5, p75_s=1e-5, min_s=1e-5, n=20, spread=0.01
    )
    shape = ShapeResult(name="big", weight=1.0, correct=status == Status.OK, candidate=stats, eager=stats)
    return Verdict(
        status=status,
        correct=status == Status.OK,
        timed=status == Status.OK,
        shapes=[shape],
        speedup_vs_eager=fitness if status == Status.OK else None,
        fitness=fitness if status == Status.OK else 0.0,
        spec_fingerprint=SPEC_FP,
        method=Method(platform="cpu", device="test cpu"),
        message="" if status == Status.OK else "max abs error 3.1 at [0, 2]",
    ).to_dict()


def add_node(ws: Workspace, run_id: str, parent: int | None, source: str, fitness: float, **kw: Any) -> int:
    """One node through the three writes a search makes: created, proposed, evaluated."""
    status = kw.pop("status", Status.OK)
    node = ws.create_node(run_id, parent, None, "seed" if parent is None else "mutate")
    digest = ws.propose_node(run_id, node, source=source, kind="python", note=kw.pop("note", "a try"))
    ws.finish_node(run_id, node, {**verdict(fitness, status), "candidate_hash": digest}, eval_s=1.5)
    return node


@dataclass
class Live:
    root: Path
    run_id: str
    bench_id: str
    server: LiveServer

    def get(self, path: str) -> tuple[int, str, Any]:
        """(status, content type, body: parsed JSON or text)."""
        try:
            with urllib.request.urlopen(self.server.url.rstrip("/") + path, timeout=10) as r:
                body, status, ctype = r.read().decode(), r.status, r.headers["Content-Type"]
        except urllib.error.HTTPError as e:
            body, status, ctype = e.read().decode(), e.code, e.headers["Content-Type"]
        return status, ctype, json.loads(body) if ctype.startswith("application/json") else body


def build_workspace(root: Path) -> tuple[str, str]:
    """A run of five nodes (seed, a better child, an incorrect one, the best one whose source and note
    are hostile, one still being synthesized) and a bench of one done op: the fixture the live view tests and the browser test share."""
    with Workspace.open(root) as ws:
        ws.record_spec(SPEC_FP, "double", "specs/double.py", "# spec\n", {})
        run_id = ws.create_run(SPEC_FP, "specs/double.py", "cpu", "tuner", "uct", {}, {"budget": 8})
        seed = add_node(ws, run_id, None, SEED, 1.0)
        better = add_node(ws, run_id, seed, BETTER, 1.8)
        add_node(ws, run_id, seed, SEED.replace("2", "3"), 0.0, status=Status.INCORRECT)
        add_node(ws, run_id, better, EVIL, 2.1, note=EVIL_NOTE)  # the best
        ws.create_node(run_id, better, None, "mutate")  # being synthesized: no source yet
        bench_id = ws.create_bench("key", "suites/demo", {"budget": 8, "fitness_baseline": "eager"})
        row = {
            "name": "double", "correct": True, "run_id": run_id, "speedup_vs_eager": 1.8, "speedup_vs_compile": 1.2,
            "fitness": 1.8, "roofline_fraction": 0.4, "candidates": 4, "curve": [1.0, 1.8, 1.8, 1.8],
            "suspicious": 0,
        }  # fmt: skip
        ws.put_bench_item(
            bench_id, "suites/demo/double.py", 0, "double", run_id=run_id, status="done", result=row
        )
        ws.put_bench_item(bench_id, "suites/demo/next.py", 1, "next", status="pending")
    return run_id, bench_id


@contextmanager
def serving(root: Path) -> Iterator[Live]:
    """The fixture's workspace at `root`, served on an ephemeral port of 127.0.0.1 until the block ends."""
    run_id, bench_id = build_workspace(root)
    server = make_server(root, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Live(root, run_id, bench_id, server)
    finally:
        server.shutdown()
        server.server_close()
        server.view.close()
        thread.join(5)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    with serving(tmp_path / "ws") as served:
        yield served


def test_page_and_its_assets_are_local_and_locked_down(live: Live) -> None:
    status, ctype, page = live.get("/")
    assert status == 200 and ctype.startswith("text/html")
    assert '<script src="/live.js"' in page and "http" not in page.replace("http-equiv", "")  # no CDN
    with urllib.request.urlopen(live.server.url, timeout=10) as r:
        csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    status, ctype, js = live.get("/live.js")
    assert status == 200 and "javascript" in ctype and "textContent" in js and "fetch(" in js
    assert "innerHTML" in js and js.count("innerHTML") == 1  # only the server-built charts go in as markup


def test_runs_list(live: Live) -> None:
    _, ctype, doc = live.get("/api/runs")
    assert ctype.startswith("application/json")
    (run,) = doc["runs"]
    assert run["run_id"] == live.run_id and run["spec"] == "double" and run["status"] == "running"
    assert (run["nodes"], run["evaluated"], run["budget"], run["best"]) == (5, 4, 8, "2.10x")
    (bench,) = doc["benches"]
    assert bench["bench_id"] == live.bench_id and (bench["items"], bench["done"]) == (2, 1)


def test_run_tree_progress_and_charts(live: Live) -> None:
    _, _, doc = live.get(f"/api/runs/{live.run_id[:4]}")  # a prefix names the run, as on the CLI
    assert doc["run_id"] == live.run_id and doc["best"] == 4 and doc["best_path"] == [1, 2, 4]
    assert doc["progress"]["evaluated"] == 4 and doc["progress"]["budget"] == 8
    assert doc["progress"]["states"] == {"evaluated": 4, "created": 1}
    statuses = {n["id"]: n["status"] for n in doc["nodes"]}
    assert statuses == {1: "ok", 2: "ok", 3: "incorrect", 4: "ok", 5: "pending"}
    assert [n["cells"][1] for n in doc["nodes"]] == ["-", "1", "1", "2", "2"]  # parents
    tree = ET.fromstring(doc["charts"]["tree"])  # well-formed SVG, linking to the live node pages
    links = [a.get("href") for a in tree.iter("{http://www.w3.org/2000/svg}a")]
    assert f"#/run/{live.run_id}/node/4" in links and len(links) == 5
    curve = doc["charts"]["curve"]
    assert "best 2.10x" in curve and "nodes evaluated" in curve
    assert "seconds since the run started" in doc["charts"]["time"] and "best 2.10x" in doc["charts"]["time"]


def test_node_source_and_diff_against_its_parent(live: Live) -> None:
    _, _, doc = live.get(f"/api/runs/{live.run_id}/nodes/2")
    assert doc["source"] == BETTER
    assert "-        return x * 2" in doc["diff"] and "+        return x + x  # fused" in doc["diff"]
    assert dict(doc["facts"])["fitness"] == "1.80x" and doc["shapes"][0][0] == "big"
    _, _, seed = live.get(f"/api/runs/{live.run_id}/nodes/1")
    assert seed["diff"] is None and "seed" in seed["diff_note"]
    _, _, pending = live.get(f"/api/runs/{live.run_id}/nodes/5")
    assert pending["source"] is None and dict(pending["facts"])["status"] == "pending"
    status, _, missing = live.get(f"/api/runs/{live.run_id}/nodes/99")
    assert status == 404 and "no node 99" in missing["error"]


def test_bench_rows_and_charts(live: Live) -> None:
    _, _, doc = live.get(f"/api/benches/{live.bench_id}")
    (row,) = doc["rows"]
    assert row["run_id"] == live.run_id and row["cells"][0] == "double" and "1.80x" in row["cells"]
    assert doc["pending"] == ["suites/demo/next.py"]
    assert set(doc["charts"]) == {"speedup", "roofline", "progress", "cost"}
    assert "double" in doc["charts"]["speedup"] and ET.fromstring(doc["charts"]["cost"]) is not None


def test_a_node_written_while_serving_appears_in_the_next_poll(live: Live) -> None:
    _, _, first = live.get(f"/api/runs/{live.run_id}")
    _, _, same = live.get(f"/api/runs/{live.run_id}?since={first['stamp']}")
    assert same == {"stamp": first["stamp"], "unchanged": True}  # nothing written: nothing resent
    _, _, listed = live.get("/api/runs")
    with Workspace.open(live.root) as ws:  # the search's writer, beside the server's reader
        new = add_node(ws, live.run_id, 4, BETTER.replace("fused", "fused twice"), 2.6)
    _, _, after = live.get(f"/api/runs/{live.run_id}?since={first['stamp']}")
    assert not after.get("unchanged") and after["stamp"] != first["stamp"]
    assert new == 6 and {"id": 6, "state": "evaluated", "status": "ok"}.items() <= after["nodes"][-1].items()
    assert (
        after["best"] == 6 and after["best_path"] == [1, 2, 4, 6] and "best 2.60x" in after["charts"]["curve"]
    )
    _, _, relisted = live.get(f"/api/runs?since={listed['stamp']}")
    assert relisted["runs"][0]["best"] == "2.60x"


def test_hostile_kernel_text_is_escaped_everywhere(live: Live) -> None:
    # JSON: no angle bracket at all in the text, the source intact once parsed.
    with urllib.request.urlopen(live.server.url + f"api/runs/{live.run_id}/nodes/4", timeout=10) as r:
        raw = r.read().decode()
    assert "<" not in raw and ">" not in raw and "\\u003c/script\\u003e" in raw
    assert json.loads(raw)["source"] == EVIL
    _, _, run = live.get(f"/api/runs/{live.run_id}")
    assert (
        "<img" not in run["charts"]["tree"]
        and "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in run["charts"]["tree"]
    )
    # The static report the view links to: the source is text in a <pre>, never a script.
    status, ctype, html = live.get(f"/api/runs/{live.run_id}/report")
    assert status == 200 and ctype.startswith("text/html")
    assert HOSTILE not in html and "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script" not in html.lower() and "<img" not in html.lower()


def test_static_report_has_the_run(live: Live) -> None:
    _, _, html = live.get(f"/api/runs/{live.run_id}/report")
    assert f"kernelevolve run {live.run_id}: double" in html and "<svg" in html


def test_unknown_paths_and_foreign_hosts_are_refused(live: Live) -> None:
    status, _, doc = live.get("/api/runs/nope")
    assert status == 404 and "no run 'nope'" in doc["error"] and doc["hint"]
    status, _, doc = live.get("/etc/passwd")
    assert status == 404
    request = urllib.request.Request(live.server.url + "api/runs", headers={"Host": "attacker.example"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 403  # a rebound DNS name cannot read the workspace


def test_the_view_reads_only(live: Live) -> None:
    with pytest.raises(Exception, match="readonly"):
        live.server.view.ws._connection().execute("DELETE FROM nodes")
    with pytest.raises(WorkspaceError, match="no workspace database"):
        Workspace.open_readonly(live.root / "missing")
    assert not (live.root / "missing").exists()  # nothing created


def test_json_has_no_markup_and_no_nan() -> None:
    text = to_json({"a": "</script>&", "b": float("nan"), "c": [float("inf"), 1.5]}).decode()
    assert json.loads(text) == {"a": "</script>&", "b": None, "c": [None, 1.5]}
    assert "<" not in text and "&" not in text


def test_cli_serve_refuses_a_missing_workspace(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "-w", str(tmp_path / "none"), "--port", "0"])
    assert result.exit_code == 2 and "no workspace at" in result.output  # the read-only commands' refusal
