"""The search end to end on the CPU: the offline tuner through the CLI, resume after SIGKILL, budgets,
a model through the engine (the scripted fake, registered as a provider), the agent interface and the
MCP server. Each test runs real evaluations in the isolated harness; shapes and timings are small."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kernelevolve.errors import WorkspaceError
from kernelevolve.search.limits import Limits
from kernelevolve.search.policies import SearchConfig
from kernelevolve.store import Workspace
from kernelevolve.synth import SynthConfig, providers

from .conftest import EXAMPLES, SPECS, cpu_settings
from .fakes import ScriptedModel, text_reply

FAST_ENV = {
    "KERNELEVOLVE_BASELINES": "eager",
    "KERNELEVOLVE_FITNESS_BASELINE": "eager",
    "KERNELEVOLVE_TIMING_BUDGET_S": "0.15",
    "KERNELEVOLVE_MIN_TRIALS": "10",
    "KERNELEVOLVE_MAX_TRIALS": "40",
    "KERNELEVOLVE_WARMUP_TRIALS": "2",
    # Eager's own time on a shared 2-core VM swings 4x between runs (10-40 ms at ew_chain's big
    # shape), so an honest 10x fused kernel can cross the default plausibility limit.
    "KERNELEVOLVE_SUSPICIOUS_SPEEDUP": "50",
}
C_SOFTMAX = (EXAMPLES / "softmax/c_rowsoftmax.py").read_text()


def cli(*args: str, ws: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **FAST_ENV, "KERNELEVOLVE_WORKSPACE": str(ws)}
    return subprocess.run(
        [sys.executable, "-m", "kernelevolve.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_optimize_cpu_json_runs_and_resume(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    done = cli(
        "optimize",
        str(SPECS / "ew_chain.py"),
        "--platform",
        "cpu",
        "--budget",
        "4",
        "--draft",
        "2",
        "--json",
        ws=ws,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["status"] == "done" and summary["nodes_evaluated"] == 4
    assert "candidate budget reached (4/4)" in summary["stop_reason"]
    # the fused chain is a real win over eager's six passes, re-measured in a fresh worker
    assert summary["best_speedup_vs_eager"] > 1.2, summary["shapes"]
    best = Path(summary["best_candidate"])
    assert best.is_file() and "TUNABLES" in best.read_text()
    assert Path(summary["report"]["html"]).is_file() and Path(summary["export"]).is_dir()
    assert "node 1: draft" in done.stderr and "re-measuring" in done.stderr  # progress on stderr

    listed = cli("runs", "--json", ws=ws)
    assert [r["run_id"] for r in json.loads(listed.stdout)["runs"]] == [summary["run_id"]]

    again = cli("resume", summary["run_id"], "--budget", "5", "--json", ws=ws)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = json.loads(again.stdout)
    assert resumed["run_id"] == summary["run_id"] and resumed["nodes_evaluated"] == 5
    assert set(summary) <= set(resumed)  # the same summary as optimize


def test_resume_after_sigkill_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    env = {**os.environ, **FAST_ENV, "KERNELEVOLVE_WORKSPACE": str(ws)}
    args = [
        "optimize",
        str(SPECS / "ew_chain.py"),
        "--platform",
        "cpu",
        "--budget",
        "5",
        "--draft",
        "2",
        "--parallel",
        "1",
    ]
    proc = subprocess.Popen([sys.executable, "-m", "kernelevolve.cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    db = ws / "kernelevolve.db"
    deadline = time.monotonic() + 400
    evaluated = 0
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        if db.exists():
            with sqlite3.connect(db) as conn:
                try:
                    evaluated = conn.execute(
                        "SELECT count(*) FROM nodes WHERE state = 'evaluated'"
                    ).fetchone()[0]
                except sqlite3.OperationalError:
                    continue
            if evaluated >= 2:
                break
    assert evaluated >= 2 and proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)  # the engine dies mid-run, as in a crash
    proc.wait()
    with Workspace.open(ws) as w:
        run_id = w.runs()[0]["run_id"]
        before = {n["id"]: (n["state"], n["candidate_hash"]) for n in w.nodes(run_id)}
    assert len(before) <= 5

    done = cli("resume", run_id, "--json", ws=ws)
    assert done.returncode == 0, done.stderr[-3000:]
    with Workspace.open(ws) as w:
        nodes = w.nodes(run_id)
        evaluations = w.evaluations(limit=100)
    assert [n["id"] for n in nodes] == [1, 2, 3, 4, 5]  # no node lost, none duplicated
    assert all(n["state"] == "evaluated" for n in nodes)
    for node_id, (state, digest) in before.items():  # what was stored before the kill is kept
        if state in ("proposed", "evaluated"):
            assert nodes[node_id - 1]["candidate_hash"] == digest
    # every node evaluated exactly once (plus the final re-measurement of the winners)
    per_candidate: dict[str, int] = {}
    for e in evaluations:
        per_candidate[e["candidate_hash"]] = per_candidate.get(e["candidate_hash"], 0) + 1
    finals = len([e for e in evaluations if "final" in (e["verdict"].get("candidate") or "")])
    assert sum(per_candidate.values()) == 5 + finals


def _register_script(script: list) -> None:
    providers.register("scripted", lambda model, **kw: ScriptedModel(model, script=list(script), tools=False))


def test_model_through_the_engine_records_failures_costs_and_stops_at_the_usd_cap(tmp_path: Path) -> None:
    from kernelevolve.optimize import drive, start

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "prices.toml").write_text('["fake-1"]\ninput = 100.0\noutput = 1000.0\n')  # USD per million tokens
    code = f"Here is the kernel.\n```python\n{C_SOFTMAX}\n```\n"
    cheat = "```python\nimport torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.softmax(x, -1)\n```"
    _register_script([text_reply(code), text_reply("I could not write it."), text_reply(cheat)])
    settings = replace(cpu_settings(tmp_path), workspace=ws)
    try:
        run_id = start(SPECS / "softmax.py", settings, SearchConfig(draft=3, parallel=1), Limits(budget=3),
                       SynthConfig("scripted:fake-1", single_shot=True))  # fmt: skip
        summary = drive(run_id, ws)
        with Workspace.open(ws) as w:
            nodes = w.nodes(run_id, text=True)
            run = w.run(run_id)
        statuses = [n["status"] for n in nodes]
        assert statuses == ["ok", "synth_error", "guard_violation"]
        assert "without a ```python block" in nodes[1]["message"]  # why the node has no candidate
        assert "torch" in nodes[2]["message"]  # the guard's reason is recorded for the children to read
        assert nodes[0]["prompt"] and "ModelNew" in nodes[0]["prompt"]
        assert run["tokens_in"] == 3000 and run["tokens_out"] == 300
        assert run["cost_usd"] == pytest.approx(3 * (1000 * 100 + 100 * 1000) / 1e6)
        assert summary["best_node"] == 1 and summary["synthesizer"] == "scripted:fake-1"

        # a USD cap: the first expansion costs $0.20, the cap is $0.30: two model nodes, then a clean
        # stop. The run also starts warm from run 1's kernel (same spec), which costs no tokens.
        _register_script([text_reply(code)] * 5)
        run2 = start(SPECS / "softmax.py", settings, SearchConfig(draft=5, parallel=1), Limits(budget=5, max_usd=0.3),
                     SynthConfig("scripted:fake-1", single_shot=True))  # fmt: skip
        summary2 = drive(run2, ws)
        assert "USD budget" in summary2["stop_reason"] or "cap" in summary2["stop_reason"]
        with Workspace.open(ws) as w:
            modes = [n["mode"] for n in w.nodes(run2)]
        assert modes[0] == "warm" and len(summary2["warm_start"]) == 1
        assert summary2["nodes"] == 3 and modes.count("warm") == 1  # 1 warm + 2 paid nodes
    finally:
        providers.unregister("scripted")


def test_workspace_cap_stops_a_run_on_what_all_runs_spent_and_the_estimate_says_so(tmp_path: Path) -> None:
    from kernelevolve.config import load_settings
    from kernelevolve.cost import estimate
    from kernelevolve.optimize import drive, start

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "prices.toml").write_text('["fake-1"]\ninput = 100.0\noutput = 1000.0\n')  # $0.20 per reply
    code = f"```python\n{C_SOFTMAX}\n```\n"
    settings = replace(cpu_settings(tmp_path), workspace=ws, warm_start=False)
    synth = SynthConfig("scripted:fake-1", single_shot=True)
    try:
        _register_script([text_reply(code)] * 2)
        first = drive(start(SPECS / "softmax.py", settings, SearchConfig(draft=2, parallel=1), Limits(budget=2),
                            synth), ws)  # fmt: skip
        assert first["cost_usd"] == pytest.approx(0.4)
        # The workspace may spend $0.70 in all: another run gets $0.30 of it, whatever its own caps.
        (ws / "config.toml").write_text("workspace_max_usd = 0.7\n")
        with Workspace.open(ws) as w:
            guess = estimate(w, synth, 10, load_settings(ws))
        assert guess.tokens_in == 10 * 1000 and guess.tokens_out == 10 * 100  # this workspace's history
        assert guess.usd == pytest.approx(2.0) and guess.workspace_left_usd == pytest.approx(0.3)
        assert "2 earlier candidates" in guess.line() and "stop at the cap" in guess.line()
        _register_script([text_reply(code)] * 5)
        second = drive(start(SPECS / "softmax.py", settings, SearchConfig(draft=5, parallel=1), Limits(budget=5),
                             synth), ws)  # fmt: skip
        assert "workspace" in second["stop_reason"] and "$0.70" in second["stop_reason"]
        # $0.40 + $0.20 is under the cap, so a second call is made; after it ($0.80) nothing more
        assert second["nodes"] == 2 and second["cost_usd"] == pytest.approx(0.4)
    finally:
        providers.unregister("scripted")


def test_a_model_endpoint_down_for_minutes_spends_no_budget_and_the_run_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelevolve.optimize import drive, start
    from kernelevolve.search import engine
    from kernelevolve.synth.providers.base import ProviderError

    monkeypatch.setattr(engine, "OUTAGE_WAIT_S", (0.2,))  # pauses of seconds to minutes, shortened
    ws = tmp_path / "ws"
    # "minutes" at test scale: the endpoint is down for longer than the run's outage limit of 2 s
    settings = replace(cpu_settings(tmp_path), workspace=ws, warm_start=False, provider_outage_s=2.0)
    down = ProviderError("server", "scripted:fake-1: 503 Service Unavailable (after 4 retries)")
    synth = SynthConfig("scripted:fake-1", single_shot=True)
    try:
        _register_script([down] * 100)
        run_id = start(
            SPECS / "softmax.py", settings, SearchConfig(draft=3, parallel=1), Limits(budget=3), synth
        )
        first = drive(run_id, ws)
        assert "model endpoint has failed" in first["stop_reason"] and "503" in first["stop_reason"]
        with Workspace.open(ws) as w:
            statuses = [n["status"] for n in w.nodes(run_id)]
        assert len(statuses) >= 5 and set(statuses) == {"unavailable"}  # it kept trying, for free
        assert first["nodes_evaluated"] == 0 and first["best_node"] is None

        _register_script([text_reply(f"```python\n{C_SOFTMAX}\n```\n")] * 3)  # the endpoint is back
        second = drive(run_id, ws)
        with Workspace.open(ws) as w:
            nodes = w.nodes(run_id)
        paid = [n for n in nodes if n["status"] != "unavailable"]
        assert "candidate budget reached (3/3)" in second["stop_reason"]
        assert len(paid) == 3 and all(n["status"] == "ok" for n in paid)  # the whole budget, once
        from kernelevolve.data import trajectories

        with Workspace.open(ws) as w:  # training data holds the model's steps, not the outage
            assert [t["status"] for t in trajectories(w, [run_id])] == ["ok"] * 3
    finally:
        providers.unregister("scripted")


def test_agent_next_submit_finish_and_mcp_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelevolve import agent_jobs as agent
    from kernelevolve.optimize import start

    ws = tmp_path / "ws"
    settings = replace(cpu_settings(tmp_path), workspace=ws)
    run_id = start(
        SPECS / "softmax.py", settings, SearchConfig(draft=1), Limits(budget=2), SynthConfig("agent")
    )
    task = agent.next_task(ws, run_id)
    assert task["node"] == 1 and task["mode"] == "draft" and not task["done"]
    assert Path(task["files"]["task"]).read_text().count("ModelNew") >= 1
    # a draft sees the reference's numbers (measured for it: nothing of the run was timed yet)
    assert "## The reference's own numbers" in task["prompt"] and "eager " in task["prompt"]
    assert "roofline " in task["prompt"]
    assert agent.next_task(ws, run_id)["node"] == 1  # the same task until it is submitted
    result = agent.submit(ws, run_id, 1, C_SOFTMAX, note="one row per thread, exp in place")
    assert result["status"] == "ok" and result["best"]["node"] == 1
    with pytest.raises(WorkspaceError, match="already has its candidate"):
        agent.submit(ws, run_id, 1, C_SOFTMAX)

    from mcp import Client

    from kernelevolve.mcp_server import build_server

    again = tmp_path / "again.py"
    again.write_text(C_SOFTMAX)
    # The server keeps the run warm between calls: its engine is built, and attached to a pool, once.
    import kernelevolve.optimize as optimize_mod
    from kernelevolve.agent_jobs import Session

    built: list[str] = []
    build_engine = optimize_mod.build_engine
    monkeypatch.setattr(
        optimize_mod,
        "build_engine",
        lambda ws_, rid, *a, **k: built.append(rid) or build_engine(ws_, rid, *a, **k),
    )
    session = Session(ws)

    async def use_mcp() -> tuple[set[str], dict, str, dict, dict]:
        async with Client(build_server(ws, session=session)) as client:
            tools = (await client.list_tools()).tools
            names = {t.name for t in tools}
            hints = {t.name: t.annotations.read_only_hint for t in tools if t.annotations}
            assert hints["lint"] is True and hints["read_node"] is True and hints["submit"] is False
            nxt = await client.call_tool("next_task", {"run_id": run_id})
            lint = await client.call_tool("lint", {"run_id": run_id, "source": "import os\n"})
            neither = await client.call_tool("submit", {"run_id": run_id, "node": 2})
            missing = await client.call_tool(
                "submit", {"run_id": run_id, "node": 2, "path": str(tmp_path / "no.py")}
            )
            assert "no such candidate file" in json.loads(missing.content[0].text)["error"]
            by_path = await client.call_tool(
                "submit", {"run_id": run_id, "node": 2, "path": str(again), "note": "the same kernel again"}
            )
            # outside any run: a verdict, and a profile with its diagnosis
            spec = str(SPECS / "softmax.py")
            evaluated = await client.call_tool("eval", {"spec": spec, "source": C_SOFTMAX})
            profiled = await client.call_tool("profile", {"spec": spec, "path": str(again)})
            outside = (json.loads(evaluated.content[0].text), json.loads(profiled.content[0].text))
            return (names, json.loads(nxt.content[0].text), lint.content[0].text,
                    json.loads(neither.content[0].text), json.loads(by_path.content[0].text), outside)  # fmt: skip

    names, nxt, lint, neither, by_path, (evaluated, profiled) = asyncio.run(use_mcp())
    assert evaluated["status"] == "ok" and "status: ok" in evaluated["text"] and evaluated["fitness"] > 0
    assert profiled["status"] == "ok" and profiled["diagnosis"]["class"] and profiled["metrics"]["profiler"]
    assert built == [run_id] and len(session) == 1  # four calls, one engine and pool
    session.close()
    assert len(session) == 0
    assert "source" in neither["error"] and "path" in neither["error"]
    # a file path is a submission too; the same kernel, spec, device and settings: its verdict is reused
    assert by_path["status"] == "ok" and "not evaluated again" in by_path["text"]
    assert {
        "start_run",
        "next_task",
        "read_node",
        "lint",
        "submit",
        "search_knowledge",
        "finish_run",
        "remeasure",
        "eval",
        "profile",
    } <= names
    assert nxt["node"] == 2 and nxt["parents"] == [1]  # the next node grows from the submitted one
    assert "What it changed: one row per thread, exp in place" in nxt["prompt"]  # the agent's note
    assert "os" in lint and lint != "ok"
    again_measured = agent.remeasure(ws, run_id, 1)  # live, a fresh worker; the node keeps its verdict
    with Workspace.open(ws) as w:
        ranked_by = w.nodes(run_id)[0]["evaluation_id"]
    assert again_measured["status"] == "ok" and again_measured["evaluation"] > ranked_by  # stored, its own
    assert again_measured["search_fitness"] == result["fitness"]
    assert agent.lint(ws, run_id, C_SOFTMAX) == "ok" and agent.lint(ws, run_id, "import os\n") != "ok"
    summary = agent.finish(ws, run_id)
    assert summary["best_node"] == 1 and Path(summary["best_candidate"]).read_text() == C_SOFTMAX


def test_tune_searches_a_users_declared_tunables_per_shape(tmp_path: Path) -> None:
    from kernelevolve import tunables
    from kernelevolve.errors import SpecError
    from kernelevolve.optimize import tune
    from kernelevolve.spec import load_spec
    from kernelevolve.synth.tuner.templates import templates_for

    spec_path = SPECS / "ew_chain.py"
    templates, why = templates_for(load_spec(spec_path), "cpu", ("c",))
    assert templates, why
    kernel = tmp_path / "my_kernel.py"  # stands in for a user's own kernel with declared knobs
    kernel.write_text(
        "# my kernel: tuned, never replaced by the tuner's own templates\n" + templates[0].source
    )
    declared, start_config = tunables.read(kernel.read_text())  # type: ignore[misc]
    settings = replace(cpu_settings(tmp_path, suspicious_speedup=50.0), workspace=tmp_path / "ws")
    result = tune(spec_path, kernel, settings, SearchConfig(policy="greedy"), Limits(budget=2))
    assert [r["shape"] for r in result["shapes"]] == load_spec(spec_path).names
    for row in result["shapes"]:
        assert row["nodes_evaluated"] == 2 and row["start_config"] == start_config
        assert row["config"] is not None and all(row["config"][k] in declared[k] for k in declared)
        with Workspace.open(tmp_path / "ws") as w:
            first = w.nodes(row["run_id"])[0]
            sources = [n["source"] for n in w.nodes(row["run_id"])]
        assert first["source"] == kernel.read_text()  # the user's kernel is the seed, as written
        assert all(src.startswith("# my kernel") for src in sources)  # and only its configurations

    plain = tmp_path / "plain.py"
    plain.write_text(C_SOFTMAX)
    with pytest.raises(SpecError, match="declares no tunables"):
        tune(spec_path, plain, settings, SearchConfig(), Limits(budget=2))


def test_ctrl_c_stops_the_run_cleanly_and_names_it(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    env = {**os.environ, **FAST_ENV, "KERNELEVOLVE_WORKSPACE": str(ws)}
    args = ["optimize", str(SPECS / "ew_chain.py"), "--platform", "cpu", "--budget", "20", "--parallel", "1"]
    # Ctrl-C as a terminal sends it, even where the tests themselves run with SIGINT ignored (a shell
    # without job control starts background commands so, and children inherit it).
    proc = subprocess.Popen([sys.executable, "-m", "kernelevolve.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    db = ws / "kernelevolve.db"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        if db.exists():
            with sqlite3.connect(db) as conn:
                try:
                    if conn.execute("SELECT count(*) FROM nodes WHERE state = 'evaluated'").fetchone()[0]:
                        break
                except sqlite3.OperationalError:
                    continue
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-2000:]
    with Workspace.open(ws) as w:
        run = w.runs()[0]
    assert run["status"] == "stopped"
    assert f"kernelevolve resume {run['run_id']}" in stderr


def test_an_interrupted_run_stops_at_once_and_leaves_its_node_for_the_resume(tmp_path: Path) -> None:
    """`interrupt`, set from another thread (a bench's Ctrl-C reaches only the main thread), stops the
    run as Ctrl-C would, without waiting for the evaluation in flight: here one whose candidate spins
    for its whole run limit (120 s)."""
    import threading

    from kernelevolve.optimize import drive, start

    spin = C_SOFTMAX.replace(
        "        x = x.contiguous()\n", "        while x.numel() > 0:  # never returns\n            pass\n", 1
    )
    assert spin != C_SOFTMAX
    _register_script([text_reply(f"```python\n{spin}\n```")])
    ws = tmp_path / "ws"
    settings = replace(cpu_settings(tmp_path, run_timeout_s=120, workers=1), workspace=ws)
    interrupt = threading.Event()
    running = threading.Event()

    def on_event(event: str, data: dict) -> None:
        if event == "phase" and data["phase"] == "first-run":
            running.set()

    outcome: list[BaseException] = []

    def go() -> None:
        try:
            drive(run_id, ws, on_event, interrupt=interrupt)
        except BaseException as exc:
            outcome.append(exc)

    try:
        run_id = start(SPECS / "softmax.py", settings, SearchConfig(draft=1, parallel=1), Limits(budget=1),
                       SynthConfig("scripted:fake-1", single_shot=True))  # fmt: skip
        thread = threading.Thread(target=go)
        thread.start()
        assert running.wait(120), "the candidate never started running"
        time.sleep(0.5)
        asked = time.monotonic()
        interrupt.set()
        thread.join(60)
        assert not thread.is_alive() and time.monotonic() - asked < 30
        assert len(outcome) == 1 and isinstance(outcome[0], KeyboardInterrupt)
        with Workspace.open(ws) as w:
            (node,) = w.nodes(run_id)
            assert node["state"] == "proposed" and node["evaluation_id"] is None  # evaluated on resume
            assert w.run(run_id)["status"] == "stopped"
    finally:
        providers.unregister("scripted")


def test_an_interrupt_during_the_finish_step_stops_it_at_once_and_resume_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finish step's re-measure is given up on an interrupt (the pool aborted), not waited for:
    here a re-measure that would hang for two minutes. The run is left stopped, and its resume
    finishes it with no new candidate."""
    import threading
    from contextlib import contextmanager

    from kernelevolve.evaluate.pool import EvaluationAborted
    from kernelevolve.optimize import drive, start
    from kernelevolve.search import engine as engine_mod

    real = engine_mod.open_evaluator
    hang = {"on": True}
    remeasuring, aborted = threading.Event(), threading.Event()

    class HangingRemeasure:
        def __init__(self, pool: Any) -> None:
            self.pool = pool

        def __getattr__(self, name: str) -> Any:
            return getattr(self.pool, name)

        def evaluate_one(self, source: str, label: str = "candidate.py", **options: Any) -> Any:
            if hang["on"] and label.endswith("-final.py"):
                remeasuring.set()
                if not aborted.wait(120):
                    raise AssertionError("the finish step was never aborted")
                raise EvaluationAborted("the evaluator pool was aborted")
            return self.pool.evaluate_one(source, label, **options)

        def abort(self) -> None:
            aborted.set()
            self.pool.abort()

    @contextmanager
    def wrapped(request: Any) -> Any:
        with real(request) as pool:
            yield HangingRemeasure(pool)

    monkeypatch.setattr(engine_mod, "open_evaluator", wrapped)
    _register_script([text_reply(f"```python\n{C_SOFTMAX}\n```")])
    ws = tmp_path / "ws"
    settings = replace(cpu_settings(tmp_path, workers=1), workspace=ws)
    interrupt = threading.Event()
    outcome: list[BaseException] = []
    try:
        run_id = start(SPECS / "softmax.py", settings, SearchConfig(draft=1, parallel=1), Limits(budget=1),
                       SynthConfig("scripted:fake-1", single_shot=True))  # fmt: skip

        def go() -> None:
            try:
                drive(run_id, ws, interrupt=interrupt)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=go)
        thread.start()
        assert remeasuring.wait(180), "the run never reached its re-measure"
        asked = time.monotonic()
        interrupt.set()
        thread.join(60)
        assert not thread.is_alive() and time.monotonic() - asked < 30
        assert len(outcome) == 1 and isinstance(outcome[0], KeyboardInterrupt), outcome
        with Workspace.open(ws) as w:
            assert w.run(run_id)["status"] == "stopped"
            (node,) = w.nodes(run_id)
            assert node["state"] == "evaluated"
        hang["on"] = False
        summary = drive(run_id, ws)
        assert summary["best_node"] == node["id"] and summary["nodes_evaluated"] == 1
        with Workspace.open(ws) as w:
            assert w.run(run_id)["status"] == "done" and len(w.nodes(run_id)) == 1
    finally:
        providers.unregister("scripted")
