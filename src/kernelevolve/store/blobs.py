"""Content-addressed blobs: bytes stored under the sha256 of their content.

A blob with digest `abcdef...` lives at `<root>/ab/abcdef...`. Writing is atomic (a temporary file
in the same folder, fsynced, then `os.replace`), so a reader sees a whole blob or none, and two
writers of the same bytes race harmlessly: both produce the same file. The same bytes are stored
once.

Deliberately not here: garbage collection (nothing is ever deleted), compression, and integrity
checks on every read. `get(..., verify=True)` re-hashes the bytes when the caller cares, e.g. before
running a candidate whose source came from the store.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from kernelevolve.errors import WorkspaceError

_DIGEST = re.compile(r"[0-9a-f]{64}")


def digest_of(data: bytes) -> str:
    """The sha256 hex digest that names `data` in a blob store."""
    return hashlib.sha256(data).hexdigest()


def candidate_hash(source: str) -> str:
    """A candidate's identity everywhere (nodes, verdicts, the tried set, blobs): the digest of its
    source's UTF-8 bytes, the name its blob is stored under."""
    return digest_of(source.encode())


class BlobStore:
    """Blobs under one root folder, created on the first `put`."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        """Where the blob `digest` lives (whether or not it exists)."""
        # Validating the name also keeps a hostile "digest" like "../../x" inside the store.
        if not _DIGEST.fullmatch(digest):
            raise WorkspaceError(
                f"{digest!r} is not a blob digest",
                hint="a digest is the 64 lowercase hex characters of a sha256",
            )
        return self.root / digest[:2] / digest

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def put(self, data: bytes) -> str:
        """Store `data` (once) and return its digest."""
        digest = digest_of(data)
        target = self.path(digest)
        if target.is_file():
            return digest
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{digest[:8]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest

    def put_text(self, text: str) -> str:
        """Store `text` as UTF-8 and return its digest."""
        return self.put(text.encode("utf-8"))

    def get(self, digest: str, verify: bool = False) -> bytes:
        """The bytes of blob `digest`; with `verify`, check they still hash to `digest`."""
        path = self.path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise WorkspaceError(
                f"blob {digest} is missing from {self.root}",
                hint="the workspace's blobs/ folder was changed by hand; re-record the spec or candidate",
            ) from None
        if verify and digest_of(data) != digest:
            raise WorkspaceError(
                f"blob {digest} is corrupt: its content hashes to {digest_of(data)}",
                hint=f"delete {path} and re-record the spec or candidate it came from",
            )
        return data

    def get_text(self, digest: str, verify: bool = False) -> str:
        return self.get(digest, verify=verify).decode("utf-8")

    def usage(self) -> tuple[int, int]:
        """(number of blobs, their total size in bytes)."""
        count = size = 0
        if not self.root.is_dir():
            return 0, 0
        for sub in self.root.iterdir():
            if not sub.is_dir():
                continue
            for blob in sub.iterdir():
                if _DIGEST.fullmatch(blob.name):
                    count += 1
                    size += blob.stat().st_size
        return count, size
