"""The knowledge base's tables in the workspace database (mixed into `Workspace`).

    kb_docs / kb_fts   indexed documents and their FTS5 index (one transaction keeps them in step)
    kb_meta            which version of the shipped documents is indexed
    skills             distilled improvements with provenance; only `verified` ones are indexed
    shared_kernels     verified kernels imported from another workspace, for warm starts

Storage only: what to index, how to rank and when a skill counts as verified live in `knowledge/`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from kernelevolve.store.runs import _json, _now


class DocFields(Protocol):
    """What the store keeps of a knowledge document (`knowledge.docs.Doc` has these fields)."""

    id: str
    title: str
    category: str
    body: str
    platforms: list[str]
    targets: list[str]
    tags: list[str]
    triggers: list[str]
    level: str
    origin: str
    path: str
    meta: dict[str, Any]


def _fts_text(values: Iterable[str]) -> str:
    return " ".join(v.replace("-", " ").replace("_", " ") for v in values)


class KnowledgeMixin:
    """Methods for `Workspace`; they rely on its `_write` and `_rows`."""

    if TYPE_CHECKING:

        def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...
        def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]: ...

    # -- documents --------------------------------------------------------------------------------

    def kb_meta(self, key: str) -> str | None:
        rows = self._rows("SELECT value FROM kb_meta WHERE key = ?", (key,))
        return str(rows[0]["value"]) if rows else None

    def kb_replace(
        self, docs: Iterable[DocFields], *, origin: str | None = None, meta: Mapping[str, str] | None = None
    ) -> int:
        """Delete every document of `origin` and any with the ids of `docs`, insert `docs`, set `meta`:
        one transaction, so a reader never sees a half-built index. Returns the number inserted."""
        docs = list(docs)
        drop = {d.id for d in docs}
        with self._write() as conn:
            if origin is not None:
                drop |= {r[0] for r in conn.execute("SELECT id FROM kb_docs WHERE origin = ?", (origin,))}
            for doc_id in drop:
                conn.execute("DELETE FROM kb_docs WHERE id = ?", (doc_id,))
                conn.execute("DELETE FROM kb_fts WHERE id = ?", (doc_id,))
            now = _now()
            for d in docs:
                conn.execute(
                    "INSERT INTO kb_docs (id, title, category, platforms, targets, tags, triggers, level, origin, "
                    "path, body, meta_json, added_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (d.id, d.title, d.category, json.dumps(d.platforms), json.dumps(d.targets),
                     json.dumps(d.tags), json.dumps(d.triggers), d.level, d.origin, d.path, d.body,
                     _json(d.meta), now),
                )  # fmt: skip
                conn.execute(
                    "INSERT INTO kb_fts (id, title, tags, triggers, body) VALUES (?, ?, ?, ?, ?)",
                    (d.id, d.title, _fts_text([*d.tags, d.category]), _fts_text(d.triggers), d.body),
                )
            for key, value in (meta or {}).items():
                conn.execute("INSERT OR REPLACE INTO kb_meta (key, value) VALUES (?, ?)", (key, value))
        return len(docs)

    def kb_delete(self, prefix: str) -> int:
        """Delete the documents whose id starts with `prefix`; returns how many."""
        with self._write() as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM kb_docs WHERE id LIKE ?", (prefix + "%",))]
            for doc_id in ids:
                conn.execute("DELETE FROM kb_docs WHERE id = ?", (doc_id,))
                conn.execute("DELETE FROM kb_fts WHERE id = ?", (doc_id,))
        return len(ids)

    def kb_doc_rows(self) -> list[dict[str, Any]]:
        """Every stored document as a dict of `DocFields`' fields, by id (`Doc(**row)` rebuilds one)."""
        rows = self._rows("SELECT * FROM kb_docs ORDER BY id")
        return [
            dict(id=r["id"], title=r["title"], category=r["category"], body=r["body"],
                 platforms=json.loads(r["platforms"]), targets=json.loads(r["targets"]),
                 tags=json.loads(r["tags"]), triggers=json.loads(r["triggers"]), level=r["level"],
                 origin=r["origin"], path=r["path"], meta=json.loads(r["meta_json"]))
            for r in rows
        ]  # fmt: skip

    def kb_match(self, fts_query: str, limit: int, weights: tuple[float, ...]) -> list[tuple[str, float]]:
        """(id, bm25) of the best `limit` documents for an FTS5 query; lower bm25 is better."""
        w = ", ".join(str(x) for x in weights)
        try:
            rows = self._rows(
                f"SELECT id, bm25(kb_fts, 0, {w}) AS rank FROM kb_fts WHERE kb_fts MATCH ? ORDER BY rank LIMIT ?",
                (fts_query, limit),
            )
        except sqlite3.OperationalError:  # a query FTS5 cannot parse: no lexical hits, not a crash
            return []
        return [(str(r["id"]), float(r["rank"])) for r in rows]

    # -- skills -----------------------------------------------------------------------------------

    def skills(self, status: str | None = None) -> list[dict[str, Any]]:
        sql, params = "SELECT * FROM skills", tuple[Any, ...]()
        if status:
            sql, params = sql + " WHERE status = ?", (status,)
        return [_skill_row(r) for r in self._rows(sql + " ORDER BY created_at", params)]

    def skill(self, skill_id: str) -> dict[str, Any] | None:
        rows = self._rows(
            "SELECT * FROM skills WHERE id LIKE ? ORDER BY id", (skill_id.replace("%", "") + "%",)
        )
        return _skill_row(rows[0]) if len(rows) == 1 else None

    def put_skill(self, skill: Mapping[str, Any]) -> None:
        """Insert or replace a skill (a dict as `skill()` returns it)."""
        now = _now()
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO skills (id, key, title, platform, target, pattern, change_json, text, "
                "status, provenance_json, verification_json, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE((SELECT created_at FROM skills WHERE id = ?), ?), ?)",
                (skill["id"], skill["key"], skill["title"], skill["platform"], skill["target"], skill["pattern"],
                 _json(skill["change"]), skill["text"], skill["status"], _json(skill["provenance"]),
                 _json(skill.get("verification")) if skill.get("verification") is not None else None,
                 skill["id"], now, now),
            )  # fmt: skip

    # -- shared kernels ---------------------------------------------------------------------------

    def put_shared_kernel(self, row: Mapping[str, Any]) -> bool:
        """Add an imported kernel; False if it was already there."""
        with self._write() as conn:
            cur = conn.execute(
                "INSERT OR IGNORE INTO shared_kernels (hash, spec_fingerprint, spec_name, pattern, platform, "
                "source, data_json, origin, imported_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row["hash"], row["spec_fingerprint"], row["spec_name"], row["pattern"], row["platform"],
                 row["source"], _json(row.get("data") or {}), row["origin"], _now()),
            )  # fmt: skip
            return cur.rowcount == 1

    def shared_kernels(self, platform: str | None = None) -> list[dict[str, Any]]:
        sql, params = "SELECT * FROM shared_kernels", tuple[Any, ...]()
        if platform:
            sql, params = sql + " WHERE platform = ?", (platform,)
        out = []
        for r in self._rows(sql + " ORDER BY imported_at", params):
            r["data"] = json.loads(r.pop("data_json"))
            out.append(r)
        return out


def _skill_row(row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    row["change"] = json.loads(row.pop("change_json"))
    row["provenance"] = json.loads(row.pop("provenance_json"))
    ver = row.pop("verification_json")
    row["verification"] = json.loads(ver) if ver else None
    return row
