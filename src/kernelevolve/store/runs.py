"""Runs and their nodes in the workspace database (mixed into `Workspace`).

A node's life is three writes, each one transaction:

    create_node    state `created`: id, parent(s), memory mode (before anything is spent on it)
    propose_node   state `proposed`: the candidate's source (a blob), the synthesizer's prompt,
                   response and actions (blobs), tokens, USD and time; the run's totals grow in the
                   same transaction, so a cost is counted exactly once
    finish_node    the verdict recorded and the node `evaluated`, in one transaction
    fail_node      state `failed`: the synthesizer produced nothing (its cost still counted)

Node ids are allocated per run inside the write transaction (max + 1), so concurrent expansions of
one tree, in one process or several, never collide. Resume reads the states back: `created` nodes
are synthesized again under the same id, `proposed` ones are evaluated from the stored source.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections import Counter
from collections.abc import Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kernelevolve.errors import WorkspaceError
from kernelevolve.store.seal import SEALED, foreign

NODE_STATES = ("created", "proposed", "evaluated", "failed")
RUN_STATUSES = ("running", "done", "stopped", "failed")


def _now() -> str:
    # Fixed width, so string order is time order.
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _json(data: Any) -> str:
    # default=str: a stray Path or enum in a record is kept readable rather than refused.
    return json.dumps(data, sort_keys=True, default=str)


class RunsMixin:
    """Methods for `Workspace`; they rely on its `_write`, `_rows` and `blobs`."""

    if TYPE_CHECKING:
        from kernelevolve.store.blobs import BlobStore

        blobs: BlobStore

        def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...
        def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]: ...
        def _insert_evaluation(self, conn: sqlite3.Connection, verdict: Mapping[str, Any]) -> int: ...
        def tampered(self, row: Mapping[str, Any]) -> str | None: ...

    # -- runs -------------------------------------------------------------------------------------

    def create_run(
        self,
        spec_fingerprint: str,
        spec_path: str,
        platform: str,
        synthesizer: str,
        policy: str,
        config: Mapping[str, Any],
        limits: Mapping[str, Any],
        pattern: str = "",
    ) -> str:
        """A new run (status `running`); returns its id. `pattern` is the spec's operator pattern."""
        run_id = secrets.token_hex(4)
        now = _now()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO runs (id, spec_fingerprint, spec_path, platform, synthesizer, policy, status, "
                "config_json, limits_json, pattern, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (run_id, spec_fingerprint, spec_path, platform, synthesizer, policy,
                 _json(dict(config)), _json(dict(limits)), pattern, now, now),
            )  # fmt: skip
        return run_id

    def resolve_run(self, run_id: str) -> str:
        """The full id of the run named by `run_id` or a unique prefix of it."""
        rows = self._rows("SELECT id FROM runs WHERE id LIKE ? ORDER BY id", (run_id.replace("%", "") + "%",))
        if len(rows) == 1:
            return str(rows[0]["id"])
        if not rows:
            raise WorkspaceError(
                f"no run {run_id!r} in this workspace", hint="`kernelevolve runs` lists them"
            )
        raise WorkspaceError(
            f"{run_id!r} names {len(rows)} runs",
            hint="give more characters: " + ", ".join(r["id"] for r in rows),
        )

    def run(self, run_id: str) -> dict[str, Any]:
        rows = self._rows("SELECT * FROM runs WHERE id = ?", (self.resolve_run(run_id),))
        return _run_row(rows[0])

    def change_token(self, run_id: str | None = None) -> str:
        """A value that changes whenever the run (given) or any run, node or bench (none given) is
        written: every write sets `updated_at`. For a live view's polling."""
        if run_id is not None:
            row = self._rows(
                "SELECT (SELECT updated_at FROM runs WHERE id = ?) AS r, count(*) AS n, max(updated_at) AS u "
                "FROM nodes WHERE run_id = ?",
                (run_id, run_id),
            )[0]
        else:
            row = self._rows(
                "SELECT (SELECT count(*) || '@' || max(updated_at) FROM runs) AS r, "
                "(SELECT count(*) || '@' || max(updated_at) FROM nodes) AS n, "
                "(SELECT count(*) || '@' || max(updated_at) FROM benches) AS b, "
                "(SELECT count(*) || '@' || max(updated_at) FROM bench_items) AS i"
            )[0]
        return "|".join(str(v) for v in row.values())

    def best_fitness_by_run(self) -> dict[str, float | None]:
        """Each run's best fitness among its `ok` nodes (None where it has none)."""
        return {
            r["run_id"]: r["best"]
            for r in self._rows(
                "SELECT run_id, max(CASE WHEN status = 'ok' THEN fitness END) AS best FROM nodes GROUP BY run_id"
            )
        }

    def spec_names(self) -> dict[str, str]:
        """Spec fingerprint -> the spec's name, for every spec recorded."""
        return {r["fingerprint"]: r["name"] for r in self._rows("SELECT fingerprint, name FROM specs")}

    def runs(self, limit: int = 100) -> list[dict[str, Any]]:
        """Runs, newest first, each with node counts by state."""
        rows = self._rows("SELECT * FROM runs ORDER BY created_at DESC LIMIT ?", (limit,))
        counts = self._rows("SELECT run_id, state, count(*) AS n FROM nodes GROUP BY run_id, state")
        by_run: dict[str, dict[str, int]] = {}
        for c in counts:
            by_run.setdefault(c["run_id"], {})[c["state"]] = c["n"]
        out = []
        for row in rows:
            r = _run_row(row)
            r["nodes"] = by_run.get(r["run_id"], {})
            out.append(r)
        return out

    def spend(self, exclude_run: str | None = None) -> tuple[int, float]:
        """Tokens and USD that the workspace's runs have spent (their totals grow as each node's
        proposal is recorded), leaving out `exclude_run`: what a workspace-wide cap counts."""
        row = self._rows(
            "SELECT coalesce(sum(tokens_in + tokens_out), 0) AS tokens, coalesce(sum(cost_usd), 0) AS usd "
            "FROM runs WHERE id != ?",
            (exclude_run or "",),
        )[0]
        return int(row["tokens"]), float(row["usd"])

    def synth_usage(self, synthesizer: str) -> tuple[int, int, int]:
        """(tokens in, tokens out, candidates asked for) over every node a synthesizer proposed in this
        workspace (warm starts cost nothing and are left out): the history a cost estimate rests on."""
        row = self._rows(
            "SELECT coalesce(sum(n.tokens_in), 0) AS tin, coalesce(sum(n.tokens_out), 0) AS tout, "
            "count(*) AS n FROM nodes n JOIN runs r ON r.id = n.run_id "
            "WHERE r.synthesizer = ? AND n.mode != 'warm' AND n.state != 'created'",
            (synthesizer,),
        )[0]
        return int(row["tin"]), int(row["tout"]), int(row["n"])

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set `status`, `best_node`, `wall_s`, `summary` or `limits` (dicts) of a run."""
        allowed = {"status", "best_node", "wall_s", "summary", "limits"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"cannot update {sorted(unknown)} of a run")
        if "status" in fields and fields["status"] not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}")
        cols, params = [], []
        for key, value in fields.items():
            as_json = key in ("summary", "limits")
            cols.append(f"{key}_json = ?" if as_json else f"{key} = ?")
            params.append(_json(value) if as_json else value)
        with self._write() as conn:
            conn.execute(
                f"UPDATE runs SET {', '.join(cols)}, updated_at = ? WHERE id = ?", (*params, _now(), run_id)
            )

    # -- nodes ------------------------------------------------------------------------------------

    def create_node(self, run_id: str, parent: int | None, parent2: int | None, mode: str) -> int:
        now = _now()
        with self._write() as conn:
            row = conn.execute(
                "SELECT coalesce(max(id), 0) + 1 FROM nodes WHERE run_id = ?", (run_id,)
            ).fetchone()
            node_id = int(row[0])
            conn.execute(
                "INSERT INTO nodes (run_id, id, parent, parent2, mode, state, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, 'created', ?, ?)",
                (run_id, node_id, parent, parent2, mode, now, now),
            )
        return node_id

    def propose_node(
        self,
        run_id: str,
        node_id: int,
        *,
        source: str | None,
        kind: str | None = None,
        note: str = "",
        error: str | None = None,
        prompt: str | None = None,
        response: str | None = None,
        actions: list[dict[str, Any]] | None = None,
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost_usd: float = 0.0,
        synth_s: float = 0.0,
        status: str | None = None,
    ) -> str | None:
        """Record what the synthesizer answered: the node becomes `proposed` (a source) or `failed`
        (none; `error` and `status` say why). The run's token and USD totals grow in the same
        transaction. Returns the candidate's hash. Only a `created` node can be proposed."""
        digest = self.blobs.put_text(source) if source is not None else None
        prompt_blob = self.blobs.put_text(prompt) if prompt else None
        response_blob = self.blobs.put_text(response) if response else None
        state = "proposed" if source is not None else "failed"
        with self._write() as conn:
            current = conn.execute(
                "SELECT state FROM nodes WHERE run_id = ? AND id = ?", (run_id, node_id)
            ).fetchone()
            if current is None or current[0] != "created":
                raise WorkspaceError(f"node {node_id} of run {run_id} is not awaiting a proposal")
            if digest is not None:
                assert source is not None
                conn.execute(
                    "INSERT INTO candidates (hash, path, kind, size_bytes, created_at) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (hash) DO NOTHING",
                    (digest, f"run {run_id} node {node_id}", kind, len(source.encode()), _now()),
                )
            conn.execute(
                "UPDATE nodes SET state = ?, candidate_hash = ?, note = ?, message = ?, status = ?, "
                "prompt_blob = ?, response_blob = ?, actions_json = ?, tokens_in = ?, tokens_out = ?, "
                "cost_usd = ?, synth_s = ?, updated_at = ? WHERE run_id = ? AND id = ?",
                (state, digest, note, error or "", status if source is None else None, prompt_blob,
                 response_blob, _json(actions or []), tokens_in, tokens_out, cost_usd, synth_s, _now(),
                 run_id, node_id),
            )  # fmt: skip
            conn.execute(
                "UPDATE runs SET tokens_in = tokens_in + ?, tokens_out = tokens_out + ?, "
                "cost_usd = cost_usd + ?, updated_at = ? WHERE id = ?",
                (tokens_in, tokens_out, cost_usd, _now(), run_id),
            )
        return digest

    def finish_node(
        self,
        run_id: str,
        node_id: int,
        verdict: Mapping[str, Any],
        eval_s: float,
        diagnosis: Mapping[str, Any] | None = None,
        reused: int | None = None,
    ) -> int:
        """Record the node's verdict (as `record_evaluation` does) and make the node `evaluated`, in one
        transaction: a write the disk refuses leaves neither, so a resumed run evaluates the node once
        more instead of holding an evaluation no node points to. Returns the evaluation's id. With
        `reused`, the node points to that stored evaluation instead of a new one (`reusable_evaluation`)."""
        with self._write() as conn:
            evaluation_id = self._insert_evaluation(conn, verdict) if reused is None else reused
            cur = conn.execute(
                "UPDATE nodes SET state = 'evaluated', evaluation_id = ?, status = ?, fitness = ?, "
                "speedup_vs_eager = ?, speedup_vs_compile = ?, message = ?, diagnosis_json = ?, eval_s = ?, "
                "updated_at = ? WHERE run_id = ? AND id = ? AND state = 'proposed'",
                (evaluation_id, str(verdict["status"]), float(verdict.get("fitness") or 0.0),
                 verdict.get("speedup_vs_eager"), verdict.get("speedup_vs_compile"),
                 str(verdict.get("message") or ""), _json(dict(diagnosis)) if diagnosis else None,
                 eval_s, _now(), run_id, node_id),
            )  # fmt: skip
            if cur.rowcount != 1:
                raise WorkspaceError(f"node {node_id} of run {run_id} is not awaiting an evaluation")
        return evaluation_id

    def set_node_analysis(self, run_id: str, node_id: int, analysis: str) -> None:
        """Record a node's analysis (context memory): derived data, written after the node's own
        transaction."""
        with self._write() as conn:
            conn.execute(
                "UPDATE nodes SET analysis = ?, updated_at = ? WHERE run_id = ? AND id = ?",
                (analysis, _now(), run_id, node_id),
            )

    def set_node_diagnosis(self, run_id: str, node_id: int, diagnosis: Mapping[str, Any]) -> None:
        """Record a node's refined diagnosis (a profile's, taken beside the search)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE nodes SET diagnosis_json = ?, updated_at = ? WHERE run_id = ? AND id = ?",
                (_json(dict(diagnosis)), _now(), run_id, node_id),
            )

    def nodes(self, run_id: str, text: bool = False) -> list[dict[str, Any]]:
        """A run's nodes in creation order, with `source` (and with `text`, `prompt` and `response`)
        read back and `verdict` parsed where the node was evaluated."""
        sealed = ", ".join(f"e.{name} AS e_{name}" for name in SEALED)
        rows = self._rows(
            f"SELECT n.*, {sealed}, e.seal AS e_seal FROM nodes n LEFT JOIN evaluations e "
            "ON e.id = n.evaluation_id WHERE n.run_id = ? ORDER BY n.id",
            (run_id,),
        )
        out = []
        for row in rows:
            evaluation = {name: row.pop(f"e_{name}") for name in (*SEALED, "seal")}
            row["tampered"] = None
            if row["evaluation_id"] is not None:
                # A node is ranked by its sealed evaluation, not by the node's own copies of it.
                row["tampered"] = self.tampered(evaluation)
                row["status"], row["fitness"] = evaluation["status"], float(evaluation["fitness"] or 0.0)
                row["speedup_vs_eager"] = evaluation["speedup_vs_eager"]
                row["speedup_vs_compile"] = evaluation["speedup_vs_compile"]
            if row["tampered"]:
                row.update(status="tampered", fitness=0.0, speedup_vs_eager=None, speedup_vs_compile=None,
                           message=f"tampered: evaluation {row['evaluation_id']}: {row['tampered']}", verdict=None)  # fmt: skip
            else:
                row["verdict"] = self._verdict(row["evaluation_id"], evaluation["verdict_json"])
            row["actions"] = json.loads(row.pop("actions_json") or "[]")
            diag = row.pop("diagnosis_json")
            row["diagnosis"] = json.loads(diag) if diag else None
            row["source"] = self._blob_text(row["candidate_hash"])
            prompt_blob, response_blob = row.pop("prompt_blob"), row.pop("response_blob")
            if text:
                row["prompt"] = self._blob_text(prompt_blob)
                row["response"] = self._blob_text(response_blob)
            out.append(row)
        return out

    def foreign_seals(self, run_id: str) -> dict[str, int]:
        """How many of the run's verdicts were sealed under each seal key other than this machine's
        (key id -> count): a workspace carried here without its key (`store.seal`). Such verdicts
        read `tampered`: never ranked nor reused, so a resumed run would spend its budget again."""
        rows = self._rows(
            "SELECT e.seal FROM nodes n JOIN evaluations e ON e.id = n.evaluation_id WHERE n.run_id = ?",
            (run_id,),
        )
        return dict(Counter(k for k in (foreign(row["seal"]) for row in rows) if k))

    def _verdict(self, evaluation_id: int | None, text: str | None) -> dict[str, Any] | None:
        # An evaluation is never changed once written, so its parsed verdict is cached like a blob's
        # text (the engine rebuilds its tree before every decision; parsing every verdict each time
        # made a 500-node rebuild cost 65 ms). The dict is shared: callers read it, never modify it.
        if evaluation_id is None or text is None:
            return None
        cache: dict[int, dict[str, Any]] = self.__dict__.setdefault("_verdict_cache", {})
        if evaluation_id not in cache:
            if len(cache) > 4096:
                cache.clear()
            cache[evaluation_id] = json.loads(text)
        return cache[evaluation_id]

    def _blob_text(self, digest: str | None) -> str | None:
        # Blobs never change (content-addressed), so their text is cached: the engine rebuilds its
        # tree from the store before every decision.
        if digest is None:
            return None
        cache: dict[str, str] = self.__dict__.setdefault("_text_cache", {})
        if digest not in cache:
            if len(cache) > 4096:
                cache.clear()
            cache[digest] = self.blobs.get_text(digest)
        return cache[digest]


def _run_row(row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    row["run_id"] = row.pop("id")
    row["config"] = json.loads(row.pop("config_json"))
    row["limits"] = json.loads(row.pop("limits_json"))
    summary = row.pop("summary_json")
    row["summary"] = json.loads(summary) if summary else None
    return row


__all__ = ["NODE_STATES", "RUN_STATUSES", "RunsMixin"]
