"""The engine's side of one worker process: spawn it, watch its phases, enforce timeouts, kill it.

A worker is spawned (never forked: the engine may have touched CUDA) as
`python -m kernelevolve.evaluate.worker` in its own process group and its own temporary directory,
with a scrubbed environment, private compile caches, and its stdout/stderr in a log file; it is told
that directory (`--workdir`): once confined (`sandbox.py`), it writes nowhere else but leases and its
device nodes, and reads only what compiling and running a kernel needs, the spec, and the reference
outputs an earlier worker of its pool shared (`references.py`).
The torch.compile cache it starts from is a copy of a trusted one, written only by workers that had
no candidate loaded, so no candidate can slow down the baselines of later candidates by poisoning it.

Every way a worker can end is turned into a value: a `result` message, a `timeout` (the phase it was
in and the limit), a `crash` (exit code or signal, the end of its log), or an `oom` (killed by the
kernel, or its memory limit). The handle never raises for a candidate's behaviour.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kernelevolve
from kernelevolve import integrity
from kernelevolve.errors import HarnessError, SpecError
from kernelevolve.evaluate import bytecode, compile_cache, forkserver
from kernelevolve.evaluate.lease import lease_dir
from kernelevolve.evaluate.protocol import Channel
from kernelevolve.evaluate.references import FILE_NAME, Given
from kernelevolve.evaluate.sandbox import kill_tree, sandbox_argv, scrub_env

log = logging.getLogger(__name__)

NO_LIMIT = 7 * 24 * 3600.0


@dataclass
class Outcome:
    """How a worker's job ended: a message from it, or what the engine saw."""

    kind: str  # "result" | "error" | "timeout" | "crash"
    message: dict[str, Any] | None = None
    phase: str = ""
    detail: str = ""
    returncode: int | None = None
    log_tail: str = ""


def worker_environ(platform: Any, workdir: Path, bytecode_dir: Path | None) -> dict[str, str]:
    """A worker's environment, its own paths under `workdir` (the fork server's key is the rest)."""
    inductor = workdir / "inductor"
    env = scrub_env(dict(os.environ), workdir)
    env.update(platform.worker_env())
    # The compile cache starts as a copy of the run's trusted one, so nothing in it may name the
    # worker that filled it. Triton kernels bundled into inductor's graph cache do: they carry their
    # source's absolute path, beside which autotuning reads and writes its choice, and a later
    # worker then writes into a directory not its own (denied by the sandbox: torch.compile failed
    # in every worker but the first few of a GPU run). Unbundled, a cache hit writes the kernels'
    # source into this worker's cache, at the same relative path, and finds the trusted worker's
    # autotuning choice there; Triton's own cache, which names no paths, travels in the copy.
    env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor)
    env["TORCHINDUCTOR_BUNDLE_TRITON_INTO_FX_GRAPH_CACHE"] = "0"
    env["TRITON_CACHE_DIR"] = str(inductor / "triton")
    env["KERNELEVOLVE_NATIVE_CACHE"] = str(workdir / "native")
    # Where the installation keeps no bytecode, the engine's (read-only here; see bytecode.py).
    if bytecode_dir is not None:
        env["PYTHONPYCACHEPREFIX"] = str(bytecode_dir)
    # torch.compile (the baseline) compiles in this process, never in a pool of subprocesses: a
    # pool started lazily while a candidate runs would be blamed on the candidate (the process check).
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    # Resolved here, once: a worker's own TMPDIR is private, and leases must be shared by all.
    env["KERNELEVOLVE_LEASE_DIR"] = str(lease_dir())
    src_root = str(Path(kernelevolve.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src_root, env.get("PYTHONPATH", "")) if p)
    return env


def _forked(settings: Any) -> bool:
    mode = settings.worker_start
    if mode == "auto":  # see Settings.worker_start
        mode = "fork"
    return mode == "fork" and sys.platform == "linux"


def prestart(platform: Any, settings: Any, device_index: int = 0) -> None:
    """Start now the fork server this process's workers on `platform` will be forked from, where
    workers are forked (`forkserver.py`): its imports (torch, Triton, inductor: about 5 s) then overlap
    the caller's own start-up (a bench staging its specs) rather than delay the first worker. Nothing
    is started for spawned workers; a server that fails says so to its first worker, which is
    spawned."""
    if not _forked(settings):
        return
    workdir = Path(tempfile.mkdtemp(prefix="kernelevolve-prestart-"))
    try:
        env = worker_environ(platform, workdir, bytecode.folder())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    lease = platform.lease_key(device_index) if platform.exclusive else None
    forkserver.server_for(env, Path(tempfile.gettempdir()), lease, settings.prepare_timeout_s, asking=False)


class WorkerHandle:
    def __init__(
        self,
        *,
        platform: Any,
        settings: Any,
        spec_path: Path | None,
        precision: str,
        device_index: int = 0,
        gpu_memory_fraction: float | None = None,
        trusted_cache: Path | None = None,
        references: Given | None = None,
        share_references: bool = False,
    ):
        self.platform = platform
        self.settings = settings
        self.spec_path = spec_path
        self.precision = precision
        self.device_index = device_index
        self.gpu_memory_fraction = gpu_memory_fraction
        self.trusted_cache = trusted_cache
        # The pool's shared reference outputs to load; else, with `share_references`,
        # the worker writes its own to `shared_path` for the pool (`references.py`)
        self.references = references
        self.share_references = share_references and references is None
        self.dir = Path(tempfile.mkdtemp(prefix="kernelevolve-worker-"))
        self.inductor_cache = self.dir / "inductor"
        self.bytecode = bytecode.folder()
        self.filler: subprocess.Popen[bytes] | None = None  # compiling the bytecode, if this one started it
        self.log_path = self.dir / "worker.log"
        self.shared_path = self.dir / FILE_NAME
        self.shared: Path | None = None  # `shared_path`, once the ready message says it was written
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.proc: subprocess.Popen[bytes] | forkserver.ForkedProcess | None = None
        self.started_by = "spawn"  # or "fork" (forkserver.py)
        self.server: forkserver.ForkServer | None = None  # the fork server asked for it, if any
        self.start_error = ""
        self._proc_lock = threading.Lock()
        self._killed = False
        self.info: dict[str, Any] | None = None
        self.notes: list[str] = []
        self.ready_error: BaseException | None = None
        self._ready = threading.Event()
        self._chan: Channel | None = None
        self._spawned = 0.0

    # -- start-up ----------------------------------------------------------------------------------

    def start(self) -> WorkerHandle:
        (self.dir / "tmp").mkdir()
        if self.trusted_cache is not None and self.trusted_cache.is_dir():
            shutil.copytree(self.trusted_cache, self.inductor_cache, symlinks=True)
            compile_cache.relocate_groups(self.inductor_cache / "triton")
        env = worker_environ(self.platform, self.dir, self.bytecode)
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        s = self.settings
        wall = s.prepare_timeout_s + s.compile_timeout_s + s.run_timeout_s
        cpu_seconds = int(wall * max(2, min(os.cpu_count() or 2, 16)))
        memory = int(min(s.memory_limit_gb * 2**30, _physical_memory() * 0.9))
        args = ["--memory-bytes", str(memory), "--cpu-seconds", str(cpu_seconds)]
        # The device lease's name, given to the worker from here, where the candidate cannot reach:
        # the worker's environment and PATH are the candidate's to change once it is imported.
        lease_key = self.platform.lease_key(self.device_index)
        if self.platform.exclusive:
            args += ["--lease", lease_key]
        given = self.references.path if self.references else None
        reads = [p for p in (self.spec_path, self.bytecode, given) if p is not None]
        args += sandbox_argv(self.dir, s, reads)
        self._spawned = time.monotonic()
        log_file = open(self.log_path, "wb")  # noqa: SIM115 (closed by _launch, once the worker has it)
        self.server = server = self._fork_server(env, lease_key)
        launch = (server, args, env, cmd_r, res_w, log_file)
        if server is None:
            self._launch(*launch)
        else:  # the server may still be importing, or waiting for the lease: not on the caller's time
            threading.Thread(
                target=self._launch, args=launch, daemon=True, name="kernelevolve-worker-fork"
            ).start()
        self._chan = Channel(res_r, cmd_w)
        threading.Thread(target=self._read, daemon=True, name="kernelevolve-worker-reader").start()
        self.send(
            "prepare",
            spec_path=str(self.spec_path.resolve()) if self.spec_path else None,  # the worker runs elsewhere
            platform=self.platform.name,
            device_index=self.device_index,
            lease_key=lease_key,
            precision=self.precision,
            gpu_memory_fraction=self.gpu_memory_fraction,
            settings=self.settings.to_dict(),
            report_modules=self.bytecode is not None and not bytecode.filled(self.bytecode),
            harness_digest=integrity.check().digest,  # refused here already if modified
            references=str(given) if given else None,
            references_sha256=self.references.sha256 if self.references else None,
            share_references=str(self.shared_path) if self.share_references else None,
        )
        threading.Thread(target=self._await_ready, daemon=True, name="kernelevolve-worker-prepare").start()
        return self

    def _fork_server(self, env: dict[str, str], lease_key: str) -> forkserver.ForkServer | None:
        """The engine's fork server for this worker (`forkserver.py`), or None where workers are
        spawned (`worker_start`; or the server could not serve)."""
        if not _forked(self.settings):
            return None
        lease = lease_key if self.platform.exclusive else None
        return forkserver.server_for(env, Path(tempfile.gettempdir()), lease, self.settings.prepare_timeout_s)

    def _launch(
        self, server: forkserver.ForkServer | None, args: list[str], env: dict[str, str], cmd_r: int,
        res_w: int, log_file: Any,
    ) -> None:  # fmt: skip
        """Start the worker: forked by `server` (once it is ready), else spawned. Its ends of the
        channel and its log are closed here once it holds them; a handle killed meanwhile ends it."""
        proc: subprocess.Popen[bytes] | forkserver.ForkedProcess | None = None
        try:
            if server is not None:
                try:
                    proc = server.fork(args, env, self.dir, (cmd_r, res_w, log_file.fileno()))
                    self.started_by = "fork"
                except forkserver.ForkServerUnavailable as exc:
                    log.warning("workers are spawned, not forked: %s", exc)
            if proc is None:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "kernelevolve.evaluate.worker",
                     "--cmd-fd", str(cmd_r), "--res-fd", str(res_w), *args],
                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, cwd=self.dir,
                    env=env, pass_fds=(cmd_r, res_w), start_new_session=True,
                )  # fmt: skip
        except OSError as exc:  # the reader sees the channel close, and reports this
            self.start_error = f"the worker could not be started: {exc}"
        finally:
            os.close(cmd_r)
            os.close(res_w)
            log_file.close()
        with self._proc_lock:
            self.proc = proc
            killed = self._killed
        if killed:
            self.kill()

    def _read(self) -> None:
        assert self._chan is not None
        while True:
            try:
                msg = self._chan.recv()
            except (OSError, ValueError):
                msg = None
            self.messages.put(msg)
            if msg is None:
                self._chan.close_read()
                return

    def _await_ready(self) -> None:
        try:
            msg = self.messages.get(timeout=self.settings.prepare_timeout_s)
        except queue.Empty:
            self.ready_error = HarnessError(
                f"a worker did not finish preparing within {self.settings.prepare_timeout_s:.0f} s",
                hint="raise prepare_timeout_s, or check the device; log: " + str(self.log_path),
            )
            self.kill()
        else:
            if msg is None:
                self.ready_error = HarnessError(
                    "a worker died while preparing: " + self._exit_description(),
                    hint=self._sandbox_hint() + "its log ends with:\n" + self.log_tail(),
                )
            elif msg["op"] == "prep_error" and msg.get("kind") == "spec":
                self.ready_error = SpecError(msg["message"])
            elif msg["op"] == "prep_error":
                self.ready_error = HarnessError(
                    "a worker failed to prepare: " + msg["message"],
                    hint=self._sandbox_hint() + msg.get("traceback", "")[-2000:],
                )
            else:
                self.info, self.notes = msg.get("info") or {}, msg.get("notes", [])
                if self.share_references and msg.get("references") == str(self.shared_path):
                    self.shared = self.shared_path
                modules = self.info.pop("module_files", None)
                if modules and self.bytecode is not None:  # reported before any candidate ran
                    self.filler = bytecode.fill(self.bytecode, modules)
                # spawn to ready: the interpreter, torch's import and the worker's own steps
                self.info["start_s"] = round(time.monotonic() - self._spawned, 3)
                self.info["started_by"] = self.started_by
        self._ready.set()

    def _sandbox_hint(self) -> str:
        """Where a worker fails to start on a system the sandbox was not tried on: how to rule it out."""
        s = self.settings
        on = [n for n in ("sandbox_network", "sandbox_processes", "sandbox_filesystem") if getattr(s, n)]
        if not on:
            return ""
        return (
            "if the device failed to initialize or a file was refused ('Permission denied'), the worker's "
            f"sandbox may be the cause: try setting {' or '.join(f'{n} = false' for n in on)}, one at a "
            "time, or add a toolkit's folder to sandbox_read_paths (see SECURITY.md)\n"
        )

    def wait_ready(self, timeout: float | None = None) -> dict[str, Any]:
        if not self._ready.wait(timeout):
            raise HarnessError("timed out waiting for a worker to prepare")
        if self.ready_error is not None:
            raise self.ready_error
        assert self.info is not None
        return self.info

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.ready_error is None

    # -- jobs --------------------------------------------------------------------------------------

    def send(self, op: str, **payload: Any) -> None:
        assert self._chan is not None
        try:
            self._chan.send(op, **payload)
        except (BrokenPipeError, OSError):
            pass  # the worker is gone; the reader reports it

    def run_job(self, op: str, payload: dict[str, Any], on_phase: Any = None) -> Outcome:
        """Send one job and watch it to its end under the phase timeouts."""
        s = self.settings
        limits = {
            "compile": s.compile_timeout_s,
            "lease": NO_LIMIT,
            "first-run": s.run_timeout_s,
            "correctness": s.run_timeout_s,
        }
        self.send(op, **payload)
        phase, deadline = "start", time.monotonic() + s.compile_timeout_s
        while True:
            try:
                msg = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                limit = limits.get(phase, s.run_timeout_s)
                self.kill()
                return Outcome(
                    "timeout",
                    phase=phase,
                    detail=f"no progress within {limit:.0f} s",
                    log_tail=self.log_tail(),
                )
            if msg is None:
                code = self._wait_exit()
                return Outcome(
                    "crash",
                    phase=phase,
                    detail=self._exit_description(),
                    returncode=code,
                    log_tail=self.log_tail(),
                )
            if msg["op"] == "phase":
                phase = msg["phase"]
                if phase in limits:  # "timing" continues under the run deadline set at "correctness"
                    deadline = time.monotonic() + limits[phase]
                if on_phase:
                    on_phase(phase)
                continue
            return Outcome(
                msg["op"], message=msg, phase=phase, log_tail=self.log_tail() if msg["op"] == "error" else ""
            )

    # -- ending ------------------------------------------------------------------------------------

    def _wait_exit(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:  # never started (`start_error`), or not yet
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait()

    def _exit_description(self) -> str:
        if self.start_error:
            return self.start_error
        code = self._wait_exit()
        if code is None:
            return "the worker is unresponsive"
        if code < 0:
            sig = signal.Signals(-code)
            why = {
                signal.SIGSEGV: "segmentation fault",
                signal.SIGBUS: "bus error",
                signal.SIGABRT: "aborted",
                signal.SIGFPE: "floating-point exception",
                signal.SIGILL: "illegal instruction",
                signal.SIGKILL: "killed (SIGKILL): the kernel's OOM killer or an external kill",
                signal.SIGXCPU: "CPU-time limit exceeded",
                signal.SIGXFSZ: "file-size limit exceeded",
            }.get(sig, sig.name)
            return f"the worker died by {sig.name} ({why})"
        return f"the worker exited with code {code} without reporting a result"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            data = self.log_path.read_bytes()[-chars:]
        except OSError:
            return ""
        return data.decode("utf-8", "replace").strip()

    def kill(self) -> None:
        with self._proc_lock:
            self._killed = True  # a worker still being forked is ended as soon as it exists
            if self.proc is None:
                return
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        else:
            kill_tree(self.proc.pid)  # its own exit may leave children behind
        if isinstance(self.proc, forkserver.ForkedProcess) and self.proc.poll() is not None:
            self.proc.release()  # its pid may now be reaped, and reused

    def close(self) -> None:
        """Kill the worker and everything it started. A worker that reported waits for this rather
        than exiting, so its children are still its children here and cannot be missed."""
        self.kill()
        if self._chan is not None:
            self._chan.close_write()
        shutil.rmtree(self.dir, ignore_errors=True)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 64 * 2**30
