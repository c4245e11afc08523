"""The harness checks itself (issue O): an installed kernelevolve whose files differ from its RECORD
evaluates nothing and names the files; a working tree is labelled; a worker whose files differ from
its engine's refuses to prepare; every verdict's method says which harness judged it.

The installed copy is made here as pip makes one: the package's files in a folder of their own, a
`kernelevolve-<version>.dist-info` beside them whose RECORD lists each file's sha256, and that folder
first on the interpreter's path.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kernelevolve
from kernelevolve import integrity
from kernelevolve.errors import HarnessError
from tests.conftest import SPECS, cpu_settings
from tests.cpu_candidates import HONEST

PACKAGE = Path(kernelevolve.__file__).resolve().parent


def _installed_copy(site: Path) -> Path:
    """`site/kernelevolve` and its dist-info with a RECORD, as an install leaves them."""
    shutil.copytree(PACKAGE, site / "kernelevolve", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    info = site / f"kernelevolve-{kernelevolve.__version__}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: kernelevolve\nVersion: {kernelevolve.__version__}\n"
    )
    rows = []
    for f in sorted((site / "kernelevolve").rglob("*")):
        if f.is_file():
            digest = base64.urlsafe_b64encode(hashlib.sha256(f.read_bytes()).digest()).rstrip(b"=").decode()
            rows.append(f"{f.relative_to(site).as_posix()},sha256={digest},{f.stat().st_size}")
    rows.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return site


def _run(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "KERNELEVOLVE_PLATFORM": "cpu"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )


def test_an_edited_installed_harness_is_refused_with_the_file_named(tmp_path: Path) -> None:
    site = _installed_copy(tmp_path / "site")
    probe = "from kernelevolve import integrity; h = integrity.check(); print(h.kind, h.root); print(h.label)"
    intact = _run(site, "-c", probe, cwd=tmp_path)
    assert intact.returncode == 0, intact.stderr
    assert f"installed {site}" in intact.stdout and "installed (intact)" in intact.stdout  # the control
    # one comparison line changed: a tolerance loosened a thousandfold
    correctness = site / "kernelevolve" / "evaluate" / "correctness.py"
    text = correctness.read_text()
    assert "rtol" in text
    correctness.write_text(text.replace("rtol", "1000 * rtol", 1))
    cand = tmp_path / "cand.py"
    cand.write_text(HONEST)
    refused = _run(site, "-c", "from kernelevolve.cli import main; main()", "eval", str(SPECS / "softmax.py"),
                   str(cand), "--workspace", str(tmp_path / "ws"), cwd=tmp_path)  # fmt: skip
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0, said
    assert "the installed harness was modified" in said and "kernelevolve/evaluate/correctness.py" in said, (
        said
    )
    assert "status: ok" not in said and "pip install --force-reinstall" in said
    # a module added beside the installed ones is a modification too
    correctness.write_text(text)
    (site / "kernelevolve" / "evaluate" / "patch.py").write_text("print('hello')\n")
    added = _run(site, "-c", probe, cwd=tmp_path)
    assert added.returncode != 0 and "kernelevolve/evaluate/patch.py" in added.stderr, added.stderr


def test_a_working_tree_is_labelled_and_every_verdict_says_which_harness_judged_it(tmp_path: Path) -> None:
    from kernelevolve import jobs

    h = integrity.harness()
    assert h.kind == "working tree" and not h.modified  # this checkout: src on the path, not installed
    assert h.label.startswith(f"kernelevolve {kernelevolve.__version__} from a working tree")
    assert h.digest[:16] in h.label
    cand = tmp_path / "cand.py"
    cand.write_text(HONEST)
    _, (verdict,) = jobs.evaluate(SPECS / "softmax.py", [cand], cpu_settings(tmp_path, timing_budget_s=0.3))
    assert verdict.status == "ok", verdict.message
    assert verdict.method.harness == h.label


def test_a_worker_whose_files_differ_from_its_engines_prepares_nothing() -> None:
    from kernelevolve.config import load_settings
    from kernelevolve.evaluate import worker
    from kernelevolve.evaluate.messages import PrepareMsg, WorkerSettings

    settings = WorkerSettings.from_dict(load_settings().to_dict())
    mine = integrity.harness(git=False).digest
    assert integrity.check(git=False, expected_digest=mine).digest == mine  # the control
    msg = PrepareMsg(platform="cpu", lease_key="x", settings=settings, harness_digest="0" * 64)
    with pytest.raises(HarnessError, match="changed after the engine started"):
        worker.prepare(msg, [])


# -- verdicts bound to what was evaluated (store.seal) ---------------------------------------------


def test_an_edited_verdict_row_and_a_replaced_blob_are_tampered_never_ranked(tmp_path: Path) -> None:
    """What an agent with a shell would try on the workspace: raise a verdict's fitness in SQLite (the
    evaluation row and the node's copy), swap the judged kernel's blob for another, insert a verdict
    row of its own. Each is read back as `tampered`, with the reason, and never ranked; the restored
    row verifies again (the control). The run's report gives the re-measured figures."""
    import sqlite3
    from dataclasses import replace

    from kernelevolve import agent_jobs as agent
    from kernelevolve.optimize import start
    from kernelevolve.search.limits import Limits
    from kernelevolve.search.policies import SearchConfig
    from kernelevolve.search.tree import Tree
    from kernelevolve.store import Workspace
    from kernelevolve.synth import SynthConfig
    from tests.conftest import EXAMPLES

    c_softmax = (EXAMPLES / "softmax/c_rowsoftmax.py").read_text()
    ws = tmp_path / "ws"
    settings = replace(cpu_settings(tmp_path, timing_budget_s=0.3), workspace=ws)
    run_id = start(
        SPECS / "softmax.py", settings, SearchConfig(draft=1), Limits(budget=3), SynthConfig("agent")
    )
    agent.next_task(ws, run_id)
    assert agent.submit(ws, run_id, 1, c_softmax, note="one row per thread")["status"] == "ok"

    def node1() -> dict:
        with Workspace.open(ws) as w:
            rows = w.nodes(run_id)
        return rows[0] | {"_tree_best": Tree.from_rows(rows).best()}

    honest = node1()
    assert honest["status"] == "ok" and honest["tampered"] is None and honest["_tree_best"].id == 1
    eid, fitness = honest["evaluation_id"], honest["fitness"]
    db = sqlite3.connect(ws / "kernelevolve.db")
    db.execute("UPDATE evaluations SET fitness = 50.0 WHERE id = ?", (eid,))
    db.execute("UPDATE nodes SET fitness = 50.0 WHERE run_id = ? AND id = 1", (run_id,))
    db.commit()
    forged = node1()
    assert forged["status"] == "tampered" and forged["fitness"] == 0.0 and forged["_tree_best"] is None
    assert "edited after it was written" in forged["message"]
    db.execute("UPDATE evaluations SET fitness = ? WHERE id = ?", (fitness, eid))
    db.commit()
    assert node1()["status"] == "ok"  # the restored row verifies again; the node's own copy is not read
    with Workspace.open(ws) as w:
        blob = w.blobs.path(honest["candidate_hash"])
    blob.write_text(c_softmax.replace("expf", "expf /* a faster kernel, swapped in */"))
    swapped = node1()
    assert swapped["status"] == "tampered" and "blob was replaced" in swapped["message"]
    blob.write_text(c_softmax)
    # a verdict row inserted without the store: it has no seal, and no later submit reuses it
    db.execute(
        "INSERT INTO evaluations (created_at, spec_fingerprint, candidate_hash, platform, device, status, "
        "correct, speedup_vs_eager, speedup_vs_compile, fitness, verdict_json) SELECT created_at, "
        "spec_fingerprint, candidate_hash, platform, device, status, correct, 9.0, 9.0, 9.0, verdict_json "
        "FROM evaluations WHERE id = ?",
        (eid,),
    )
    db.commit()
    inserted = db.execute("SELECT max(id) FROM evaluations").fetchone()[0]
    with Workspace.open(ws) as w:
        assert "carries no seal" in (w.evaluation(inserted) or {})["tampered"]
        row = w.evaluation(eid) or {}
        key = row["verdict"]["method"]["key"]
        found = w.reusable_evaluation(honest["candidate_hash"], row["spec_fingerprint"], key, {"ok"})
        assert key and found is not None and found[0] == eid  # the newer, inserted row is passed over
    # the run goes on with node 1 forged again: an honest node 2 is the best, and the report's figures
    # are its final re-measure's
    db.execute("UPDATE evaluations SET fitness = 50.0 WHERE id = ?", (eid,))
    db.commit()
    agent.next_task(ws, run_id, new=True)
    assert agent.submit(ws, run_id, 2, c_softmax + "\n# node 2\n")["status"] == "ok"
    summary = agent.finish(ws, run_id)
    assert summary["best_node"] == 2 and summary["final"] is not None
    assert summary["best_fitness"] == summary["final"]["fitness"]
    report = Path(summary["report"]["markdown"]).read_text()
    assert "fitness at search time" in report
    assert integrity.harness().label in report  # which harness judged it, in the report's header


def test_a_row_sealed_under_another_key_says_so_with_both_ids_and_an_old_seal_still_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workspace carried to a machine with another seal key: its rows are refused as before, but the
    reason names the two keys and what to do, not an edit. A seal from before the key's id verifies."""
    import hashlib
    import hmac
    import json

    from kernelevolve.store import seal

    row = {"spec_fingerprint": "fp", "candidate_hash": "h", "platform": "cuda", "device": "H100",
           "status": "ok", "correct": True, "speedup_vs_eager": 1.5, "speedup_vs_compile": 1.1,
           "fitness": 1.1, "verdict_json": "{}"}  # fmt: skip
    monkeypatch.setenv("KERNELEVOLVE_SEAL_KEY_FILE", str(tmp_path / "a.key"))
    row["seal"] = seal.seal(row)
    first = seal.key_id()
    assert row["seal"].startswith(f"{first}:") and seal.verify(row) is None
    monkeypatch.setenv("KERNELEVOLVE_SEAL_KEY_FILE", str(tmp_path / "b.key"))
    why = seal.verify(row)
    assert why is not None and "another seal key" in why and first in why and seal.key_id() in why
    assert "edited" not in why
    # an edit under the right key is still an edit, and a forged id is still refused
    monkeypatch.setenv("KERNELEVOLVE_SEAL_KEY_FILE", str(tmp_path / "a.key"))
    assert "edited" in (seal.verify({**row, "fitness": 9.0}) or "")
    assert seal.verify({**row, "seal": "0" * 12 + ":" + row["seal"].split(":")[1]}) is not None
    # a seal written before the id: the bare HMAC over the same fields
    fields = [seal._canonical(name, row.get(name)) for name in seal.SEALED]
    bare = hmac.new(
        seal.key(), json.dumps(fields, separators=(",", ":")).encode(), hashlib.sha256
    ).hexdigest()
    assert seal.verify({**row, "seal": bare}) is None
    assert "edited" in (seal.verify({**row, "seal": bare, "fitness": 9.0}) or "")


def test_a_run_sealed_under_another_key_is_refused_before_it_spends_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workspace carried to a machine without its seal key (a bare GPU machine, say): resumed there,
    the run would rank none of its verdicts and spend its budget again; in the 11-28 suites run two
    specs ended "no correct kernel (tampered 49)" so. It is refused instead, naming both keys and
    what to do, and resumes once the key is back."""
    from kernelevolve import optimize
    from kernelevolve.errors import WorkspaceError
    from kernelevolve.search.limits import Limits
    from kernelevolve.search.policies import SearchConfig
    from kernelevolve.store import Workspace, seal
    from kernelevolve.synth import SynthConfig

    monkeypatch.setenv("KERNELEVOLVE_SEAL_KEY_FILE", str(tmp_path / "here.key"))
    settings = cpu_settings(tmp_path)
    run_id = optimize.start(SPECS / "ew_chain.py", settings, SearchConfig(), Limits(budget=3), SynthConfig())
    with Workspace.open(settings.workspace) as ws:
        node = ws.create_node(run_id, None, None, "draft")
        digest = ws.propose_node(run_id, node, source="KERNEL = 1\n")
        verdict = {"status": "ok", "correct": True, "fitness": 1.3, "platform": "cpu",
                   "spec_fingerprint": ws.run(run_id)["spec_fingerprint"], "candidate_hash": digest}  # fmt: skip
        ws.finish_node(run_id, node, verdict, 1.0)
        sealed_by = seal.key_id()
        assert ws.foreign_seals(run_id) == {}
        optimize.build_engine(ws, run_id)  # its own key: it resumes

        monkeypatch.setenv("KERNELEVOLVE_SEAL_KEY_FILE", str(tmp_path / "elsewhere.key"))
        assert ws.foreign_seals(run_id) == {sealed_by: 1}
        with pytest.raises(WorkspaceError) as refused:
            optimize.build_engine(ws, run_id)
        said = str(refused.value)
        assert sealed_by in said and seal.key_id() in said and "KERNELEVOLVE_SEAL_KEY_FILE" in said
        assert "--redo" in said and [n["status"] for n in ws.nodes(run_id)][-1] == "tampered"

        monkeypatch.setenv("KERNELEVOLVE_SEAL_KEY_FILE", str(tmp_path / "here.key"))  # the key copied along
        assert ws.foreign_seals(run_id) == {} and ws.nodes(run_id)[-1]["status"] == "ok"
        optimize.build_engine(ws, run_id)
