"""`kernelevolve serve`: the live view of a workspace in a browser (the `serve` package serves it).

A module of its own so that the command adds one import line to `cli.py`.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer
from rich.markup import escape

from kernelevolve.cli_common import WorkspaceOpt, app, err, fail, settings_for
from kernelevolve.errors import KernelevolveError


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.command()
def serve(
    workspace: WorkspaceOpt = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on; the default keeps the view on this machine.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8765,
) -> None:
    """Watch runs and benches live in a browser: the search tree, each kernel's source and diff,
    the best-so-far charts and the bench rows, refreshed every 2 s while a search writes the
    workspace. Read-only; stop it with Ctrl-C.

    \b
    Examples:
      kernelevolve serve
      kernelevolve serve -w runs/ws --port 9000
      ssh -L 8765:127.0.0.1:8765 gpu-box   # then `kernelevolve serve` there, open it here
    """
    from kernelevolve.serve import make_server

    try:
        server = make_server(settings_for(workspace, existing=True).workspace, host, port)
    except KernelevolveError as exc:
        fail(exc)
        return
    if not _loopback(host):
        err.print(
            f"[yellow]listening on {escape(host)}: anyone who can reach it can read this workspace's kernels "
            "(there is no login); prefer the default 127.0.0.1 and an SSH tunnel[/]"
        )
    err.print(
        f"live view of {escape(str(server.view.root))}: [bold]{escape(server.url)}[/]  (Ctrl-C stops it)"
    )
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        err.print("[dim]stopped[/]")
    finally:
        server.server_close()
        server.view.close()
