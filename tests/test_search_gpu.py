"""The search on the GPU: the offline tuner finds a real speedup, and the export runs the winner.

Run on the device machine: pytest -m gpu tests/test_search_gpu.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kernelevolve.search.limits import Limits
from kernelevolve.search.policies import SearchConfig
from kernelevolve.synth import SynthConfig

from .conftest import EXAMPLES, harness_settings

pytestmark = pytest.mark.gpu


def test_tuner_beats_eager_on_a_fused_elementwise_chain(tmp_path: Path) -> None:
    from kernelevolve.optimize import optimize

    settings = harness_settings(
        tmp_path, "cuda", workers=2, baselines=["eager", "compile"], fitness_baseline="compile"
    )
    summary = optimize(
        EXAMPLES / "bias_gelu_residual/spec.py",
        settings,
        SearchConfig(draft=2),
        Limits(budget=6),
        SynthConfig("tuner"),
    )
    assert summary["nodes_evaluated"] >= 4
    assert summary["best_node"] is not None, summary["stop_reason"]
    # eager makes four passes over memory; one fused pass is several times faster
    assert summary["best_speedup_vs_eager"] > 2.0, summary["shapes"]
    assert Path(summary["best_candidate"]).is_file()
    # the exported package imports and computes the reference's function on the GPU
    code = f"""
import sys, torch
sys.path.insert(0, {str(Path(summary["export"]).parent)!r})
sys.path.insert(0, {str(EXAMPLES / "bias_gelu_residual")!r})
import spec, kernelevolve_winner as w
torch.manual_seed(0)
ref = spec.Model(2048).cuda()
new = w.ModelNew(2048).cuda()
new.load_state_dict(ref.state_dict())
x, r = torch.randn(4096, 2048, device="cuda"), torch.randn(4096, 2048, device="cuda")
torch.testing.assert_close(new(x, r), ref(x, r), rtol=1e-5, atol=1e-5)
print(w.choose(x, r))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_tuner_on_a_row_reduction_is_correct_and_fast(tmp_path: Path) -> None:
    from kernelevolve.optimize import optimize

    settings = harness_settings(
        tmp_path, "cuda", workers=2, baselines=["eager", "compile"], fitness_baseline="compile"
    )
    summary = optimize(
        EXAMPLES / "rmsnorm/spec.py", settings, SearchConfig(draft=3), Limits(budget=6), SynthConfig("tuner")
    )
    assert summary["best_node"] is not None, summary["stop_reason"]
    assert summary["best_speedup_vs_eager"] > 1.5  # eager: five kernels and fp32 temporaries
