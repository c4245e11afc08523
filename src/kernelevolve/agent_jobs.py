"""The external-agent interface's jobs: any coding agent, or a person, is the operator (ask/tell).

    kernelevolve agent start SPEC            a run whose synthesizer is `agent`
    kernelevolve agent next RUN              select a node, write its task and files, print them
    kernelevolve agent submit RUN NODE FILE  evaluate FILE for that node; print the verdict
    kernelevolve agent lint RUN FILE         the static guards on FILE, nothing run
    kernelevolve agent remeasure RUN NODE    a node's kernel measured again, live
    kernelevolve agent finish RUN            re-measure the winners; best kernel, export, report

The task is the universal operator's prompt (`synth/prompt.py`) for the selected node, the same one a
model would get, written to `<workspace>/runs/<run>/node-<n>/TASK.md` beside `parent.py` (the
parent's kernel, when there is one) and `candidate.py` (a starting point to edit). `next` is
idempotent: while a selected node awaits its submission, `next` hands out that node again (`new=True`
selects another, for agents working in parallel). A submission is evaluated by the same isolated
harness as any candidate, and recorded as the node's proposal and verdict: budgets, the tree, resume
and the report treat it like any other node. The MCP server (`kernelevolve.mcp_server`) exposes the
same functions as tools. These are jobs like `jobs.py`'s and `optimize.py`'s, beside them; the run's
synthesizer, which the engine never asks, is `synth.agent.ExternalAgent`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelevolve.errors import KernelevolveError, WorkspaceError
from kernelevolve.evaluate.verdict import best_baseline_label
from kernelevolve.store import Workspace
from kernelevolve.synth.base import Task

PROMPT_TOKENS = 24_000
SUBMIT_NOTE = "submitted by an external agent"


def _prompt(task: Task) -> tuple[str, str]:
    from kernelevolve.synth.prompt import synthesize

    return synthesize(task, PROMPT_TOKENS, tool_mode=False)


def next_task(workspace: Path, run_id: str, new: bool = False) -> dict[str, Any]:
    """The task of the node awaiting a submission (selecting one if none waits, or if `new`).
    `{"done": True, "reason": ...}` once the run's limits are reached."""
    from kernelevolve.optimize import build_engine, run_dir

    with Workspace.open(workspace) as ws:
        engine = build_engine(ws, run_id)
        _require_agent(engine.synth.name, engine.run_id)
        waiting = [n.id for n in engine.tree().nodes.values() if n.state == "created"]
        if waiting and not new:
            node_id = waiting[0]
        else:
            why = engine.stop_reason()
            if why:
                return {
                    "run_id": engine.run_id,
                    "done": True,
                    "reason": why,
                    "finish": f"kernelevolve agent finish {engine.run_id}",
                }
            node_id = engine.new_node()
        task = engine.task(node_id)
        if task.reference is None and engine.ctx.settings.diagnosis:  # nothing timed yet: a draft's task
            task.reference = _baseline_reference(ws, engine)
        system, user = _prompt(task)
        folder = run_dir(ws, engine.run_id) / f"node-{node_id}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "TASK.md").write_text(f"{system}\n\n{user}\n")
        files = {"task": str(folder / "TASK.md")}
        start = task.parents[0].source if task.parents and task.parents[0].source else None
        if start is not None:
            (folder / "parent.py").write_text(start)
            files["parent"] = str(folder / "parent.py")
        candidate = folder / "candidate.py"
        if not candidate.exists():
            candidate.write_text(
                start or "# Write a complete candidate here: a ModelNew with the reference's constructor.\n"
            )
        files["candidate"] = str(candidate)
        return {
            "run_id": engine.run_id,
            "done": False,
            "node": node_id,
            "mode": task.mode,
            "parents": [p.id for p in task.parents],
            "spec": str(task.spec.path),
            "platform": task.platform,
            "system": system,
            "prompt": user,
            "files": files,
            "submit": f"kernelevolve agent submit {engine.run_id} {node_id} {candidate}",
        }


def submit(
    workspace: Path, run_id: str, node_id: int, source: str, note: str | None = None
) -> dict[str, Any]:
    """Evaluate `source` as node `node_id`'s candidate; the verdict, as data and as text. `note`: what
    the candidate changed and why, in the agent's words: the node's change in later tasks and in the
    report (without one, the node says only that an external agent submitted it)."""
    note = note.strip() if note and note.strip() else SUBMIT_NOTE
    from kernelevolve.optimize import build_engine, run_dir
    from kernelevolve.search.tools import describe_verdict

    with Workspace.open(workspace) as ws:
        engine = build_engine(ws, run_id)
        _require_agent(engine.synth.name, engine.run_id)
        tree = engine.tree()
        if node_id not in tree.nodes:
            raise WorkspaceError(
                f"run {engine.run_id} has no node {node_id}",
                hint=f"`kernelevolve agent next {engine.run_id}`",
            )
        if tree[node_id].state != "created":
            raise WorkspaceError(
                f"node {node_id} of run {engine.run_id} already has its candidate ({tree[node_id].state})",
                hint=f"ask for another task: `kernelevolve agent next {engine.run_id}`",
            )
        task_file = run_dir(ws, engine.run_id) / f"node-{node_id}" / "TASK.md"
        prompt = task_file.read_text() if task_file.is_file() else None
        ws.propose_node(engine.run_id, node_id, source=source, note=note, prompt=prompt)
        with engine.attached():
            verdict = engine.evaluate(node_id)
        return {
            "run_id": engine.run_id,
            "node": node_id,
            "status": str(verdict.status),
            "correct": verdict.correct,
            "speedup_vs_eager": verdict.speedup_vs_eager,
            "speedup_vs_compile": verdict.speedup_vs_compile,
            "speedup_vs_best": verdict.speedup_vs_best,
            "best_baseline": best_baseline_label(s.best_baseline for s in verdict.shapes),
            "fitness": verdict.fitness,
            "text": describe_verdict(verdict.to_dict()),
            "best": engine.best_info(),
            "stop_reason": engine.stop_reason(),
            "verdict": verdict.to_dict(),
        }


def remeasure(workspace: Path, run_id: str, node_id: int) -> dict[str, Any]:
    """Measure a node's kernel again, live, in a fresh worker: the number to trust before building on
    it (a search-time verdict can be a lucky or unlucky moment). Stored as an evaluation of its own;
    the node keeps the verdict it was ranked by."""
    from kernelevolve.optimize import build_engine
    from kernelevolve.search.tools import describe_verdict

    with Workspace.open(workspace) as ws:
        engine = build_engine(ws, run_id)
        if node_id not in engine.tree().nodes:
            raise WorkspaceError(f"run {engine.run_id} has no node {node_id}")
        ranked = engine.tree()[node_id]
        with engine.attached():
            evaluation_id, verdict = engine.remeasure(node_id)
        return {
            "run_id": engine.run_id,
            "node": node_id,
            "evaluation": evaluation_id,
            "status": str(verdict.status),
            "speedup_vs_eager": verdict.speedup_vs_eager,
            "speedup_vs_compile": verdict.speedup_vs_compile,
            "fitness": verdict.fitness,
            "search_fitness": ranked.fitness,
            "text": describe_verdict(verdict.to_dict()),
        }


def lint(workspace: Path, run_id: str, source: str) -> str:
    """The static guards on a candidate for this run's platform: "ok" or the violations. Nothing runs."""
    from kernelevolve.optimize import build_engine

    with Workspace.open(workspace) as ws:
        return build_engine(ws, run_id).tools.lint(source)


def finish(workspace: Path, run_id: str) -> dict[str, Any]:
    """Close an agent run: re-measure the winners, write the best kernel, export and report."""
    from kernelevolve.optimize import build_engine

    with Workspace.open(workspace) as ws:
        engine = build_engine(ws, run_id)
        with engine.attached():
            return engine.finish(engine.stop_reason() or "finished by the agent")


def _baseline_reference(ws: Workspace, engine: Any) -> dict[str, Any] | None:
    """The reference's numbers for a task before any candidate of the run was timed (a draft's): the
    baselines stored for this spec on this device and software, measured now where there are none (a
    worker's start and the baselines' timing, once per spec and device), with each shape's roofline
    from the device's hardware profile: the same figures a timed node's verdict gives later tasks
    (`profile.diagnosis.reference_analysis`). None where they cannot be measured (the task says less)."""
    from kernelevolve.jobs import baselines, device_key
    from kernelevolve.roofline import flop_class, roofline

    ctx = engine.ctx
    spec, platform, settings = ctx.spec, ctx.platform, ctx.settings
    key = device_key(platform.identity(settings.device), platform.name)
    rows = [ws.get_baseline(spec.fingerprint, key, shape.name) for shape in spec.shapes]
    if any(row is None for row in rows):
        try:
            _, measured, _, _ = baselines(spec.path, settings)
        except KernelevolveError:
            return None
        found = {row["shape"]: row for row in measured}
        rows = [found.get(shape.name) for shape in spec.shapes]
    bandwidth = float(ctx.profile.get("bandwidth") or 0.0)
    peak = (ctx.profile.get("flops") or {}).get(flop_class(spec.dtype, spec.precision))
    out = []
    for shape, row in zip(spec.shapes, rows, strict=True):
        if not row:
            continue
        entry: dict[str, Any] = {"shape": shape.name, "bytes": row.get("bytes"), "flops": row.get("flops")}
        t_roof = None
        if bandwidth:
            t_roof, entry["bound"] = roofline(row.get("bytes") or 0, row.get("flops") or 0, bandwidth, peak)
            entry["roofline_us"] = round(t_roof * 1e6, 2)
        for b in ("eager", "compile"):
            if row.get(b):
                median = row[b]["median_s"]
                entry[f"{b}_us"] = round(median * 1e6, 2)
                if t_roof:
                    entry[f"{b}_roofline_fraction"] = round(t_roof / median, 3)
        out.append(entry)
    return {"shapes": out} if out else None


def _require_agent(name: str, run_id: str) -> None:
    if name != "agent":
        raise WorkspaceError(
            f"run {run_id} is driven by {name}, not an external agent",
            hint="start an agent run with `kernelevolve agent start SPEC`",
        )


__all__ = ["finish", "lint", "next_task", "remeasure", "submit"]
