"""The bench and data commands: bench, benches (list, show), export. Registered on `cli.app`.

`bench DIR` runs the search over every spec of a folder (a suite or a KernelBench level) and ends with
one table; `--json` prints the bench document on stdout, `--report OUT` writes it as markdown, CSV,
JSON, PNG plots and one HTML page. Running the same command again resumes the bench. Exit codes
(`cli_common.EXIT_CODES`): 0 the bench ran to its end (whether or not every op got a correct kernel:
its table says), 2 bad input, 3 the harness failed, 130 interrupted (the bench is stored; the same
command resumes it). `benches` and `export` only read the workspace: one that is not there is an
error, not created.
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

benches_app = typer.Typer(help="Benches in the workspace: list them, show one, write its report.",
                          no_args_is_help=True)  # fmt: skip
app.add_typer(benches_app, name="benches")


def _bench_progress() -> Any:
    def on_event(event: str, data: dict[str, Any]) -> None:
        counter = escape(f"[{data.get('index')}/{data.get('total')}]")
        if event == "bench":
            what = "resuming" if data["resumed"] else "starting"
            err.print(
                f"[bold]bench {data['bench_id']}[/]: {what}, {data['specs']} spec(s) in {escape(data['dir'])}"
            )
            err.print(f"[dim]{escape(data['estimate_line'])}[/]")
        elif event == "load_error":
            err.print(
                f"[yellow]{counter} {escape(data['path'])}: skipped, it does not load: {escape(data['error'][:300])}[/]"
            )
        elif event == "cached":
            err.print(
                f"[dim]{counter} {escape(data['name'])}: done earlier: {_result_text(data['result'])}[/]"
            )
        elif event in ("start", "resume"):
            verb = "run" if event == "start" else "resuming run"
            note = f" [dim]({escape(data['note'])})[/]" if data.get("note") else ""
            err.print(f"{counter} [bold]{escape(data['name'])}[/]: {verb} {data['run_id']}{note}")
        elif event == "run_error":
            err.print(
                f"[red]{counter} {escape(data['name'])}: the run failed: {escape(data['error'][:300])}[/]"
            )
        elif event == "result":
            colour = "green" if data["result"].get("correct") else "red"
            err.print(f"[{colour}]{counter} {escape(data['name'])}: {_result_text(data['result'])}[/]")
        elif event == "run_event":
            inner, d = data["event"], data["data"]
            spec = f"{counter} {escape(str(data.get('name') or data.get('path')))}:"  # runs interleave
            if inner == "evaluated" and d.get("new_best"):
                v = d["verdict"]
                err.print(f"[dim]    {spec} node {d['node']}: new best, {fmt_x(v.fitness)} vs "
                          f"{escape(str(v.method.fitness_baseline))}, {fmt_x(v.speedup_vs_eager)} vs eager, "
                          f"{fmt_x(v.speedup_vs_compile)} vs compile[/]")  # fmt: skip
            elif inner == "stop":
                err.print(f"[dim]    {spec} stopping: {escape(d['reason'])}[/]")

    return on_event


def _result_text(r: dict[str, Any]) -> str:
    if not r.get("correct"):
        return escape(str(r.get("message") or "no correct kernel")[:300])
    roof = r.get("roofline_fraction")
    return (
        f"{fmt_x(r.get('speedup_vs_eager'))} vs eager, {fmt_x(r.get('speedup_vs_compile'))} vs compile"
        + (f", {roof:.0%} of roofline" if roof else "")
        + f" ({r.get('candidates', 0)} candidates, {r.get('wall_s', 0):.0f} s)"
    )


def _print_bench(doc: dict[str, Any]) -> None:
    from kernelevolve.bench.report import COLUMNS, cell, header, summary_rows

    if doc.get("imported") is True:
        _print_imported(doc)
        return

    for k, v in header(doc):
        out.print(f"[dim]{escape(k)}:[/] {escape(v)}")
    t = Table(show_header=True, box=None, padding=(0, 2))
    for h, _ in COLUMNS[:9]:
        t.add_column(h)
    for r in doc["results"]:
        t.add_row(*(escape(cell(k, r.get(k))) for _, k in COLUMNS[:9]))
    out.print(t)
    s = doc["summary"]
    out.print(
        f"{s['correct']} of {s['specs']} correct; {s['load_errors']} failed to load; {s['flagged']} flagged"
    )
    st = Table(show_header=True, box=None, padding=(0, 2))
    for h in ("metric", "vs eager", "vs compile"):
        st.add_column(h)
    for row in summary_rows(s):
        st.add_row(*row)
    out.print(st)
    if doc.get("pending"):
        out.print(f"[yellow]not yet run: {escape(', '.join(doc['pending']))}[/]")
    for other in doc.get("other_sources") or []:
        out.print(f"[dim]beside: imported bench {other['bench_id']} ({escape(str(other.get('source')))}, "
                  "reported by the source; the report shows it)[/]")  # fmt: skip


def _finish(doc: dict[str, Any], report: Path | None, as_json: bool) -> None:
    if report is not None:
        from kernelevolve.bench.report import write_bench_report

        paths = write_bench_report(doc, report)
        err.print(f"report: {escape(', '.join(str(p) for p in paths.values()))}")
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        _print_bench(doc)


@app.command()
def bench(
    directory: Annotated[
        Path, typer.Argument(help="A folder of spec files (a suite, a KernelBench level), or one file.")
    ],
    budget: BudgetOpt = None,
    llm: Annotated[str | None, typer.Option(help="PROVIDER:MODEL; default: the offline tuner.")] = None,
    base_url: Annotated[str | None, typer.Option(help="An OpenAI-compatible server.")] = None,
    baseline: Annotated[
        str | None, typer.Option(help="Fitness baseline of the searches: best (default) | eager | compile.")
    ] = None,
    track: Annotated[
        str, typer.Option(help="Precision track: strict (fp32) | tf32 (TF32 allowed).")
    ] = "strict",
    policy: PolicyOpt = "uct",
    only: Annotated[str | None, typer.Option(help="Only the specs whose path matches this regex.")] = None,
    fresh: Annotated[bool, typer.Option(help="Start a new bench instead of resuming this one.")] = False,
    redo: Annotated[
        str | None,
        typer.Option(help="Run the done specs whose path matches this regex again, in new runs."),
    ] = None,
    report: Annotated[
        Path | None, typer.Option(help="Write the report (md, csv, json, png, html) here.")
    ] = None,
    platform: PlatformOpt = None,
    device: Annotated[int | None, typer.Option("--device", help="Device index.")] = None,
    devices: Annotated[
        str | None, typer.Option(help=f"Run specs on several GPUs at once. {DEVICES_HELP}")
    ] = None,
    per_device: Annotated[
        int | None,
        typer.Option(
            help="Specs run at once on each device (timings still take turns per device); default: "
            "1 on the CPU, on a GPU one per 4 of its host cores (the host's over the devices) up to 4."
        ),
    ] = None,
    order_from: Annotated[
        Path | None,
        typer.Option(
            help="A bench document (--json) whose run times order the specs, longest first; "
            "default: the times of this workspace's earlier benches."
        ),
    ] = None,
    workers: Annotated[int | None, typer.Option(help="Candidates evaluated at once (0: auto).")] = None,
    timing_budget: Annotated[float | None, typer.Option(help="Seconds of timing per shape.")] = None,
    max_usd: Annotated[float | None, typer.Option(help="USD budget per op (model synthesizers).")] = None,
    import_dir: Annotated[
        Path | None,
        typer.Option(
            "--import",
            help="Import a KernelBench run's folder (eval_results.json, kernels) for DIRECTORY's problems; no search.",
        ),
    ] = None,
    reverify: Annotated[
        bool, typer.Option(help="With --import: evaluate the imported kernels in this harness, live.")
    ] = False,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search every spec of DIRECTORY; one table of correctness, speedups, roofline and cost.

    \b
    Examples:
      kernelevolve bench suites/recsys --budget 50
      kernelevolve bench PATH/TO/kernelbench/level2 --budget 20 --baseline compile
      kernelevolve bench suites/llm --report out/ --json > bench.json
      kernelevolve bench suites --devices auto         # one spec per GPU at a time
      kernelevolve bench suites --devices auto --per-device 3   # three per GPU: more host CPU, 1/3 the memory
      kernelevolve bench KernelBench/level1 --import runs/my_run     # their results, beside ours in reports
    Run the same command again to resume; --fresh starts over, --redo NAME runs one spec again.
    """
    from kernelevolve.bench import run_bench
    from kernelevolve.search.policies import SearchConfig
    from kernelevolve.synth import SynthConfig

    if import_dir is not None:
        _import(directory, import_dir, reverify, report, as_json, workspace, platform, device)
        return
    try:
        settings = settings_for(workspace, platform=platform, device=device, fitness_baseline=baseline,
                             workers=workers, timing_budget_s=timing_budget)  # fmt: skip
        search = SearchConfig(policy=policy).validate()
        limits = limits_from(budget, None, None, max_usd, None, None)
        synth = SynthConfig(name=llm or "tuner", base_url=base_url)
        if synth.is_model:
            from kernelevolve.cost import require_price

            require_price(synth, limits.max_usd, settings)  # once here, not once per spec's run
        doc = run_bench(directory, settings, search, limits, synth, track=track, fresh=fresh, only=only, redo=redo,
                        devices=_devices(devices), per_device=per_device, order_from=order_from,
                        on_event=_bench_progress())  # fmt: skip
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    except KeyboardInterrupt:
        raise interrupted("the bench is stored; run the same command again to resume it", as_json) from None
    _finish(doc, report, as_json)


def _import(
    directory: Path, results: Path, reverify: bool, report: Path | None, as_json: bool,
    workspace: Path | None, platform: str | None, device: int | None,
) -> None:  # fmt: skip
    """`bench DIRECTORY --import RESULTS`: the source's results as an imported bench (`bench.imported`)."""
    from kernelevolve.bench.imported import import_kernelbench

    def on_event(event: str, data: dict[str, Any]) -> None:
        if event == "imported":
            err.print(f"[bold]bench {data['bench_id']}[/]: imported {data['problems']} problem(s) from "
                      f"{escape(data['source'])} (numbers reported by the source, not re-measured)")  # fmt: skip
            if data["unmatched"]:
                err.print(f"[yellow]results without a problem file: {data['unmatched']}[/]")
        elif event == "reverify":
            counter = escape(f"[{data['index']}/{data['total']}]")
            err.print(f"[dim]{counter} re-verifying {escape(data['name'])} in this harness[/]")

    try:
        settings = settings_for(workspace, platform=platform, device=device)
        doc = import_kernelbench(directory, results, settings, reverify=reverify, on_event=on_event)
    except KernelevolveError as exc:
        fail(exc)
        return
    _finish(doc, report, as_json)


def _print_imported(doc: dict[str, Any]) -> None:
    from kernelevolve.bench.report_imported import IMPORTED_COLUMNS, REPORTED, imported_cell, imported_header

    out.print(f"[yellow]{escape(REPORTED)}[/]")
    for k, v in imported_header(doc):
        out.print(f"[dim]{escape(k)}:[/] {escape(v)}")
    t = Table(show_header=True, box=None, padding=(0, 2))
    for h, _ in IMPORTED_COLUMNS:
        t.add_column(h)
    for r in doc["results"]:
        t.add_row(*(escape(imported_cell(k, r.get(k))) for _, k in IMPORTED_COLUMNS))
    out.print(t)


def _devices(text: str | None) -> list[int] | None:
    """The GPUs a bench spreads its specs over, from `--devices` in the vocabulary of every command
    (`parse_devices_option`): auto (or its alias all) is every visible GPU."""
    from kernelevolve.errors import WorkspaceError

    canonical = parse_devices_option(text)
    if canonical is None:
        return None
    if canonical == "auto":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise WorkspaceError(
                f"--devices {text}: no GPU is visible", hint="leave --devices out on the CPU"
            )
        return list(range(count))
    return [int(d) for d in canonical.split(",")]


@benches_app.command("list")
def benches_list(workspace: WorkspaceOpt = None, as_json: JsonOpt = False) -> None:
    """The workspace's benches, newest first."""
    from kernelevolve.store import Workspace

    try:
        with Workspace.open(settings_for(workspace, existing=True).workspace) as ws:
            rows = ws.benches()
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        sys.stdout.write(json.dumps({"benches": rows}, indent=2, default=str) + "\n")
        return
    t = Table(title="benches")
    for col in ("bench", "created", "dir", "track", "synthesizer", "budget", "specs done", "status"):
        t.add_column(col)
    for r in rows:
        c = r["config"]
        if c.get("imported"):  # another system's results: no track, synthesizer or budget of ours
            source = f"imported: {c.get('source') or c.get('format')}" + (
                " (re-verified)" if c.get("reverified") else ""
            )
            cells = ["-", escape(str(source)), "-"]
        else:
            cells = [str(c.get("track")), str(c.get("synthesizer")), str(c.get("budget"))]
        t.add_row(
            r["bench_id"],
            r["created_at"][:19],
            escape(r["dir"]),
            *cells,
            f"{r['done']}/{r['items']}",
            r["status"],
        )
    out.print(t)


@benches_app.command("show")
def benches_show(
    bench_id: Annotated[str, typer.Argument(help="The bench's id (or a unique prefix).")],
    report: Annotated[
        Path | None, typer.Option(help="Write the report (md, csv, json, png, html) here.")
    ] = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A stored bench's table (and report), without running anything."""
    from kernelevolve.bench import bench_document
    from kernelevolve.store import Workspace

    try:
        with Workspace.open(settings_for(workspace, existing=True).workspace) as ws:
            doc = bench_document(ws, ws.resolve_bench(bench_id))
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    _finish(doc, report, as_json)


@app.command()
def export(
    runs: Annotated[list[str] | None, typer.Argument(help="Run ids (or unique prefixes).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="trajectories | winners | package")] = "trajectories",
    bench_id: Annotated[str | None, typer.Option("--bench", help="Every run of this bench.")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="A file instead of stdout (package: the folder).")
    ] = None,
    name: Annotated[
        str, typer.Option("--name", help="package: its name, a Python identifier.")
    ] = "kernelevolve_winner",
    build: Annotated[
        bool,
        typer.Option("--build", help="package: prebuild native kernels for this host (no compiler there)."),
    ] = False,
    workspace: WorkspaceOpt = None,
) -> None:
    """Training data as JSONL: every step of the runs (prompt, response, verdict, reward), or the winners;
    or one run's winning kernels as an importable package (`--format package`).

    \b
    Examples:
      kernelevolve export 3f2a9c1e --format trajectories > data.jsonl
      kernelevolve export --bench b41c2d7e --format winners -o winners.jsonl
      kernelevolve export 3f2a9c1e --format package --name softmax_winner --build -o deploy/
    The reward is 0 for a failed step, else clamp(1 + log2(fitness), 0.1, 4.32) (see docs/bench.md).
    """
    from kernelevolve.data import FORMATS
    from kernelevolve.errors import WorkspaceError
    from kernelevolve.store import Workspace

    if fmt == "package":  # one run's dispatch as the package `name` under `output` (default .)
        from kernelevolve.export import export_run

        try:
            if len(runs or []) != 1 or bench_id is not None:
                raise WorkspaceError(
                    "--format package exports one run", hint="give one run id, without --bench"
                )
            with Workspace.open(settings_for(workspace).workspace) as ws:
                path = export_run(ws, ws.resolve_run((runs or [""])[0]), output or Path("."), name, build)
        except KernelevolveError as exc:
            fail(exc)
            return
        out.print(escape(str(path)))
        return
    try:
        if fmt not in FORMATS:
            raise WorkspaceError(f"unknown format {fmt!r}", hint="formats: " + ", ".join(FORMATS))
        with Workspace.open(settings_for(workspace, existing=True).workspace) as ws:
            ids = [ws.resolve_run(r) for r in runs or []]
            if bench_id is not None:
                ids += [i["run_id"] for i in ws.bench_items(ws.resolve_bench(bench_id)) if i["run_id"]]
            if not ids:
                raise WorkspaceError(
                    "no runs to export", hint="give run ids (kernelevolve runs) or --bench BENCH"
                )
            sink = output.open("w") if output else sys.stdout
            count = 0
            try:
                for record in FORMATS[fmt](ws, dict.fromkeys(ids)):
                    sink.write(json.dumps(record, default=str) + "\n")
                    count += 1
            finally:
                if output:
                    sink.close()
    except KernelevolveError as exc:
        fail(exc)
        return
    err.print(f"[dim]{count} {fmt} record(s) from {len(set(ids))} run(s)[/]")
