"""What a run's engine is given besides the run's stored record, shared by the modules it drives.

`EngineContext` is built once per run (`optimize.build_engine`): the workspace, the spec, the platform,
the layered settings, the device's hardware profile, the spec's trusted torch.compile cache (made by
workers that saw no candidate), where the run's files are written, and the shapes to evaluate. The engine (`engine.py`), its task
builder (`tasks.py`), its finish step (`finish.py`) and its profiler (`profiling.py`) read it; none
of them changes it.

`Event` is the engine's progress callback: an event name and its data (the CLI prints them, a bench
counts them).

Deliberately not here: anything that runs, opens or decides. This module holds the types only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelevolve.config import Settings
from kernelevolve.platforms import Platform
from kernelevolve.spec import Spec
from kernelevolve.store import Workspace

Event = Callable[[str, dict[str, Any]], None]


@dataclass
class EngineContext:
    """What an engine needs besides the run's stored record."""

    ws: Workspace
    spec: Spec
    platform: Platform
    settings: Settings
    profile: dict[str, Any]
    trusted_cache: Path | None
    out_dir: Path
    shapes: list[str] | None = None  # evaluate only these spec shapes (tuning one shape)
    # Stores a hardware profile that a pool measured again (its kernel was above the roofline).
    store_profile: Callable[[dict[str, Any]], None] | None = None


__all__ = ["EngineContext", "Event"]
