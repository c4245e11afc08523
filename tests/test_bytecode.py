"""The engine's bytecode for workers (bytecode.py), where the installation keeps none: the first
worker's imports are compiled into it by the engine, later workers read it, and no worker can write
it: a candidate that tries to plant or overwrite bytecode there fails, where the same candidate with
the file-system sandbox off succeeds (so the test sees the attack run)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelevolve.evaluate import EvaluatorPool, bytecode
from kernelevolve.evaluate.handle import WorkerHandle
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from tests.conftest import SPECS, cpu_settings
from tests.cpu_candidates import candidate
from tests.test_sandbox import LANDLOCK_MISSING

PLANTER = candidate(
    prelude="""
import os as _os, pathlib as _pl
_prefix = _pl.Path(_os.environ["PYTHONPYCACHEPREFIX"])
for _target in [_prefix / "planted.pyc", *sorted(_prefix.rglob("torch/__init__*.pyc"))[:1]]:
    try:
        _target.write_bytes(b"planted by a candidate")
    except OSError:
        pass
"""
)


@pytest.fixture
def no_bytecode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An installation without bytecode, as the engine sees it; the folder's root under tmp_path."""
    monkeypatch.setattr(bytecode, "needed", lambda: True)
    monkeypatch.setattr(bytecode, "root", lambda: tmp_path / "machine" / "bytecode")
    (tmp_path / "machine").mkdir(mode=0o700)
    yield tmp_path / "machine" / "bytecode"


def _first_worker(tmp: Path) -> Path:
    settings = cpu_settings(tmp, baselines=["eager"], fitness_baseline="eager")
    handle = WorkerHandle(
        platform=get_platform("cpu"),
        settings=settings,
        spec_path=SPECS / "softmax.py",
        precision="strict_fp32",
    ).start()
    try:
        handle.wait_ready(300)
        assert handle.bytecode is not None and handle.filler is not None
        assert handle.filler.wait(300) == 0
        return handle.bytecode
    finally:
        handle.close()


@pytest.mark.slow
def test_the_first_workers_imports_are_compiled_by_the_engine(no_bytecode: Path, tmp_path: Path) -> None:
    folder = _first_worker(tmp_path)
    assert folder.parent == no_bytecode and bytecode.filled(folder)
    compiled = {p.name.split(".")[0] for p in folder.rglob("*.pyc")}
    assert len(list(folder.rglob("*.pyc"))) > 500  # torch's import alone is over a thousand modules
    assert {"worker", "timing", "correctness"} <= compiled  # kernelevolve's own
    assert bytecode.fill(folder, ["x.py"]) is None  # filled once


def test_only_the_installations_and_the_projects_sources_are_compiled(
    no_bytecode: Path, tmp_path: Path
) -> None:
    """A file outside them (a secret that happens to parse as Python) never reaches the folder that
    every worker can read."""
    folder = bytecode.folder()
    assert folder is not None
    outside = tmp_path / "secret_settings.py"
    outside.write_text("API_KEY = 'sk-not-for-workers'\n")
    inside = Path(bytecode.__file__)
    proc = bytecode.fill(folder, [str(outside), str(inside)])
    assert proc is not None and proc.wait(120) == 0
    names = {p.name for p in folder.rglob("*.pyc")}
    assert any(n.startswith("bytecode.") for n in names)
    assert not any(n.startswith("secret_settings.") for n in names)
    assert (folder / bytecode.FILLED).read_text().startswith("1 of 1")


def test_a_folder_that_others_own_or_may_write_is_not_used(no_bytecode: Path) -> None:
    folder = bytecode.folder()
    assert folder is not None and folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o777)  # planted by someone else, or left open: workers would run its bytecode
    assert bytecode.folder() is None
    folder.chmod(0o700)
    assert bytecode.folder() == folder


def test_an_installation_with_its_bytecode_gets_no_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bytecode, "needed", lambda: False)
    assert bytecode.folder() is None


@pytest.mark.slow
@pytest.mark.skipif(bool(LANDLOCK_MISSING), reason=str(LANDLOCK_MISSING))
@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "control-without-landlock"])
def test_a_candidate_cannot_plant_bytecode_for_later_workers(
    no_bytecode: Path, tmp_path: Path, sandboxed: bool
) -> None:
    folder = _first_worker(tmp_path)
    victim = sorted(folder.rglob("torch/__init__*.pyc"))[0]
    before = victim.read_bytes()
    settings = cpu_settings(tmp_path / "pool", sandbox_filesystem=sandboxed)
    with EvaluatorPool(
        load_spec(SPECS / "softmax.py"), get_platform("cpu"), settings, static_guards=False
    ) as pool:
        verdict = pool.evaluate_one(PLANTER, "planter.py")
    assert verdict.correct, verdict.message  # the candidate ran to its end either way
    planted = folder / "planted.pyc"
    if sandboxed:
        assert not planted.exists() and victim.read_bytes() == before
    else:  # the control: the same code, Landlock off, writes both
        assert planted.exists() and victim.read_bytes() == b"planted by a candidate"
    assert os.environ.get("PYTHONPYCACHEPREFIX") is None  # the engine's own imports are untouched
