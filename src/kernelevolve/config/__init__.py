"""Typed, layered settings: defaults < workspace `config.toml` < `KERNELEVOLVE_*` environment < flags.

The workspace's location is resolved first (flag, then `KERNELEVOLVE_WORKSPACE`, then
`./.kernelevolve`), because its `config.toml` is one of the layers. Every other field can be set in
any layer by its name: `timing_budget_s = 2.0` in the TOML, `KERNELEVOLVE_TIMING_BUDGET_S=2.0` in the
environment, or the matching CLI flag. `kernelevolve config` shows each value in force and its layer.

Two halves. This module is the value: the `Settings` dataclass, which the rest of the code copies with
`dataclasses.replace`, sends to worker processes and reads; it imports nothing beyond the standard
library, so a worker never pays for a validation library. `config.layers` is the loading: it reads
the layers with pydantic-settings and refuses what it cannot read exactly (a boolean that is not
true/false/1/0/yes/no/on/off, a number that does not parse, a key or a `KERNELEVOLVE_*` variable
that names no setting, with the nearest valid name). Only `load_settings` imports it.

Some `KERNELEVOLVE_*` variables are not settings: `OTHER_VARIABLES` declares them (and what reads
each), so that they are not refused as misspellings; a test fails when the code reads one that is
neither a setting nor declared there.

Secrets never live here: LLM keys (issue B) are read from the environment by the providers alone, and
workers never see them (see `kernelevolve.evaluate.sandbox`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelevolve.config.values import (
    DEFAULT_WORKSPACE,
    ENV_PREFIX,
    FITNESS_BASELINES,
    OTHER_VARIABLES,
    PROFILE_MODES,
    WORKER_STARTS,
    WORKSPACE_VARIABLE,
    Settings,
    Source,
    parse_devices,
    resolve_workspace,
    setting_names,
)


def load_settings(workspace: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Build settings from all layers. `overrides` are CLI flags; None values mean 'not given'.
    Raises WorkspaceError, naming the file, variable or flag, for anything that cannot be read."""
    return explain_settings(workspace, overrides)[0]


def explain_settings(
    workspace: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> tuple[Settings, dict[str, Source]]:
    """`load_settings`, and each field's `Source` (`workspace` included)."""
    from kernelevolve.config.layers import load  # pydantic: only here, never in a worker

    return load(resolve_workspace(workspace), bool(workspace), overrides or {})


__all__ = [
    "DEFAULT_WORKSPACE",
    "ENV_PREFIX",
    "FITNESS_BASELINES",
    "OTHER_VARIABLES",
    "PROFILE_MODES",
    "WORKER_STARTS",
    "WORKSPACE_VARIABLE",
    "Settings",
    "Source",
    "explain_settings",
    "load_settings",
    "parse_devices",
    "resolve_workspace",
    "setting_names",
]
