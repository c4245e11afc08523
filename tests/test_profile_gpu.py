"""Profiling on the GPU (marker `gpu`): ncu and torch.profiler on a real Triton kernel, filtered to
the candidate's own kernels, and the diagnosis made from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelevolve.jobs import profile_file
from kernelevolve.profile.diagnosis import CLASSES

from .conftest import EXAMPLES, harness_settings

pytestmark = pytest.mark.gpu


def test_profile_collects_ncu_and_profiler_metrics_for_the_candidate_only(tmp_path: Path) -> None:
    settings = harness_settings(tmp_path, "cuda", timing_budget_s=0.3, profile="auto")
    result = profile_file(EXAMPLES / "softmax/spec.py", EXAMPLES / "softmax/triton_rowsoftmax.py", settings)
    assert result["status"] == "ok", result["message"]
    m = result["metrics"]
    assert m["tools"] == ["torch.profiler", "ncu"], m["errors"]
    assert m["profiler"]["kernels_per_call"] == 1.0  # one Triton kernel: torch.empty_like launches none
    names = m["ncu"]["summary"]["kernel_names"]
    assert names == ["softmax_kernel"], names  # input generation and copies are outside the range
    assert (
        m["ncu"]["summary"]["dram_throughput_pct"] > 10
        and m["ncu"]["summary"]["max_registers_per_thread"] > 0
    )
    d = result["diagnosis"]
    assert d["class"] in CLASSES and isinstance(result["roofline_fraction"], float)
    assert any("ncu" in e for e in d["evidence"]), d["evidence"]
