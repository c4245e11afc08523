"""The worker's sandbox: a scrubbed environment, no network, writes confined to its own directory,
resource limits, and a kill that leaves nothing behind.

What it covers:
- Environment: every variable that looks like a secret (*KEY*, *TOKEN*, *SECRET*, *PASSWORD*,
  *CREDENTIAL*, cloud and LLM provider prefixes) is removed; HOME and TMPDIR point into the worker's
  own temporary directory, so dotfiles with credentials are out of reach by path.
- Network (Linux, `isolate_network`): the worker moves itself into a new, empty network namespace
  (only a loopback interface, down), so no address is reachable, not even the host's 127.0.0.1 or its
  abstract Unix sockets. As root it unshares the network namespace alone; as any other user it first
  enters a new user namespace that maps its uid and gid to themselves (so nothing looks different).
- Writes (Linux 5.13+ with Landlock, `restrict_writes`): the worker may create, write, truncate,
  rename, link or remove files only beneath its own directory, the device-lease directory, /dev and
  its own threads' /proc entries (`/proc/self/task`, which CUDA writes as it starts).
  Reads stay allowed everywhere (Python, torch and the vendor libraries load from anywhere).
- Limits (set by the worker on itself, before torch is imported): address-space growth through
  RLIMIT_DATA (not RLIMIT_AS, which breaks CUDA start-up), no core files, a maximum file size, and a
  CPU-time backstop; RLIMIT_NPROC where it is enforced (not for root).
- Kill: the worker leads its own process group and is a child subreaper (orphans of its descendants
  are re-parented to it); after reporting it waits to be killed rather than exiting. `kill_tree` stops
  the group, collects every descendant (including ones that left the group with setsid or
  double-forked) from /proc, and SIGKILLs them all.

The worker applies the network and write layers to itself (`confine`) first (after the device lease,
where it takes one at start), while it is still one thread and before torch is imported: both bind
only the calling thread and what it starts later. Both can be switched off (settings `sandbox_network`, `sandbox_filesystem`;
CUDA, Triton and the torch.compile baseline run inside both on an H100 and an H200). Where the OS
refuses one (no user namespaces, no Landlock, not Linux), the worker runs without it and says so in
a note that reaches every verdict's method notes.

What it does not cover (see SECURITY.md): reads (native code can read whatever the engine's user
can), Unix sockets that have a path in the file system, and a candidate that is root on the machine
(it can leave the namespace and raise its own limits). The static and runtime guards keep a
candidate's Python away from `os`, `resource` and `ctypes`; native code is contained by these layers
and the kill alone.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import re
import signal
import socket
import stat
import struct
import sys
import time
from pathlib import Path

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


# -- network and writes: the worker confines itself -------------------------------------------------

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38

# Landlock's system calls: from number 424 on, every architecture (x86_64 and aarch64 included) shares
# one numbering; alpha, the exception, is not listed.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_MACHINES = ("x86_64", "aarch64", "riscv64", "ppc64le", "s390x")
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
# The write-type file-system rights (ABI 1), then those later ABIs added. Reads (READ_FILE, READ_DIR,
# EXECUTE) are not handled, so they stay allowed everywhere; nor is IOCTL_DEV (ABI 5): drivers need it.
FS_WRITE_FILE = 1 << 1
FS_WRITE_RIGHTS_ABI1 = (
    FS_WRITE_FILE
    | 1 << 4  # REMOVE_DIR
    | 1 << 5  # REMOVE_FILE
    | 1 << 6  # MAKE_CHAR
    | 1 << 7  # MAKE_DIR
    | 1 << 8  # MAKE_REG
    | 1 << 9  # MAKE_SOCK
    | 1 << 10  # MAKE_FIFO
    | 1 << 11  # MAKE_BLOCK
    | 1 << 12  # MAKE_SYM
)
FS_REFER = 1 << 13  # ABI 2: link or rename into another directory
FS_TRUNCATE = 1 << 14  # ABI 3


class _RulesetAttr(ctypes.Structure):
    # struct landlock_ruleset_attr, first field only: later fields (network, scopes) stay unhandled,
    # and every ABI accepts the shorter struct.
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _errno_name(err: int) -> str:
    return errno.errorcode.get(err, str(err))


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


# Written by the GPU drivers of a confined process: device nodes, and its own threads' /proc entries
# (CUDA fails to start with error 304, "OS call failed", without the latter; measured on an H100 and
# an H200, driver 580). `/proc/self` resolves to the confining process itself, so no other process's.
DEVICE_WRITES = (Path("/dev"), Path("/proc/self/task"))


def confine(workdir: Path | None, network: bool = True, filesystem: bool = True) -> list[str]:
    """The worker's first act: no network, and writes only beneath `workdir`, the lease directory and
    `DEVICE_WRITES`. Returns notes about the layers that are off or that the OS refused."""
    from kernelevolve.evaluate.lease import lease_dir

    notes = []
    if not network:
        notes.append("network isolation is off (sandbox_network = false): the worker can reach the network")
    else:
        note = isolate_network()
        if note:
            notes.append(note)
    if not filesystem:
        notes.append(
            "write confinement is off (sandbox_filesystem = false): native code can write wherever "
            "the engine's user can"
        )
    elif workdir is None:
        notes.append("no worker directory given: native code can write wherever the engine's user can")
    else:
        note = restrict_writes([workdir, lease_dir(), *DEVICE_WRITES])
        if note:
            notes.append(note)
    return notes


def confine_child(workdir: Path, network: bool, filesystem: bool) -> None:
    """`confine` for a child between fork and exec (a `preexec_fn`, as the profiler spawns its
    processes): no imports, no lease directory (the parent holds the lease), writes beneath /proc
    allowed, and the loopback interface up inside the empty namespace (Nsight Compute talks to its
    target over it). Notes go to `workdir/sandbox-notes.txt`, written before the write rules apply."""
    notes = []
    if network:
        note = isolate_network()
        if note:
            notes.append(note)
        else:
            loopback_up()
    if filesystem:
        # The profiled program is a child of the one confined here (ncu starts it), so its threads'
        # /proc entries cannot be named in advance: /proc as a whole (for a user other than root,
        # only its own processes' entries are writable there anyway).
        note = restrict_writes([workdir, Path("/dev"), Path("/proc")])
        if note:
            notes.append(note)
    if notes:
        with open(workdir / "sandbox-notes.txt", "a") as f:
            f.write("".join(n + "\n" for n in notes))


def loopback_up() -> None:
    """Bring up `lo` in this (new, empty) network namespace: traffic to 127.0.0.1 stays inside it."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, siocgifflags, request)[:18])[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))


def isolate_network() -> str | None:
    """Move this process into a new network namespace that holds only a loopback interface, down.
    Must run while the process has one thread. Returns None, or a note saying why it could not."""
    if sys.platform != "linux":
        return "no network namespaces on this OS: the worker can reach the network; see SECURITY.md"
    if _threads() > 1:
        return "network namespace not entered (the worker already runs threads): it can reach the network"
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNET if uid == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if _libc().unshare(ctypes.c_int(flags)) != 0:
        why = _errno_name(ctypes.get_errno())
        return f"network namespace unavailable ({why}): the worker can reach the network; see SECURITY.md"
    if uid != 0:
        # In the new user namespace our ids are unmapped until we map them (to themselves): an
        # unmapped process cannot even create a file, so a failure here cannot be left as a note.
        try:
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        except OSError as exc:
            raise RuntimeError(
                f"the worker entered a user namespace but could not map its ids into it ({exc}); "
                "set sandbox_network = false"
            ) from exc
    return None


def restrict_writes(allowed: list[Path]) -> str | None:
    """Landlock: from now on this thread and everything it starts may write (create, write, truncate,
    remove, rename into, make nodes) only beneath the `allowed` paths; reads are untouched. Must run
    before any other thread exists. Returns None, or a note saying why it could not."""
    unconfined = "native code can write wherever the engine's user can; see SECURITY.md"
    if sys.platform != "linux" or platform.machine() not in LANDLOCK_MACHINES:
        return f"no Landlock on this OS or architecture: {unconfined}"
    if _threads() > 1:
        return f"Landlock not applied (the worker already runs threads): {unconfined}"
    libc = _libc()

    def syscall(*args: object) -> int:  # ints as longs; None is NULL; byref(...) a pointer
        return int(libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args)))

    abi = syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 0:
        err = ctypes.get_errno()
        why = {errno.ENOSYS: "not built into this kernel", errno.EOPNOTSUPP: "disabled at boot"}
        return f"Landlock unavailable ({why.get(err, _errno_name(err))}): {unconfined}"
    rights = FS_WRITE_RIGHTS_ABI1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(rights)
    ruleset = syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        return f"Landlock ruleset refused ({_errno_name(ctypes.get_errno())}): {unconfined}"
    try:
        for path in allowed:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # nothing there: nothing to allow
            try:
                # A rule on a file (not a directory) may carry only the rights that apply to files.
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                rule = _PathBeneathAttr(rights if is_dir else rights & (FS_WRITE_FILE | FS_TRUNCATE), fd)
                rc = syscall(
                    SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0
                )
            finally:
                os.close(fd)
            if rc != 0:
                return f"Landlock rule for {path} refused ({_errno_name(ctypes.get_errno())}): {unconfined}"
        # Required of an unprivileged restrict_self; set-uid programs run without their privileges.
        if libc.prctl(PR_SET_NO_NEW_PRIVS, *(ctypes.c_ulong(v) for v in (1, 0, 0, 0))) != 0:
            return f"no_new_privs refused ({_errno_name(ctypes.get_errno())}): {unconfined}"
        if syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return f"Landlock refused ({_errno_name(ctypes.get_errno())}): {unconfined}"
    finally:
        os.close(ruleset)
    return None


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
