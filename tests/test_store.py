"""The workspace store: migrations, blobs, records, caches, and sharing across threads and connections."""

from __future__ import annotations

import hashlib
import sqlite3
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelevolve.errors import WorkspaceError
from kernelevolve.store import BlobStore, Workspace
from kernelevolve.store.migrations import MIGRATIONS

SPEC_FP = "f" * 16
SOURCE = "def kernel(x):\n    return x * 2\n"


def verdict(**kw: Any) -> dict[str, Any]:
    v: dict[str, Any] = {
        "status": "ok",
        "correct": True,
        "spec_fingerprint": SPEC_FP,
        "candidate_hash": "",
        "platform": "cuda",
        "speedup_vs_eager": 1.5,
        "speedup_vs_compile": 1.2,
        "fitness": 1.2,
        "method": {"device": "NVIDIA H100", "torch": "2.13.0"},
        "shapes": [{"name": "big", "weight": 1.0}],
    }
    v.update(kw)
    return v


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    with Workspace.open(tmp_path / "ws") as w:
        w.record_spec(SPEC_FP, "scale", "specs/scale.py", "# spec\n", {"shapes": ["big"]})
        yield w


def applied(root: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(root / "kernelevolve.db") as conn:
        return conn.execute("SELECT name, applied_at FROM _migrations ORDER BY name").fetchall()


# -- opening and migrations ---------------------------------------------------------------------


def test_open_creates_layout_and_wal(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    with Workspace.open(root) as w:
        assert (root / "kernelevolve.db").is_file()
        assert w._rows("PRAGMA journal_mode")[0]["journal_mode"] == "wal"
        assert w._rows("PRAGMA foreign_keys")[0]["foreign_keys"] == 1
    with sqlite3.connect(root / "kernelevolve.db") as conn:  # WAL is persistent in the file
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_migrations_applied_once_across_reopen(tmp_path: Path) -> None:
    Workspace.open(tmp_path).close()
    first = applied(tmp_path)
    assert [name for name, _ in first] == sorted(fn.__name__ for fn in MIGRATIONS)
    assert first[0][0] == "m001_initial"
    with Workspace.open(tmp_path) as w:
        w.record_candidate(SOURCE, "c.py", None)
    Workspace.open(tmp_path).close()
    assert applied(tmp_path) == first  # same rows, same applied_at: nothing re-ran
    with Workspace.open(tmp_path) as w:
        assert w.stats()["candidates"] == 1


def test_migration_names_are_numbered_and_unique() -> None:
    names = [fn.__name__ for fn in MIGRATIONS]
    assert len(set(names)) == len(names)
    assert all(name[0] == "m" and name[1:4].isdigit() for name in names)
    assert names == sorted(names)


def test_unknown_migration_means_newer_code(tmp_path: Path) -> None:
    Workspace.open(tmp_path).close()
    with sqlite3.connect(tmp_path / "kernelevolve.db") as conn:
        conn.execute("INSERT INTO _migrations (name, applied_at) VALUES ('m999_future', 'x')")
    with pytest.raises(WorkspaceError, match="m999_future") as e:
        Workspace.open(tmp_path)
    assert e.value.hint and "upgrade" in e.value.hint


def test_path_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "ws"
    f.write_text("not a folder")
    with pytest.raises(WorkspaceError, match="not a directory") as e:
        Workspace.open(f)
    assert e.value.hint


def test_db_that_is_not_sqlite(tmp_path: Path) -> None:
    (tmp_path / "kernelevolve.db").write_bytes(b"this is not a database, just text\n" * 100)
    with pytest.raises(WorkspaceError, match="not a usable SQLite database"):
        Workspace.open(tmp_path)


def test_foreign_sqlite_db_is_refused_untouched(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "kernelevolve.db") as conn:
        conn.execute("CREATE TABLE notes (x TEXT)")
    with pytest.raises(WorkspaceError, match="no kernelevolve migrations"):
        Workspace.open(tmp_path)
    with sqlite3.connect(tmp_path / "kernelevolve.db") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"notes"}


def test_closed_workspace_raises(tmp_path: Path) -> None:
    w = Workspace.open(tmp_path)
    w.close()
    w.close()  # idempotent
    with pytest.raises(WorkspaceError, match="closed"):
        w.evaluations()


# -- blobs --------------------------------------------------------------------------------------


def test_blob_round_trip_and_addressing(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    data = b"\x00\x01 some bytes \xff"
    digest = blobs.put(data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert blobs.path(digest) == tmp_path / "blobs" / digest[:2] / digest
    assert blobs.has(digest)
    assert blobs.get(digest) == data
    assert blobs.get(digest, verify=True) == data
    assert blobs.put(data) == digest  # same bytes, same digest, stored once
    assert blobs.usage() == (1, len(data))
    assert blobs.put_text("héllo") == hashlib.sha256("héllo".encode()).hexdigest()
    assert blobs.get_text(blobs.put_text("héllo")) == "héllo"
    assert blobs.usage()[0] == 2
    leftovers = [p for p in (tmp_path / "blobs").rglob("*") if p.is_file() and p.name.endswith(".tmp")]
    assert leftovers == []


def test_blob_missing_names_digest(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    digest = "ab" * 32
    assert not blobs.has(digest)
    with pytest.raises(WorkspaceError, match=digest):
        blobs.get(digest)


@pytest.mark.parametrize("bad", ["../../etc/passwd", "ABCD" * 16, "ab" * 31, ""])
def test_blob_rejects_malformed_digest(tmp_path: Path, bad: str) -> None:
    with pytest.raises(WorkspaceError, match="not a blob digest"):
        BlobStore(tmp_path).get(bad)


def test_blob_verify_detects_corruption(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    digest = blobs.put(b"the real kernel")
    blobs.path(digest).write_bytes(b"a swapped kernel")
    assert blobs.get(digest) == b"a swapped kernel"  # no check unless asked
    with pytest.raises(WorkspaceError, match="corrupt"):
        blobs.get(digest, verify=True)


# -- specs, candidates, evaluations ------------------------------------------------------------


def test_spec_upsert(ws: Workspace) -> None:
    ws.record_spec(SPEC_FP, "scale2", "specs/scale2.py", "# spec v2\n", {"shapes": ["big", "small"]})
    spec = ws.spec(SPEC_FP)
    assert spec is not None
    assert (spec["name"], spec["path"], spec["source"]) == ("scale2", "specs/scale2.py", "# spec v2\n")
    assert spec["info"] == {"shapes": ["big", "small"]}
    assert ws.stats()["specs"] == 1
    assert ws.spec("nope") is None


def test_candidate_is_content_addressed_and_idempotent(ws: Workspace) -> None:
    h = ws.record_candidate(SOURCE, "cands/a.py", "triton")
    assert h == hashlib.sha256(SOURCE.encode()).hexdigest()
    assert ws.blobs.get_text(h, verify=True) == SOURCE
    assert ws.record_candidate(SOURCE, "cands/copy.py", None) == h
    cand = ws.candidate(h)
    assert cand is not None
    assert (cand["path"], cand["kind"], cand["source"]) == ("cands/a.py", "triton", SOURCE)
    assert ws.stats()["candidates"] == 1


def test_evaluations_round_trip_and_order(ws: Workspace) -> None:
    h = ws.record_candidate(SOURCE, "a.py", None)
    ids = [ws.record_evaluation(verdict(candidate_hash=h, fitness=float(i))) for i in range(3)]
    other_fp = "e" * 16
    ws.record_spec(other_fp, "other", "o.py", "# o\n", {})
    other = ws.record_evaluation(verdict(spec_fingerprint=other_fp, status="incorrect", correct=False))

    rows = ws.evaluations(SPEC_FP)
    assert [r["id"] for r in rows] == ids[::-1]
    assert [r["fitness"] for r in rows] == [2.0, 1.0, 0.0]
    assert [r["id"] for r in ws.evaluations()] == [other, *ids[::-1]]
    assert [r["id"] for r in ws.evaluations(limit=2)] == [other, ids[2]]

    row = ws.evaluation(ids[0])
    assert row is not None
    assert row["verdict"] == verdict(candidate_hash=h, fitness=0.0)
    assert (row["device"], row["platform"], row["status"], row["correct"]) == (
        "NVIDIA H100",
        "cuda",
        "ok",
        True,
    )
    assert row["candidate_hash"] == h and row["speedup_vs_eager"] == 1.5
    assert row["created_at"].endswith("+00:00")
    bad = ws.evaluation(other)
    assert bad is not None and bad["correct"] is False and bad["candidate_hash"] is None
    assert ws.evaluation(10_000) is None


def test_a_stored_verdict_is_found_again_only_under_its_key_and_a_reusable_status(ws: Workspace) -> None:
    h = ws.record_candidate(SOURCE, "c.py", None)
    method = {"device": "NVIDIA H100", "key": "k1"}
    ok = ws.record_evaluation(verdict(candidate_hash=h, method=method, fitness=1.1))
    ws.record_evaluation(verdict(candidate_hash=h, method={**method, "key": "k2"}, fitness=2.0))
    ws.record_evaluation(verdict(candidate_hash=h, method=method, status="timeout", correct=False))
    found = ws.reusable_evaluation(h, SPEC_FP, "k1", {"ok", "incorrect"})
    assert found is not None and found[0] == ok and found[1]["fitness"] == 1.1  # not the newer timeout
    assert ws.reusable_evaluation(h, SPEC_FP, "k3", {"ok", "incorrect"}) is None  # another key
    assert ws.reusable_evaluation(h, SPEC_FP, "", {"ok"}) is None  # a verdict recorded with no key
    assert ws.reusable_evaluation(h, "e" * 16, "k1", {"ok"}) is None  # another spec
    assert ws.reusable_evaluation(h, SPEC_FP, "k1", {"incorrect"}) is None  # a status not asked for


def test_reuse_keys_differ_where_a_verdict_would() -> None:
    """`reuse_key` changes with a setting the worker reads, the device's software, the shapes; not with
    one it does not read (the number of workers)."""
    from dataclasses import replace

    from kernelevolve.config import Settings
    from kernelevolve.evaluate.reuse import reuse_key

    base = Settings()
    device = {"device": "NVIDIA H100", "driver": "580", "torch": "2.11.0", "triton": "3.6.0"}
    key = reuse_key(base.to_dict(), device, None)
    assert key == reuse_key(replace(base, workers=7).to_dict(), device, None)
    assert key != reuse_key(replace(base, timing_budget_s=2.0).to_dict(), device, None)
    assert key != reuse_key(replace(base, fitness_baseline="eager").to_dict(), device, None)
    assert key != reuse_key(base.to_dict(), {**device, "torch": "2.12.0"}, None)
    assert key != reuse_key(base.to_dict(), device, ["small"])


def test_evaluation_of_unrecorded_candidate_is_refused(ws: Workspace) -> None:
    with pytest.raises(WorkspaceError, match="record_candidate"):
        ws.record_evaluation(verdict(candidate_hash="0" * 64))
    with pytest.raises(WorkspaceError, match="record_spec"):
        ws.record_evaluation(verdict(spec_fingerprint="nope"))
    assert ws.stats()["evaluations"] == 0


def test_foreign_keys_enforced_by_database(ws: Workspace) -> None:
    with pytest.raises(sqlite3.IntegrityError), ws._write() as conn:
        conn.execute(
            "INSERT INTO evaluations (created_at, candidate_hash, status, correct, verdict_json) "
            "VALUES ('t', 'missing', 'ok', 1, '{}')"
        )


# -- caches -------------------------------------------------------------------------------------


def test_baseline_upsert_replaces(ws: Workspace) -> None:
    key = "NVIDIA H100|550.54|2.13|3.4"
    assert ws.get_baseline(SPEC_FP, key, "big") is None
    ws.put_baseline(SPEC_FP, key, "big", {"eager_s": 2.0})
    ws.put_baseline(SPEC_FP, key, "small", {"eager_s": 0.5})
    ws.put_baseline(SPEC_FP, key, "big", {"eager_s": 1.0, "compile_s": 0.8})
    assert ws.get_baseline(SPEC_FP, key, "big") == {"eager_s": 1.0, "compile_s": 0.8}
    assert ws.get_baseline(SPEC_FP, "other-device", "big") is None
    rows = ws.baselines(SPEC_FP)
    assert [(r["shape"], r["data"]) for r in rows] == [
        ("big", {"eager_s": 1.0, "compile_s": 0.8}),
        ("small", {"eager_s": 0.5}),
    ]
    assert all(r["device_key"] == key and r["measured_at"] for r in rows)
    assert ws.stats()["baselines"] == 2


def test_hardware_profile_upsert_replaces(ws: Workspace) -> None:
    assert ws.get_hardware_profile("h100") is None
    ws.put_hardware_profile("h100", "cuda", "NVIDIA H100", {"hbm_gbps": 3000})
    first = ws.get_hardware_profile("h100")
    ws.put_hardware_profile("h100", "cuda", "NVIDIA H100 80GB", {"hbm_gbps": 3350})
    second = ws.get_hardware_profile("h100")
    assert first is not None and second is not None
    assert second["hbm_gbps"] == 3350 and second["measured_at"] >= first["measured_at"]
    [row] = ws.hardware_profiles()
    assert (row["key"], row["device"], row["data"]) == ("h100", "NVIDIA H100 80GB", {"hbm_gbps": 3350})


def test_cache_dir(ws: Workspace) -> None:
    d = ws.cache_dir("triton")
    assert d == ws.root / "cache" / "triton" and d.is_dir()
    assert ws.cache_dir("triton") == d
    for bad in ("../escape", "a/b", "", "."):
        with pytest.raises(WorkspaceError):
            ws.cache_dir(bad)


def test_stats_counts_blob_bytes(ws: Workspace) -> None:
    ws.record_candidate(SOURCE, "a.py", None)
    s = ws.stats()
    assert (s["specs"], s["candidates"], s["evaluations"], s["blobs"]) == (1, 1, 0, 2)
    assert s["blob_bytes"] == len(b"# spec\n") + len(SOURCE.encode())


# -- sharing ------------------------------------------------------------------------------------


def test_concurrent_record_evaluation_from_threads(ws: Workspace) -> None:
    n_threads, per_thread = 8, 25
    start = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                ws.record_evaluation(verdict(fitness=float(t * 1000 + i)))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    rows = ws.evaluations(SPEC_FP, limit=10_000)
    assert len(rows) == n_threads * per_thread
    assert len({r["id"] for r in rows}) == len(rows)
    assert {r["fitness"] for r in rows} == {float(t * 1000 + i) for t in range(8) for i in range(25)}


def test_two_connections_share_a_workspace(tmp_path: Path) -> None:
    with Workspace.open(tmp_path) as a, Workspace.open(tmp_path) as b:
        a.record_spec(SPEC_FP, "s", "s.py", "# s\n", {})
        h = b.record_candidate(SOURCE, "c.py", None)
        errors: list[BaseException] = []

        def work(w: Workspace) -> None:
            try:
                for _ in range(20):
                    w.record_evaluation(verdict(candidate_hash=h))
                    w.put_baseline(SPEC_FP, "dev", "big", {"by": repr(w)})
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work, args=(w,)) for w in (a, b, a, b)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        assert len(a.evaluations(limit=1000)) == len(b.evaluations(limit=1000)) == 80
        assert b.candidate(h) is not None and a.spec(SPEC_FP) is not None


def test_store_imports_no_torch() -> None:
    import subprocess

    code = "import sys, kernelevolve.store; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
