"""Device leases: at most one correctness-and-timing phase per device on this machine at a time.

A lease is an exclusive `flock` on a file named after the device, in a directory shared by every
kernelevolve process of this user (`$TMPDIR/kernelevolve-<uid>/leases`). Compilation needs no lease,
so one candidate compiles while another is timed; a candidate's first run on the device, its
correctness trials and its timing hold it. The kernel drops the lock when its holder dies, so a
killed worker can never leave a device locked.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path


def lease_dir() -> Path:
    path = Path(
        os.environ.get("KERNELEVOLVE_LEASE_DIR")
        or Path(tempfile.gettempdir()) / f"kernelevolve-{os.getuid()}" / "leases"
    )
    path.mkdir(parents=True, exist_ok=True)
    return path


class DeviceLease:
    def __init__(self, key: str, directory: Path | None = None):
        self.path = (directory or lease_dir()) / f"{key}.lock"
        self.fd: int | None = None

    def acquire(self) -> DeviceLease:
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> DeviceLease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
