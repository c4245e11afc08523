"""GPU faults: each is the candidate's verdict, and the next candidate in the same pool is measured
on a healthy device. An illegal address poisons the CUDA context of the process that made it, so
only a fresh worker per candidate keeps it from spreading; a kernel that never ends is killed at the
run limit; device memory asked for past the limit is an out-of-memory verdict.

The fault kernels are the soak benchmark's (`benchmarks/soak.py`). Run on the device machine:
pytest -m gpu tests/test_faults_gpu.py
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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
    # stopped at the run limit (20 s here), not the compile limit (90 s): its first launch began the run
    assert v.status == Status.TIMEOUT and "phase first-run, limit 20 s" in v.message, v.message
    _healthy(pool)


def test_a_hanging_first_run_holds_the_device(tmp_path: Path) -> None:
    """The spinning kernel holds the device lease: the candidate beside it waits for the lease
    instead of being timed while the spin occupies the GPU."""
    spinning = threading.Event()

    def on_event(event: str, label: str, detail: Any) -> None:
        if event == "phase" and label == "spin.py" and detail == "first-run":
            spinning.set()

    settings = harness_settings(tmp_path, "cuda", run_timeout_s=15, workers=2, spares=2)
    spec, cuda = load_spec(SPECS / "softmax.py"), get_platform("cuda")
    with EvaluatorPool(spec, cuda, settings, on_event=on_event) as two, ThreadPoolExecutor(1) as ex:
        hang = ex.submit(two.evaluate_one, fault_source("hang", gpu=True, node=4), "spin.py")
        assert spinning.wait(120), "the spinning candidate never reached its first run"
        honest = two.evaluate_one(TRITON_SOFTMAX, "honest.py")
        v = hang.result()
    assert v.status == Status.TIMEOUT and "phase first-run, limit 15 s" in v.message, v.message
    assert honest.status == Status.OK and honest.correct, honest.message
    assert honest.phases.get("lease", 0.0) > 5.0, honest.phases  # it waited for the spin to be killed


def test_device_memory_past_the_limit_is_a_verdict(pool: EvaluatorPool) -> None:
    v = pool.evaluate_one(fault_source("oom", gpu=True, node=3), "hoard.py")
    assert v.status in (Status.OOM, Status.RUNTIME_ERROR) and not v.correct, v.message
    assert "memory" in v.message.lower(), v.message
    _healthy(pool)


def test_a_spec_too_large_for_the_first_memory_share_gets_the_larger_one(tmp_path: Path) -> None:
    """Out of memory under the harness's first cap (0.9 over workers, spares and specs per device) is
    not the candidate's fault: the pool raises the share to all of its part of the device (0.9 over
    the specs per device), one evaluation at a time, and evaluates again.
    The candidate's scratch (1.1x the first share) stands in for a spec whose timing needs more."""
    import torch

    from kernelevolve.evaluate.pool import gpu_shares

    from .cpu_candidates import TRITON_SOFTMAX_KERNEL

    settings = harness_settings(tmp_path, "cuda", workers=2, spares=1, device_share=3)
    shares = gpu_shares(settings, "cuda")
    assert shares == (0.1, 0.3)
    scratch = int(1.1 * shares[0] * torch.cuda.get_device_properties(0).total_memory)
    # One scratch per process, taken at the first call (a CUDA graph capture would take another).
    source = (
        TRITON_SOFTMAX_KERNEL
        + f"""
_SCRATCH = []


class ModelNew(nn.Module):
    def forward(self, x):
        if not _SCRATCH:
            _SCRATCH.append(torch.empty({scratch}, dtype=torch.uint8, device=x.device))
        x = x.contiguous()
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
"""
    )
    events: list[tuple[str, Any]] = []
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cuda"), settings,
                       on_event=lambda e, label, d: events.append((e, d))) as pool:  # fmt: skip
        v = pool.evaluate_one(source, "scratch.py")
        assert pool.gpu_share == 0.3 and pool.solo
    retries = [d for e, d in events if e == "retry"]
    assert len(retries) == 1 and "out of memory under the harness's memory cap of 10.0%" in retries[0]
    assert v.status == Status.OK and v.correct and v.timed, v.message
