"""`kernelevolve mcp`: the external-agent interface as an MCP server (official `mcp` SDK, stdio).

The tools are the functions of `kernelevolve.agent_jobs` plus what an agent needs around them:

    start_run(spec, budget, platform, policy, drafts, start_from)  a new agent-driven run; its id
    next_task(run_id, new)                      the selected node's task: prompt, files, how to submit
    read_node(run_id, node)                     a node's kernel, verdict and note
    lint(run_id, source)                        the static guards on a draft, without running it
    submit(run_id, node, source | path, note)   the harness's verdict on a candidate for that node
    search_knowledge(query, platform)           knowledge snippets
    remeasure(run_id, node)                     a node's kernel measured again, live, in a fresh worker
    eval(spec, source | path)                   a candidate's verdict outside any run (`kernelevolve eval`)
    profile(spec, source | path, shape)         its profile and diagnosis (`kernelevolve profile`)
    finish_run(run_id)                          re-measure, write the best kernel, export and report
    list_runs()                                 the workspace's runs

Candidates submitted here are evaluated exactly as any other: in isolated worker processes, never in
the server's process. The server keeps each agent run's evaluator pool between calls
(`agent_jobs.Session`), so a submit finds a worker already prepared. The server holds no model keys and needs none. Blocking work runs in threads
so the server keeps answering while the harness works.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelevolve.errors import KernelevolveError, WorkspaceError

INSTALL_HINT = 'the MCP server needs the `mcp` SDK: pip install "kernelevolve[mcp]"'


def build_server(workspace: Path, platform: str | None = None, session: Any = None) -> Any:
    """The MCPServer with kernelevolve's tools, for `workspace`. Its agent runs are kept warm between
    calls (`agent_jobs.Session`: each run's evaluator pool stays attached, its spare workers prepared
    while the agent writes): `session`, else one of its own, which `serve` closes at the end."""
    try:
        import anyio
        from mcp.server.mcpserver import MCPServer
    except ImportError as exc:
        raise KernelevolveError(INSTALL_HINT) from exc

    from mcp.types import ToolAnnotations

    from kernelevolve import agent_jobs as agent

    session = session if session is not None else agent.Session(workspace)

    # What each tool does to the workspace, for a client deciding what to ask its user about:
    # nothing (reads), or records (a run, a node, an evaluation); none reaches outside this machine.
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    records = ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
    )

    server = MCPServer(
        name="kernelevolve",
        instructions=(
            "Write faster kernels for a PyTorch reference. Call next_task for a node's task, write a complete "
            "candidate file (a ModelNew with the reference's constructor, its kernels in Triton on CUDA or C "
            "via kernelevolve.native on the CPU), lint it, submit it, read the verdict, repeat; finish_run at the end."
        ),
    )

    async def call(fn: Any, *args: Any) -> Any:
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except KernelevolveError as exc:  # a usable message for the agent, not a stack trace
            return {"error": exc.message, "hint": exc.hint}

    @server.tool(annotations=records)
    async def start_run(
        spec: str, budget: int = 20, platform_name: str | None = None, policy: str = "uct", drafts: int = 1,
        start_from: list[str] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Start an agent-driven optimization run for a spec file; returns its run_id. `drafts`:
        independent first candidates before each task grows from a parent's verdict. `start_from`:
        paths of the user's own kernels, the run's first nodes (evaluated at the first next_task)."""

        def go() -> dict[str, Any]:
            from kernelevolve.config import load_settings
            from kernelevolve.optimize import start
            from kernelevolve.search.limits import Limits
            from kernelevolve.search.policies import SearchConfig
            from kernelevolve.synth import SynthConfig

            settings = load_settings(workspace, {"platform": platform_name or platform})
            run_id = start(
                Path(spec),
                settings,
                SearchConfig(policy=policy, draft=drafts).validate(),
                Limits(budget=budget),
                SynthConfig("agent"),
                start_from=[Path(p) for p in start_from or []],
            )
            return {"run_id": run_id}

        result: dict[str, Any] = await call(go)
        return result

    @server.tool(annotations=records)
    async def next_task(run_id: str, new: bool = False) -> dict[str, Any]:
        """The task for the next node: the prompt, the files, the constraints, how to submit."""
        result: dict[str, Any] = await call(agent.next_task, workspace, run_id, new, session)
        return result

    @server.tool(annotations=reads)
    async def read_node(run_id: str, node: int) -> dict[str, Any]:
        """A node's kernel source, verdict summary and note."""

        def go() -> dict[str, Any]:
            from kernelevolve.search.tools import describe_verdict
            from kernelevolve.store import Workspace

            with Workspace.open(workspace) as ws:
                rows = [n for n in ws.nodes(ws.resolve_run(run_id)) if n["id"] == node]
            if not rows:
                raise KernelevolveError(f"run {run_id} has no node {node}")
            n = rows[0]
            return {"node": node, "parent": n["parent"], "mode": n["mode"], "state": n["state"], "note": n["note"],
                    "source": n["source"], "verdict": describe_verdict(n["verdict"]) if n["verdict"] else n["message"]}  # fmt: skip

        result: dict[str, Any] = await call(go)
        return result

    @server.tool(annotations=reads)
    async def lint(run_id: str, source: str) -> str:
        """The static guards on a candidate's source: 'ok' or the violations. Nothing runs."""

        result: str = await call(agent.lint, workspace, run_id, source, session)
        return result

    @server.tool(annotations=records)
    async def submit(
        run_id: str, node: int, source: str | None = None, path: str | None = None, note: str | None = None
    ) -> dict[str, Any]:
        """Evaluate a candidate for a node in the isolated harness; the verdict (status, speedups, errors).
        Give the candidate as `source`, or as `path` to a file (e.g. the task's candidate.py); `note`:
        what it changed and why, shown as the node's change in later tasks."""

        def go() -> dict[str, Any]:
            if (source is None) == (path is None):
                raise WorkspaceError("give the candidate as `source` or as `path`, one of them")
            text = source if source is not None else agent.read_candidate(Path(str(path)))
            result = agent.submit(workspace, run_id, node, text, note=note, session=session)
            result.pop("verdict", None)  # the text and headline numbers are what an agent reads
            return result

        result: dict[str, Any] = await call(go)
        return result

    @server.tool(annotations=reads)
    async def search_knowledge(
        query: str, platform_name: str | None = None, limit: int = 5
    ) -> list[dict[str, Any]]:
        """Knowledge documents (constraints, guidance, hardware, code samples, verified skills) for a query."""
        from kernelevolve.config import load_settings
        from kernelevolve.knowledge import KnowledgeBase
        from kernelevolve.store import Workspace

        def go() -> list[dict[str, Any]]:
            with Workspace.open(workspace) as ws:
                kb = KnowledgeBase.for_settings(ws, load_settings(workspace))
                hits = kb.search(query, platform=platform_name or platform, limit=limit)
            return [{"doc": h.doc.id, "title": h.doc.title, "category": h.doc.category, "text": h.doc.body}
                    for h in hits]  # fmt: skip

        found: list[dict[str, Any]] = await call(go)
        return found

    @server.tool(annotations=records)
    async def remeasure(run_id: str, node: int) -> dict[str, Any]:
        """Measure an evaluated node's kernel again, live, in a fresh worker: the number to trust before
        building on it. The node keeps the verdict it was ranked by."""
        result: dict[str, Any] = await call(agent.remeasure, workspace, run_id, node, session)
        return result

    def candidate_file(source: str | None, path: str | None, folder: Path) -> Path:
        """The candidate as a file: `path`, or `source` written into `folder`."""
        if (source is None) == (path is None):
            raise WorkspaceError("give the candidate as `source` or as `path`, one of them")
        if path is not None:
            agent.read_candidate(Path(path))  # the missing-file message, as submit gives it
            return Path(path)
        file = folder / "candidate.py"
        file.write_text(str(source))
        return file

    @server.tool(name="eval", annotations=records)
    async def eval_candidate(spec: str, source: str | None = None, path: str | None = None) -> dict[str, Any]:
        """Evaluate a candidate against a spec outside any run (a fresh worker): its verdict as text,
        status and speedups. The evaluation is recorded in the workspace; no node is made."""

        def go() -> dict[str, Any]:
            import tempfile

            from kernelevolve import jobs
            from kernelevolve.config import load_settings
            from kernelevolve.search.tools import describe_verdict

            settings = load_settings(workspace, {"platform": platform})
            with tempfile.TemporaryDirectory(prefix="kernelevolve-eval-") as tmp:
                file = candidate_file(source, path, Path(tmp))
                _, (verdict,) = jobs.evaluate(Path(spec), [file], settings)
            v = verdict.to_dict()
            return {"status": v["status"], "text": describe_verdict(v), "fitness": v["fitness"],
                    "speedup_vs_eager": v["speedup_vs_eager"], "speedup_vs_compile": v["speedup_vs_compile"]}  # fmt: skip

        result: dict[str, Any] = await call(go)
        return result

    @server.tool(annotations=records)
    async def profile(
        spec: str, source: str | None = None, path: str | None = None, shape: str | None = None
    ) -> dict[str, Any]:
        """Evaluate a candidate, and where it is correct profile it (ncu on NVIDIA GPUs, else
        torch.profiler) at one shape (default: the heaviest): the diagnosis and the metrics."""

        def go() -> dict[str, Any]:
            import tempfile

            from kernelevolve import jobs
            from kernelevolve.config import load_settings

            settings = load_settings(workspace, {"platform": platform})
            with tempfile.TemporaryDirectory(prefix="kernelevolve-profile-") as tmp:
                return jobs.profile_file(Path(spec), candidate_file(source, path, Path(tmp)), settings, shape)

        result: dict[str, Any] = await call(go)
        return result

    @server.tool(annotations=records)
    async def finish_run(run_id: str) -> dict[str, Any]:
        """Re-measure the best kernels; write the best kernel, the per-shape export and the report."""

        def go() -> dict[str, Any]:
            summary = agent.finish(workspace, run_id, session=session)
            return {k: v for k, v in summary.items() if k not in ("final", "method")}

        result: dict[str, Any] = await call(go)
        return result

    @server.tool(annotations=reads)
    async def list_runs() -> list[dict[str, Any]]:
        """The workspace's runs, newest first."""
        from kernelevolve.store import Workspace

        with Workspace.open(workspace) as ws:
            return [{k: r[k] for k in ("run_id", "spec_path", "platform", "synthesizer", "status", "best_node")}
                    for r in ws.runs()]  # fmt: skip

    return server


def serve(workspace: Path, platform: str | None = None) -> None:
    from kernelevolve.agent_jobs import Session

    session = Session(workspace)
    try:
        build_server(workspace, platform, session).run("stdio")
    finally:  # the runs' pools: their workers end with the server
        session.close()


__all__ = ["build_server", "serve"]
