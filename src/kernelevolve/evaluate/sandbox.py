"""The worker's sandbox: a scrubbed environment, namespaces of its own, reads and writes confined
by Landlock, resource limits, and a kill that leaves nothing behind.

What it covers:
- Environment: every variable that looks like a secret (*KEY*, *TOKEN*, *SECRET*, *PASSWORD*,
  *CREDENTIAL*, cloud and LLM provider prefixes) is removed; HOME and TMPDIR point into the worker's
  own temporary directory.
- Namespaces (Linux, `namespaces.py`): the worker runs as process 2 of a PID namespace of its own,
  with a private /proc (the engine, other workers and every other process have no entry there and
  no number to name), a private /dev/shm and System V IPC, and an empty network namespace (only a
  loopback interface, down: not the host's 127.0.0.1, not its abstract Unix sockets). As root, the
  namespaces are made with root's privileges and then every capability is dropped; as any other
  user, a user namespace that maps the ids to themselves comes first.
- Files (Linux 5.13+ with Landlock, `landlock.py`): reads only beneath what compiling and running
  a kernel needs (`readable_paths`: the system's libraries, compilers and headers, the Python
  installation and import paths, toolkit folders, parts of /etc, GPU device nodes, /sys, /proc,
  the spec), never a folder that holds the engine's home or workspace; writes only beneath the
  worker's own directory, the device-lease directory, those device nodes and its own threads' /proc
  entries (CUDA writes them as it starts). No TCP at all (ABI 4+); no signals or abstract Unix
  sockets outside its domain (ABI 6+); no mounts; no device nodes made anywhere.
- Limits (set by the worker on itself, before torch is imported): address-space growth through
  RLIMIT_DATA (not RLIMIT_AS, which breaks CUDA start-up), no core files, a maximum file size, and a
  CPU-time backstop; RLIMIT_NPROC where it is enforced (not for root).
- Kill: the worker leads its own process group and is a child subreaper (orphans of its descendants
  are re-parented to it); after reporting it waits to be killed rather than exiting. `kill_tree` stops
  the group, collects every descendant (including ones that left the group with setsid or
  double-forked) from /proc, and SIGKILLs them all; the PID namespace's init dying takes the rest.

The worker applies the layers to itself (`confine`) first (after the device lease, where it takes one
at start), while it is still one thread and before torch is imported. Each can be switched off
(settings `sandbox_network`, `sandbox_processes`, `sandbox_filesystem`; CUDA, Triton, nvcc and the
torch.compile baseline run inside all of them on an H100). Where the OS refuses one (no user
namespaces, no Landlock, not Linux), the worker runs without it and says so in a note that reaches
every verdict's method notes. The profiler's process is confined the same way through
`confined_exec.py`.

What it does not cover (see SECURITY.md): Unix sockets that have a path in the file system, files
beneath the readable folders, and the GPU itself (shared memory of the device, timing side channels).
The static and runtime guards keep a candidate's Python away from `os`, `resource` and `ctypes`;
native code is contained by these layers and the kill alone.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|CERT|SIGNATURE|WEBHOOK|"
    r"^AWS_|^AZURE_|^GCP_|^GOOGLE_|^OPENAI|^ANTHROPIC|^HF_|^HUGGING|^GITHUB_|^GH_|^GITLAB|^NETRC|"
    r"^SSH_|^GPG|^DOCKER_|^NPM_|^PYPI|^TWINE|^WANDB|^DATABASE_URL|^REDIS_URL|_URI$|_DSN$",
    re.IGNORECASE,
)


def scrub_env(env: dict[str, str], workdir: Path) -> dict[str, str]:
    """A worker's environment: the parent's minus anything secret-looking, with a private HOME."""
    clean = {k: v for k, v in env.items() if not SECRET_NAME.search(k)}
    clean["HOME"] = str(workdir)
    clean["TMPDIR"] = str(workdir / "tmp")
    clean["PYTHONDONTWRITEBYTECODE"] = "1"
    clean["PYTHONUNBUFFERED"] = "1"
    clean["PYTHONNOUSERSITE"] = "1"
    return clean


# -- namespaces and Landlock: the worker confines itself ------------------------------------------

# Read-only beneath these (where they exist): the system's programs, libraries, headers and compilers
# (/usr holds /usr/local/cuda and the GCC toolchain), and the kernel's views a runtime reads (/sys for
# devices and CPUs; /proc, private where a PID namespace was had).
SYSTEM_READS = (
    "/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/sys", "/proc",
    "/opt/rocm", "/opt/nvidia",  # ROCm; NVIDIA's tools (Nsight Compute lives in /opt/nvidia)
)  # fmt: skip
# Of /etc, what the loader, the C library and the drivers read; never all of it (/etc/shadow, keys).
ETC_READS = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group", "localtime",
    "timezone", "os-release", "lsb-release", "debian_version", "host.conf", "hosts", "gai.conf",
    "mime.types", "nvidia", "OpenCL", "vulkan", "alternatives",
)  # fmt: skip
# Device nodes a kernel's runtime opens for reading and writing; never a disk's. /dev/shm is private
# where a mount namespace was had.
DEVICE_NODES = ("null", "zero", "full", "random", "urandom", "shm", "kfd", "dri", "nvidia-caps")
# Variables naming toolkits a compile reads (their folders become readable, as PATH's entries do).
TOOLKIT_VARS = (
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_ROOT",
    "ROCM_PATH",
    "TRITON_PTXAS_PATH",
    "TRITON_LIBCUDA_PATH",
)
# Compilers and profilers, by name or as $CC-style variables name them: each one's install prefix
# becomes readable (a GCC in /opt/gcc reads its own headers from /opt/gcc/lib/gcc/...).
COMPILERS = ("cc", "c++", "gcc", "g++", "clang", "clang++", "nvcc", "ncu", "hipcc")
COMPILER_VARS = ("CC", "CXX", "NVCC", "CUDAHOSTCXX", "NVCC_CCBIN", "HIPCC")


def device_nodes() -> list[Path]:
    dev = Path("/dev")
    nodes = [dev / name for name in DEVICE_NODES]
    try:
        nodes += sorted(p for p in dev.iterdir() if p.name.startswith("nvidia"))
    except OSError:
        pass
    return nodes


def _holds(path: Path, protected: list[Path]) -> bool:
    """Whether `path` is or contains a protected path (the engine's home, the workspace)."""
    return any(p == path or path in p.parents for p in protected)


def readable_paths(extra: list[Path], protect: list[Path]) -> tuple[list[Path], list[str]]:
    """What a confined process may read, beyond the folders it may write: the system's (above), the
    Python installation and every import path, toolkit folders (PATH, LD_LIBRARY_PATH, CUDA_HOME, ...),
    and `extra` (the spec). A candidate folder that is or holds a `protect`ed path is left out, with
    a note (a PYTHONPATH of the home folder would otherwise open the whole home)."""
    import shutil

    import kernelevolve

    protected = [p.resolve() for p in protect if str(p) not in ("", "/")]
    found: list[Path] = [Path(p) for p in SYSTEM_READS] + [Path("/etc") / name for name in ETC_READS]
    found.append(Path(f"/etc/python{sys.version_info.major}.{sys.version_info.minor}"))  # sitecustomize
    found += device_nodes()
    python = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
    python += [os.path.dirname(os.path.realpath(sys.executable)), *sys.path]
    tools = [os.environ.get(v, "") for v in TOOLKIT_VARS]
    for var in ("PATH", "LD_LIBRARY_PATH"):
        tools += os.environ.get(var, "").split(os.pathsep)
    named = [os.environ.get(v, "").split(" ")[0] for v in COMPILER_VARS]
    for exe in [*COMPILERS, *filter(None, named)]:
        where = shutil.which(exe)
        if where:  # the toolkit's folder (bin/.., with its include and lib), as found and as resolved
            tools += [str(Path(where).parent.parent), str(Path(where).resolve().parent.parent)]
    notes = []
    for text in [*python, *tools]:
        if not text or not os.path.isabs(text):
            continue
        path = Path(text).resolve()
        if not os.path.exists(path):  # False also where this user may not look
            continue
        if _holds(path, protected):
            if str(path) not in ("/",) and text in python:
                notes.append(
                    f"{path} is not readable by the worker: it holds the engine's home or workspace "
                    "(move the package, or add a narrower folder to sandbox_read_paths)"
                )
            continue
        found.append(path)
    found.append(Path(kernelevolve.__file__).resolve().parent)  # an editable install's source
    found += [Path(p).resolve() for p in extra]
    return list(dict.fromkeys(found)), notes


def protected_paths(settings: Any) -> list[Path]:
    """Never readable by a confined process, nor any folder above them: the engine's home (dotfiles,
    keys, tokens) and the workspace (the store, every run's kernels)."""
    import pwd

    homes = {os.path.expanduser("~")}
    try:
        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    return [Path(h) for h in sorted(homes) if h not in ("", "/")] + [Path(settings.workspace).resolve()]


def sandbox_argv(workdir: Path, settings: Any, reads: list[Path]) -> list[str]:
    """The sandbox's flags for a worker or `confined_exec`, from the settings: which layers are on,
    what is readable beyond the system's (`reads`, `sandbox_read_paths`) and what is protected."""
    argv = ["--workdir", str(workdir)]
    if not settings.sandbox_network:
        argv.append("--no-netns")
    if not settings.sandbox_processes:
        argv.append("--no-pidns")
    if not settings.sandbox_filesystem:
        argv.append("--no-landlock")
    for path in [*reads, *map(Path, settings.sandbox_read_paths)]:
        argv += ["--read", str(Path(path).expanduser().resolve())]
    for path in protected_paths(settings):
        argv += ["--protect", str(path)]
    return argv


def profiler_capabilities() -> tuple[str, ...]:
    """What the profiler's process keeps as root: CAP_SYS_ADMIN where the NVIDIA driver lets only
    administrators read the GPU's counters (`RmProfilingAdminOnly: 1`), nothing elsewhere."""
    try:
        params = Path("/proc/driver/nvidia/params").read_text()
    except OSError:
        return ()
    return ("SYS_ADMIN",) if re.search(r"RmProfilingAdminOnly:\s*1", params) else ()


def confine(
    workdir: Path | None,
    network: bool = True,
    filesystem: bool = True,
    processes: bool = True,
    reads: list[Path] | None = None,
    protect: list[Path] | None = None,
    profiler: bool = False,
) -> list[str]:
    """A confined process's first act, while it is one thread and before torch is imported: enter
    its namespaces (`namespaces.enter`: this forks, and only the confined process returns), then
    Landlock. Reads only beneath `readable_paths`, writes only beneath `workdir`, the lease directory
    and `device_nodes`, no TCP, no abstract Unix sockets or signals outside. For the profiler's
    process (`profiler`): its loopback up and TCP on it (Nsight Compute talks to its target over
    it), root's CAP_SYS_ADMIN kept where the driver requires it for the GPU's counters
    (`profiler_capabilities`), and /proc writable (ncu starts the
    profiled program, whose entries cannot be named in advance). Returns notes about layers that are
    off or that the OS refused."""
    from kernelevolve.evaluate import landlock, namespaces
    from kernelevolve.evaluate.lease import lease_dir

    notes = []
    if not network:
        notes.append("network isolation is off (sandbox_network = false): the worker can reach the network")
    if not processes:
        notes.append(
            "process isolation is off (sandbox_processes = false): native code can see other processes "
            "of this user (their /proc entries, environment and memory) and share /dev/shm"
        )
    keep = profiler_capabilities() if profiler and os.geteuid() == 0 else ()
    entered = namespaces.enter(network, processes, loopback=profiler, keep=keep)
    notes += entered.notes
    if keep and entered.capabilities_dropped:
        notes.append(
            "the profiler's process keeps CAP_SYS_ADMIN (this NVIDIA driver lets only administrators read "
            "the GPU's counters): native code profiled by ncu as root keeps it too; see SECURITY.md"
        )
    if not filesystem:
        notes.append(
            "file-system confinement is off (sandbox_filesystem = false): native code can read and write "
            "wherever the engine's user can"
        )
        return notes
    if workdir is None:
        notes.append(
            "no worker directory given: native code can read and write wherever the engine's user can"
        )
        return notes
    if namespaces.threads() > 1:  # a domain entered by one thread would not bind the others
        notes.append(
            "Landlock not applied (the worker already runs threads): native code can read and write "
            "wherever the engine's user can; see SECURITY.md"
        )
        return notes
    readable, read_notes = readable_paths(list(reads or []), list(protect or []))
    notes += read_notes
    writable = [workdir, *device_nodes()]
    writable += [lease_dir(), Path("/proc")] if profiler else [lease_dir(), Path("/proc/self/task")]
    result = landlock.restrict(readable, writable, deny_tcp=network and not profiler)
    if result.note:
        notes.append(result.note)
    elif not result.scopes:
        notes.append(
            f"Landlock ABI {result.abi} (Linux before 6.12) has no scopes: native code can signal "
            "processes it can see and reach abstract Unix sockets of its network namespace"
        )
    return notes


# -- resource limits and the kill ----------------------------------------------------------------


def apply_limits(memory_bytes: int, cpu_seconds: int, file_bytes: int) -> list[str]:
    """Limit this process (the worker). Returns notes about limits the OS did not enforce."""
    import resource

    notes = []

    def lower(which: int, value: int) -> None:
        _soft, hard = resource.getrlimit(which)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (cap, cap))

    lower(resource.RLIMIT_CORE, 0)
    lower(resource.RLIMIT_DATA, memory_bytes)
    lower(resource.RLIMIT_FSIZE, file_bytes)
    lower(resource.RLIMIT_CPU, cpu_seconds)
    if not _become_subreaper():
        notes.append("could not become a child subreaper: double-forked processes may escape the kill")
    if os.geteuid() == 0:
        notes.append(
            "running as root: RLIMIT_NPROC is not enforced; process count is bounded by the kill only"
        )
    else:
        lower(resource.RLIMIT_NPROC, 4096)
    return notes


def _become_subreaper() -> bool:
    """Orphans of our descendants are re-parented to us, not to init, so `kill_tree` still finds a
    process that double-forked to escape (Linux 3.4+)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def descendants(pid: int, include_zombies: bool = True) -> list[int]:
    """All descendants of `pid`, found through /proc (Linux); empty elsewhere."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: parse after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] == "Z" and not include_zombies:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def kill_tree(pid: int) -> None:
    """Stop the process group (no more forking), collect every descendant, SIGKILL them all."""
    try:
        os.killpg(pid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(3):  # a child forked between the listing and the kill is caught on the next pass
        found = descendants(pid)
        for p in found:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not found:
            break
        time.sleep(0.01)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
