"""Numbered schema migrations for the workspace database, in the style of simonw/llm.

Each migration is a function `mNNN_what(conn)` registered in order with `@migration`; the names of
the applied ones live in `_migrations`. `migrate(conn)` applies the missing ones in registration
order, each in its own `BEGIN IMMEDIATE` transaction together with its `_migrations` row, so a crash
or a second process opening the same workspace never sees half a migration or applies one twice.

Rules for adding one: append, never edit or reorder an applied migration; name it `m002_...`,
`m003_...`; execute statements one by one with `conn.execute` (`executescript` would commit the
surrounding transaction).

Deliberately not here: downgrades. A database that records a migration this code does not know
was written by a newer kernelevolve, and `migrate` refuses it rather than guess.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime

from kernelevolve.errors import WorkspaceError

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[Migration] = []


def migration(fn: Migration) -> Migration:
    """Register `fn` as the next migration."""
    MIGRATIONS.append(fn)
    return fn


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply the migrations missing from `conn` in order; return the names applied now.

    `conn` must be in autocommit mode (`isolation_level=None`): transactions here are explicit.
    """
    check_known(conn)
    conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT)")
    applied_now: list[str] = []
    for fn in MIGRATIONS:
        name = fn.__name__
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read inside the write lock: another process may have applied it meanwhile.
            if conn.execute("SELECT 1 FROM _migrations WHERE name = ?", (name,)).fetchone() is None:
                fn(conn)
                conn.execute(
                    "INSERT INTO _migrations (name, applied_at) VALUES (?, ?)",
                    (name, datetime.now(UTC).isoformat(timespec="microseconds")),
                )
                applied_now.append(name)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return applied_now


def check_known(conn: sqlite3.Connection) -> None:
    """Refuse a database that is not a workspace's, or that a newer kernelevolve has migrated."""
    tables = {
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    }
    if "_migrations" not in tables:
        if tables:
            raise WorkspaceError(
                f"the database holds tables ({', '.join(sorted(tables))}) but no kernelevolve migrations",
                hint="it is not a kernelevolve workspace database; point --workspace at another directory",
            )
        return
    applied = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
    unknown = sorted(applied - {fn.__name__ for fn in MIGRATIONS})
    if unknown:
        raise WorkspaceError(
            f"the workspace database was written by a newer kernelevolve (unknown migrations: "
            f"{', '.join(unknown)})",
            hint="upgrade kernelevolve (pip install -U kernelevolve), or use another --workspace",
        )


def _run(conn: sqlite3.Connection, *statements: str) -> None:
    for statement in statements:
        conn.execute(statement)


@migration
def m001_initial(conn: sqlite3.Connection) -> None:
    _run(
        conn,
        """
        CREATE TABLE specs (
            fingerprint TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            path TEXT NOT NULL,
            source_blob TEXT NOT NULL,
            info_json TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """,
        "CREATE INDEX idx_specs_name ON specs (name)",
        """
        CREATE TABLE candidates (
            hash TEXT PRIMARY KEY,
            path TEXT NOT NULL,
            kind TEXT,
            size_bytes INTEGER NOT NULL,
            created_at TEXT NOT NULL
        )
        """,
        # The foreign keys are nullable: a verdict for something that never got that far (no spec
        # fingerprint, no candidate hash) is still recorded.
        """
        CREATE TABLE evaluations (
            id INTEGER PRIMARY KEY,
            created_at TEXT NOT NULL,
            spec_fingerprint TEXT REFERENCES specs (fingerprint),
            candidate_hash TEXT REFERENCES candidates (hash),
            platform TEXT,
            device TEXT,
            status TEXT NOT NULL,
            correct INTEGER NOT NULL,
            speedup_vs_eager REAL,
            speedup_vs_compile REAL,
            fitness REAL,
            verdict_json TEXT NOT NULL
        )
        """,
        "CREATE INDEX idx_evaluations_spec_created ON evaluations (spec_fingerprint, created_at)",
        "CREATE INDEX idx_evaluations_candidate ON evaluations (candidate_hash)",
        # Baselines and hardware profiles are caches: no foreign keys, so filling one never fails.
        """
        CREATE TABLE baselines (
            spec_fingerprint TEXT NOT NULL,
            device_key TEXT NOT NULL,
            shape TEXT NOT NULL,
            data_json TEXT NOT NULL,
            measured_at TEXT NOT NULL,
            PRIMARY KEY (spec_fingerprint, device_key, shape)
        )
        """,
        """
        CREATE TABLE hardware_profiles (
            key TEXT PRIMARY KEY,
            platform TEXT NOT NULL,
            device TEXT NOT NULL,
            data_json TEXT NOT NULL,
            measured_at TEXT NOT NULL
        )
        """,
    )


@migration
def m002_runs_and_nodes(conn: sqlite3.Connection) -> None:
    """Optimization runs and the nodes of their trees. A node is written when it is created
    (state `created`), again when its candidate is proposed (`proposed`, the source's blob and the
    synthesizer's prompt, response and cost) and when it is evaluated (`evaluated`) or its synthesis
    failed (`failed`). Resume reads the states back: nothing is lost, nothing is paid twice."""
    _run(
        conn,
        """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            spec_fingerprint TEXT NOT NULL REFERENCES specs (fingerprint),
            spec_path TEXT NOT NULL,
            platform TEXT NOT NULL,
            synthesizer TEXT NOT NULL,
            policy TEXT NOT NULL,
            status TEXT NOT NULL,
            config_json TEXT NOT NULL,
            limits_json TEXT NOT NULL,
            best_node INTEGER,
            tokens_in INTEGER NOT NULL DEFAULT 0,
            tokens_out INTEGER NOT NULL DEFAULT 0,
            cost_usd REAL NOT NULL DEFAULT 0,
            wall_s REAL NOT NULL DEFAULT 0,
            summary_json TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """,
        """
        CREATE TABLE nodes (
            run_id TEXT NOT NULL REFERENCES runs (id),
            id INTEGER NOT NULL,
            parent INTEGER,
            parent2 INTEGER,
            mode TEXT NOT NULL,
            state TEXT NOT NULL,
            candidate_hash TEXT REFERENCES candidates (hash),
            evaluation_id INTEGER REFERENCES evaluations (id),
            status TEXT,
            fitness REAL NOT NULL DEFAULT 0,
            speedup_vs_eager REAL,
            speedup_vs_compile REAL,
            note TEXT NOT NULL DEFAULT '',
            message TEXT NOT NULL DEFAULT '',
            prompt_blob TEXT,
            response_blob TEXT,
            actions_json TEXT,
            diagnosis_json TEXT,
            tokens_in INTEGER NOT NULL DEFAULT 0,
            tokens_out INTEGER NOT NULL DEFAULT 0,
            cost_usd REAL NOT NULL DEFAULT 0,
            synth_s REAL NOT NULL DEFAULT 0,
            eval_s REAL NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (run_id, id)
        )
        """,
        "CREATE INDEX idx_nodes_run_state ON nodes (run_id, state)",
    )


@migration
def m003_knowledge(conn: sqlite3.Connection) -> None:
    """The knowledge base's index, skills, shared kernels, and per-node analyses.

    - `kb_docs` holds every indexed document (shipped, added with `kb add`, or a verified skill) and
      `kb_fts` its full-text index (FTS5, porter stemming; ranked by BM25). `kb_meta` records which
      version of the shipped documents is indexed, so an upgrade re-indexes them.
    - `skills`: improvements distilled from runs, with provenance; `status` is `candidate` until the
      gain is reproduced (`verified`), and only verified skills are indexed for retrieval.
    - `shared_kernels`: verified kernels imported from another workspace (warm starts use them).
    - `nodes.analysis`: what a node tried, what it changed and why it failed or won (context memory);
      `runs.pattern`: the spec's operator pattern, which warm starts match on.
    """
    _run(
        conn,
        "ALTER TABLE nodes ADD COLUMN analysis TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE runs ADD COLUMN pattern TEXT NOT NULL DEFAULT ''",
        """
        CREATE TABLE kb_docs (
            id TEXT PRIMARY KEY,
            title TEXT NOT NULL,
            category TEXT NOT NULL,
            platforms TEXT NOT NULL,
            targets TEXT NOT NULL,
            tags TEXT NOT NULL,
            triggers TEXT NOT NULL,
            level TEXT NOT NULL,
            origin TEXT NOT NULL,
            path TEXT NOT NULL,
            body TEXT NOT NULL,
            meta_json TEXT NOT NULL,
            added_at TEXT NOT NULL
        )
        """,
        "CREATE VIRTUAL TABLE kb_fts USING fts5(id UNINDEXED, title, tags, triggers, body, "
        "tokenize = 'porter unicode61')",
        "CREATE TABLE kb_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """
        CREATE TABLE skills (
            id TEXT PRIMARY KEY,
            key TEXT NOT NULL,
            title TEXT NOT NULL,
            platform TEXT NOT NULL,
            target TEXT NOT NULL,
            pattern TEXT NOT NULL,
            change_json TEXT NOT NULL,
            text TEXT NOT NULL,
            status TEXT NOT NULL,
            provenance_json TEXT NOT NULL,
            verification_json TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """,
        "CREATE INDEX idx_skills_key ON skills (key)",
        """
        CREATE TABLE shared_kernels (
            hash TEXT PRIMARY KEY,
            spec_fingerprint TEXT NOT NULL,
            spec_name TEXT NOT NULL,
            pattern TEXT NOT NULL,
            platform TEXT NOT NULL,
            source TEXT NOT NULL,
            data_json TEXT NOT NULL,
            origin TEXT NOT NULL,
            imported_at TEXT NOT NULL
        )
        """,
    )


@migration
def m004_benches(conn: sqlite3.Connection) -> None:
    """Benches: one search per spec of a directory, resumable.

    - `benches`: a bench's directory, its options (track, baseline, synthesizer, budget, platform) and
      `key`, the hash of both, by which running the same command again finds it and resumes it.
    - `bench_items`: one row per spec file: its run (once started), `status` (`pending`, `running`,
      `done`, `load_error`) and the row of the results table, once the run is done.
    """
    _run(
        conn,
        """
        CREATE TABLE benches (
            id TEXT PRIMARY KEY,
            key TEXT NOT NULL,
            dir TEXT NOT NULL,
            config_json TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """,
        "CREATE INDEX idx_benches_key ON benches (key, created_at)",
        """
        CREATE TABLE bench_items (
            bench_id TEXT NOT NULL REFERENCES benches (id),
            path TEXT NOT NULL,
            position INTEGER NOT NULL,
            name TEXT NOT NULL,
            fingerprint TEXT,
            run_id TEXT,
            status TEXT NOT NULL,
            error TEXT NOT NULL DEFAULT '',
            result_json TEXT,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (bench_id, path)
        )
        """,
    )


@migration
def m005_bench_file_keys(conn: sqlite3.Connection) -> None:
    """`bench_items.file_key`: a digest of what a spec's result stands for that needs no loading (the
    file's bytes, the track, the timing method, torch's version and the shipped samples), stored with
    each done item, by which a resumed bench recognises a cached result without importing, probing
    and tracing the spec again (minutes for KernelBench level 3's models)."""
    _run(conn, "ALTER TABLE bench_items ADD COLUMN file_key TEXT NOT NULL DEFAULT ''")


@migration
def m006_evaluation_seals(conn: sqlite3.Connection) -> None:
    """`evaluations.seal`: each evaluation row's HMAC under the user's key (`store.seal`), checked
    wherever it is read. The rows already written predate the protection and are sealed as they are."""
    from kernelevolve.store.seal import SEALED, seal

    _run(conn, "ALTER TABLE evaluations ADD COLUMN seal TEXT")
    columns = ", ".join(SEALED)
    for row in conn.execute(f"SELECT id, {columns} FROM evaluations").fetchall():
        fields = dict(zip(SEALED, row[1:], strict=True))
        conn.execute("UPDATE evaluations SET seal = ? WHERE id = ?", (seal(fields), row[0]))
