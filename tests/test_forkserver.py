"""Workers forked from the engine's fork server: they are the same confined workers, they hold
nothing of the server's, their exits read as a spawned worker's do, and where the server cannot serve
the workers are spawned."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from kernelevolve.errors import WorkspaceError
from kernelevolve.evaluate import EvaluatorPool, Status, forkserver
from kernelevolve.evaluate.handle import WorkerHandle
from kernelevolve.evaluate.sandbox import descendants
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from tests.conftest import SPECS, cpu_settings
from tests.cpu_candidates import HONEST

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server is Linux's")


def _links(pid: int) -> set[str]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    out = set()
    for fd in fds:
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def _handle(tmp: Path, **overrides: object) -> WorkerHandle:
    settings = cpu_settings(tmp, **overrides)
    return WorkerHandle(
        platform=get_platform("cpu"),
        settings=settings,
        spec_path=SPECS / "softmax.py",
        precision="strict_fp32",
    ).start()


def test_a_forked_worker_is_confined_and_holds_nothing_of_the_servers(tmp_path: Path) -> None:
    handle = _handle(tmp_path)
    try:
        info = handle.wait_ready(120)
        assert handle.started_by == "fork" and info["started_by"] == "fork"
        assert isinstance(handle.proc, forkserver.ForkedProcess)
        server = handle.proc.server
        server_sockets = {link for link in _links(server.proc.pid) if link.startswith("socket:")}
        assert server_sockets  # the control: the server's end of its socket is there to be found
        tree = [handle.proc.pid, *descendants(handle.proc.pid)]
        assert len(tree) >= 2  # the stub outside, and the namespace's processes under it
        held = set().union(*(_links(pid) for pid in tree))
        assert not held & server_sockets, held & server_sockets
        # The worker confined itself after the fork, as a spawned one does: no note of a step skipped
        assert not [n for n in handle.notes if "threads" in n], handle.notes
    finally:
        handle.close()


def test_a_forked_workers_exit_is_reported_and_its_pid_reaped_once_released(tmp_path: Path) -> None:
    handle = _handle(tmp_path)
    handle.wait_ready(120)
    proc = handle.proc
    assert isinstance(proc, forkserver.ForkedProcess)
    server = proc.server
    handle.close()  # kills the tree, waits for the exit report, releases the pid
    assert proc.poll() is not None and proc.poll() != 0  # killed, as Popen would read it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.pid in descendants(server.proc.pid):
        time.sleep(0.05)
    assert proc.pid not in descendants(server.proc.pid)  # reaped: no zombie left behind


def test_workers_are_spawned_where_the_fork_server_cannot_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: object, *args: object, **kwargs: object) -> None:
        raise forkserver.ForkServerUnavailable("refused for this test")

    monkeypatch.setattr(forkserver.ForkServer, "fork", refuse)
    settings = cpu_settings(tmp_path, baselines=["eager"], fitness_baseline="eager")
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cpu"), settings) as pool:
        verdict = pool.evaluate_one(HONEST, "honest.py")
        assert verdict.status == Status.OK, verdict.message
        assert pool.device_info["started_by"] == "spawn"


def test_spawn_is_a_setting_and_a_typo_is_refused(tmp_path: Path) -> None:
    settings = cpu_settings(tmp_path, worker_start="spawn", baselines=["eager"], fitness_baseline="eager")
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cpu"), settings) as pool:
        verdict = pool.evaluate_one(HONEST, "honest.py")
        assert verdict.status == Status.OK, verdict.message
        assert pool.device_info["started_by"] == "spawn"
    with pytest.raises(WorkspaceError, match="worker_start must be one of fork, spawn"):
        cpu_settings(tmp_path, worker_start="frok").validate()
