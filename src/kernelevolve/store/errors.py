"""What the store's callers need to know about its failures."""

from __future__ import annotations

import errno
import sqlite3


def storage_failed(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is the disk refusing a write: SQLite's SQLITE_FULL or
    SQLITE_IOERR ("disk I/O error", what it reports for EFBIG and EIO), or ENOSPC, EDQUOT, EFBIG or EIO
    from the OS. Not the run's fault, and nothing a retry in this process would mend."""
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        if isinstance(seen, sqlite3.OperationalError) and (
            "is full" in str(seen) or "I/O error" in str(seen)
        ):
            return True
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
