"""What every command module of the CLI shares: the app the commands register on, the consoles,
the common options, and how a failure is said and settings are loaded.

`cli.py` (eval, baseline, spec, ...) and `cli_search.py`, `cli_agent.py`, `cli_kb.py`, `cli_bench.py`
import this module and add their commands to `app`; `cli.py` imports the others once, so that
`kernelevolve.cli:main` knows every command. Besides this module, a command module imports only
`cli_search.emit_summary` (`cli_agent` prints a run's summary as `optimize` does).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from kernelevolve.errors import HarnessError, KernelevolveError

app = typer.Typer(
    name="kernelevolve",
    help="Search for faster GPU kernels, verified against the PyTorch reference by a harness that cannot be fooled.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Messages are never hard-wrapped (paths must stay greppable) and never read as markup (candidates'
# error messages may contain brackets): dynamic text goes through `escape`.
err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)

WorkspaceOpt = Annotated[
    Path | None,
    typer.Option(
        "--workspace", "-w", help="Workspace directory [env KERNELEVOLVE_WORKSPACE; default ./.kernelevolve]."
    ),
]
PlatformOpt = Annotated[
    str | None,
    typer.Option(
        "--platform", "-p", help="auto | cuda | cpu | rocm (auto: the GPU if present, else the CPU)."
    ),
]
DeviceOpt = Annotated[int | None, typer.Option("--device", help="Device index on a multi-GPU machine.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def settings_for(workspace: Path | None, **flags: Any) -> Any:
    from kernelevolve.config import load_settings

    return load_settings(workspace, flags)


def fail(exc: KernelevolveError) -> None:
    err.print(f"[bold red]error:[/] {escape(exc.message)}")
    if exc.hint:
        err.print(f"[dim]hint: {escape(exc.hint)}[/]")
    raise typer.Exit(3 if isinstance(exc, HarnessError) else 2)


def fmt_x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


BudgetOpt = Annotated[int | None, typer.Option("--budget", "-n", help="Candidates to evaluate (default 50).")]
PolicyOpt = Annotated[
    str, typer.Option(help="Selection policy: uct | greedy | evolutionary (see docs/search.md).")
]


def limits_from(budget: int | None, wall: float | None, max_tokens: int | None, max_usd: float | None,
            patience: int | None, target: float | None) -> Any:  # fmt: skip
    from kernelevolve.search.limits import Limits

    return Limits(
        budget=budget or 50,
        wall_s=wall,
        max_tokens=max_tokens,
        max_usd=max_usd,
        patience=patience,
        target=target,
    ).validate()


__all__ = [
    "DeviceOpt",
    "JsonOpt",
    "PlatformOpt",
    "WorkspaceOpt",
    "app",
    "err",
    "fail",
    "fmt_x",
    "out",
    "settings_for",
]
