"""The agent commands: agent start/next/submit/lint/remeasure/finish (tasks out, candidates in) and `mcp` (the same
interface as an MCP server). Registered on `cli.app` (see cli.py); they share the search commands'
options and output (`cli_search.py`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from kernelevolve.cli_common import (
    BudgetOpt,
    JsonOpt,
    PlatformOpt,
    PolicyOpt,
    WorkspaceOpt,
    app,
    fail,
    fmt_x,
    limits_from,
    out,
    settings_for,
)
from kernelevolve.cli_search import emit_summary
from kernelevolve.errors import KernelevolveError

agent_app = typer.Typer(
    help="Be the operator yourself, or let any coding agent be: tasks out, candidates in.",
    no_args_is_help=True,
)
app.add_typer(agent_app, name="agent")


@agent_app.command("start")
def agent_start(
    spec: Annotated[Path, typer.Argument(help="The spec: a KernelBench-format .py file.")],
    budget: BudgetOpt = None,
    policy: PolicyOpt = "uct",
    drafts: Annotated[
        int, typer.Option(help="Independent first candidates (drafts) before each task grows from a parent.")
    ] = 1,
    platform: PlatformOpt = None,
    start_from: Annotated[
        list[Path] | None,
        typer.Option("--start-from", help="Your kernel, evaluated first and grown from; repeat for several."),
    ] = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a run whose candidates come from an external agent (or you).

    \b
    Example:
      kernelevolve agent start examples/softmax/spec.py --budget 10
      kernelevolve agent next RUN
    """
    from kernelevolve import optimize as jobs
    from kernelevolve.search.policies import SearchConfig
    from kernelevolve.synth import SynthConfig

    try:
        settings = settings_for(workspace, platform=platform)
        limits = limits_from(budget, None, None, None, None, None)
        run_id = jobs.start(
            spec, settings, SearchConfig(policy=policy, draft=drafts).validate(), limits, SynthConfig("agent"),
            start_from=start_from,
        )  # fmt: skip
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        sys.stdout.write(json.dumps({"run_id": run_id}) + "\n")
    else:
        out.print(f"run {run_id}; next: kernelevolve agent next {run_id}")


@agent_app.command("next")
def agent_next(
    run: Annotated[str, typer.Argument(help="The run's id (or a unique prefix).")],
    new: Annotated[bool, typer.Option(help="Select another node even if one awaits its submission.")] = False,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the task for the next selected node: the prompt, the files, how to submit.

    \b
    Example:
      kernelevolve agent next 3f2a9c1e --json
    """
    from kernelevolve import agent_jobs as agent

    try:
        task = agent.next_task(settings_for(workspace, existing=True).workspace, run, new=new)
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        sys.stdout.write(json.dumps(task, indent=2) + "\n")
        return
    if task["done"]:
        out.print(f"run {task['run_id']} is done: {escape(task['reason'])}; close it with `{task['finish']}`")
        return
    out.print(task["system"], markup=False, highlight=False)
    out.print(task["prompt"], markup=False, highlight=False)
    out.print(f"[bold]files:[/] {escape(json.dumps(task['files']))}")
    out.print(f"[bold]when done:[/] {escape(task['submit'])}")


@agent_app.command("submit")
def agent_submit(
    run: Annotated[str, typer.Argument(help="The run's id (or a unique prefix).")],
    node: Annotated[int, typer.Argument(help="The node the task named.")],
    file: Annotated[Path, typer.Argument(help="The candidate file.")],
    note: Annotated[
        str | None,
        typer.Option(
            help="What this candidate changed and why: stored as the node's change, shown in later tasks."
        ),
    ] = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a candidate file for a node; print the verdict.

    \b
    Example:
      kernelevolve agent submit 3f2a9c1e 5 candidate.py --note "two rows per program: half the launches"
    """
    from kernelevolve import agent_jobs as agent

    try:
        result = agent.submit(
            settings_for(workspace, existing=True).workspace, run, node, agent.read_candidate(file), note=note
        )
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
    else:
        out.print(escape(result["text"]))
        best = result["best"]
        out.print(
            f"best so far: node {best.get('node')} {fmt_x(best.get('fitness'))}; {best['spent']}/{best['budget']} candidates"
        )
        if result["stop_reason"]:
            out.print(
                f"the run is done ({escape(result['stop_reason'])}): `kernelevolve agent finish {result['run_id']}`"
            )
    raise typer.Exit(0 if result["status"] == "ok" else 1)


@agent_app.command("lint")
def agent_lint(
    run: Annotated[str, typer.Argument(help="The run's id (or a unique prefix).")],
    file: Annotated[Path, typer.Argument(help="The candidate file.")],
    workspace: WorkspaceOpt = None,
) -> None:
    """The static guards on a candidate file, for this run's platform: nothing runs.

    \b
    Example:
      kernelevolve agent lint 3f2a9c1e candidate.py
    """
    from kernelevolve import agent_jobs as agent

    try:
        said = agent.lint(settings_for(workspace, existing=True).workspace, run, agent.read_candidate(file))
    except KernelevolveError as exc:
        fail(exc)
        return
    out.print(escape(said))
    raise typer.Exit(0 if said == "ok" else 1)


@agent_app.command("remeasure")
def agent_remeasure(
    run: Annotated[str, typer.Argument(help="The run's id (or a unique prefix).")],
    node: Annotated[int, typer.Argument(help="An evaluated node.")],
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure a node's kernel again, live, in a fresh worker (the node keeps its ranked verdict).

    \b
    Example:
      kernelevolve agent remeasure 3f2a9c1e 4
    """
    from kernelevolve import agent_jobs as agent

    try:
        result = agent.remeasure(settings_for(workspace, existing=True).workspace, run, node)
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
    else:
        out.print(escape(result["text"]))
        out.print(f"search-time fitness {fmt_x(result['search_fitness'])}; now {fmt_x(result['fitness'])}")
    raise typer.Exit(0 if result["status"] == "ok" else 1)


@agent_app.command("finish")
def agent_finish(
    run: Annotated[str, typer.Argument(help="The run's id (or a unique prefix).")],
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Close an agent run: re-measure the winners; write the best kernel, export and report."""
    from kernelevolve import agent_jobs as agent

    try:
        summary = agent.finish(settings_for(workspace, existing=True).workspace, run)
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    emit_summary(summary, as_json)


@app.command()
def mcp(
    workspace: WorkspaceOpt = None,
    platform: PlatformOpt = None,
) -> None:
    """Serve the agent interface over MCP (stdio): start_run, next_task, lint, submit, search_knowledge, ...

    \b
    Example (an MCP client's server entry):
      {"command": "kernelevolve", "args": ["mcp", "--workspace", "/path/to/ws"]}
    """
    from kernelevolve.mcp_server import serve

    try:
        serve(settings_for(workspace).workspace.resolve(), platform)
    except KernelevolveError as exc:
        fail(exc)
