"""Small pure pieces of the harness: timing statistics, the weighted speedup, verdict serialization,
the worker's environment and kill, the roofline, and device leases."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelevolve.evaluate.lease import DeviceLease
from kernelevolve.evaluate.sandbox import descendants, kill_tree, scrub_env
from kernelevolve.evaluate.timing import summarize
from kernelevolve.evaluate.verdict import (
    Method,
    ShapeResult,
    Status,
    TimeStats,
    Verdict,
    Violation,
    weighted_speedup,
)
from kernelevolve.roofline import LAUNCH_FLOOR_S, flop_class, roofline

# -- timing statistics ----------------------------------------------------------------------------


def test_summarize_median_and_quartiles() -> None:
    times = [i * 1e-6 for i in range(101)]
    random.Random(0).shuffle(times)
    stats = summarize(times)
    assert stats.n == 101
    assert stats.median_s == pytest.approx(50e-6)
    assert stats.p25_s == pytest.approx(25e-6)
    assert stats.p75_s == pytest.approx(75e-6)
    assert stats.min_s == 0.0
    assert stats.p25_s <= stats.median_s <= stats.p75_s


def test_summarize_even_count_median() -> None:
    assert summarize([4.0, 1.0, 3.0, 2.0]).median_s == 2.5


def test_spread_is_zero_for_constant_times() -> None:
    stats = summarize([1e-3] * 40)
    assert stats.spread == 0.0
    assert stats.median_s == stats.p25_s == stats.p75_s == stats.min_s == 1e-3


def test_spread_is_large_when_the_median_moves() -> None:
    """Second half twice the first: block medians run from 1 to 2 around a median of 1.5."""
    stats = summarize([1.0] * 50 + [2.0] * 50)
    assert stats.median_s == 1.5
    assert stats.spread == pytest.approx((2.0 - 1.0) / (2 * 1.5))


def test_spread_ignores_order_free_noise() -> None:
    """The same two values interleaved: every block has the same median, the spread is ~0."""
    stats = summarize([1.0, 2.0] * 50)
    assert stats.spread < 0.05


def test_spread_of_a_single_time() -> None:
    stats = summarize([3e-6])
    assert (stats.n, stats.median_s, stats.spread) == (1, 3e-6, 0.0)


def test_p75_of_four_times_is_below_the_maximum() -> None:
    assert summarize([1.0, 2.0, 3.0, 4.0]).p75_s < 4.0


# -- weighted speedup and verdicts ----------------------------------------------------------------


def stats(median_s: float) -> TimeStats:
    return TimeStats(median_s=median_s, p25_s=median_s, p75_s=median_s, min_s=median_s, n=20, spread=0.01)


def two_shapes() -> list[ShapeResult]:
    return [
        ShapeResult("serving", 0.75, candidate=stats(1e-3), eager=stats(2e-3), compile=stats(1.5e-3)),
        ShapeResult("small", 0.25, candidate=stats(2e-3), eager=stats(1e-3), compile=stats(1e-3)),
    ]


def test_weighted_speedup_by_hand() -> None:
    shapes = two_shapes()
    # eager: (0.75 * 2 + 0.25 * 1) / (0.75 * 1 + 0.25 * 2) = 1.75 / 1.25
    assert weighted_speedup(shapes, "eager") == pytest.approx(1.4)
    # compile: (0.75 * 1.5 + 0.25 * 1) / 1.25 = 1.375 / 1.25
    assert weighted_speedup(shapes, "compile") == pytest.approx(1.1)
    # Not the mean of per-shape ratios (2.0 and 0.5 -> 1.625): time is what adds up.
    assert weighted_speedup(shapes, "eager") != pytest.approx(0.75 * 2.0 + 0.25 * 0.5)


def test_weighted_speedup_is_none_when_a_time_is_missing() -> None:
    shapes = two_shapes()
    shapes[1].compile = None
    assert weighted_speedup(shapes, "compile") is None
    assert weighted_speedup(shapes, "eager") == pytest.approx(1.4)
    shapes[0].candidate = None
    assert weighted_speedup(shapes, "eager") is None


def test_verdict_round_trips_through_json() -> None:
    shapes = two_shapes()
    shapes[0].correct, shapes[0].trials, shapes[0].rel_norm_err, shapes[0].bound = True, 6, 1e-7, "memory"
    verdict = Verdict(
        status=Status.SUSPICIOUS,
        message="faster than the roofline",
        correct=True,
        timed=True,
        spec="softmax",
        candidate_kind="triton",
        shapes=shapes,
        speedup_vs_eager=1.4,
        fitness=0.0,
        violations=[Violation("side-stream", "busy after the call"), Violation("import", "os", line=3)],
        flags=["above-roofline"],
        method=Method(
            platform="cuda:sm90",
            timer="cuda_events",
            baselines=["eager", "compile"],
            baseline_errors={"compile": "inductor failed"},
            tolerance={"rtol": 1e-3, "atol": 1e-4, "rel_norm": 5e-5},
            distributions=["spec", "scaled"],
            notes=["graphs"],
        ),
        phases={"compile": 1.5},
    )
    data = json.loads(json.dumps(verdict.to_dict()))
    back = Verdict.from_dict(data)
    assert back == verdict
    assert back.status is Status.SUSPICIOUS and not back.ok
    assert isinstance(back.shapes[0], ShapeResult) and isinstance(back.shapes[0].eager, TimeStats)
    assert isinstance(back.violations[1], Violation) and back.violations[1].line == 3
    assert isinstance(back.method, Method) and back.method.baseline_errors == {"compile": "inductor failed"}
    assert weighted_speedup(back.shapes, "eager") == pytest.approx(1.4)


def test_failure_verdict_round_trips() -> None:
    verdict = Verdict.failure(Status.COMPILE_ERROR, "nvcc: error", log_tail="line 3: error")
    back = Verdict.from_dict(json.loads(json.dumps(verdict.to_dict())))
    assert back == verdict
    assert (back.fitness, back.correct, back.shapes) == (0.0, False, [])


def test_violation_str() -> None:
    assert str(Violation("import", "no os", 4)) == "[import] line 4: no os"
    assert str(Violation("side-stream", "busy")) == "[side-stream] busy"


# -- sandbox: environment -------------------------------------------------------------------------

SECRETS = [
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID",
    "GITHUB_TOKEN",
    "HF_TOKEN",
    "MY_PASSWORD",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "DATABASE_URL",
    "SENTRY_DSN",
    "openai_api_key",
]
KEPT = ["PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "TRITON_CACHE_DIR", "PYTHONPATH", "LANG"]


def test_scrub_env_removes_secrets_and_keeps_the_rest(tmp_path: Path) -> None:
    env = {name: f"value-of-{name}" for name in SECRETS + KEPT}
    env["HOME"] = "/root"
    env["TMPDIR"] = "/tmp"
    original = dict(env)
    clean = scrub_env(env, tmp_path)
    for name in SECRETS:
        assert name not in clean, name
    for name in KEPT:
        assert clean[name] == f"value-of-{name}", name
    assert clean["HOME"] == str(tmp_path)
    assert clean["TMPDIR"] == str(tmp_path / "tmp")
    assert clean["PYTHONNOUSERSITE"] == "1"
    assert env == original  # the parent's mapping is untouched


# -- sandbox: kill --------------------------------------------------------------------------------

# A process tree: the leader (its own session) starts a child in its group and a child in a new
# session; that child starts a grandchild in yet another session. All print their pids.
TREE = textwrap.dedent(
    """
    import subprocess, sys, time
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    same_group = subprocess.Popen(sleeper)
    middle_code = (
        "import subprocess, sys, time\\n"
        f"g = subprocess.Popen({sleeper!r}, start_new_session=True)\\n"
        "print(g.pid, flush=True)\\n"
        "time.sleep(120)\\n"
    )
    middle = subprocess.Popen(
        [sys.executable, "-c", middle_code], start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    grandchild = int(middle.stdout.readline())
    print(same_group.pid, middle.pid, grandchild, flush=True)
    time.sleep(120)
    """
)


def alive(pid: int) -> bool:
    """Running (or stopped): not gone and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


@pytest.fixture
def process_tree() -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    leader = subprocess.Popen(
        [sys.executable, "-c", TREE], start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    assert leader.stdout is not None
    pids = [leader.pid, *map(int, leader.stdout.readline().split())]
    try:
        yield leader, pids
    finally:
        for pid in reversed(pids):  # only if the test failed: never leave our sleepers behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        leader.wait(timeout=10)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="kill_tree walks /proc (Linux)")
def test_kill_tree_kills_every_descendant(process_tree: tuple[subprocess.Popen[str], list[int]]) -> None:
    leader, pids = process_tree
    assert len(pids) == 4 and all(alive(p) for p in pids)
    same_group, middle, grandchild = pids[1:]
    assert set(descendants(leader.pid)) == {same_group, middle, grandchild}
    assert os.getsid(grandchild) == grandchild != os.getsid(leader.pid)  # it left with setsid

    kill_tree(leader.pid)

    assert leader.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []


def test_kill_tree_of_an_exited_process_is_harmless() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    # Wait for the exit but leave the zombie unreaped, so that its pid cannot be reused meanwhile.
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    kill_tree(proc.pid)  # no error
    assert proc.wait(timeout=10) == 0


# -- roofline -------------------------------------------------------------------------------------

BANDWIDTH = 3.0e12  # bytes/s
PEAK = 1.0e15  # FLOP/s


def test_roofline_memory_bound() -> None:
    t, bound = roofline(nbytes=3e9, flops=1e9, bandwidth=BANDWIDTH, peak_flops=PEAK)
    assert (t, bound) == (pytest.approx(1e-3), "memory")


def test_roofline_compute_bound() -> None:
    t, bound = roofline(nbytes=3e9, flops=1e13, bandwidth=BANDWIDTH, peak_flops=PEAK)
    assert (t, bound) == (pytest.approx(1e-2), "compute")


def test_roofline_launch_bound() -> None:
    t, bound = roofline(nbytes=3e6, flops=1e9, bandwidth=BANDWIDTH, peak_flops=PEAK)
    assert t == pytest.approx(1e-6) and t < LAUNCH_FLOOR_S
    assert bound == "launch"


def test_roofline_without_a_peak_is_memory_only() -> None:
    t, bound = roofline(nbytes=3e9, flops=1e18, bandwidth=BANDWIDTH, peak_flops=None)
    assert (t, bound) == (pytest.approx(1e-3), "memory")
    assert roofline(3e9, 0, BANDWIDTH, PEAK) == (pytest.approx(1e-3), "memory")


@pytest.mark.parametrize(
    ("dtype", "precision", "expected"),
    [
        ("bfloat16", "strict_fp32", "bf16"),
        ("torch.bfloat16", "tf32", "bf16"),
        ("float16", "strict_fp32", "fp16"),
        ("torch.float16", "low", "fp16"),
        (None, "strict_fp32", "fp32"),
        ("float32", "strict_fp32", "fp32"),
        ("float32", "tf32", "tf32"),
        (None, "low", "bf16"),
    ],
)
def test_flop_class(dtype: str | None, precision: str, expected: str) -> None:
    assert flop_class(dtype, precision) == expected


def test_flop_class_unknown_policy() -> None:
    with pytest.raises(KeyError):
        flop_class(None, "fp8")


# -- device leases --------------------------------------------------------------------------------

TAKE_LEASE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kernelevolve.evaluate.lease import DeviceLease

    print("trying", flush=True)
    t0 = time.perf_counter()
    with DeviceLease(sys.argv[1], Path(sys.argv[2])):
        print(f"acquired {time.perf_counter() - t0:.3f}", flush=True)
    """
)


def finish(child: subprocess.Popen[str]) -> str:
    """Wait for the child, then read what it printed after "trying" (some may be buffered already:
    `communicate` with a timeout would skip the buffer)."""
    child.wait(timeout=30)
    assert child.stdout is not None
    return child.stdout.read()


def take_lease_in_child(key: str, directory: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", TAKE_LEASE, key, str(directory)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "trying"
    return child


def test_lease_is_exclusive_across_processes(tmp_path: Path) -> None:
    lease = DeviceLease("cuda0", tmp_path).acquire()
    child = take_lease_in_child("cuda0", tmp_path)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1.0)  # blocked on our lock
    finally:
        lease.release()
    out = finish(child)
    assert child.returncode == 0
    word, waited = out.split()
    assert word == "acquired" and float(waited) >= 0.9


def test_leases_on_other_devices_do_not_block(tmp_path: Path) -> None:
    with DeviceLease("cuda0", tmp_path):
        child = take_lease_in_child("cuda1", tmp_path)
        out = finish(child)
    assert child.returncode == 0 and out.startswith("acquired")
    assert (tmp_path / "cuda0.lock").exists() and (tmp_path / "cuda1.lock").exists()


FAKE_NVIDIA_SMI = """#!/bin/sh
# answers `nvidia-smi --query-gpu=uuid --format=csv,noheader -i N` for a machine of 4 GPUs
for last; do :; done
echo "GPU-0000000$last-fake"
"""


def test_gpu_leases_name_the_physical_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes that see the same GPU under different indices (CUDA_VISIBLE_DEVICES=2,3 and a
    Ray actor's =3) take the same lease for it; different GPUs, different leases."""
    from kernelevolve.platforms import get_platform

    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    cuda = get_platform("cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    engine_side = [cuda.lease_key(0), cuda.lease_key(1)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    actor_side = cuda.lease_key(0)
    assert engine_side == ["cuda-GPU-00000002-fake", "cuda-GPU-00000003-fake"]
    assert actor_side == engine_side[1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc,MIG-def")  # UUIDs are taken as they are
    assert [cuda.lease_key(0), cuda.lease_key(1)] == ["cuda-GPU-abc", "cuda-MIG-def"]
    rocm = get_platform("rocm")  # nvidia-smi answers, but names no AMD GPU: by index
    assert rocm.lease_key(1) == "rocm-1" and not rocm.physical_lease_keys and cuda.physical_lease_keys
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no nvidia-smi: by index, as before
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    assert cuda.lease_key(0) == "cuda-0"
    assert get_platform("cpu").lease_key(1) == "cpu-1"


def test_lease_is_freed_when_its_holder_dies(tmp_path: Path) -> None:
    hold = TAKE_LEASE + "    time.sleep(120)\n"
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, "cuda0", str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "trying"
        assert holder.stdout.readline().startswith("acquired")
        child = take_lease_in_child("cuda0", tmp_path)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)
    finally:
        holder.kill()  # SIGKILL: no release, no cleanup; the kernel drops the lock
        holder.wait(timeout=10)
    out = finish(child)
    assert child.returncode == 0 and out.startswith("acquired")
    lease = DeviceLease("cuda0", tmp_path).acquire()
    lease.release()
    lease.release()  # a second release is a no-op


def test_graph_choice_follows_the_baselines_and_a_pin() -> None:
    from kernelevolve.evaluate.timing import TimingPlan, use_graphs

    plan = TimingPlan(budget_s=1, min_trials=1, max_trials=2, warmup=1, graph_threshold_s=50e-6,
                      checked_fraction=0, allow_graphs=True)  # fmt: skip
    fast_baselines = {"eager": [8e-6, 7e-6], "compile": [6e-6], "candidate": [120e-6]}
    assert use_graphs(fast_baselines, "candidate", plan)  # a slow candidate does not switch graphs off
    slow_baselines = {"eager": [300e-6], "compile": [250e-6], "candidate": [5e-6]}
    assert not use_graphs(slow_baselines, "candidate", plan)  # nor does a fast one switch them on
    assert use_graphs({"eager": [10e-6]}, None, plan)  # baselines timed alone
    from dataclasses import replace

    assert not use_graphs(fast_baselines, "candidate", replace(plan, graphs=False))  # pinned by the pool
    assert use_graphs(slow_baselines, "candidate", replace(plan, graphs=True))


def test_ast_parsing_is_one_thread_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPython 3.11 keeps its AST converter's state per interpreter, and concurrent parses failed in
    CI with "SystemError: AST constructor recursion depth mismatch". The guards, the tuner and the
    exporter parse through `pyast`, which lets one thread parse at a time."""
    import ast
    import threading

    from kernelevolve import pyast
    from kernelevolve.evaluate.guards import check_source

    real, lock = ast.parse, threading.Lock()
    inside = peak = 0

    def slow_parse(*args: object, **kwargs: object) -> object:
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
        time.sleep(0.01)
        try:
            return real(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(ast, "parse", slow_parse)
    work = [lambda: check_source("x = 1\n", ["triton"])] * 6 + [lambda: pyast.literal_eval("(1, 2)")] * 4
    threads = [threading.Thread(target=w) for w in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 1


def test_the_workers_typed_settings_read_what_the_engine_sends() -> None:
    """`WorkerSettings` is built from `Settings.to_dict()` (the `prepare` message): every field it
    has is a setting of that name (a renamed setting fails here, not inside a worker), and the values
    come through with their types."""
    import dataclasses

    from kernelevolve.config import Settings
    from kernelevolve.evaluate.messages import WorkerSettings

    sent = Settings(timing_budget_s=0.7, min_trials=11, baselines=["eager"]).to_dict()
    typed = WorkerSettings.from_dict(sent)
    assert {f.name for f in dataclasses.fields(WorkerSettings)} <= set(sent)
    assert typed.timing_budget_s == 0.7 and typed.min_trials == 11 and typed.baselines == ("eager",)
    with pytest.raises(KeyError):  # a setting the engine did not send fails where the message is read
        WorkerSettings.from_dict({k: v for k, v in sent.items() if k != "max_trials"})
