"""Workers forked from an interpreter that has already imported torch: a fork server.

Every candidate gets a fresh worker, and each worker spent seconds importing torch, Triton and
torch.compile's stack (about 2,000 modules; 3.5 s of a 12 s start-up for torch._inductor alone on an
H200 under a bench's load, `benchmarks/results/2026-11-26-h200-throughput.md`). The fork server is a
process of the engine's that imports them once, runs no candidate and never touches a device, and
forks a worker on request. The child is the worker from its first line (`worker.main`): it takes the
device's lease where the platform wants one, confines itself (namespaces, Landlock, limits: the
child is one thread, as `sandbox.confine` needs) and prepares, as a spawned worker does.

Engine side (`ForkServer`, one per engine process and worker environment, shared by its pools):
started beside the first pool, or ahead of it (`handle.prestart`: a bench, before staging its
specs); a request sends the worker's arguments, its environment and working directory, and the
descriptors of its channel and log (SCM_RIGHTS over a Unix socket); the reply names the child's pid.
`ForkedProcess` is the engine's handle on it, with `subprocess.Popen`'s `pid`, `poll`, `wait` and
`returncode`, fed by the server's exit reports. The server keeps an exited
child unreaped (a zombie holds its pid) until the engine's handle is closed, so the engine's kill of
the child's tree can never reach a process that took the pid over.

Server side (`python -m kernelevolve.evaluate.forkserver --sock-fd N`): its environment is a
worker's (secrets scrubbed, `scrub_env`) without the per-worker paths; it imports `PRELOAD`, checks
that no device was initialised (a CUDA driver initialised before fork is unusable in the child), has
a first child prove that the device still starts after a fork, and reports ready. Where any of that
fails, the engine is told why and spawns its workers as before (`Settings.worker_start`: "spawn"
always does; "auto", the default, forks on Linux). The child closes every descriptor but its channel, log and stdio before anything
else, so no worker can reach the server's socket.

What it does not do: share anything mutable between workers. A child is a copy of the server's
memory as it was after the imports; what a worker or its candidate changes dies with it.

Why one module (over 450 lines): the engine's side (`ForkServer`, `server_for`) and the server's
own loop (`serve`, `_child`) speak one private protocol of a few messages and descriptors; kept
together, a change to one side is seen against the other.
"""

from __future__ import annotations

import argparse
import array
import atexit
import contextlib
import itertools
import json
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

# What a worker imports before its candidate, in that order; modules missing here (no Triton on a
# CPU machine) are skipped. Importing must not touch a device: `_check_untouched` verifies.
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "triton",
    "triton.language",
    "kernelevolve.spec",
    "kernelevolve.platforms",
    "kernelevolve.evaluate.prepared",
    "kernelevolve.evaluate.inputs",
    "kernelevolve.evaluate.runtime",
    "kernelevolve.evaluate.guards",
    "kernelevolve.evaluate.correctness",
    "kernelevolve.evaluate.timing",
    "kernelevolve.evaluate.evaluation",
    "kernelevolve.evaluate.baselines",
    "kernelevolve.evaluate.worker",
)
# A worker's own paths, set per child; everything else in the environment is the server's.
PER_WORKER = ("HOME", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "KERNELEVOLVE_NATIVE_CACHE")
MAX_MESSAGE = 1 << 20
COMM = b"kernelevolve-wk"  # a forked worker's name in /proc/PID/comm (15 bytes at most)
PR_SET_NAME = 15


# -- the engine's side -------------------------------------------------------------------------------


class ForkServerUnavailable(RuntimeError):
    """The server could not start or fork; the caller spawns the worker instead."""


class ForkedProcess:
    """`subprocess.Popen`'s interface for a worker the fork server started."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def release(self) -> None:
        """The engine is done with the pid (killed, waited): the server may reap it."""
        self.server._forget(self.pid)
        self.server._send({"op": "reap", "pid": self.pid})


class ForkServer:
    def __init__(self, env: dict[str, str], workdir: Path, lease: str | None, timeout_s: float):
        self.env, self.workdir, self.lease, self.timeout_s = env, workdir, lease, timeout_s
        self.error: str | None = None
        self.info: dict[str, Any] = {}
        self._ready = threading.Event()
        self._lock = threading.Lock()  # one request in flight
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}  # exits read before their fork's reply
        self._children_lock = threading.Lock()
        self._asked = 0  # forks asked for (`server_for`) and not yet answered
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "kernelevolve.evaluate.forkserver", "--sock-fd", str(theirs.fileno())]
        if lease:
            argv += ["--lease", lease]
        with open(workdir / "forkserver.log", "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env,
                pass_fds=(theirs.fileno(),), start_new_session=True,
            )  # fmt: skip
        theirs.close()
        self.started = time.monotonic()
        threading.Thread(target=self._read, daemon=True, name="kernelevolve-forkserver").start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                self.error = self.error or "the fork server ended: " + self.log_tail()
                self._ready.set()
                self._replies.put(None)
                with self._children_lock:
                    orphans = [c for c in self._children.values() if c.returncode is None]
                for orphan in orphans:
                    orphan._set_exit(-signal.SIGKILL)  # the server's death killed its children
                return
            msg = json.loads(data)
            if msg["op"] == "ready":
                self.info = msg
                self._ready.set()
            elif msg["op"] == "unfit":
                self.error = msg["message"]
                self._ready.set()
            elif msg["op"] == "exited":
                pid, code = int(msg["pid"]), int(msg["code"])
                with self._children_lock:
                    known = self._children.get(pid)
                    if known is None:
                        self._early_exits[pid] = code  # before its fork's reply was read
                    else:
                        known._set_exit(code)
            else:
                self._replies.put(msg)

    def _send(self, msg: dict[str, Any], fds: list[int] | None = None) -> None:
        data = json.dumps(msg).encode()
        try:
            if fds:
                self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                self.sock.send(data)
        except OSError as exc:
            self.error = self.error or f"the fork server cannot be reached ({exc})"

    def fork(
        self, argv: list[str], env: dict[str, str], cwd: Path, fds: tuple[int, int, int]
    ) -> ForkedProcess:
        """Fork a worker: `argv` are `worker.main`'s arguments but the channel's, `fds` its (command
        read end, result write end, log). Raises ForkServerUnavailable where it cannot."""
        try:
            return self._fork(argv, env, cwd, fds)
        finally:
            with self._children_lock:
                self._asked -= 1

    def _fork(
        self, argv: list[str], env: dict[str, str], cwd: Path, fds: tuple[int, int, int]
    ) -> ForkedProcess:
        if not self._ready.wait(self.timeout_s):
            raise ForkServerUnavailable(f"the fork server was not ready within {self.timeout_s:.0f} s")
        if self.error:
            raise ForkServerUnavailable(self.error)
        with self._lock:
            self._send({"op": "fork", "argv": argv, "env": env, "cwd": str(cwd)}, list(fds))
            try:
                reply = self._replies.get(timeout=60)
            except queue.Empty:
                reply = {"op": "error", "message": "the fork server did not answer within 60 s"}
            if reply is None or reply.get("op") != "forked":
                message = (reply or {}).get("message") or self.error or "the fork server ended"
                self.error = message
                raise ForkServerUnavailable(message)
            child = ForkedProcess(self, int(reply["pid"]))
            with self._children_lock:
                self._children[child.pid] = child
                if child.pid in self._early_exits:
                    child._set_exit(self._early_exits.pop(child.pid))
            return child

    def _forget(self, pid: int) -> None:
        with self._children_lock:
            self._children.pop(pid, None)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.workdir / "forkserver.log").read_bytes()[-chars:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def busy(self) -> bool:
        """Whether a fork was asked of it and not yet answered, or a worker it forked is still alive
        (its exit not yet reported)."""
        with self._children_lock:
            return self._asked > 0 or any(c.returncode is None for c in self._children.values())

    def close(self) -> None:
        """End the server (its workers, in sessions of their own, are the engine's to end) and remove
        its folder."""
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


_SERVERS: OrderedDict[tuple[str, ...], ForkServer] = OrderedDict()  # least recently used first
_SERVERS_LOCK = threading.Lock()
_STARTED = itertools.count()
# Servers kept by one engine process: a process whose environment changes between pools (a test
# session) would otherwise keep one server, some 300 MB, for every environment it ever had. Only
# idle ones (no worker alive) are ended to make room.
MAX_SERVERS = 2


def server_for(
    env: dict[str, str], root: Path, lease: str | None, timeout_s: float, *, asking: bool = True
) -> ForkServer | None:
    """The engine's fork server for workers with this environment (their own paths aside), started
    on first use; None once it has failed (the caller spawns). The caller then asks it for one fork
    (`ForkServer.fork`): until that is answered, the server is not ended to make room. `asking=False`
    only starts it, ahead of the first worker (`handle.prestart`)."""
    shared = {k: v for k, v in env.items() if k not in PER_WORKER}
    key = (*sorted(f"{k}={v}" for k, v in shared.items()), str(lease))
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is None:
            idle = [k for k, s in _SERVERS.items() if not s.busy()]
            while len(_SERVERS) >= MAX_SERVERS and idle:
                _SERVERS.pop(idle.pop(0)).close()
            if not _SERVERS:
                atexit.register(close_all)
            workdir = root / f"kernelevolve-forkserver-{os.getpid()}-{next(_STARTED)}"
            server_env = dict(shared, HOME=str(workdir), TMPDIR=str(workdir / "tmp"))
            (workdir / "tmp").mkdir(parents=True, exist_ok=True)
            server = _SERVERS[key] = ForkServer(server_env, workdir, lease, timeout_s)
        _SERVERS.move_to_end(key)
        if server.error:
            return None
        if asking:
            with server._children_lock:
                server._asked += 1  # busy, not to be ended for room, until `fork` answers
    return server


def close_all() -> None:
    with _SERVERS_LOCK:
        for server in _SERVERS.values():
            server.close()
        _SERVERS.clear()


# -- the server ---------------------------------------------------------------------------------------


def _exit_code(pid: int) -> int | None:
    """A child's exit as Popen's returncode, if it has exited; the zombie is kept (WNOWAIT)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return -signal.SIGKILL
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return int(info.si_status)
    return -int(info.si_status)


def _child(sock: socket.socket, msg: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the worker. Never returns."""
    code = 1
    try:
        cmd, res, log = fds
        sock.close()
        os.setsid()
        from kernelevolve.evaluate.landlock import libc

        libc().prctl(PR_SET_NAME, COMM, 0, 0, 0)  # what `ps` and /proc/PID/comm show
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        from kernelevolve.evaluate.namespaces import _close_fds

        _close_fds((cmd, res))  # the server's socket, other workers' descriptors: none stays
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it in a fresh interpreter
        os.chdir(msg["cwd"])
        os.environ.clear()
        os.environ.update(msg["env"])
        import tempfile

        tempfile.tempdir = None  # TMPDIR is the worker's own
        _own_paths()
        if sys.path and sys.path[0] == _SERVER_CWD:
            sys.path[0] = msg["cwd"]
        from kernelevolve.evaluate import worker

        worker.main([*msg["argv"], "--cmd-fd", str(cmd), "--res-fd", str(res)])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


_SERVER_CWD = ""


def _own_paths() -> None:
    """Module state that the server's imports derived from its environment, derived again from the
    worker's, as a spawned worker's imports would have: torch.compile's cache folder (created at
    import, where the pool takes its trusted compile cache from), Dynamo's package cache and
    inductor's precompiled headers. Anything else so derived points into the server's own folder,
    which no worker may read or write (Landlock): it fails closed, it is never shared."""
    with contextlib.suppress(Exception):
        from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

        cache_dir()  # creates the worker's own, as importing torch._dynamo does
        package = sys.modules.get("torch._dynamo.package")
        if package is not None and hasattr(package, "DynamoCache"):
            disk_cache = package.DiskDynamoCache
            setattr(package, "DynamoCache", disk_cache(os.path.join(cache_dir(), "dynamo")))  # noqa: B010
        codecache = sys.modules.get("torch._inductor.codecache")
        if codecache is not None and hasattr(codecache, "_HEADER_DIR"):
            setattr(codecache, "_HEADER_DIR", os.path.join(default_cache_dir(), "precompiled_headers"))  # noqa: B010


def _check_untouched() -> str | None:
    """Why a forked child could not use the device, if importing touched it."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "torch is not importable here"
    if torch.cuda.is_initialized():
        return "importing initialised CUDA in the fork server"
    return None


def _release_nvml() -> None:
    """Shut NVML down where the server's imports started it (torch's NVML-based device count, asked
    while importing, calls nvmlInit and never nvmlShutdown). NVML is not fork-safe: a child that
    inherits it started cannot start its own, and torch's out-of-memory error, which asks NVML for the
    device's usage, then failed as an internal assert that never said "out of memory" (so the pool
    never raised a spec's memory share). Shut down as often as it was started, each child starts its own."""
    try:
        with open("/proc/self/maps") as maps:
            if not any("libnvidia-ml" in line for line in maps):
                return
        import ctypes

        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return
    for _ in range(64):  # nvmlInit counts its calls; NVML_SUCCESS is 0
        if nvml.nvmlShutdown() != 0:
            break


def _device_after_fork() -> str | None:
    """Where CUDA is installed, a first child starts it after a fork: why not, if it cannot."""
    import torch

    if not (torch.version.cuda or torch.version.hip):
        return None
    pid = os.fork()
    if pid == 0:
        try:
            ok = torch.cuda.device_count() == 0 or (torch.cuda.init() is None and torch.cuda.is_initialized())
        except BaseException:
            ok = False
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return "a child forked from the server could not start CUDA"
    return None


def serve(argv: list[str] | None = None) -> None:
    global _SERVER_CWD
    ap = argparse.ArgumentParser(prog="kernelevolve-forkserver")
    ap.add_argument("--sock-fd", type=int, required=True)
    ap.add_argument("--lease", default=None)
    args = ap.parse_args(argv)
    sock = socket.socket(fileno=args.sock_fd)
    _SERVER_CWD = os.getcwd()
    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
    # A module that asks torch.cuda.is_available() while importing asks NVML, not the CUDA driver:
    # a driver initialised here would be unusable in every child. (The children's environment is the
    # engine's, without this.)
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    lease = None
    if args.lease:  # where nothing may run beside a timing (the CPU), importing may not either
        from kernelevolve.evaluate.lease import DeviceLease

        lease = DeviceLease(args.lease).acquire()
    t0 = time.perf_counter()
    loaded = []
    for name in PRELOAD:
        try:
            __import__(name)
            loaded.append(name)
        except ImportError:
            pass
    why = _check_untouched()
    _release_nvml()
    why = why or _device_after_fork()
    if lease is not None:
        lease.release()
    if why:
        sock.send(json.dumps({"op": "unfit", "message": why}).encode())
        os._exit(0)
    sys.stdout.flush()
    sys.stderr.flush()
    sock.send(
        json.dumps(
            {"op": "ready", "preloaded": loaded, "seconds": round(time.perf_counter() - t0, 3)}
        ).encode()
    )
    children: set[int] = set()  # forked, not reaped
    exited: set[int] = set()  # reported to the engine, kept as zombies until it releases them
    released: set[int] = set()  # released by the engine before they exited
    while True:
        try:
            readable, _, _ = select.select([sock], [], [], 0.05)
        except InterruptedError:
            continue
        if readable:
            data, ancdata, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(16 * 4))
            if not data:  # the engine is gone: so are its workers (they watch their channels)
                os._exit(0)  # nothing to flush or finalise: what it imported is no one's
            msg = json.loads(data)
            fds = [
                fd
                for level, kind, payload in ancdata
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                for fd in array.array("i", payload[: len(payload) - len(payload) % 4])
            ]
            if msg["op"] == "fork":
                pid = _fork(sock, msg, fds)
                if pid is not None:
                    children.add(pid)
            elif msg["op"] == "reap" and int(msg["pid"]) in children:
                released.add(int(msg["pid"]))
        for pid in list(children):
            if pid not in exited and (code := _exit_code(pid)) is not None:
                sock.send(json.dumps({"op": "exited", "pid": pid, "code": code}).encode())
                exited.add(pid)
            if pid in exited and pid in released:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                children.discard(pid)
                exited.discard(pid)
                released.discard(pid)


def _fork(sock: socket.socket, msg: dict[str, Any], fds: list[int]) -> int | None:
    """Fork one worker and tell the engine its pid (or why not)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        sock.send(json.dumps({"op": "error", "message": f"fork failed: {exc}"}).encode())
        pid = None
    if pid == 0:
        _child(sock, msg, fds)  # never returns
    for fd in fds:
        os.close(fd)
    if pid is not None:
        sock.send(json.dumps({"op": "forked", "pid": pid}).encode())
    return pid


if __name__ == "__main__":
    try:
        serve()
    finally:  # an error's traceback is in the log; nothing is finalised (see `serve`)
        sys.stderr.flush()
        os._exit(1)
