"""Shared fixtures. GPU tests (marker `gpu`) are skipped where torch sees no CUDA device; they run on
the device machine with `pytest -m gpu`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

# The store's sealing key (`store.seal`): the tests' own, not the user's.
os.environ.setdefault(
    "KERNELEVOLVE_SEAL_KEY_FILE",
    str(Path(os.environ.get("TMPDIR", "/tmp")) / f"kernelevolve-tests-{os.getuid()}.key"),
)

from kernelevolve.config import Settings
from kernelevolve.evaluate import EvaluatorPool
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec

SPECS = Path(__file__).parent / "specs"
EXAMPLES = Path(__file__).parent.parent / "examples"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the device machine with -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def worker_processes(root: int) -> tuple[list[int], list[int]]:
    """Worker processes below `root`: (the ones the engine spawned, the ones running the candidate).
    With a PID namespace, each worker is three processes: the spawned stub outside, the namespace's
    init, and the confined worker under it; without one, the two lists are the same. A worker forked
    by the fork server (the default on Linux) has the server's command line and its own name."""
    from kernelevolve.evaluate.forkserver import COMM
    from kernelevolve.evaluate.sandbox import descendants

    parents = {}
    for pid in descendants(root, include_zombies=False):
        try:
            proc = Path(f"/proc/{pid}")
            if (
                b"kernelevolve.evaluate.worker" in (proc / "cmdline").read_bytes()
                or (proc / "comm").read_bytes().strip() == COMM
            ):
                stat = Path(f"/proc/{pid}/stat").read_text()
                parents[pid] = int(stat[stat.rfind(")") + 2 :].split()[1])
        except OSError:
            pass
    spawned = [pid for pid, parent in parents.items() if parent not in parents]
    confined = [pid for pid in parents if pid not in parents.values()]
    return spawned, confined


def harness_settings(tmp: Path, platform: str = "cpu", **overrides: object) -> Settings:
    """Fast settings for tests: eager baseline only, short timing, generous timeouts."""
    base = Settings(
        workspace=tmp / "ws",
        platform=platform,
        baselines=["eager"],
        fitness_baseline="eager",
        timing_budget_s=0.15,
        min_trials=10,
        max_trials=40,
        warmup_trials=2,
        warmup_s=0.0,  # the platform's warm-up seconds are for fidelity, not for these tests
        compile_timeout_s=90,
        run_timeout_s=60,
        memory_limit_gb=6 if platform == "cpu" else 16,
        workers=1,
        spares=1,
        # The one setting taken from the environment, so the GPU tests can be run with either start.
        worker_start=os.environ.get("KERNELEVOLVE_WORKER_START", "auto"),
    )
    return replace(base, **overrides).validate()  # type: ignore[arg-type]


def cpu_settings(tmp: Path, **overrides: object) -> Settings:
    return harness_settings(tmp, "cpu", **overrides)


@pytest.fixture(scope="module")
def softmax_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluatorPool]:
    """One pool for a module's candidates: each still gets its own fresh, prepared worker."""
    tmp = tmp_path_factory.mktemp("softmax")
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cpu"), cpu_settings(tmp)) as pool:
        yield pool


@pytest.fixture(scope="module")
def unguarded_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluatorPool]:
    """Static guards off: proves each runtime check catches its trick on its own."""
    tmp = tmp_path_factory.mktemp("unguarded")
    settings = cpu_settings(tmp, compile_timeout_s=60, run_timeout_s=20)
    with EvaluatorPool(
        load_spec(SPECS / "softmax.py"), get_platform("cpu"), settings, static_guards=False
    ) as pool:
        yield pool
