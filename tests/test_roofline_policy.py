"""Above the roofline is suspicious on every platform, and a peak measured low is measured again.

A verdict whose shape runs faster than the measured roofline allows (by more than `roofline_margin`)
is flagged `suspicious` on the CPU too, which has no datasheet. Where that is its only flag, the pool
measures the hardware profile again, once, judges the kernel again against it, and its owner stores
the new profile: a profile measured on a busy machine is not believed over a kernel. Tested on the
CPU through `jobs.evaluate`, with a stored profile whose bandwidth is a thousandth of any machine's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernelevolve import jobs
from kernelevolve.evaluate import Status
from kernelevolve.evaluate import pool as pool_module
from kernelevolve.platforms import get_platform
from kernelevolve.roofline import ceiling_flops
from kernelevolve.store import Workspace
from tests.conftest import SPECS, cpu_settings
from tests.cpu_candidates import HONEST


def _stale_profile(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    """Settings whose workspace caches a hardware profile measured at 1 MB/s and 1 GFLOP/s."""
    settings = cpu_settings(tmp_path, timing_budget_s=0.3)
    cpu = get_platform("cpu")
    stale = {"platform": "cpu", "target": "x", "device": "stale", "bandwidth": 1e6,
             "flops": {"fp32": 1e9}, "method": "a test's", "measured_at": "then"}  # fmt: skip
    with Workspace.open(settings.workspace) as ws:
        jobs.store_profile(ws, cpu, settings, stale)
    return settings, stale


def _candidate(tmp_path: Path) -> Path:
    cand = tmp_path / "honest.py"
    cand.write_text(HONEST)
    return cand


def test_a_kernel_above_a_stale_roofline_gets_the_profile_measured_again_and_stored(tmp_path: Path) -> None:
    settings, _ = _stale_profile(tmp_path)
    events: list[tuple[str, str, Any]] = []
    _, (verdict,) = jobs.evaluate(
        SPECS / "softmax.py", [_candidate(tmp_path)], settings, on_event=lambda *e: events.append(e)
    )
    assert verdict.status == Status.OK, verdict.message
    assert not verdict.flags and verdict.roofline_fraction is not None and verdict.roofline_fraction < 1.05
    retries = [detail for event, _, detail in events if event == "retry"]
    assert len(retries) == 1 and "measured again" in retries[0]
    with Workspace.open(settings.workspace) as ws:
        (stored,) = ws.hardware_profiles()
    assert stored["data"]["bandwidth"] > 1e8 and stored["data"]["device"] != "stale"  # the new one


def test_a_kernel_still_above_the_roofline_measured_again_stays_suspicious(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: where the new measurement agrees with the old one (as it would for a kernel that
    does not do the reference's work), the verdict stays suspicious, and the profile is measured
    once per pool however many verdicts are above it."""
    settings, stale = _stale_profile(tmp_path)
    measured: list[int] = []

    def same_again(platform: Any, settings: Any) -> dict[str, Any]:
        measured.append(1)
        return dict(stale)

    monkeypatch.setattr(pool_module, "measure_profile", same_again)
    second = tmp_path / "second.py"
    second.write_text(HONEST + "\n# another file, the same kernel\n")
    _, verdicts = jobs.evaluate(SPECS / "softmax.py", [_candidate(tmp_path), second], settings)
    assert measured == [1]
    for verdict in verdicts:
        assert verdict.status == Status.SUSPICIOUS and verdict.fitness == 0.0, verdict.message
        assert verdict.flags and all("of the measured roofline" in f for f in verdict.flags)
        assert "measured again in this run, still puts it above" in verdict.message


def test_strict_fp32_may_reach_a_third_of_tf32_without_a_flag() -> None:
    """3xTF32 keeps fp32 accuracy: a strict-fp32 GEMM faster than the fp32 rate is not flagged for it."""
    assert ceiling_flops({"fp32": 50e12, "tf32": 400e12}, "fp32") == pytest.approx(400e12 / 3)
    assert ceiling_flops({"fp32": 50e12, "tf32": 90e12}, "fp32") == 50e12
    assert ceiling_flops({"fp32": 50e12, "tf32": 400e12}, "tf32") == 400e12
    assert ceiling_flops({"fp32": 1e9}, "fp32") == 1e9


def test_a_strict_gemm_on_tensor_cores_is_a_fraction_of_the_3xtf32_roofline_not_above_fp32s() -> None:
    """A strict-fp32 4096^3 GEMM at 78 TFLOP/s on an H100 (measured fp32 67, TF32 400) was reported at
    "116% of roofline" against fp32's own peak: the fraction is of what an honest kernel of the
    precision can reach (3xTF32, 133 TFLOP/s), as the flags are. A kernel above that is flagged."""
    from types import SimpleNamespace

    from kernelevolve.evaluate.messages import Ceilings
    from kernelevolve.evaluate.scoring import _roofline
    from kernelevolve.evaluate.verdict import ShapeResult, TimeStats, Verdict

    n = 4096
    flops, nbytes = 2 * n**3, 3 * 4 * n * n
    profile = Ceilings(bandwidth=3.0e12, flops={"fp32": 67e12, "tf32": 400e12})
    state: Any = SimpleNamespace(spec=SimpleNamespace(dtype=None, precision="strict_fp32"),
                                 settings=SimpleNamespace(roofline_margin=1.05))  # fmt: skip

    def at(tflops: float) -> tuple[Verdict, list[str]]:
        s = flops / (tflops * 1e12)
        shape = ShapeResult(name="default", weight=1.0, flops=flops, bytes=nbytes,
                            candidate=TimeStats(median_s=s, p25_s=s, p75_s=s, min_s=s, n=10, spread=0.0))  # fmt: skip
        v = Verdict(Status.OK, "", correct=True, timed=True, shapes=[shape])
        return v, _roofline(v, state, profile)

    v, flags = at(78)
    assert not flags and v.roofline_fraction == pytest.approx(78 / (400 / 3), rel=1e-3)  # 59%, not 116%
    assert v.shapes[0].bound == "compute"
    v, flags = at(160)  # beyond 3xTF32's ceiling: not an honest strict kernel
    assert flags and "of the measured roofline" in flags[0]
