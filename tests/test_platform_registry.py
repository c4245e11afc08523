"""The platform registry under threads: an MCP server starts several runs at once, and each asks
for its platform while the registry may still be loading (issue I's proof: one of three runs started
side by side was refused with "unknown platform 'cuda'")."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import kernelevolve.platforms as platforms
from kernelevolve.platforms.cpu import CpuPlatform


def test_runs_started_side_by_side_all_find_their_platform(monkeypatch):
    def slow_load():  # an entry point whose import takes a while, as torch's first import does
        time.sleep(0.3)
        return CpuPlatform

    slow = SimpleNamespace(name="cpu", value="kernelevolve.platforms.cpu:CpuPlatform", load=slow_load)
    monkeypatch.setattr(platforms, "entry_points", lambda group: [slow])
    monkeypatch.setattr(platforms, "_REGISTRY", {})
    monkeypatch.setattr(platforms, "_LOADED", False)

    found: list[object] = []
    errors: list[BaseException] = []

    def start_run() -> None:
        try:
            found.append(platforms.get_platform("cpu"))
        except BaseException as exc:  # the test reports what each thread met
            errors.append(exc)

    threads = [threading.Thread(target=start_run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(found) == 4 and all(isinstance(p, CpuPlatform) for p in found)
