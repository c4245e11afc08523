"""The external-agent interface's jobs: any coding agent, or a person, is the operator (ask/tell).

    kernelevolve agent start SPEC            a run whose synthesizer is `agent` (`--start-from FILE`:
                                             your kernel, evaluated at the first `next`)
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

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from kernelevolve.errors import KernelevolveError, WorkspaceError
from kernelevolve.evaluate.verdict import best_baseline_label
from kernelevolve.store import Workspace
from kernelevolve.synth.base import Task

PROMPT_TOKENS = 24_000
SUBMIT_NOTE = "submitted by an external agent"


def read_candidate(path: Path) -> str:
    """A candidate file's source, for `submit` and `lint` from a path (the CLI's, the MCP tools')."""
    if not path.is_file():
        raise WorkspaceError(
            f"{path}: no such candidate file", hint="give the path of a .py file defining ModelNew"
        )
    return path.read_text(errors="replace")


def _prompt(task: Task) -> tuple[str, str]:
    from kernelevolve.synth.prompt import synthesize

    return synthesize(task, PROMPT_TOKENS, tool_mode=False)


def next_task(
    workspace: Path, run_id: str, new: bool = False, session: Session | None = None
) -> dict[str, Any]:
    """The task of the node awaiting a submission (selecting one if none waits, or if `new`).
    `{"done": True, "reason": ...}` once the run's limits are reached."""
    from kernelevolve.optimize import run_dir

    with _engine(workspace, run_id, session) as (ws, engine), _selecting(session, engine.run_id):
        evaluate_seeds(engine)
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
    workspace: Path,
    run_id: str,
    node_id: int,
    source: str,
    note: str | None = None,
    session: Session | None = None,
) -> dict[str, Any]:
    """Evaluate `source` as node `node_id`'s candidate; the verdict, as data and as text. `note`: what
    the candidate changed and why, in the agent's words: the node's change in later tasks and in the
    report (without one, the node says only that an external agent submitted it)."""
    from kernelevolve.optimize import run_dir
    from kernelevolve.search.tools import describe_verdict

    note = note.strip() if note and note.strip() else SUBMIT_NOTE
    with _engine(workspace, run_id, session, attach=True) as (ws, engine):
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


def evaluate_seeds(engine: Any) -> list[int]:
    """Evaluate the run's seed nodes still awaiting their verdict (the user's kernels, proposed at
    `agent start --start-from`): before the first task, so that the agent's tasks grow from them as a
    search's would. Attaches the evaluator pool for it where the engine has none."""
    pending = [n.id for n in engine.tree().nodes.values() if n.mode == "seed" and n.state == "proposed"]
    if pending and engine.pool is None:
        with engine.attached():
            for node_id in pending:
                engine.evaluate(node_id)
    else:
        for node_id in pending:
            engine.evaluate(node_id)
    return pending


def remeasure(workspace: Path, run_id: str, node_id: int, session: Session | None = None) -> dict[str, Any]:
    """Measure a node's kernel again, live, in a fresh worker: the number to trust before building on
    it (a search-time verdict can be a lucky or unlucky moment). Stored as an evaluation of its own;
    the node keeps the verdict it was ranked by."""
    from kernelevolve.search.tools import describe_verdict

    with _engine(workspace, run_id, session, attach=True) as (_, engine):
        if node_id not in engine.tree().nodes:
            raise WorkspaceError(f"run {engine.run_id} has no node {node_id}")
        ranked = engine.tree()[node_id]
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


def lint(workspace: Path, run_id: str, source: str, session: Session | None = None) -> str:
    """The static guards on a candidate for this run's platform: "ok" or the violations. Nothing runs."""
    with _engine(workspace, run_id, session) as (_, engine):
        return engine.tools.lint(source)


def finish(workspace: Path, run_id: str, session: Session | None = None) -> dict[str, Any]:
    """Close an agent run: re-measure the winners, write the best kernel, export and report."""
    with _engine(workspace, run_id, session, attach=True) as (_, engine):
        evaluate_seeds(engine)
        summary = engine.finish(engine.stop_reason() or "finished by the agent")
    if session is not None:
        session.close(engine.run_id)
    return summary


class Session:
    """Agent runs kept warm between calls in one long-lived process (the MCP server).

    Each run's engine is built once and stays attached to its evaluator pool, whose spare workers
    prepare (start, torch.compile's baseline, the reference's outputs) while the agent writes its next
    candidate: a submit then costs the candidate's compile, checks and timing, not a worker's start.
    The tree is read from the store before every decision, as in a search, so what another process
    recorded meanwhile is seen. A run's pool closes at its `finish`, all of them at `close()`. Without
    a session (the CLI's commands, one process per call) each call builds and attaches its own.

    On a GPU the session's runs share each device as a bench's runs do (`bench.schedule`): a run is
    granted its part of the device's memory when it attaches (what its memory plan asks, or what is
    left if that still holds one worker), its pool is sized to that part, and the part is given back
    when it is detached. A run whose one worker no longer fits beside the session's others is refused,
    with what holds the memory, instead of starting workers that run out of it (an agent that started
    three KernelBench runs at once saw their submits fail with out-of-memory errors)."""

    def __init__(self, workspace: Path):
        self.workspace = workspace
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[Workspace, Any, ExitStack, threading.Lock]] = {}
        self._names: dict[str, str] = {}  # what callers named a run (a prefix) -> its id
        self._memory: dict[tuple[str, int], Any] = {}  # (platform, device) -> its bench.schedule.DeviceMemory
        self._granted: dict[str, tuple[tuple[str, int], int]] = {}  # run id -> (its device, bytes granted)

    def engine(self, run_id: str) -> tuple[Workspace, Any]:
        """The run's workspace and engine, attached to its pool: built at the first call."""
        from kernelevolve.optimize import build_engine

        with self._lock:
            key = self._names.get(run_id, run_id)
            if key not in self._runs:
                stack = ExitStack()
                try:
                    ws = stack.enter_context(Workspace.open(self.workspace))
                    engine = build_engine(ws, run_id)
                    _require_agent(engine.synth.name, engine.run_id)
                    self._share_device(engine, stack)
                    stack.enter_context(engine.attached())
                except BaseException:
                    stack.close()
                    raise
                key = engine.run_id
                self._runs[key] = (ws, engine, stack, threading.Lock())
            self._names[run_id] = key
            ws, engine, _, _ = self._runs[key]
            return ws, engine

    def _share_device(self, engine: Any, stack: ExitStack) -> None:
        """Grant the run its part of its GPU's memory beside the session's other runs, and size its
        pool to it (the class docstring); given back when `stack` closes. Nothing on the CPU, or
        where the device's memory or the spec's tensors are unknown."""
        from kernelevolve.bench.schedule import MARGIN, USABLE, DeviceMemory, run_demand
        from kernelevolve.evaluate import memory

        ctx = engine.ctx
        platform, settings = ctx.platform, ctx.settings
        demand = run_demand(ctx.spec, platform, settings)
        if demand is None:
            return
        device = (platform.name, settings.device)
        ledger = self._memory.get(device)
        if ledger is None:
            reading = platform.device_memory(settings.device)
            if reading is None:
                return
            free, total = reading
            ledger = self._memory[device] = DeviceMemory(usable=int(USABLE * min(free, total)), total=total)
        grant = ledger.try_acquire(*demand)
        if grant is None:
            held = [f"{rid} ({g / 2**30:.1f} GiB)" for rid, (d, g) in self._granted.items() if d == device]
            raise WorkspaceError(
                f"run {engine.run_id} needs about {demand[0] * MARGIN / 2**30:.1f} GiB of "
                f"{platform.name}:{settings.device} for one worker, and this session's other runs hold "
                f"{ledger.granted / 2**30:.1f} of its {ledger.usable / 2**30:.1f} GiB: {', '.join(held)}",
                hint="finish one of them (finish_run, `kernelevolve agent finish`), then ask again",
            )
        self._granted[engine.run_id] = (device, grant)
        stack.callback(self._granted.pop, engine.run_id, None)
        stack.callback(ledger.release, grant)
        share = ledger.share(grant)
        if share > 1:  # a part of the device: the pool planned on it, as a bench run's is
            placed = dataclasses.replace(settings, device_share=settings.device_share * share)
            ctx.settings, _ = memory.fit(
                ctx.spec, platform, placed, memory.settled_memory(ctx.spec, platform, placed)
            )

    def selecting(self, run_id: str) -> threading.Lock:
        """Held while a task is chosen: two calls at once never select the same waiting node twice."""
        with self._lock:
            return self._runs[self._names.get(run_id, run_id)][3]

    def close(self, run_id: str | None = None) -> None:
        """Detach one run (its pool's workers ended), or every run."""
        with self._lock:
            keys = list(self._runs) if run_id is None else [self._names.get(run_id, run_id)]
            stacks = [self._runs.pop(k)[2] for k in keys if k in self._runs]
            self._names = {n: k for n, k in self._names.items() if k in self._runs}
        for stack in stacks:
            stack.close()

    def __len__(self) -> int:
        return len(self._runs)


@contextmanager
def _engine(
    workspace: Path, run_id: str, session: Session | None, attach: bool = False
) -> Iterator[tuple[Workspace, Any]]:
    """(workspace, engine) of an agent run: the session's, kept attached, or built for this call
    (and attached to a pool for it where `attach`)."""
    if session is not None:
        yield session.engine(run_id)
        return
    from kernelevolve.optimize import build_engine

    with Workspace.open(workspace) as ws:
        engine = build_engine(ws, run_id)
        _require_agent(engine.synth.name, engine.run_id)
        if not attach:
            yield ws, engine
            return
        with engine.attached():
            yield ws, engine


@contextmanager
def _selecting(session: Session | None, run_id: str) -> Iterator[None]:
    if session is None:
        yield
        return
    with session.selecting(run_id):
        yield


def _baseline_reference(ws: Workspace, engine: Any) -> dict[str, Any] | None:
    """The reference's numbers for a task before any candidate of the run was timed (a draft's): the
    baselines stored for this spec on this device and software, measured now where there are none (a
    worker's start and the baselines' timing, once per spec and device), with each shape's roofline
    from the device's hardware profile: the same figures a timed node's verdict gives later tasks
    (`profile.diagnosis.reference_analysis`). None where they cannot be measured (the task says less)."""
    from kernelevolve.jobs import baselines, device_key
    from kernelevolve.profile.diagnosis import reference_shape
    from kernelevolve.roofline import ceiling_flops, flop_class, roofline

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
    peak = ceiling_flops(ctx.profile.get("flops") or {}, flop_class(spec.dtype, spec.precision))
    out = []
    for shape, row in zip(spec.shapes, rows, strict=True):
        if not row:
            continue
        nbytes, flops = row.get("bytes") or 0, row.get("flops") or 0
        t_roof, bound = roofline(nbytes, flops, bandwidth, peak) if bandwidth else (None, None)
        medians = {b: row[b]["median_s"] for b in ("eager", "compile") if row.get(b)}
        out.append(reference_shape(shape.name, row.get("bytes"), row.get("flops"), t_roof, bound, medians))
    return {"shapes": out} if out else None


def _require_agent(name: str, run_id: str) -> None:
    if name != "agent":
        raise WorkspaceError(
            f"run {run_id} is driven by {name}, not an external agent",
            hint="start an agent run with `kernelevolve agent start SPEC`",
        )


__all__ = [
    "Session",
    "evaluate_seeds",
    "finish",
    "lint",
    "next_task",
    "read_candidate",
    "remeasure",
    "submit",
]
