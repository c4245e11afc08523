"""The workspace: one folder holding one SQLite database and the content-addressed blobs beside it.

    <root>/kernelevolve.db   specs, candidates, evaluations, baseline and hardware-profile caches
    <root>/blobs/ab/abcd...  spec and candidate sources, by sha256 (see `blobs.py`)
    <root>/cache/<name>/     folders the harness owns (trusted compile caches)
    <root>/runs/<run id>/    what a run writes for people: the best kernel, the report, the export

Runs and their nodes are `RunsMixin`'s (`runs.py`).

The database runs in WAL mode with foreign keys on and a 30 s busy timeout, so several processes can
share a workspace. Inside one process, one connection is shared by threads (the evaluator pool
records verdicts from several) behind a lock. Every write is one `BEGIN IMMEDIATE` transaction: a
writer takes the lock up front and waits for another process's writer instead of failing halfway.
Sources are written as blobs before the rows that name them, so a crash can leave an unreferenced
blob but never a row whose blob is missing.

Deliberately not here: interpretation. Verdicts, baselines and hardware profiles are stored as the
JSON dicts the harness hands over, with a few columns copied out for querying; what they mean
belongs to `kernelevolve.evaluate` and `kernelevolve.profile`. Nothing is ever deleted.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from kernelevolve.errors import WorkspaceError
from kernelevolve.store.benches import BenchesMixin
from kernelevolve.store.blobs import BlobStore, digest_of
from kernelevolve.store.knowledge import KnowledgeMixin
from kernelevolve.store.migrations import MIGRATIONS, check_known, migrate
from kernelevolve.store.runs import RunsMixin, _json, _now
from kernelevolve.store.seal import SEALED, seal, verify

DB_NAME = "kernelevolve.db"
BUSY_TIMEOUT_S = 30.0
_CACHE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _parse(row: dict[str, Any], column: str, key: str) -> dict[str, Any]:
    row[key] = json.loads(row.pop(column))
    return row


class Workspace(RunsMixin, KnowledgeMixin, BenchesMixin):
    """A workspace folder. Use `Workspace.open(root)`, preferably as a context manager."""

    def __init__(self, root: Path, conn: sqlite3.Connection):
        self.root = root
        self.blobs = BlobStore(root / "blobs")
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()

    @classmethod
    def open(cls, root: Path | str) -> Workspace:
        """Open the workspace at `root`, creating it and migrating its database as needed."""
        root = Path(root)
        if root.exists() and not root.is_dir():
            raise WorkspaceError(
                f"workspace path {root} exists and is not a directory",
                hint="pass --workspace a directory (it is created if missing), or move the file away",
            )
        db_path, conn, opened = root / DB_NAME, None, False
        try:
            root.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA journal_mode = WAL")  # the first statement that reads the file
            conn.execute("PRAGMA synchronous = NORMAL")  # durable enough under WAL, and much faster
            migrate(conn)
            opened = True
        except (OSError, sqlite3.OperationalError) as e:
            raise WorkspaceError(
                f"cannot open workspace database {db_path}: {e}",
                hint="check the path and its permissions, and whether another process keeps it locked",
            ) from e
        except sqlite3.DatabaseError as e:  # e.g. "file is not a database"
            raise WorkspaceError(
                f"{db_path} is not a usable SQLite database: {e}",
                hint="point --workspace at another directory, or move the file away to start afresh",
            ) from e
        finally:
            if conn is not None and not opened:
                conn.close()
        return cls(root, conn)

    @classmethod
    def open_readonly(cls, root: Path | str) -> Workspace:
        """Open an existing workspace for reading only, as a viewer beside a running search does.

        The connection is SQLite's read-only mode plus `query_only`, so a bug in a reader cannot write;
        under WAL a reader never blocks the search's writer and sees each committed transaction whole.
        Nothing is created or migrated: a missing workspace, or one an older kernelevolve left without
        this version's migrations, is refused with what to do.
        """
        root = Path(root)
        db_path, conn, opened = root / DB_NAME, None, False
        if not db_path.is_file():
            raise WorkspaceError(
                f"no workspace database at {db_path}",
                hint="pass --workspace the folder a search or bench wrote (it holds kernelevolve.db)",
            )
        try:
            conn = sqlite3.connect(
                f"{db_path.resolve().as_uri()}?mode=ro",
                uri=True,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA query_only = ON")
            check_known(conn)
            applied = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
            missing = [fn.__name__ for fn in MIGRATIONS if fn.__name__ not in applied]
            if missing:
                raise WorkspaceError(
                    f"the workspace database lacks this version's migrations ({', '.join(missing)})",
                    hint="run any command that writes it once, e.g. `kernelevolve runs -w "
                    f"{root}`, or let the running search finish",
                )
            opened = True
        except sqlite3.DatabaseError as e:  # unreadable, locked for 30 s, or not a database
            raise WorkspaceError(
                f"cannot read workspace database {db_path}: {e}",
                hint="check the path and its permissions; a database being created may need a moment",
            ) from e
        finally:
            if conn is not None and not opened:
                conn.close()
        return cls(root, conn)

    @property
    def db_path(self) -> Path:
        return self.root / DB_NAME

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Workspace:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    # -- plumbing ---------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise WorkspaceError(f"workspace {self.root} is closed", hint="open it again with Workspace.open")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as e:
                raise WorkspaceError(
                    f"cannot write to workspace {self.root}: {e}",
                    hint=f"if it is locked, another process held it for over {BUSY_TIMEOUT_S:.0f} s; "
                    "wait for it or stop it",
                ) from e
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(row) for row in self._connection().execute(sql, params)]

    # -- specs and candidates ---------------------------------------------------------------------

    def record_spec(
        self, fingerprint: str, name: str, path: str, source: str, info: Mapping[str, Any]
    ) -> None:
        """Insert or update the spec `fingerprint`; its source goes to the blob store."""
        blob = self.blobs.put_text(source)
        now = _now()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO specs (fingerprint, name, path, source_blob, info_json, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (fingerprint) DO UPDATE SET "
                "name = excluded.name, path = excluded.path, source_blob = excluded.source_blob, "
                "info_json = excluded.info_json, updated_at = excluded.updated_at",
                (fingerprint, name, str(path), blob, _json(dict(info)), now, now),
            )

    def spec(self, fingerprint: str) -> dict[str, Any] | None:
        """The spec row with `info` parsed and `source` read back, or None."""
        rows = self._rows("SELECT * FROM specs WHERE fingerprint = ?", (fingerprint,))
        if not rows:
            return None
        row = _parse(rows[0], "info_json", "info")
        row["source"] = self.blobs.get_text(row["source_blob"])
        return row

    def record_candidate(self, source: str, path: str, kind: str | None) -> str:
        """Record a candidate's source; return its hash (the sha256 of the source, its blob digest).

        Idempotent: recording the same source again keeps the first path and kind.
        """
        data = source.encode("utf-8")
        digest = self.blobs.put(data)
        with self._write() as conn:
            conn.execute(
                "INSERT INTO candidates (hash, path, kind, size_bytes, created_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (hash) DO NOTHING",
                (digest, str(path), kind, len(data), _now()),
            )
        return digest

    def candidate(self, candidate_hash: str) -> dict[str, Any] | None:
        """The candidate row with `source` read back, or None."""
        rows = self._rows("SELECT * FROM candidates WHERE hash = ?", (candidate_hash,))
        if not rows:
            return None
        rows[0]["source"] = self.blobs.get_text(candidate_hash)
        return rows[0]

    # -- evaluations ------------------------------------------------------------------------------

    def record_evaluation(self, verdict: Mapping[str, Any]) -> int:
        """Store one verdict (as from `Verdict.to_dict()`); return the evaluation's id.

        `status` is required. An empty spec fingerprint or candidate hash is stored as NULL; a non-empty
        one must have been recorded first (`record_spec`, `record_candidate`).
        """
        with self._write() as conn:
            return self._insert_evaluation(conn, verdict)

    def reusable_evaluation(
        self, candidate_hash: str, spec_fingerprint: str, key: str, statuses: Iterable[str]
    ) -> tuple[int, dict[str, Any]] | None:
        """The newest stored evaluation of this candidate and spec whose verdict was recorded under
        `key` (its `method.key`) with one of `statuses`, as (id, verdict); None where there is none.
        What a key stands for, and which statuses may be reused, is the harness's (`evaluate.reuse`)."""
        wanted = set(statuses)
        rows = self._rows(
            f"SELECT id, {', '.join(SEALED)}, seal FROM evaluations WHERE candidate_hash = ? "
            "AND spec_fingerprint = ? ORDER BY id DESC",
            (candidate_hash, spec_fingerprint),
        )
        for row in rows:
            if row["status"] not in wanted or self.tampered(row):  # a forged verdict is never reused
                continue
            verdict = json.loads(row["verdict_json"])
            if key and (verdict.get("method") or {}).get("key") == key:
                return int(row["id"]), verdict
        return None

    def _insert_evaluation(self, conn: sqlite3.Connection, verdict: Mapping[str, Any]) -> int:
        """`record_evaluation` inside a transaction the caller holds."""
        spec_fp = verdict.get("spec_fingerprint") or None
        cand = verdict.get("candidate_hash") or None
        method = verdict.get("method") or {}
        fitness = verdict.get("fitness")
        row = {
            "spec_fingerprint": spec_fp,
            "candidate_hash": cand,
            "platform": verdict.get("platform") or None,
            "device": method.get("device") or None,
            "status": str(verdict["status"]),
            "correct": int(bool(verdict.get("correct", False))),
            "speedup_vs_eager": verdict.get("speedup_vs_eager"),
            "speedup_vs_compile": verdict.get("speedup_vs_compile"),
            "fitness": None if fitness is None else float(fitness),
            "verdict_json": _json(dict(verdict)),
        }
        try:
            cursor = conn.execute(
                f"INSERT INTO evaluations (created_at, {', '.join(SEALED)}, seal) "
                f"VALUES (?, {', '.join('?' for _ in SEALED)}, ?)",
                (_now(), *(row[name] for name in SEALED), seal(row)),
            )
        except sqlite3.IntegrityError as e:  # a foreign key: the spec or candidate was never recorded
            raise WorkspaceError(
                f"the verdict names spec {spec_fp!r} and candidate {cand!r}, not both recorded here",
                hint="call Workspace.record_spec and Workspace.record_candidate before record_evaluation",
            ) from e
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def tampered(self, row: Mapping[str, Any]) -> str | None:
        """Why a stored evaluation row (its `SEALED` columns and `seal`) is not what was written, or
        None: a field edited, a row written without the store, its candidate's blob replaced."""
        digest = row.get("candidate_hash")
        blob_ok = True
        if digest and self.blobs.has(digest):
            # The engine reads its tree before every decision: a blob is hashed again only when its
            # file changed (size or modification time), not at every read.
            st = self.blobs.path(digest).stat()
            key = (digest, st.st_size, st.st_mtime_ns)
            cache: dict[tuple[str, int, int], bool] = self.__dict__.setdefault("_blob_checked", {})
            if key not in cache:
                if len(cache) > 8192:
                    cache.clear()
                cache[key] = digest_of(self.blobs.get(digest)) == digest
            blob_ok = cache[key]
        return verify(row, blob_ok)

    def _evaluation_row(self, row: dict[str, Any]) -> dict[str, Any]:
        row["tampered"] = self.tampered(row)
        row["correct"] = bool(row["correct"])
        return _parse(row, "verdict_json", "verdict")

    def evaluations(self, spec_fingerprint: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Evaluations, newest first, optionally of one spec; each with the verdict under `verdict`."""
        where, params = ("WHERE spec_fingerprint = ?", (spec_fingerprint,)) if spec_fingerprint else ("", ())
        rows = self._rows(
            f"SELECT * FROM evaluations {where} ORDER BY created_at DESC, id DESC LIMIT ?", (*params, limit)
        )
        return [self._evaluation_row(row) for row in rows]

    def evaluation(self, id: int) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM evaluations WHERE id = ?", (id,))
        return self._evaluation_row(rows[0]) if rows else None

    # -- caches -----------------------------------------------------------------------------------

    def put_baseline(
        self, spec_fingerprint: str, device_key: str, shape: str, data: Mapping[str, Any]
    ) -> None:
        """Cache baseline timings for one (spec, device key, shape), replacing any earlier ones."""
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO baselines (spec_fingerprint, device_key, shape, data_json, measured_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (spec_fingerprint, device_key, shape, _json(dict(data)), _now()),
            )

    def get_baseline(self, spec_fingerprint: str, device_key: str, shape: str) -> dict[str, Any] | None:
        """The data last given to `put_baseline` for this key, or None."""
        rows = self._rows(
            "SELECT data_json FROM baselines WHERE spec_fingerprint = ? AND device_key = ? AND shape = ?",
            (spec_fingerprint, device_key, shape),
        )
        return json.loads(rows[0]["data_json"]) if rows else None

    def baselines(self, spec_fingerprint: str) -> list[dict[str, Any]]:
        """All cached baselines of a spec: key columns, `measured_at`, and `data`."""
        rows = self._rows(
            "SELECT * FROM baselines WHERE spec_fingerprint = ? ORDER BY device_key, shape",
            (spec_fingerprint,),
        )
        return [_parse(row, "data_json", "data") for row in rows]

    def put_hardware_profile(self, key: str, platform: str, device: str, data: Mapping[str, Any]) -> None:
        """Store a measured hardware profile under `key`, replacing any earlier one."""
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO hardware_profiles (key, platform, device, data_json, measured_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, platform, device, _json(dict(data)), _now()),
            )

    def get_hardware_profile(self, key: str) -> dict[str, Any] | None:
        """The profile's data plus `measured_at`, or None."""
        rows = self._rows("SELECT data_json, measured_at FROM hardware_profiles WHERE key = ?", (key,))
        if not rows:
            return None
        return {**json.loads(rows[0]["data_json"]), "measured_at": rows[0]["measured_at"]}

    def hardware_profiles(self) -> list[dict[str, Any]]:
        """All profiles: `key`, `platform`, `device`, `measured_at`, and `data`."""
        rows = self._rows("SELECT * FROM hardware_profiles ORDER BY key")
        return [_parse(row, "data_json", "data") for row in rows]

    def cache_dir(self, name: str) -> Path:
        """The folder `cache/<name>` of the workspace, created on demand."""
        if not _CACHE_NAME.fullmatch(name):
            raise WorkspaceError(
                f"{name!r} is not a cache name", hint="use letters, digits, '.', '_' and '-', no slashes"
            )
        path = self.root / "cache" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def stats(self) -> dict[str, int]:
        """Counts of rows per table and of blobs, and the blobs' total size."""
        counts: dict[str, int] = {}
        for table in (
            "specs",
            "candidates",
            "evaluations",
            "baselines",
            "hardware_profiles",
            "runs",
            "nodes",
        ):
            counts[table] = self._rows(f"SELECT count(*) AS n FROM {table}")[0]["n"]
        counts["blobs"], counts["blob_bytes"] = self.blobs.usage()
        return counts


__all__ = ["DB_NAME", "Workspace"]
