"""The command line: the only place that prints or exits.

Progress goes to stderr (`--quiet` silences it); `--json` puts one JSON document on stdout for
scripts, an error included. Exit codes are one table for every command (`cli_common.EXIT_CODES`,
shown by `kernelevolve --help`): 0 success, 1 no correct kernel or a candidate not `ok`, 2 usage
error, 3 the harness failed, 4 a correct kernel not faster than the baseline, 5 the spec cannot be
used, 130 interrupted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from kernelevolve import __version__
from kernelevolve.cli_common import (
    DeviceOpt,
    JsonOpt,
    PlatformOpt,
    WorkspaceOpt,
    app,
    err,
    fail,
    fmt_x,
    out,
    set_verbosity,
    settings_for,
)
from kernelevolve.errors import KernelevolveError


def _progress() -> Any:
    state = {"done": 0, "total": 0}

    def on_event(event: str, label: str, detail: Any) -> None:
        name = escape(Path(label).name)
        if event == "plan":
            state["total"] = detail
        elif event == "profile":
            err.print(
                f"[dim]hardware profile of {escape(label)}: cached in the workspace, or measured now (once)[/]"
            )
        elif event == "skip":
            err.print(f"[yellow]skipped {name}: {escape(str(detail))}[/]")
        elif event == "note":
            err.print(f"[yellow]{escape(str(detail))}[/]")
        elif event == "start":
            err.print(f"[dim]{name}: static guards, then a prepared worker[/]")
        elif event == "phase":
            err.print(f"[dim]{name}: {escape(str(detail))}[/]")
        elif event == "retry":
            err.print(f"[yellow]{name}: {escape(str(detail))}[/]")
        elif event == "done":
            state["done"] += 1
            colour = "green" if detail.ok else "red"
            counter = escape(f"[{state['done']}/{state['total']}]")
            err.print(f"[{colour}]{counter} {name}: {detail.status}[/] {escape(detail.message[:300])}")

    return on_event


@app.command("eval")
def eval_cmd(
    spec: Annotated[Path, typer.Argument(help="The spec: a KernelBench-format .py file.")],
    candidates: Annotated[
        list[Path], typer.Argument(help="Candidate .py files defining ModelNew, or folders of them.")
    ],
    platform: PlatformOpt = None,
    device: DeviceOpt = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="Baseline fitness is measured against: best (the faster per shape) | eager | compile."
        ),
    ] = None,
    no_compile: Annotated[
        bool, typer.Option("--no-compile", help="Skip the torch.compile baseline (eager only).")
    ] = False,
    workers: Annotated[int | None, typer.Option(help="Candidates evaluated at once (0: auto).")] = None,
    timing_budget: Annotated[float | None, typer.Option(help="Seconds of timing per shape.")] = None,
    compile_timeout: Annotated[
        float | None, typer.Option(help="Seconds allowed to import and compile.")
    ] = None,
    run_timeout: Annotated[float | None, typer.Option(help="Seconds allowed to check and time.")] = None,
    memory_limit_gb: Annotated[
        float | None, typer.Option(help="Memory limit of a candidate's worker.")
    ] = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate candidates against a spec: guards, correctness, timing against live baselines.

    \b
    Examples:
      kernelevolve eval examples/softmax/spec.py examples/softmax/triton_rowsoftmax.py
      kernelevolve eval examples/softmax/spec.py examples/softmax/ --platform cpu --json
    --json prints one object, {"spec": {...}, "verdicts": [{...}, ...]}, whatever the number of
    candidates: one verdict per candidate, in the order given (a folder's files sorted by name).
    """
    from kernelevolve import jobs

    try:
        settings = settings_for(
            workspace,
            platform=platform,
            device=device,
            fitness_baseline=baseline,
            baselines=["eager"] if no_compile else None,
            workers=workers,
            timing_budget_s=timing_budget,
            compile_timeout_s=compile_timeout,
            run_timeout_s=run_timeout,
            memory_limit_gb=memory_limit_gb,
        )
        loaded, verdicts = jobs.evaluate(spec, candidates, settings, on_event=_progress())
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        doc = {"spec": loaded.summary(), "verdicts": [v.to_dict() for v in verdicts]}
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        _print_verdicts(verdicts)
    raise typer.Exit(0 if all(v.ok for v in verdicts) else 1)


def _print_verdicts(verdicts: list[Any]) -> None:
    table = Table(title="verdicts", show_lines=False)
    for col in ("candidate", "status", "correct", "vs eager", "vs compile", "roofline", "spread"):
        table.add_column(col)
    for v in verdicts:
        table.add_row(
            Path(v.candidate).name,
            str(v.status),
            "yes" if v.correct else "no",
            fmt_x(v.speedup_vs_eager),
            fmt_x(v.speedup_vs_compile),
            "-" if v.roofline_fraction is None else f"{v.roofline_fraction:.0%}",
            "-" if v.spread is None else f"{v.spread:.1%}",
        )
    out.print(table)
    for v in verdicts:
        out.print(f"[bold]{escape(Path(v.candidate).name)}[/]: {escape(v.message)}")
        for violation in v.violations[:5]:
            out.print(f"  - {escape(str(violation))}")
        if v.timed and v.shapes:
            shapes = Table(show_header=True, box=None, padding=(0, 2))
            for col in (
                "shape",
                "weight",
                "candidate",
                "eager",
                "compile",
                "vs eager",
                "vs compile",
                "graphs",
                "roofline",
                "bound",
            ):
                shapes.add_column(col)
            for s in v.shapes:
                shapes.add_row(
                    s.name,
                    f"{s.weight:.2f}",
                    _us(s.candidate),
                    _us(s.eager),
                    _us(s.compile),
                    fmt_x(s.speedup_vs_eager),
                    fmt_x(s.speedup_vs_compile),
                    "yes" if s.cuda_graphs else "no",
                    "-" if s.roofline_fraction is None else f"{s.roofline_fraction:.0%}",
                    s.bound or "-",
                )
            out.print(shapes)
        if v.log_tail and not v.ok:
            out.print("[dim]worker log (end):[/]")
            out.print(v.log_tail[-800:], markup=False, highlight=False)
        m = v.method
        if m.device:
            parts = [
                m.timer,
                m.l2,
                f"{m.platform} {m.device}",
                f"torch {m.torch}, triton {m.triton}, driver {m.driver}",
                f"precision {m.precision_policy}",
                f"baselines {', '.join(m.baselines)}",
            ]
            line = "method: " + "; ".join(p for p in parts if p)
            out.print(f"[dim]{escape(line)}[/]")


def _us(stats: Any) -> str:
    return "-" if stats is None else f"{stats.median_s * 1e6:.1f} us"


@app.command()
def baseline(
    spec: Annotated[Path, typer.Argument(help="The spec: a KernelBench-format .py file.")],
    platform: PlatformOpt = None,
    device: DeviceOpt = None,
    timing_budget: Annotated[float | None, typer.Option(help="Seconds of timing per shape.")] = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Time the eager and torch.compile baselines per shape, interleaved; cache them in the workspace.

    \b
    Example:
      kernelevolve baseline examples/softmax/spec.py --json
    """
    from kernelevolve import jobs

    try:
        settings = settings_for(workspace, platform=platform, device=device, timing_budget_s=timing_budget)
        loaded, rows, key, errors = jobs.baselines(spec, settings)
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        sys.stdout.write(
            json.dumps(
                {"spec": loaded.summary(), "device_key": key, "shapes": rows, "errors": errors},
                indent=2,
                default=str,
            )
            + "\n"
        )
        return
    table = Table(title=f"baselines: {loaded.name} on {key}")
    for col in ("shape", "weight", "eager", "compile", "compile vs eager", "graphs"):
        table.add_column(col)
    for r in rows:
        eager, comp = r.get("eager"), r.get("compile")
        ratio = eager["median_s"] / comp["median_s"] if eager and comp else None
        table.add_row(
            r["shape"],
            f"{r['weight']:.2f}",
            f"{eager['median_s'] * 1e6:.1f} us" if eager else "-",
            f"{comp['median_s'] * 1e6:.1f} us" if comp else "-",
            fmt_x(ratio),
            "yes" if r["cuda_graphs"] else "no",
        )
    out.print(table)
    for name, why in errors.items():
        out.print(f"[yellow]{escape(name)} baseline missing: {escape(why)}[/]")


@app.command()
def platforms(
    measure: Annotated[
        bool, typer.Option(help="Measure (or read cached) peaks of the present platforms.")
    ] = True,
    remeasure: Annotated[bool, typer.Option(help="Measure again even if a profile is cached.")] = False,
    device: DeviceOpt = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What this machine offers: registered platforms, which are present, their measured peaks.

    \b
    Example:
      kernelevolve platforms --json
    """
    from kernelevolve import jobs
    from kernelevolve.platforms import all_platforms, describe, get_platform
    from kernelevolve.store import Workspace

    rows = []
    try:
        settings = settings_for(workspace, device=device)
        for name in sorted(all_platforms()):
            p = get_platform(name)
            row = describe(p)
            if row["present"] and measure:
                err.print(
                    f"[dim]{name}: reading the cached hardware profile, or measuring it (a few seconds)[/]"
                )
                with Workspace.open(settings.workspace) as ws:
                    row["profile"], _ = jobs.hardware_profile(p, settings, ws, remeasure=remeasure)
            rows.append(row)
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        sys.stdout.write(json.dumps({"platforms": rows}, indent=2, default=str) + "\n")
        return
    table = Table(title="platforms")
    for col in ("platform", "present", "kernels", "device", "bandwidth", "fp32", "tf32", "bf16"):
        table.add_column(col)
    for r in rows:
        prof = r.get("profile") or {}
        flops = prof.get("flops", {})
        sheet = prof.get("datasheet_flops") or {}

        def tf(cls: str, flops: dict[str, float] = flops, sheet: dict[str, float] = sheet) -> str:
            if cls not in flops:
                return "-"
            extra = f" ({sheet[cls] / 1e12:.0f})" if cls in sheet else ""
            return f"{flops[cls] / 1e12:.1f}{extra}"

        bw = prof.get("bandwidth")
        sheet_bw = prof.get("datasheet_bandwidth")
        table.add_row(
            r["name"],
            "yes" if r["present"] else f"no ({r['why']})",
            ", ".join(r["kinds"]),
            prof.get("device", "-"),
            "-" if bw is None else f"{bw / 1e9:.0f} GB/s" + (f" ({sheet_bw / 1e9:.0f})" if sheet_bw else ""),
            tf("fp32"),
            tf("tf32"),
            tf("bf16"),
        )
    out.print(table)
    out.print(
        "[dim]measured peaks (datasheet in parentheses); FLOP/s in TFLOP/s; bandwidth counts bytes read + written[/]"
    )


@app.command("spec")
def spec_cmd(
    spec: Annotated[Path | None, typer.Argument(help="The spec: a KernelBench-format .py file.")] = None,
    from_tritonbench: Annotated[str | None, typer.Option("--from-tritonbench", metavar="OPERATOR",
        help="Write a spec from a tritonbench operator (softmax, layer_norm, ...): its baseline benchmark "
        "is the reference, the examples of its input iterator the shapes. Needs tritonbench.")] = None,
    out_file: Annotated[Path | None, typer.Option("--out",
        help="Where --from-tritonbench writes (default: tritonbench_OPERATOR.py).")] = None,
    inputs: Annotated[int, typer.Option(min=1, help="--from-tritonbench: examples drawn, a shape each.")] = 4,
    baseline: Annotated[str | None, typer.Option(help="--from-tritonbench: the benchmark the reference "
        "calls (default: the one registered with baseline=True).")] = None,
    tb_args: Annotated[str | None, typer.Option("--tb-args",
        help='--from-tritonbench: more tritonbench arguments, e.g. "--precision bf16".')] = None,
    force: Annotated[bool, typer.Option(help="--from-tritonbench: overwrite an existing --out.")] = False,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Load and validate a spec; show its shapes, tensors, policy and fingerprint. With
    --from-tritonbench, write the spec from a tritonbench operator first (docs/specs.md).

    \b
    Examples:
      kernelevolve spec examples/softmax/spec.py --json
      kernelevolve spec --from-tritonbench softmax --out softmax.py --inputs 4
    """
    from kernelevolve.spec import load_spec

    try:
        if from_tritonbench is not None:
            from kernelevolve.tritonbench import parse_tb_args, write_spec

            if spec is not None:
                raise KernelevolveError(
                    f"both {spec} and --from-tritonbench given", hint="name the file with --out"
                )
            target = out_file or Path(f"tritonbench_{from_tritonbench}.py")
            spec = write_spec(
                from_tritonbench, target, inputs, baseline, parse_tb_args(tb_args), overwrite=force
            )
            err.print(f"[dim]wrote {escape(str(spec))} from tritonbench's {escape(from_tritonbench)}[/]")
        elif spec is None:
            raise KernelevolveError("no spec given", hint="pass a spec file, or --from-tritonbench OPERATOR")
        loaded = load_spec(spec)
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    summary = loaded.summary()
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
        return
    out.print(f"[bold]{escape(loaded.name)}[/] ({escape(str(loaded.path))}) fingerprint {loaded.fingerprint}")
    out.print(
        f"precision {loaded.precision}; dtype {loaded.dtype or 'as written'}; backward {loaded.backward}"
    )
    for s in summary["shapes"]:
        out.print(
            f"  {s['name']} (weight {s['weight']:.2f}) {s['params']}: {', '.join(s['inputs'])} -> {', '.join(s['outputs']) or '?'}"
        )
        if s.get("probe"):
            out.print(f"    [dim]{escape(s['probe'])}[/]")


def version_callback(value: bool) -> None:
    if value:
        out.print(f"kernelevolve {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Show the version.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print results and errors only: no progress on stderr.")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Debug logging of the library on stderr, beside progress.")
    ] = False,
) -> None:
    """kernelevolve: search for faster GPU kernels, verified against the PyTorch reference.

    Global options go before the command: kernelevolve --quiet optimize SPEC --json
    """
    set_verbosity(quiet, verbose)


def main() -> None:
    app()


# The search commands (optimize, resume, runs, show, tune), the agent commands (agent, mcp), the
# knowledge commands (kb, skills, profile) and the bench commands (bench, benches, export) live in
# their own modules, which import only `cli_common`; importing them here, after this module's own
# commands, adds theirs to `app` and lists them after eval, baseline and spec in --help.
from kernelevolve import cli_agent, cli_bench, cli_config, cli_kb, cli_search, cli_serve  # noqa: E402, F401

if __name__ == "__main__":
    main()
