"""Verdicts bound to what was evaluated: a seal on every stored evaluation, checked when it is read.

A coding agent with a shell (issue O) could write a verdict row straight into the workspace's SQLite
file, or replace a candidate's blob after it was judged, and every report would repeat the forged
numbers. So each evaluation row carries a seal: an HMAC-SHA256 over what the row binds (the spec's
fingerprint, the candidate's hash, platform, device, status, correctness, speedups, fitness and the
whole verdict, which names the harness that judged it), under a key kept outside the workspace:

    $KERNELEVOLVE_SEAL_KEY_FILE, else $XDG_CONFIG_HOME/kernelevolve/seal.key (~/.config/...), made
    on first use with 32 random bytes, readable by its owner alone (0600)

`verify(row)` says what is wrong with a row read back, or None: its seal does not match its fields
(a field edited, or a row inserted without the key), or its candidate's blob no longer hashes to the
candidate's hash (a blob replaced). A seal names the key it was made with (`key_id`, a digest of the
key that gives nothing of it away), so a workspace carried to a machine with another key reads
"sealed under another key" with both ids and what to do, not "edited" (its rows are refused all the
same: nothing this machine cannot check is ranked or reused). Seals written before the id (a bare
HMAC) are verified as they are. The workspace marks such a row `tampered` wherever it is read
(`Workspace.nodes`, the verdicts it reuses): never ranked, never reused, and the reason said.

What it protects against, and what not (SECURITY.md): anything that can change the workspace but
cannot read the key (an agent confined to the project folder or a container, a shared workspace on a
network drive). A process running as the user, with the user's home folder, can read the key and
forge a seal: against that, run the agent as another user or in a container, as the README says.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The columns an evaluation's seal binds, in order (the row's own id and time are not evidence).
SEALED = (
    "spec_fingerprint", "candidate_hash", "platform", "device", "status", "correct",
    "speedup_vs_eager", "speedup_vs_compile", "fitness", "verdict_json",
)  # fmt: skip

_KEYS: dict[Path, bytes] = {}


def key_path() -> Path:
    explicit = os.environ.get("KERNELEVOLVE_SEAL_KEY_FILE")
    if explicit:
        return Path(explicit).expanduser()
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "kernelevolve" / "seal.key"


def key() -> bytes:
    """The sealing key, made on first use (0600, its folder 0700)."""
    path = key_path()
    if path not in _KEYS:
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        _KEYS[path] = bytes.fromhex(path.read_text().strip())
    return _KEYS[path]


def key_id() -> str:
    """A short name of the sealing key, written beside each seal: a digest, not the key nor a way to it."""
    return hashlib.sha256(b"kernelevolve seal key id\0" + key()).hexdigest()[:12]


def _mac(row: Mapping[str, Any]) -> str:
    fields = [_canonical(name, row.get(name)) for name in SEALED]
    message = json.dumps(fields, separators=(",", ":")).encode()
    return hmac.new(key(), message, hashlib.sha256).hexdigest()


def seal(row: Mapping[str, Any]) -> str:
    """The seal of an evaluation row (its `SEALED` columns as stored): `KEYID:HMAC`."""
    return f"{key_id()}:{_mac(row)}"


def verify(row: Mapping[str, Any], blob_ok: bool = True) -> str | None:
    """Why the row read back is not what was sealed, or None. `blob_ok`: whether the candidate's
    stored blob still hashes to the row's candidate hash (the store checks it)."""
    stored = row.get("seal")
    if not stored:
        return "it carries no seal (written by something other than kernelevolve's store)"
    sealed_by, _, mac = str(stored).rpartition(":")  # "" for a seal written before the key's id
    if sealed_by not in ("", key_id()):
        return (
            f"it was sealed under another seal key (id {sealed_by}; this machine's, {key_path()}, is "
            f"{key_id()}): copy the key that sealed it here (KERNELEVOLVE_SEAL_KEY_FILE names its file) "
            "to have it verified, or evaluate it again"
        )
    if not hmac.compare_digest(mac, _mac(row)):
        return "its fields no longer match its seal (edited after it was written)"
    if not blob_ok:
        return "its candidate's blob was replaced after it was judged (the blob no longer hashes to it)"
    return None


def foreign(stored: str | None) -> str | None:
    """The id of the key a stored seal was made with where it is not this machine's key, else None
    (this key's seal, a seal from before key ids, or none)."""
    sealed_by = str(stored or "").rpartition(":")[0]
    return None if sealed_by in ("", key_id()) else sealed_by


_REAL = frozenset({"speedup_vs_eager", "speedup_vs_compile", "fitness"})


def _canonical(name: str, value: Any) -> Any:
    """A column's value as the seal reads it, the same before it is written and after it is read back
    (SQLite gives a REAL column's 1 back as 1.0, a boolean as 0/1)."""
    if value is None:
        return None
    if name in _REAL:
        return repr(float(value))
    if name == "correct":
        return int(bool(value))
    return str(value)
