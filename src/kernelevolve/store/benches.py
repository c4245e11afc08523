"""The benches' tables in the workspace database (mixed into `Workspace`).

    benches       one row per bench: directory, options, the key that finds it again, status
    bench_items   one row per spec file of a bench: its run, status and, once done, its result row

Storage only: which specs a bench has, how a run is driven and how results are scored live in
`kernelevolve.bench`.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from kernelevolve.errors import WorkspaceError
from kernelevolve.store.runs import _json, _now

ITEM_STATUSES = ("pending", "running", "done", "load_error")


class BenchesMixin:
    """Methods for `Workspace`; they rely on its `_write` and `_rows`."""

    if TYPE_CHECKING:

        def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...
        def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]: ...

    def create_bench(self, key: str, directory: str, config: Mapping[str, Any]) -> str:
        bench_id = "b" + secrets.token_hex(4)
        now = _now()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO benches (id, key, dir, config_json, status, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, 'running', ?, ?)",
                (bench_id, key, directory, _json(dict(config)), now, now),
            )
        return bench_id

    def find_bench(self, key: str) -> str | None:
        """The newest bench with this key (same directory and options), if any."""
        rows = self._rows("SELECT id FROM benches WHERE key = ? ORDER BY created_at DESC LIMIT 1", (key,))
        return str(rows[0]["id"]) if rows else None

    def resolve_bench(self, bench_id: str) -> str:
        rows = self._rows("SELECT id FROM benches WHERE id LIKE ? ORDER BY created_at", (bench_id + "%",))
        if not rows:
            raise WorkspaceError(
                f"no bench {bench_id!r} in this workspace", hint="list them: kernelevolve benches"
            )
        if len(rows) > 1:
            raise WorkspaceError(
                f"bench id {bench_id!r} is ambiguous", hint="candidates: " + ", ".join(r["id"] for r in rows)
            )
        return str(rows[0]["id"])

    def bench(self, bench_id: str) -> dict[str, Any]:
        bench_id = self.resolve_bench(bench_id)
        row = self._rows("SELECT * FROM benches WHERE id = ?", (bench_id,))[0]
        row["bench_id"] = row.pop("id")
        row["config"] = json.loads(row.pop("config_json"))
        return row

    def bench_change_token(self, bench_id: str) -> str:
        """A value that changes whenever the bench or any of its items is written (a live view's poll)."""
        row = self._rows(
            "SELECT (SELECT updated_at FROM benches WHERE id = ?) AS b, count(*) AS n, max(updated_at) AS u "
            "FROM bench_items WHERE bench_id = ?",
            (bench_id, bench_id),
        )[0]
        return "|".join(str(v) for v in row.values())

    def benches(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT b.id, b.dir, b.status, b.created_at, b.updated_at, b.config_json, "
            "(SELECT COUNT(*) FROM bench_items i WHERE i.bench_id = b.id) AS items, "
            "(SELECT COUNT(*) FROM bench_items i WHERE i.bench_id = b.id AND i.status = 'done') AS done "
            "FROM benches b ORDER BY b.created_at DESC LIMIT ?",
            (limit,),
        )
        for row in rows:
            row["bench_id"] = row.pop("id")
            row["config"] = json.loads(row.pop("config_json"))
        return rows

    def set_bench_status(self, bench_id: str, status: str) -> None:
        with self._write() as conn:
            conn.execute(
                "UPDATE benches SET status = ?, updated_at = ? WHERE id = ?", (status, _now(), bench_id)
            )

    def set_bench_config(self, bench_id: str, config: Mapping[str, Any]) -> None:
        """Replace a bench's stored options (how a later invocation ran it, say; not its key)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE benches SET config_json = ?, updated_at = ? WHERE id = ?",
                (_json(dict(config)), _now(), bench_id),
            )

    def put_bench_item(self, bench_id: str, path: str, position: int, name: str, **fields: Any) -> None:
        """Insert or update one spec's row: `fingerprint`, `file_key`, `run_id`, `status`, `error`, `result`."""
        if "status" in fields and fields["status"] not in ITEM_STATUSES:
            raise ValueError(f"bench item status {fields['status']!r}")
        now = _now()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO bench_items (bench_id, path, position, name, status, updated_at) "
                "VALUES (?, ?, ?, ?, 'pending', ?) ON CONFLICT (bench_id, path) DO UPDATE SET "
                "position = excluded.position, name = excluded.name, updated_at = excluded.updated_at",
                (bench_id, path, position, name, now),
            )
            for column in ("fingerprint", "file_key", "run_id", "status", "error"):
                if column in fields:
                    conn.execute(
                        f"UPDATE bench_items SET {column} = ? WHERE bench_id = ? AND path = ?",
                        (fields[column], bench_id, path),
                    )
            if "result" in fields:
                conn.execute(
                    "UPDATE bench_items SET result_json = ? WHERE bench_id = ? AND path = ?",
                    (None if fields["result"] is None else _json(fields["result"]), bench_id, path),
                )

    def bench_items(self, bench_id: str) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM bench_items WHERE bench_id = ? ORDER BY position, path", (bench_id,))
        for row in rows:
            text = row.pop("result_json")
            row["result"] = json.loads(text) if text else None
        return rows


__all__ = ["ITEM_STATUSES", "BenchesMixin"]
