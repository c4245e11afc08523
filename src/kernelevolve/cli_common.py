"""What every command module of the CLI shares: the app the commands register on, the consoles,
the common options, and how a failure is said and settings are loaded.

`cli.py` (eval, baseline, spec, ...) and `cli_search.py`, `cli_agent.py`, `cli_kb.py`, `cli_bench.py`
import this module and add their commands to `app`; `cli.py` imports the others once, so that
`kernelevolve.cli:main` knows every command. Besides this module, a command module imports only
`cli_search.emit_summary` (`cli_agent` prints a run's summary as `optimize` does).

What a script can rely on lives here too, so that every command says it the same way:

- exit codes (`EXIT_CODES`, printed as the epilog of `kernelevolve --help`);
- errors: `fail` prints the message and its hint on stderr, and with `--json` also one JSON object
  on stdout, `{"error", "hint", "kind", "exit_code"}`, so that stdout is always one document;
- `--quiet` silences progress (`err`), never results or errors (`error_out`); `--verbose` turns
  on the library's debug logging (`set_verbosity`);
- `--devices` has one vocabulary, `parse_devices_option`: indices or `auto` (`all` is an alias);
- read-only commands refuse a workspace that does not exist (`settings_for(..., existing=True)`)
  instead of creating an empty one at a mistyped path.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from kernelevolve.errors import HarnessError, KernelevolveError, SpecError

# Exit codes: what a script can branch on. The same number means the same thing in every command.
EXIT_OK = 0  # done; optimize/resume/agent finish: a correct kernel faster than the baseline
EXIT_NOT_OK = 1  # no correct kernel (optimize, ...), or a candidate was not ok (eval, submit, ...)
EXIT_USAGE = 2  # bad flags or arguments, a missing file or workspace, an unknown run, bad settings
EXIT_HARNESS = 3  # the harness itself failed (a worker could not start, an unhealthy device)
EXIT_NOT_FASTER = 4  # a correct kernel, but not faster than the baseline beyond the measured noise
EXIT_SPEC = 5  # the spec cannot be used (it does not load, or get_inputs/Model fail)
EXIT_INTERRUPTED = 130  # Ctrl-C: the run or bench is stored; `kernelevolve resume RUN` continues
EXIT_CODES = {
    EXIT_OK: "success (optimize, resume, agent finish: a correct kernel faster than the baseline; "
    "eval: every candidate ok)",
    EXIT_NOT_OK: "no correct kernel was found, or a candidate was not ok",
    EXIT_USAGE: "usage error: bad flags or arguments, a missing file or workspace, unknown run, bad settings",
    EXIT_HARNESS: "the harness failed (not the candidate): a worker could not start, an unhealthy device",
    EXIT_NOT_FASTER: "a correct kernel, but not faster than the baseline (outcome: not_faster)",
    EXIT_SPEC: "the spec cannot be used: it does not load, or get_inputs / Model raise",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C): the run is stored; `kernelevolve resume RUN` continues it",
}
EXIT_EPILOG = "Exit codes:\n\n" + "\n\n".join(f"{code}: {what}" for code, what in EXIT_CODES.items())


# Click's UsageError (a bad flag, a missing argument). Typer 0.2x vendors its own copy of click, older
# releases use click itself: in both, BadParameter derives from it.
_UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class _Group(TyperGroup):
    """The app's command group: a usage error (a bad flag, a missing argument) of a command given
    `--json` is also written as the JSON error object on stdout, as every other error is."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        ctx = super().make_context(info_name, args, parent=parent, **extra)
        ctx.meta["kernelevolve.json"] = "--json" in args
        return ctx

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _UsageError as exc:
            if ctx.meta.get("kernelevolve.json"):
                where = getattr(exc, "ctx", None)
                hint = f"`{where.command_path} --help` lists the options" if where else None
                _json_error(exc.format_message(), hint, "UsageError", EXIT_USAGE)  # type: ignore[attr-defined]
            raise


app = typer.Typer(
    name="kernelevolve",
    cls=_Group,
    help="Search for faster GPU kernels, verified against the PyTorch reference by a harness that cannot be "
    "fooled. Global options (--quiet, --verbose) go before the command: kernelevolve -q optimize SPEC --json",
    epilog=EXIT_EPILOG,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
# Messages are never hard-wrapped (paths must stay greppable) and never read as markup (candidates'
# error messages may contain brackets): dynamic text goes through `escape`. `err` carries progress
# and notes (silenced by --quiet); `error_out` carries errors, which --quiet never silences.
err = Console(stderr=True, soft_wrap=True)
error_out = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
_log_handler = logging.StreamHandler(sys.stderr)
_log_handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))


def set_verbosity(quiet: bool, verbose: bool) -> None:
    """--quiet: results and errors only; --verbose: the library's debug logging on stderr too. Set
    on every invocation (the app's callback), so nothing carries over between commands in-process."""
    if quiet and verbose:
        raise typer.BadParameter("--quiet and --verbose contradict each other; give one")
    err.quiet = quiet
    logger = logging.getLogger("kernelevolve")
    _log_handler.stream = sys.stderr  # the stream of this invocation (a test's runner swaps it)
    if verbose:
        if _log_handler not in logger.handlers:
            logger.addHandler(_log_handler)
        logger.setLevel(logging.DEBUG)
    else:
        if _log_handler in logger.handlers:
            logger.removeHandler(_log_handler)
        logger.setLevel(logging.ERROR if quiet else logging.NOTSET)


WorkspaceOpt = Annotated[
    Path | None,
    typer.Option(
        "--workspace",
        "-w",
        help="Workspace directory (default ./.kernelevolve, or the environment's KERNELEVOLVE_WORKSPACE).",
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


def settings_for(workspace: Path | None, *, existing: bool = False, **flags: Any) -> Any:
    """The layered settings with `flags` on top. `existing`: the command only reads the workspace
    (runs, show, export, ...), so a workspace that is not there is an error, never created."""
    from kernelevolve.config import load_settings
    from kernelevolve.errors import WorkspaceError
    from kernelevolve.store.workspace import DB_NAME

    settings = load_settings(workspace, flags)
    if existing and not (settings.workspace / DB_NAME).is_file():
        where = settings.workspace
        what = "is a directory without a kernelevolve database" if where.is_dir() else "does not exist"
        raise WorkspaceError(
            f"no workspace at {where}: it {what}",
            hint="pass --workspace (or set KERNELEVOLVE_WORKSPACE to) the folder a command such as "
            "`kernelevolve optimize` wrote; the default is ./.kernelevolve in the current directory",
        )
    return settings


def exit_code_of(exc: KernelevolveError) -> int:
    if isinstance(exc, HarnessError):
        return EXIT_HARNESS
    return EXIT_SPEC if isinstance(exc, SpecError) else EXIT_USAGE


def _json_error(message: str, hint: str | None, kind: str, code: int) -> None:
    doc = {"error": message, "hint": hint, "kind": kind, "exit_code": code}
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def fail(exc: KernelevolveError, as_json: bool = False) -> None:
    """Say the error (and its hint) on stderr and exit with its code; with --json, the error is also
    the one JSON document on stdout."""
    code = exit_code_of(exc)
    error_out.print(f"[bold red]error:[/] {escape(exc.message)}")
    if exc.hint:
        error_out.print(f"[dim]hint: {escape(exc.hint)}[/]")
    if as_json:
        _json_error(exc.message, exc.hint, type(exc).__name__, code)
    raise typer.Exit(code)


def interrupted(message: str, as_json: bool = False) -> typer.Exit:
    """Ctrl-C: the work is stored; say how to continue it. Returns the Exit to raise."""
    error_out.print(f"[yellow]interrupted: {escape(message)}[/]")
    if as_json:
        _json_error(f"interrupted: {message}", None, "KeyboardInterrupt", EXIT_INTERRUPTED)
    return typer.Exit(EXIT_INTERRUPTED)


def parse_devices_option(text: str | None) -> str | None:
    """`--devices` of every command: device indices ("0,1,2,3") or "auto" (every visible device of the
    platform); "all" is accepted as an alias of "auto" (what `bench` took before). Returns None (not
    given), "auto", or the indices written canonically ("0,1")."""
    from kernelevolve.config import parse_devices

    if text is None:
        return None
    word = text.strip().lower()
    if word in ("auto", "all"):
        return "auto"
    return ",".join(str(d) for d in parse_devices(word))


DEVICES_HELP = "Devices: indices like 0,1,2,3, or auto (every visible device; `all` is an alias)."


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
    "DEVICES_HELP",
    "EXIT_CODES",
    "DeviceOpt",
    "JsonOpt",
    "PlatformOpt",
    "WorkspaceOpt",
    "app",
    "err",
    "error_out",
    "exit_code_of",
    "fail",
    "fmt_x",
    "interrupted",
    "out",
    "parse_devices_option",
    "set_verbosity",
    "settings_for",
]
