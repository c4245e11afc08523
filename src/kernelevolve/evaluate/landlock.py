"""Landlock, the kernel's unprivileged access control (Linux 5.13+): what a confined process may read,
write and connect to, for itself and everything it starts.

`restrict(reads, writes, ...)` builds one ruleset and enforces it on the calling thread:
- Reads (open for reading, list a directory, execute) only beneath `reads` and `writes`.
- Writes (create, write, truncate, remove, rename or link into) only beneath `writes`. Device nodes
  may be made nowhere, so a process cannot mint a node for a disk it may not open.
- TCP (ABI 4+, `deny_tcp`): no bind and no connect at all, beneath the network namespace.
- Scopes (ABI 6+): no connecting to abstract Unix sockets and no signals outside the domain.
A rule on a file (not a directory) carries only the rights that apply to files. Paths that do not
exist are skipped. Rights a kernel's ABI does not know are left out; `LandlockResult.abi` tells which.

Landlock also forbids a confined process to mount, unmount or pivot its root (whatever its
capabilities), and to ptrace a process outside its domain.

Deliberately not here: choosing the paths (`sandbox.py` does), and ioctls on device nodes (IOCTL_DEV,
ABI 5): GPU drivers live on them, and the node itself must already be readable or writable.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# From number 424 on, every architecture (x86_64 and aarch64 included) shares one numbering of system
# calls; alpha, the exception, is not listed.
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
MACHINES = ("x86_64", "aarch64", "riscv64", "ppc64le", "s390x")
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

# File-system rights (include/uapi/linux/landlock.h).
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
READ_RIGHTS = EXECUTE | READ_FILE | READ_DIR
# FIFOs included: Nsight Compute fails to launch its target without them (seen on an H100).
WRITE_RIGHTS_ABI1 = (
    WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_SYM
)
NODE_RIGHTS = MAKE_CHAR | MAKE_BLOCK  # handled, never granted: no device node can be made
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE
# Network rights (ABI 4) and scopes (ABI 6).
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    # struct landlock_ruleset_attr; a kernel takes the prefix its ABI knows (8, 16 or 24 bytes).
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def errno_name(err: int) -> str:
    return errno.errorcode.get(err, str(err))


@dataclass
class LandlockResult:
    """What was enforced: `abi` 0 and a `note` when nothing was."""

    abi: int = 0
    note: str | None = None
    reads: bool = False
    tcp: bool = False
    scopes: bool = False


def abi_version() -> int:
    """The running kernel's Landlock ABI, or -errno (ENOSYS: not built in; EOPNOTSUPP: off at boot)."""
    if sys.platform != "linux" or platform.machine() not in MACHINES:
        return -errno.ENOSYS
    rc = _syscall(libc(), SYS_CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    return rc if rc >= 0 else -ctypes.get_errno()


def _syscall(lib: ctypes.CDLL, *args: object) -> int:  # ints as longs; None is NULL; byref(...) a pointer
    return int(lib.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args)))


def restrict(
    reads: Iterable[Path] | None,
    writes: Iterable[Path],
    deny_tcp: bool = False,
    scope: bool = True,
) -> LandlockResult:
    """Enforce the ruleset on this thread and all it starts later. `reads` None leaves reads
    unrestricted. Must run before any other thread exists (the caller checks)."""
    what = "native code can read and write wherever the engine's user can; see SECURITY.md"
    if sys.platform != "linux" or platform.machine() not in MACHINES:
        return LandlockResult(note=f"no Landlock on this OS or architecture: {what}")
    lib = libc()
    abi = _syscall(lib, SYS_CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    if abi < 0:
        err = ctypes.get_errno()
        why = {errno.ENOSYS: "not built into this kernel", errno.EOPNOTSUPP: "disabled at boot"}
        return LandlockResult(note=f"Landlock unavailable ({why.get(err, errno_name(err))}): {what}")
    writes_mask = WRITE_RIGHTS_ABI1 | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0)
    handled_fs = writes_mask | NODE_RIGHTS | (READ_RIGHTS if reads is not None else 0)
    tcp = deny_tcp and abi >= 4
    scopes = scope and abi >= 6
    attr = _RulesetAttr(
        handled_fs,
        NET_BIND_TCP | NET_CONNECT_TCP if tcp else 0,
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if scopes else 0,
    )
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _syscall(lib, SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        return LandlockResult(note=f"Landlock ruleset refused ({errno_name(ctypes.get_errno())}): {what}")
    read_mask = READ_RIGHTS if reads is not None else 0
    rules = [(Path(p), read_mask) for p in reads or ()] + [(Path(p), writes_mask | read_mask) for p in writes]
    try:
        for path, rights in rules:
            if not _add_rule(lib, ruleset, path, rights):
                return LandlockResult(
                    note=f"Landlock rule for {path} refused ({errno_name(ctypes.get_errno())}): {what}"
                )
        # Required of an unprivileged restrict_self; set-uid programs run without their privileges.
        if lib.prctl(PR_SET_NO_NEW_PRIVS, *(ctypes.c_ulong(v) for v in (1, 0, 0, 0))) != 0:
            return LandlockResult(note=f"no_new_privs refused ({errno_name(ctypes.get_errno())}): {what}")
        if _syscall(lib, SYS_RESTRICT_SELF, ruleset, 0) != 0:
            return LandlockResult(note=f"Landlock refused ({errno_name(ctypes.get_errno())}): {what}")
    finally:
        os.close(ruleset)
    return LandlockResult(abi=abi, reads=reads is not None, tcp=tcp, scopes=scopes)


def _add_rule(lib: ctypes.CDLL, ruleset: int, path: Path, rights: int) -> bool:
    """Allow `rights` beneath `path`. A missing path is no error: nothing there to allow."""
    if not rights:
        return True
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        return _syscall(lib, SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0) == 0
    finally:
        os.close(fd)
