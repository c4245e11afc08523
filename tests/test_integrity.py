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
