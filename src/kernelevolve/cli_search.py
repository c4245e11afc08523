"""The search commands: optimize, resume, runs, show, tune. Registered on `cli.app` (see cli.py).

Progress goes to stderr, one line per event; `--json` prints one summary object on stdout, with
`outcome` (`faster`, `not_faster`, `no_correct_kernel`) and `exit_code`. Exit codes
(`cli_common.EXIT_CODES`): 0 a correct kernel faster than the baseline, 4 a correct kernel that is
not, 1 no correct kernel, 2 bad input, 3 the harness failed, 5 the spec cannot be used. Ctrl-C
stops a run cleanly (exit 130); `kernelevolve resume RUN` continues it.

Why one module (over 450 lines): the five commands share one progress printer, one summary
printer and the exit-code rules; each command is a short block that reads top to bottom.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from kernelevolve.cli_common import (
    DEVICES_HELP,
    EXIT_NOT_FASTER,
    EXIT_NOT_OK,
    EXIT_OK,
    BudgetOpt,
    JsonOpt,
    PlatformOpt,
    PolicyOpt,
    WorkspaceOpt,
    app,
    err,
    fail,
    fmt_x,
    interrupted,
    limits_from,
    out,
    parse_devices_option,
    settings_for,
)
from kernelevolve.errors import KernelevolveError


def _search_progress(state: dict[str, Any] | None = None) -> Any:
    """Progress lines on stderr; the run's id is kept in `state["run_id"]` for the interrupt message."""
    state = state if state is not None else {}

    def on_event(event: str, data: dict[str, Any]) -> None:
        if event == "run":
            state["run_id"] = data["run_id"]
            shape = f" (shape {data['shape']})" if data.get("shape") else ""
            err.print(f"[bold]run {data['run_id']}[/]{escape(shape)}")
        elif event == "memory_plan":
            err.print(f"[yellow]{escape(data['note'])}[/]")
        elif event == "resume":
            err.print(f"[dim]resuming: {len(data['pending'])} node(s) were in flight: {data['pending']}[/]")
        elif event == "synthesize":
            parents = ", ".join(map(str, data["parents"])) or "none"
            err.print(f"[dim]node {data['node']}: {data['mode']} (parents: {parents})[/]")
        elif event == "outage":
            err.print(f"[yellow]node {data['node']}: the model endpoint failed (no candidate spent); "
                      f"trying again in {data['wait_s']:.0f} s[/]")  # fmt: skip
        elif event == "failed":
            colour = "yellow" if data["status"] in ("exhausted", "unavailable") else "red"
            err.print(
                f"[{colour}]node {data['node']}: no candidate ({data['status']}): {escape(data['error'][:300])}[/]"
            )
        elif event == "evaluated":
            v, best = data["verdict"], data["best"] or {}
            colour = "green" if v.ok else "red"
            what = (
                f"{fmt_x(v.speedup_vs_eager)} vs eager, {fmt_x(v.speedup_vs_compile)} vs compile"
                if v.ok
                else escape(v.message[:200])
            )
            if v.method.reused_from is not None:  # evaluate/reuse.py
                what += f" (the verdict of evaluation {v.method.reused_from}, not evaluated again)"
            star = " [bold]new best[/]" if data.get("new_best") else ""
            best_txt = (
                f"best node {best['node']}: {fmt_x(best.get('fitness'))}"
                if best.get("node")
                else "no correct kernel yet"
            )
            err.print(
                f"[{colour}]node {data['node']}: {v.status}[/] {what}{star}  "
                f"[dim]({best_txt}; {best.get('spent', 0)}/{best.get('budget', 0)} candidates)[/]"
            )
        elif event == "stop":
            err.print(f"[bold]stopping:[/] {escape(data['reason'])}")
        elif event == "retry":
            err.print(f"[yellow]{escape(data['label'])}: {escape(data['reason'][:300])}[/]")
        elif event == "remeasure":
            err.print(f"[dim]re-measuring node {data['node']} in a fresh worker[/]")
        elif event in ("warm_start", "seeds"):
            for n in data["nodes"]:
                err.print(f"[cyan]node {n['node']}: {escape(n['note'][:200])}[/]")
        elif event == "profile":
            err.print(f"[dim]profiling node {data['node']} (the new best) for its diagnosis[/]")
        elif event == "skill":
            err.print(
                f"[dim]node {data['node']}: candidate skill {data['skill']}: {escape(data['title'])}[/]"
            )
        elif event == "verify_skill":
            err.print(f"[dim]verifying a skill: re-measuring {escape(data['label'])}[/]")
        elif event == "learn_failed":
            err.print(
                f"[yellow]analysis of node {data['node']} failed (the node is kept): {escape(data['error'][:300])}[/]"
            )

    return on_event


def _interrupted(run_id: str | None, as_json: bool) -> typer.Exit:
    what = f"kernelevolve resume {run_id}" if run_id else "kernelevolve runs` and `kernelevolve resume RUN"
    return interrupted(f"the run is stored; continue it with `{what}`", as_json)


def outcome(summary: dict[str, Any]) -> tuple[str, int]:
    """What a finished run found, as a word and an exit code: `faster` (0) when the best kernel,
    re-measured in a fresh worker, beats the run's fitness baseline by more than its measured spread
    (and 1%, the search's smallest gain); `not_faster` (4) when the best kernel is correct but is not
    (or its re-measurement was not ok); `no_correct_kernel` (1) when no candidate was correct."""
    if summary.get("best_node") is None:
        return "no_correct_kernel", EXIT_NOT_OK
    fitness = summary.get("best_fitness")
    spread = (summary.get("final") or {}).get("spread") or 0.0
    if fitness is not None and fitness > 1.0 + max(spread, 0.01):
        return "faster", EXIT_OK
    return "not_faster", EXIT_NOT_FASTER


def _print_summary(summary: dict[str, Any]) -> None:
    b = summary.get("baseline", "best")
    if summary.get("best_node") is None:
        out.print(
            f"[red]run {summary['run_id']}: no correct kernel found[/] ({escape(summary['stop_reason'])})"
        )
    else:
        if summary.get("outcome") == "not_faster":
            out.print(f"[yellow]run {summary['run_id']}: the best correct kernel is not faster than the "
                      f"baseline ({b}); the export keeps the reference where it is faster[/]")  # fmt: skip
        against = (
            f"{fmt_x(summary.get('best_speedup_vs_best'))} vs {summary.get('best_baseline') or 'the best baseline'} "
            "(the faster baseline), "
            if summary.get("best_speedup_vs_best") is not None
            else ""
        )
        out.print(
            f"[bold]run {summary['run_id']}[/]: best node {summary['best_node']}, {against}"
            f"{fmt_x(summary.get('best_speedup_vs_eager'))} vs eager, "
            f"{fmt_x(summary.get('best_speedup_vs_compile'))} vs compile (re-measured; fitness vs {b})"
        )
        if summary.get("final_status") and summary["final_status"] != "ok":
            out.print(
                f"[yellow]the re-measurement was not ok: {escape(str(summary.get('final_message')))}[/]"
            )
    if summary.get("shapes"):
        t = Table(show_header=True, box=None, padding=(0, 2))
        for col in (
            "shape",
            "weight",
            "correct",
            "time",
            "eager",
            "compile",
            "vs eager",
            "vs compile",
            "vs best",
            "roofline",
            "export",
        ):
            t.add_column(col)
        for s in summary["shapes"]:
            best = s.get("speedup_vs_best")
            t.add_row(
                s["shape"], f"{s['weight']:.2f}", "yes" if s["correct"] else "no", _us(s["time_us"]),
                _us(s["eager_us"]), _us(s["compile_us"]), fmt_x(s["speedup_vs_eager"]),
                fmt_x(s["speedup_vs_compile"]),
                "-" if best is None else f"{fmt_x(best)} ({s.get('best_baseline')})",
                "-" if s["roofline_fraction"] is None else f"{s['roofline_fraction']:.0%}",
                s["dispatch"] if s["dispatch"] != "kernel" else f"node {s['node']}",
            )  # fmt: skip
        out.print(t)
    for flag in summary.get("flags") or []:
        out.print(f"[yellow]flag: {escape(flag)}[/]")
    out.print(
        f"{summary['nodes_evaluated']} evaluated ({summary['nodes_ok']} correct) in {summary['wall_s']:.0f} s; "
        f"{summary['tokens_in'] + summary['tokens_out']} tokens, ${summary['cost_usd']:.2f}; "
        f"stopped: {escape(summary['stop_reason'])}"
    )
    if summary.get("warm_start"):
        best_warm = max(summary["warm_start"], key=lambda w: w["fitness"])
        out.print(f"warm start: {len(summary['warm_start'])} earlier kernel(s) seeded the tree "
                  f"(best of them: node {best_warm['node']}, fitness {best_warm['fitness']:.2f})")  # fmt: skip
    for seed in summary.get("seeds") or []:
        said = (f"{fmt_x(seed['speedup_vs_eager'])} vs eager, {fmt_x(seed['speedup_vs_compile'])} vs compile"
                if seed["status"] == "ok" else escape(str(seed["message"] or seed["state"])[:200]))  # fmt: skip
        out.print(
            f"your kernel {escape(str(seed['file']))}: node {seed['node']}, {seed['status'] or seed['state']}: {said}"
        )
    skills = summary.get("skills") or {}
    if skills.get("candidates") or skills.get("verified"):
        out.print(f"skills: {skills.get('candidates', 0)} candidate(s) from this run; verified now: "
                  f"{', '.join(skills.get('verified') or []) or 'none'} (`kernelevolve skills list`)")  # fmt: skip
    if summary.get("best_candidate"):
        out.print(f"best kernel: {escape(summary['best_candidate'])}")
    if summary.get("export"):
        out.print(f"export (per-shape dispatch, reference fallback): {escape(summary['export'])}")
    for kind, path in (summary.get("report") or {}).items():
        out.print(f"report ({kind}): {escape(path)}")


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} us"


def emit_summary(summary: dict[str, Any], as_json: bool) -> None:
    """Print a finished run's summary (with its `outcome` and `exit_code`) and exit with that code."""
    word, code = outcome(summary)
    summary = {**summary, "outcome": word, "exit_code": code}
    if as_json:
        slim = {k: v for k, v in summary.items() if k != "final"}
        sys.stdout.write(json.dumps(slim, indent=2, default=str) + "\n")
    else:
        _print_summary(summary)
    raise typer.Exit(code)


@app.command()
def optimize(
    spec: Annotated[Path, typer.Argument(help="The spec: a KernelBench-format .py file.")],
    llm: Annotated[
        str | None,
        typer.Option(
            help="PROVIDER:MODEL (openai:gpt-4.1, anthropic:claude-sonnet-4-5). Default: the offline tuner."
        ),
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option(help="An OpenAI-compatible server (vLLM, SGLang, Ollama): http://host:8000/v1."),
    ] = None,
    budget: BudgetOpt = None,
    wall: Annotated[float | None, typer.Option("--wall", help="Wall-clock budget in seconds.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Token budget (prompt + completion).")] = None,
    max_usd: Annotated[
        float | None,
        typer.Option(help="USD budget, from the price table; a model without a price there is refused."),
    ] = None,
    patience: Annotated[
        int | None, typer.Option(help="Stop after this many candidates without a new best.")
    ] = None,
    target: Annotated[float | None, typer.Option(help="Stop once the best speedup reaches this.")] = None,
    policy: PolicyOpt = "uct",
    draft: Annotated[int, typer.Option(help="Independent samples before feedback-driven expansion.")] = 4,
    schedule: Annotated[
        str, typer.Option(help="Memory modes cycled per expansion (inherit, compare, combine, fresh).")
    ] = "inherit,compare,combine",
    parallel: Annotated[int, typer.Option(help="Expansions in flight (0: auto).")] = 0,
    single_shot: Annotated[
        bool, typer.Option(help="A model without tool calling: code in the answer.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of the search's random choices.")] = 0,
    platform: PlatformOpt = None,
    device: Annotated[int | None, typer.Option("--device", help="Use this device alone.")] = None,
    devices: Annotated[
        str | None, typer.Option(help=f"Candidates are spread over these. {DEVICES_HELP}")
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="Fitness baseline: best (each shape's faster of eager and torch.compile, the default) | eager | compile."
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help="Candidates evaluated at once, over all devices (0: auto, 2 per GPU).")
    ] = None,
    executor: Annotated[
        str | None, typer.Option(help="Where candidates are evaluated: local | ray (the `ray` extra).")
    ] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="The Ray cluster (as ray.init takes it: auto, ray://host:10001).")
    ] = None,
    timing_budget: Annotated[float | None, typer.Option(help="Seconds of timing per shape.")] = None,
    start_from: Annotated[
        list[Path] | None,
        typer.Option(
            "--start-from",
            help="Your kernel (a ModelNew file), evaluated first and grown from; repeat for several.",
        ),
    ] = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search for a faster kernel for SPEC; write the best kernel, a per-shape dispatch module and a report.

    \b
    Examples:
      kernelevolve optimize examples/softmax/spec.py                      # offline tuner, this machine's device
      kernelevolve optimize SPEC --platform cpu --budget 20 --json
      kernelevolve optimize SPEC --llm openai:gpt-4.1 --budget 100
      kernelevolve optimize SPEC --llm openai:qwen3-coder --base-url http://localhost:8000/v1
      kernelevolve optimize SPEC --llm anthropic:claude-sonnet-4-5 --max-usd 20
      kernelevolve optimize SPEC --workers 8                            # every local GPU (auto devices)
      kernelevolve optimize SPEC --executor ray --ray-address auto       # a Ray cluster
      kernelevolve optimize SPEC --start-from my_kernel.py               # grow the tree from your kernel
    """
    from kernelevolve import optimize as jobs
    from kernelevolve.search.policies import SearchConfig
    from kernelevolve.synth import SynthConfig

    state: dict[str, Any] = {}
    try:
        settings = settings_for(
            workspace, platform=platform, device=device, fitness_baseline=baseline, workers=workers,
            timing_budget_s=timing_budget, executor=executor, ray_address=ray_address,
            devices=parse_devices_option(devices) or (str(device) if device is not None else None),
        )  # fmt: skip
        search = SearchConfig(
            policy=policy, draft=draft, schedule=tuple(m.strip() for m in schedule.split(",") if m.strip()),
            parallel=parallel, seed=seed,
        ).validate()  # fmt: skip
        limits = limits_from(budget, wall, max_tokens, max_usd, patience, target)
        synth = SynthConfig(name=llm or "tuner", base_url=base_url, single_shot=single_shot)
        if synth.is_model:  # what the model will likely cost, before the first call
            from kernelevolve.cost import estimate, require_price
            from kernelevolve.store import Workspace

            require_price(synth, limits.max_usd, settings)

            with Workspace.open(settings.workspace) as ws:
                err.print(f"[dim]{escape(estimate(ws, synth, limits.budget, settings).line())}[/]")
        summary = jobs.optimize(
            spec, settings, search, limits, synth, on_event=_search_progress(state), start_from=start_from
        )
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    except KeyboardInterrupt:
        raise _interrupted(state.get("run_id"), as_json) from None
    emit_summary(summary, as_json)


@app.command()
def resume(
    run: Annotated[str, typer.Argument(help="The run's id (or a unique prefix).")],
    budget: BudgetOpt = None,
    device: Annotated[
        int | None, typer.Option("--device", help="Use this device alone (default: the run's own).")
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option(help=f"Candidates are spread over these (default: the run's own). {DEVICES_HELP}"),
    ] = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Continue a run that was stopped or killed: nothing is lost, nothing is spent twice.

    \b
    Examples:
      kernelevolve resume 3f2a9c1e
      kernelevolve resume 3f2a --budget 80 --json     # and raise its candidate budget
      kernelevolve resume 3f2a --device 0             # on another machine, with fewer GPUs
    """
    from dataclasses import replace

    from kernelevolve import optimize as jobs
    from kernelevolve.search.limits import Limits
    from kernelevolve.store import Workspace

    try:
        settings = settings_for(workspace, existing=True)
        limits = None
        if budget is not None:
            with Workspace.open(settings.workspace) as ws:
                limits = replace(Limits(**ws.run(run)["limits"]), budget=budget).validate()
        err.print(f"[bold]resuming run {escape(run)}[/]")
        where = _placement(device, parse_devices_option(devices))
        summary = jobs.drive(run, settings.workspace, _search_progress(), limits=limits, where=where)
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    except KeyboardInterrupt:
        raise _interrupted(run, as_json) from None
    emit_summary(summary, as_json)


def _placement(device: int | None, devices: str | None) -> dict[str, Any] | None:
    """`resume`'s --device/--devices as the run's placement for this drive; None keeps its own. The
    device also names the one `devices = auto` would otherwise keep (a stored index not here)."""
    if device is None and devices is None:
        return None
    if devices is None:
        return {"device": device, "devices": str(device)}
    if device is None:
        from kernelevolve.config import parse_devices

        device = 0 if devices == "auto" else parse_devices(devices)[0]
    return {"device": device, "devices": devices}


@app.command("runs")
def runs_cmd(
    workspace: WorkspaceOpt = None,
    limit: Annotated[int, typer.Option(help="Show the newest this many runs.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List the workspace's runs, newest first.

    \b
    Example:
      kernelevolve runs --json
    """
    from kernelevolve import optimize as jobs

    try:
        rows = jobs.runs(settings_for(workspace, existing=True).workspace, limit)
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        slim = [{k: v for k, v in r.items() if k != "summary"} | _headline(r) for r in rows]
        sys.stdout.write(json.dumps({"runs": slim}, indent=2, default=str) + "\n")
        return
    t = Table(title="runs")
    for col in (
        "run",
        "created",
        "spec",
        "platform",
        "synthesizer",
        "policy",
        "status",
        "nodes",
        "best vs eager",
        "best vs compile",
    ):
        t.add_column(col)
    for r in rows:
        h = _headline(r)
        t.add_row(
            r["run_id"], r["created_at"][:19], Path(r["spec_path"]).parent.name + "/" + Path(r["spec_path"]).name,
            r["platform"], r["synthesizer"], r["policy"], r["status"], str(sum(r["nodes"].values())),
            fmt_x(h["best_speedup_vs_eager"]), fmt_x(h["best_speedup_vs_compile"]),
        )  # fmt: skip
    out.print(t)


def _headline(run: dict[str, Any]) -> dict[str, Any]:
    s = run.get("summary") or {}
    return {
        k: s.get(k)
        for k in ("best_speedup_vs_eager", "best_speedup_vs_compile", "best_candidate", "nodes_evaluated")
    }


@app.command()
def show(
    run: Annotated[str, typer.Argument(help="The run's id (or a unique prefix).")],
    node: Annotated[
        int | None, typer.Option(help="Show one node: its verdict, note, prompt and source.")
    ] = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A run's tree: every node with its mode, parents, verdict and what changed.

    \b
    Examples:
      kernelevolve show 3f2a9c1e
      kernelevolve show 3f2a --node 7
    """
    from kernelevolve import optimize as jobs
    from kernelevolve.search.tools import describe_verdict
    from kernelevolve.store import Workspace

    try:
        settings = settings_for(workspace, existing=True)
        record, nodes = jobs.show(settings.workspace, run)
        if node is not None:
            with Workspace.open(settings.workspace) as ws:
                nodes = [n for n in ws.nodes(record["run_id"], text=True) if n["id"] == node]
            if not nodes:
                raise KernelevolveError(f"run {record['run_id']} has no node {node}")
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        sys.stdout.write(json.dumps({"run": record, "nodes": nodes}, indent=2, default=str) + "\n")
        return
    if node is not None:
        n = nodes[0]
        out.print(
            f"[bold]node {n['id']}[/] parent {n['parent']} mode {n['mode']} state {n['state']}: {escape(n['note'])}"
        )
        if n.get("verdict"):
            out.print(escape(describe_verdict(n["verdict"])))
        elif n.get("message"):
            out.print(escape(n["message"]))
        for key in ("prompt", "response", "source"):
            if n.get(key):
                out.print(f"[dim]--- {key} ---[/]")
                out.print(n[key], markup=False, highlight=False)
        return
    s = record.get("summary") or {}
    out.print(
        f"[bold]run {record['run_id']}[/] {record['status']}: {escape(record['spec_path'])} on {record['platform']}, "
        f"{record['synthesizer']}, {record['policy']}; best node {record['best_node']}"
        + (f", {fmt_x(s.get('best_speedup_vs_eager'))} vs eager" if s else "")
    )
    t = Table(show_header=True, box=None, padding=(0, 2))
    for col in ("node", "parent", "mode", "state", "status", "vs eager", "vs compile", "note"):
        t.add_column(col)
    for n in nodes:
        parent = (
            "-" if n["parent"] is None else str(n["parent"]) + (f"+{n['parent2']}" if n["parent2"] else "")
        )
        t.add_row(
            str(n["id"]), parent, n["mode"], n["state"], n["status"] or "-", fmt_x(n["speedup_vs_eager"]),
            fmt_x(n["speedup_vs_compile"]), escape((n["note"] or n["message"] or "")[:70]),
        )  # fmt: skip
    out.print(t)


@app.command()
def tune(
    spec: Annotated[Path, typer.Argument(help="The spec: a KernelBench-format .py file.")],
    kernel: Annotated[Path, typer.Argument(help="Your candidate, declaring TUNABLES and CONFIG.")],
    budget: Annotated[int, typer.Option("--budget", "-n", help="Configurations to evaluate per shape.")] = 12,
    policy: PolicyOpt = "greedy",
    platform: PlatformOpt = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search your own kernel's declared tunables at every shape of the spec; print the best per shape.

    \b
    The kernel declares its knobs as module-level literals and reads CONFIG:
      TUNABLES = {"BLOCK": [256, 512, 1024], "num_warps": [2, 4, 8]}
      CONFIG = {"BLOCK": 512, "num_warps": 4}
    Example:
      kernelevolve tune examples/softmax/spec.py my_softmax.py --budget 16
    """
    from kernelevolve import optimize as jobs
    from kernelevolve.search.policies import SearchConfig

    try:
        settings = settings_for(workspace, platform=platform)
        result = jobs.tune(
            spec, kernel, settings, SearchConfig(policy=policy).validate(), limits_from(budget, None, None, None, None, None),
            on_event=_search_progress(),
        )  # fmt: skip
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    except KeyboardInterrupt:
        raise interrupted("each shape's run is stored; `kernelevolve runs` lists them", as_json) from None
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
        return
    t = Table(title=f"tuned {Path(result['kernel']).name} for {result['spec']}")
    for col in ("shape", "best config", "time", "vs eager", "vs compile", "roofline", "evaluated", "run"):
        t.add_column(col)
    for r in result["shapes"]:
        t.add_row(
            r["shape"], escape(json.dumps(r["config"])) if r["config"] else "-", _us(r["time_us"]),
            fmt_x(r["speedup_vs_eager"]), fmt_x(r["speedup_vs_compile"]),
            "-" if r["roofline_fraction"] is None else f"{r['roofline_fraction']:.0%}", str(r["nodes_evaluated"]),
            r["run_id"],
        )  # fmt: skip
    out.print(t)
