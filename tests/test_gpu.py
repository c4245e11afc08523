"""GPU tests (marker `gpu`): run on the device machine with `pytest -m gpu`. Each trick and fault is
shown on real hardware, beside the honest candidates that pass."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelevolve.config import Settings
from kernelevolve.evaluate import EvaluatorPool, Status
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from tests import gpu_candidates as gc
from tests.conftest import SPECS, harness_settings

pytestmark = pytest.mark.gpu


def gpu_settings(tmp: Path, **overrides: object) -> Settings:
    return harness_settings(tmp, "cuda", **{"timing_budget_s": 0.3, "compile_timeout_s": 120, **overrides})


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluatorPool]:
    tmp = tmp_path_factory.mktemp("gpu-small")
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cuda"), gpu_settings(tmp)) as pool:
        yield pool


@pytest.fixture(scope="module")
def large_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluatorPool]:
    tmp = tmp_path_factory.mktemp("gpu-large")
    settings = gpu_settings(tmp, compile_timeout_s=25, run_timeout_s=30)
    with EvaluatorPool(
        load_spec(SPECS / "softmax_large.py"), get_platform("cuda"), settings, static_guards=False
    ) as pool:
        yield pool


def test_honest_triton_small_shapes_use_cuda_graphs(small_pool: EvaluatorPool) -> None:
    v = small_pool.evaluate_one(gc.HONEST, "honest.py")
    assert v.status == Status.OK, v.message
    assert v.timed and v.method.timer == "cuda_events" and "flushed" in (v.method.l2 or "")
    assert all(s.cuda_graphs for s in v.shapes)  # single calls of a few microseconds: launch-bound
    assert v.method.device and v.method.torch and v.method.triton


def test_honest_cuda_cpp_candidate(small_pool: EvaluatorPool) -> None:
    v = small_pool.evaluate_one(gc.CUDA_CPP, "cuda_cpp.py")
    assert v.status == Status.OK, v.message
    assert v.candidate_kind == "cuda"


def test_side_stream_is_refused_statically(small_pool: EvaluatorPool) -> None:
    v = small_pool.evaluate_one(gc.SIDE_STREAM, "side_static.py")
    assert v.status == Status.GUARD_VIOLATION and "forbidden-api" in {x.rule for x in v.violations}


def test_side_stream_work_is_caught_at_run_time(large_pool: EvaluatorPool) -> None:
    v = large_pool.evaluate_one(gc.SIDE_STREAM, "side_runtime.py")
    # Either the timed call's output (snapshotted when its stream finished) is incomplete, or the
    # device stayed busy after the timed region: never a win.
    assert v.status in (Status.GUARD_VIOLATION, Status.INCORRECT), v.message
    assert not v.ok


def test_event_timer_patch_is_caught_at_run_time(large_pool: EvaluatorPool) -> None:
    v = large_pool.evaluate_one(gc.EVENT_PATCH, "event_patch.py")
    assert v.status == Status.GUARD_VIOLATION and "torch.cuda.Event.elapsed_time" in v.message


def test_illegal_memory_access_is_a_verdict(large_pool: EvaluatorPool) -> None:
    v = large_pool.evaluate_one(gc.ILLEGAL_ACCESS, "wild.py")
    assert v.status in (Status.RUNTIME_ERROR, Status.CRASH), v.message
    assert "illegal" in v.message.lower() or "CUDA" in v.message


def test_kernel_that_never_ends_times_out(large_pool: EvaluatorPool) -> None:
    v = large_pool.evaluate_one(gc.HANG, "hang.py")
    assert v.status == Status.TIMEOUT, v.message


def test_next_candidate_runs_on_a_healthy_device(large_pool: EvaluatorPool) -> None:
    v = large_pool.evaluate_one(gc.HONEST, "honest_after_faults.py")
    assert v.status == Status.OK, v.message
    (shape,) = v.shapes
    assert not shape.cuda_graphs  # ~100 us per call: timed eagerly


def test_every_worker_of_a_run_times_torch_compile(tmp_path: Path) -> None:
    """A run's workers after the first start from a copy of its trusted compile cache, taken from the
    first. While that cache bundled Triton kernels, which name the first worker's directory, every
    later worker's torch.compile failed under the sandbox's write rules (seen on an H100: its autotuning
    choice was written beside the first worker's kernel source, PermissionError), and the run fell back
    to ranking against eager. Here the first worker has ended before the last ones start."""
    settings = gpu_settings(tmp_path, baselines=["eager", "compile"], fitness_baseline="compile")
    assert settings.sandbox_filesystem
    trusted = tmp_path / "trusted" / "inductor"
    spec = load_spec(SPECS / "softmax_large.py")
    with EvaluatorPool(spec, get_platform("cuda"), settings, trusted_cache=trusted) as pool:
        verdicts = [pool.evaluate_one(gc.HONEST, f"honest{i}.py") for i in range(4)]
    assert any(trusted.rglob("*.best_config")), "torch.compile autotuned nothing: the test shows nothing"
    for v in verdicts:
        assert v.status == Status.OK, v.message
        assert v.method.baseline_errors == {}, v.method.baseline_errors
        assert v.speedup_vs_compile is not None and v.fitness > 0


SLOW_HONEST = gc.triton_candidate("""
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        for _ in range(40):  # correct, and forty launches slow: well above the graph threshold
            launch(x, y)
        return y
""")


def test_graph_decision_follows_the_baselines_not_the_candidate(tmp_path: Path) -> None:
    # A slow candidate must not switch CUDA graphs off for the baselines it is compared with: without
    # graphs, torch.compile's per-call overhead would make a slow kernel look fast against it.
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cuda"), gpu_settings(tmp_path)) as pool:
        v = pool.evaluate_one(SLOW_HONEST, "slow.py")
        assert v.status == Status.OK, v.message
        assert all(s.cuda_graphs for s in v.shapes)
        assert v.speedup_vs_eager is not None and v.speedup_vs_eager < 0.5
        assert pool.graphs == {s.name: True for s in v.shapes}  # pinned for the run's later candidates


def test_host_launch_overhead_is_not_timed_as_device_time() -> None:
    """A call whose host side takes 200 us before it launches a short kernel: the timer's flush,
    lengthened to twice that, keeps the device busy meanwhile, so what is timed is the kernel; with
    the flush at its base length (the control), most of the host's 200 us land between the events."""
    import statistics
    import time

    import torch

    from kernelevolve.evaluate.lease import DeviceLease
    from kernelevolve.platforms.timers import CudaTimer

    device = torch.device("cuda", 0)
    timer = get_platform("cuda").make_timer(device)  # the product's timer, sized for this device
    assert isinstance(timer, CudaTimer) and timer.max_bytes > timer.base_bytes
    x = torch.randn(1 << 20, device=device)
    y = torch.empty_like(x)

    def slow_host() -> list[torch.Tensor]:
        until = time.perf_counter() + 200e-6
        while time.perf_counter() < until:
            pass
        return [torch.mul(x, 2.0, out=y)]

    def median_time() -> float:
        times = []
        for _ in range(30):
            timer.flush()
            times.append(timer.time_call(slow_host, snapshot=False)[0])
        return statistics.median(times[10:])

    with DeviceLease(get_platform("cuda").lease_key(0)):  # no other process's timing beside ours
        held = median_time()
        timer.max_bytes = timer.base_bytes
        unheld = median_time()
    assert held < 60e-6, (held, unheld)
    assert unheld > 100e-6, (held, unheld)


def test_a_checked_calls_output_copy_is_not_its_tail_but_side_stream_work_is() -> None:
    """The snapshot of a checked call's outputs (a copy, and its allocation) is not time the device
    spent after the call: a 512 MiB output's copy made an honest call's tail several hundred us (a
    GEMM with a 64 MiB output was flagged `side-stream` at 284 us against the baselines' 30 us).
    Work left running on a side stream still shows in the tail, snapshot or not."""
    import statistics

    import torch

    from kernelevolve.platforms.timers import CudaTimer

    device = torch.device("cuda", 0)
    timer = get_platform("cuda").make_timer(device)
    assert isinstance(timer, CudaTimer)
    x = torch.randn(1 << 27, device=device)  # 512 MiB
    side = torch.cuda.Stream(device)
    y = torch.empty_like(x)

    def honest() -> list[torch.Tensor]:
        return [torch.mul(x, 2.0)]  # a new 512 MiB output each call

    def cheat() -> list[torch.Tensor]:
        out = torch.empty_like(x)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(4):
                torch.mul(x, 2.0, out=y)
            out.copy_(y)
        return [out]

    def median_tail(fn: object, snapshot: bool) -> float:
        tails = []
        for _ in range(12):
            timer.flush()
            tails.append(timer.time_call(fn, snapshot=snapshot)[1])  # type: ignore[arg-type]
        return statistics.median(tails[2:])

    torch.cuda.empty_cache()  # a fresh allocation for the first copies
    honest_tail = median_tail(honest, True)
    cheat_tails = (median_tail(cheat, True), median_tail(cheat, False))
    assert honest_tail < 60e-6, honest_tail
    assert min(cheat_tails) > 300e-6, cheat_tails  # four passes over 512 MiB on the side stream


def test_the_flush_grows_only_into_a_quarter_of_the_workers_room() -> None:
    """Under a worker's memory cap with 1 GiB left, a slow host asks for a 2 GiB flush: the buffer
    grows by at most a quarter of the room, and the calls still get the rest (level 1's 17_ ran out of
    memory at a re-measure when the flush took it all)."""
    import torch

    from kernelevolve.platforms.timers import CudaTimer

    device = torch.device("cuda", 0)
    timer = get_platform("cuda").make_timer(device)
    assert isinstance(timer, CudaTimer) and timer.max_bytes > timer.base_bytes + 2**29  # 2 GiB on 80 GB
    total = torch.cuda.get_device_properties(device).total_memory
    held = torch.empty(2**28, device=device)  # 1 GiB in use before the cap
    torch.cuda.empty_cache()  # what earlier tests of this process left cached is not this test's
    try:
        torch.cuda.set_per_process_memory_fraction(
            (torch.cuda.memory_reserved(device) + 2**30) / total, device
        )
        timer.enqueue_s.append(1.0)  # a host so slow that the flush would want its maximum
        timer.flush()
        grown = timer.buf.numel() * 4
        assert timer.base_bytes < grown <= timer.base_bytes + 2**28, grown / 2**20
        rest = torch.empty(2**27, dtype=torch.int32, device=device)  # 512 MiB for the calls
        del rest
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        del held
    timer.flush()  # the control: with the whole device as its room, the flush takes what it wants
    assert timer.buf.numel() * 4 == timer.max_bytes // 4 * 4
