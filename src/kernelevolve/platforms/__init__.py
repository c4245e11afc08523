"""Platforms: where candidates run, which kernels they may carry, how they are timed, how fast the
hardware can possibly go.

A platform is registered under the `kernelevolve.platforms` entry-point group; the built-ins (`cuda`,
`cpu`, `rocm`) register through the package's own pyproject exactly as a third party would. A platform
knows, in the engine's process, cheaply: its kernel kinds, whether it is present, the environment its
workers need. In a worker (with the device initialized) it sets the precision flags, builds the timer,
names the device, and measures the hardware profile.

`select(name)` turns a user's `--platform` into a platform object, with "auto" meaning the GPU if one
is present, else the CPU; unknown names get an error that lists the valid ones.
"""

from __future__ import annotations

import threading
from importlib.metadata import entry_points
from typing import Any

from kernelevolve.errors import PlatformError
from kernelevolve.platforms.base import HardwareProfile, Platform

__all__ = ["HardwareProfile", "Platform", "all_platforms", "get_platform", "register", "select"]

_REGISTRY: dict[str, type[Platform]] = {}
_LOADED = False
_LOCK = threading.Lock()  # an MCP server starts runs side by side: one loads, the others wait


def register(cls: type[Platform]) -> type[Platform]:
    """Register a platform class (used by tests and by code that cannot ship entry points)."""
    if not getattr(cls, "name", ""):
        raise PlatformError(f"platform class {cls.__name__} has no `name`")
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> None:
    """Fill the registry once: the entry points, else (a source tree never installed) the built-ins.
    Marked loaded only when filled, so a thread that comes while another loads waits for it."""
    global _LOADED
    with _LOCK:
        if _LOADED:
            return
        for ep in entry_points(group="kernelevolve.platforms"):
            try:
                cls = ep.load()
            except Exception as exc:  # a broken third-party plugin must not take the built-ins down
                raise PlatformError(
                    f"platform plugin {ep.name!r} ({ep.value}) failed to load: {exc}"
                ) from exc
            _REGISTRY.setdefault(ep.name, cls)
        if not _REGISTRY:  # running from a source tree that was never installed
            from kernelevolve.platforms.cpu import CpuPlatform
            from kernelevolve.platforms.cuda import CudaPlatform
            from kernelevolve.platforms.rocm import RocmPlatform

            for builtin in (CudaPlatform, CpuPlatform, RocmPlatform):
                _REGISTRY.setdefault(builtin.name, builtin)
        _LOADED = True


def all_platforms() -> dict[str, type[Platform]]:
    _load()
    return dict(_REGISTRY)


def get_platform(name: str) -> Platform:
    _load()
    cls = _REGISTRY.get(name)
    if cls is None:
        raise PlatformError(
            f"unknown platform {name!r}", hint="valid platforms: auto, " + ", ".join(sorted(_REGISTRY))
        )
    return cls()


def select(name: str = "auto") -> Platform:
    """The platform to run on. 'auto': a present GPU platform, else the CPU."""
    if name != "auto":
        platform = get_platform(name)
        present, why = platform.present()
        if not present:
            raise PlatformError(f"platform {name!r} is not usable here: {why}", hint="try --platform auto")
        return platform
    for candidate in ("cuda", "rocm"):
        p = get_platform(candidate)
        if p.present()[0]:
            return p
    return get_platform("cpu")


def describe(platform: Platform) -> dict[str, Any]:
    present, why = platform.present()
    return {
        "name": platform.name,
        "present": present,
        "why": why,
        "description": platform.description,
        "kinds": sorted(platform.kinds),
        "timed_kinds": sorted(platform.timed_kinds),
        "dsls": platform.dsls,
    }
