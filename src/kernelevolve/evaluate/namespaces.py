"""Namespaces for a confined process (Linux): its own network, processes, mounts and System V IPC,
and no capabilities left once they are set up.

`enter(...)` is called by a single-threaded process before it imports anything heavy (a worker, or
the profiler's launcher). It unshares, then forks twice. The process the engine spawned stays
outside as a stub that holds nothing of the worker's and exits the way the worker did (so the
engine's process handle, exit codes and kill work as before). Its child is process 1 of the new PID
namespace: it mounts the private /proc and /dev/shm, drops the capabilities, and stays as the
namespace's init, reaping. Its child, process 2, returns from `enter` and runs the caller's code
(process 1 would be shielded from its own signals: the kernel ignores a namespace's init killing
itself). In the namespace:

- **Processes.** A fresh `/proc` is mounted, so the child and what it starts see only themselves:
  the engine, other workers and every other process of the machine have no `/proc/<pid>` entry and
  no number that `kill`, `ptrace` or `process_vm_readv` could name. When process 1 dies (its
  worker ended, or the stub was killed: it dies with its parent), the kernel kills everything left in
  the namespace.
- **Shared memory.** A fresh tmpfs on `/dev/shm` and a new IPC namespace: nothing a candidate leaves
  there survives it or reaches another process.
- **Network** (optional): a new network namespace with only a loopback interface, down (or up, for
  Nsight Compute, which talks to its target over it). No address outside is reachable, not the host's
  127.0.0.1 and not its abstract Unix sockets.
- **Capabilities.** As root, the namespaces are made with root's privileges (a fresh `/proc` cannot
  be mounted from a user namespace inside most containers), and then every capability is dropped from
  the bounding, permitted, effective, inheritable and ambient sets, except those `keep` names (the
  profiler keeps CAP_SYS_ADMIN where the driver restricts the GPU's counters to it). Root's uid
  stays, its power does not: no reading another user's files, no raw devices or kernel memory, no
  modules. As any other user, a
  user namespace that maps the ids to themselves comes first, and the capabilities it grants inside
  are dropped the same way.

Where a step is refused (not Linux, no user namespaces, a container that forbids mounting `/proc`),
`enter` goes on without it and returns a note saying what is missing; the caller puts it in every
verdict's method. Deliberately not here: reads, writes and sockets by path (`landlock.py`), limits
and kills (`sandbox.py`).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kernelevolve.evaluate.landlock import errno_name, libc

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_RDONLY = 0x2, 0x4, 0x8, 0x1
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS (off), each with its lock bit.
SECUREBITS_LOCKED = 0b1 | 0b10 | 0b100 | 0b1000 | 0b100000
CAPABILITY_VERSION_3 = 0x20080522
CAPABILITIES = {"SYS_ADMIN": 21}  # the ones a caller may keep
# Entries of a fresh /proc that only privileged readers should see; hidden from a root candidate too.
PROC_MASKED = ("kcore", "keys", "timer_list", "sched_debug", "kallsyms", "kpagecount", "kpageflags")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


@dataclass
class Entered:
    """What `enter` achieved, for the caller's notes and for tests."""

    notes: list[str] = field(default_factory=list)
    pid_namespace: bool = False
    private_proc: bool = False
    private_shm: bool = False
    network: bool = False
    capabilities_dropped: bool = False


def threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def enter(network: bool, processes: bool, loopback: bool = False, keep: tuple[str, ...] = ()) -> Entered:
    """Unshare what is asked and, with `processes`, fork into a new PID namespace (only the child
    returns). Must run while this process has a single thread."""
    out = Entered()
    if sys.platform != "linux":
        if network:
            out.notes.append(
                "no network namespaces on this OS: the worker can reach the network; see SECURITY.md"
            )
        if processes:
            out.notes.append(_no_pidns("not Linux"))
        return out
    if threads() > 1:
        if network:
            out.notes.append(
                "network namespace not entered (the worker already runs threads): it can reach the network"
            )
        if processes:
            out.notes.append(_no_pidns("the worker already runs threads"))
        return out
    root = os.geteuid() == 0
    flags = (CLONE_NEWNET if network else 0) | (CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC if processes else 0)
    if flags == 0:
        return out
    user = 0 if root else CLONE_NEWUSER
    lib = libc()
    err = 0 if lib.unshare(ctypes.c_int(user | flags)) == 0 else ctypes.get_errno()
    if err and processes and network:
        # Some systems allow a network namespace but not the others: keep what can be had.
        net_err = 0 if lib.unshare(ctypes.c_int(user | CLONE_NEWNET)) == 0 else ctypes.get_errno()
        if net_err == 0:
            out.network = True
            out.notes.append(_no_pidns(f"unshare refused ({errno_name(err)})"))
            _map_ids(root)
            return out
    if err:
        if network:
            out.notes.append(
                f"network namespace unavailable ({errno_name(err)}): the worker can reach the network; "
                "see SECURITY.md"
            )
        if processes:
            out.notes.append(_no_pidns(f"unshare refused ({errno_name(err)})"))
        return out
    _map_ids(root)
    out.network = network
    if network and loopback:
        _loopback_up()
    if not processes:
        return out
    out.pid_namespace = True
    _fork_into_namespace(out, root, keep if root else ())  # only process 2 returns
    return out


def _no_pidns(why: str) -> str:
    return (
        f"no PID, mount or IPC namespace ({why}): native code can see other processes of this user "
        "(their /proc entries, environment and memory) and leave files in /dev/shm; see SECURITY.md"
    )


def _map_ids(root: bool) -> None:
    if root:
        return
    # In the new user namespace our ids are unmapped until we map them (to themselves): an unmapped
    # process cannot even create a file, so a failure here cannot be left as a note.
    uid, gid = os.geteuid(), os.getegid()
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError as exc:
        raise RuntimeError(
            f"a confined process entered a user namespace but could not map its ids into it ({exc}); "
            "set sandbox_network = false and sandbox_processes = false"
        ) from exc


def _loopback_up() -> None:
    """Bring up `lo` in this (new, empty) network namespace: traffic to 127.0.0.1 stays inside it."""
    import fcntl

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, siocgifflags, request)[:18])[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))


# -- the forks: a stub outside, an init inside, the confined process under it ----------------------


def _fork_into_namespace(out: Entered, root: bool, keep: tuple[str, ...]) -> None:
    """Fork twice. The outer parent (the process the engine spawned) stays outside as a stub; its
    child is process 1 of the new namespace, sets up the mounts, drops the capabilities and stays
    as the namespace's init; its child, process 2, returns. The stub and the init never return.

    Process 2, not process 1, runs the caller's code: the kernel ignores signals that a namespace's
    init sends itself, so a worker that was process 1 could not die of its own abort or kill."""
    alive_r, alive_w = os.pipe()  # EOF at the init: the stub is gone
    status_r, status_w = os.pipe()  # the init tells the stub how process 2 ended
    init = os.fork()
    if init:
        os.close(alive_r)
        os.close(status_w)
        _stub(init, status_r, alive_w)
    os.close(alive_w)
    os.close(status_r)
    _die_with_parent(alive_r)
    _set_up_mounts(out, root)
    if drop_capabilities(keep):
        out.capabilities_dropped = True
    else:
        out.notes.append(f"capabilities could not be dropped ({errno_name(ctypes.get_errno())})")
    libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # nothing in the namespace may ptrace or read the init
    child = os.fork()
    if child:
        _init(child, status_w, alive_r)
    os.close(status_w)
    os.close(alive_r)
    libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as any process (CUDA writes its own /proc entries)
    _die_with_parent(None)


def _die_with_parent(alive_r: int | None) -> None:
    libc().prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    # The parent may have died before the line above: its end of the pipe is then closed (EOF).
    if alive_r is not None and select.select([alive_r], [], [], 0)[0]:
        os._exit(1)


def _close_fds(keep: tuple[int, ...]) -> None:
    """Drop everything inherited (the worker's channel, its device lease) but stdio and `keep`."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _ignore_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)  # the engine ends a worker with SIGKILL, to its group


def _init(child: int, status_w: int, alive_r: int) -> None:
    """Process 1: reap every process of the namespace; when process 2 ends, tell the stub how and
    exit, which kills whatever is left in the namespace."""
    _close_fds((status_w, alive_r))
    _ignore_signals()
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == child:
            os.write(status_w, struct.pack("i", status))
            os._exit(0)


def _stub(init: int, status_r: int, alive_w: int) -> None:
    """Outside: hold nothing of the worker's and end exactly as process 2 did, so that the engine's
    handle reads a crash inside as a crash of the process it spawned."""
    _close_fds((status_r, alive_w))
    _ignore_signals()
    while True:
        try:
            _, status = os.waitpid(init, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    data = os.read(status_r, 4)
    if len(data) == 4:  # else the init was killed (by the engine's kill, or the OOM killer): mirror that
        status = struct.unpack("i", data)[0]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # whose handlers cannot be set
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is to be ignored
    os._exit(os.waitstatus_to_exitcode(status))


# -- inside: mounts and capabilities ------------------------------------------------------------------


def _mount(lib: ctypes.CDLL, source: str, target: str, fstype: str | None, flags: int, data: str = "") -> int:
    rc = lib.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    return 0 if rc == 0 else ctypes.get_errno()


def _set_up_mounts(out: Entered, root: bool) -> None:
    lib = libc()
    # Our mounts stay ours, and the host's later mounts stay theirs.
    err = _mount(lib, "none", "/", None, MS_REC | MS_PRIVATE)
    if err:
        out.notes.append(
            f"mounts could not be made private ({errno_name(err)}): /proc and /dev/shm are the host's; "
            + _no_pidns("no private mounts").split(": ", 1)[1]
        )
        return
    err = _mount(lib, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if err:
        out.notes.append(
            f"a private /proc could not be mounted ({errno_name(err)}): native code can read other "
            "processes' /proc entries (environment, memory) as the engine's user; see SECURITY.md"
        )
    else:
        out.private_proc = True
        if root:
            for name in PROC_MASKED:
                _mount(lib, "/dev/null", f"/proc/{name}", None, MS_BIND)
    if Path("/dev/shm").is_dir():
        err = _mount(lib, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=50%")
        if err:
            out.notes.append(
                f"a private /dev/shm could not be mounted ({errno_name(err)}): files native code leaves "
                "there outlive it; see SECURITY.md"
            )
        else:
            out.private_shm = True
    else:
        out.private_shm = True  # nothing shared to leave files in


def _last_cap() -> int:
    try:
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return 40


def drop_capabilities(keep: tuple[str, ...] = ()) -> bool:
    """Empty the bounding set (what an exec can regain) but for `keep`, clear the ambient set, lock
    root's special treatment off, and set permitted = effective = inheritable = `keep`."""
    lib = libc()
    kept = {CAPABILITIES[name] for name in keep}
    for cap in range(_last_cap() + 1):
        if cap not in kept:
            lib.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0)  # EINVAL for caps unknown here
    lib.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
    lib.prctl(PR_SET_SECUREBITS, ctypes.c_ulong(SECUREBITS_LOCKED), 0, 0, 0)
    mask = [0, 0]
    for cap in kept:
        mask[cap // 32] |= 1 << (cap % 32)
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)(*(_CapData(m, m, m) for m in mask))
    return int(lib.capset(ctypes.byref(header), data)) == 0
