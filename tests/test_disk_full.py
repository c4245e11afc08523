"""The disk full under a running search: the engine stops with a message that says what happened and
how to go on, and `resume` then finishes the run with no node lost and no candidate paid twice.

A full disk is made real for the engine's process alone with a file-size limit (RLIMIT_FSIZE): the
write that would grow SQLite's write-ahead log past it fails with EFBIG (Python ignores SIGXFSZ), which
SQLite reports as "disk I/O error"; on a full disk it gets ENOSPC and says "database or disk is full".
The engine treats both alike (`storage_failed`, tested on each form below). Only the soft limit is
set: the workers raise theirs again, as they would have space on another disk.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

from kernelevolve.errors import HarnessError
from kernelevolve.store import Workspace, storage_failed
from tests.conftest import SPECS
from tests.test_search_e2e import FAST_ENV, cli


def _cli_with_file_limit(limit: int, *args: str, ws: Path) -> subprocess.CompletedProcess[str]:
    def shrink() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    env = {**os.environ, **FAST_ENV, "KERNELEVOLVE_WORKSPACE": str(ws)}
    return subprocess.run([sys.executable, "-m", "kernelevolve.cli", *args], capture_output=True, text=True,
                          env=env, timeout=900, preexec_fn=shrink)  # fmt: skip


def test_a_full_disk_stops_the_run_cleanly_and_resume_finishes_it(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "config.toml").write_text("skills = false\n")  # no skill re-measurements at the ends
    first = cli("optimize", str(SPECS / "ew_chain.py"), "--platform", "cpu", "--budget", "2", "--draft", "2",
                "--parallel", "1", "--json", ws=ws)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = json.loads(first.stdout)["run_id"]
    # SQLite's write-ahead log starts empty in a new process: room for a few nodes' records in it
    full = _cli_with_file_limit(96 * 1024, "resume", run_id, "--budget", "6", ws=ws)
    assert full.returncode == 2, full.stderr[-3000:]
    assert "the disk refused a write" in full.stderr and f"kernelevolve resume {run_id}" in full.stderr, (
        full.stderr[-3000:]
    )
    assert "Traceback" not in full.stderr
    with Workspace.open(ws) as w:
        stopped = w.nodes(run_id)
    assert 2 <= len(stopped) < 6

    done = cli("resume", run_id, "--budget", "6", "--json", ws=ws)
    assert done.returncode == 0, done.stderr[-3000:]
    with Workspace.open(ws) as w:
        nodes = w.nodes(run_id)
        evaluations = w.evaluations(limit=200)
    assert [n["id"] for n in nodes] == list(range(1, 7))  # none lost, none duplicated
    assert all(n["state"] == "evaluated" for n in nodes)
    kept = {n["id"]: n["candidate_hash"] for n in stopped if n["state"] in ("proposed", "evaluated")}
    assert all(nodes[i - 1]["candidate_hash"] == h for i, h in kept.items())
    searched = [e for e in evaluations if "final" not in (e["verdict"].get("candidate") or "")]
    assert len(searched) == 6  # each node's candidate evaluated once, across both processes


def test_storage_failures_are_told_apart_from_other_errors() -> None:
    assert storage_failed(sqlite3.OperationalError("database or disk is full"))
    assert storage_failed(sqlite3.OperationalError("disk I/O error"))
    assert storage_failed(OSError(errno.ENOSPC, "No space left on device"))
    try:  # a worker's directory that could not be made, inside the harness's own error
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as exc:
            raise HarnessError("a worker could not start") from exc
    except HarnessError as wrapped:
        assert storage_failed(wrapped)
    assert not storage_failed(sqlite3.OperationalError("no such table: nodes"))
    assert not storage_failed(OSError(errno.ENOENT, "No such file"))
    assert not storage_failed(RuntimeError("a bug"))
