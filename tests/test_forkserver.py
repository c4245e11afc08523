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
    with pytest.raises(WorkspaceError, match="worker_start must be one of auto, fork, spawn"):
        cpu_settings(tmp_path, worker_start="frok").validate()


def test_a_fork_server_ends_with_its_engine(tmp_path: Path) -> None:
    """An engine killed outright (no atexit) leaves no server behind: its socket closes, and the
    server exits at once without finalising what it imported."""
    import signal
    import subprocess

    code = (
        "import sys, time; from pathlib import Path; from kernelevolve.evaluate import forkserver; "
        "s = forkserver.server_for({'PATH': '/usr/bin:/bin'}, Path(sys.argv[1]), None, 120); "
        "s._ready.wait(120); print(s.proc.pid, flush=True); time.sleep(600)"
    )
    engine = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout is not None
        server = int(engine.stdout.readline())
        assert Path(f"/proc/{server}").exists()
        engine.send_signal(signal.SIGKILL)
        engine.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(server):
            time.sleep(0.1)
        assert not _alive(server)
    finally:
        engine.kill()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_an_engine_keeps_few_servers_and_ends_the_idle_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server asked for a fork is never ended to make room, even before it has forked (a worker's
    start waits on it on another thread); once idle, the least recently used go first."""
    monkeypatch.setattr(forkserver, "_SERVERS", forkserver.OrderedDict())
    env = {"PATH": "/usr/bin:/bin"}
    try:
        asked = [forkserver.server_for({**env, "N": str(n)}, tmp_path, None, 120) for n in range(3)]
        assert all(s is not None for s in asked)
        assert len(forkserver._SERVERS) == 3  # each still owes its caller a fork
        for server in asked:
            assert server is not None
            with server._children_lock:
                server._asked -= 1  # as `fork` does once it has answered
        forkserver.server_for({**env, "N": "3"}, tmp_path, None, 120)
        assert len(forkserver._SERVERS) == forkserver.MAX_SERVERS == 2
        for old in asked[:2]:  # ended, their folders removed
            assert old is not None and old.proc.wait(10) is not None and not old.workdir.exists()
    finally:
        forkserver.close_all()


def test_a_prestarted_server_is_the_one_the_first_worker_is_forked_from(tmp_path: Path) -> None:
    """`prestart` (a bench, before it stages its specs) starts the very server a worker of the same
    environment asks for: its imports are done by the time the first worker needs them."""
    from kernelevolve.evaluate.handle import prestart

    forkserver.close_all()
    settings = cpu_settings(tmp_path)
    prestart(get_platform("cpu"), cpu_settings(tmp_path, worker_start="spawn"))
    assert not forkserver._SERVERS  # spawned workers: nothing to start
    prestart(get_platform("cpu"), settings)
    (server,) = forkserver._SERVERS.values()
    assert server._asked == 0 and not server.busy()  # started, not asked: it may be ended for room
    handle = _handle(tmp_path)
    try:
        handle.wait_ready(120)
        assert isinstance(handle.proc, forkserver.ForkedProcess) and handle.proc.server is server
        assert len(forkserver._SERVERS) == 1
    finally:
        handle.close()
