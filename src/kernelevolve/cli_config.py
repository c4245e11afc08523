"""`kernelevolve config`: the settings in force, and where each value came from.

Settings are layered (defaults < the workspace's config.toml < `KERNELEVOLVE_*` variables < flags,
`kernelevolve.config`); this command answers "why is it this value?" by naming each value's layer:
`default`, the config.toml's path, the environment variable, or `flag`. It loads settings as every
other command does, so a misspelled variable or key, or an unreadable value, fails here the same way,
with the same message. It also lists the other `KERNELEVOLVE_*` variables that are set
(`config.OTHER_VARIABLES`: the workspace, the sealing key, ...), which are not settings.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.markup import escape
from rich.table import Table

from kernelevolve.cli_common import DeviceOpt, JsonOpt, PlatformOpt, WorkspaceOpt, app, fail, out
from kernelevolve.errors import KernelevolveError


@app.command("config")
def config_cmd(
    workspace: WorkspaceOpt = None,
    platform: PlatformOpt = None,
    device: DeviceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show every setting's value in force and its source: default, config.toml, environment or flag.

    \b
    Examples:
      kernelevolve config
      KERNELEVOLVE_TIMING_BUDGET_S=2 kernelevolve config --json
    """
    from kernelevolve.config import OTHER_VARIABLES, explain_settings

    try:
        settings, sources = explain_settings(workspace, {"platform": platform, "device": device})
    except KernelevolveError as exc:
        fail(exc)
        return
    values = settings.to_dict()
    others = {name: os.environ[name] for name in OTHER_VARIABLES if name in os.environ}
    if as_json:
        doc: dict[str, Any] = {
            "settings": {
                name: {"value": value, "source": sources[name].layer, "where": sources[name].where}
                for name, value in values.items()
            },
            "environment": others,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    table = Table(title="settings")
    for col in ("setting", "value", "source"):
        table.add_column(col)
    for name, value in values.items():
        shown = "unset" if value is None else ", ".join(value) if isinstance(value, list) else str(value)
        source = sources[name]
        table.add_row(
            name, escape(shown), escape(str(source)) if source.layer != "default" else "[dim]default[/]"
        )
    out.print(table)
    for name, value in others.items():
        out.print(f"[dim]{name}={escape(value)}: {escape(OTHER_VARIABLES[name])}[/]")
