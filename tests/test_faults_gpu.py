"""GPU faults: each is the candidate's verdict, and the next candidate in the same pool is measured
on a healthy device. An illegal address poisons the CUDA context of the process that made it, so
only a fresh worker per candidate keeps it from spreading; a kernel that never ends is killed at the
run limit; device memory asked for past the limit is an out-of-memory verdict.

The fault kernels are the soak benchmark's (`benchmarks/soak.py`). Run on the device machine:
pytest -m gpu tests/test_faults_gpu.py
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelevolve.evaluate import EvaluatorPool, Status
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec

from .conftest import SPECS, harness_settings
from .cpu_candidates import TRITON_SOFTMAX

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from soak import fault_source

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluatorPool]:
    settings = harness_settings(tmp_path_factory.mktemp("gpu-faults"), "cuda", run_timeout_s=20, workers=1)
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cuda"), settings) as p:
        yield p


def _healthy(pool: EvaluatorPool) -> None:
    v = pool.evaluate_one(TRITON_SOFTMAX, "honest.py")
    assert v.status == Status.OK and v.correct and v.timed, v.message


def test_an_illegal_address_is_the_candidates_alone(pool: EvaluatorPool) -> None:
    v = pool.evaluate_one(fault_source("crash", gpu=True, node=1), "far_store.py")
    assert v.status in (Status.RUNTIME_ERROR, Status.CRASH) and not v.correct, v.message
    assert "illegal" in (v.message + (v.log_tail or "")).lower(), v.message
    _healthy(pool)


def test_a_gpu_kernel_that_never_ends_times_out(pool: EvaluatorPool) -> None:
    v = pool.evaluate_one(fault_source("hang", gpu=True, node=2), "spin.py")
    assert v.status == Status.TIMEOUT, v.message
    _healthy(pool)


def test_device_memory_past_the_limit_is_a_verdict(pool: EvaluatorPool) -> None:
    v = pool.evaluate_one(fault_source("oom", gpu=True, node=3), "hoard.py")
    assert v.status in (Status.OOM, Status.RUNTIME_ERROR) and not v.correct, v.message
    assert "memory" in v.message.lower(), v.message
    _healthy(pool)
