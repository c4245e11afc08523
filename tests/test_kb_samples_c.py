"""The knowledge base's C samples (`knowledge/docs/samples/c/<op>.py`): every one goes through the real
evaluator on the CPU platform (static guards, native build, correctness at every shape x seed x
distribution, timing against eager) and must be `ok`. Their tunables, guards and documents are
checked in `test_kb_samples.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelevolve.evaluate import EvaluatorPool, Status
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from tests.conftest import cpu_settings
from tests.kb_samples import C_OPS as OPS
from tests.kb_samples import kernel, spec


@pytest.mark.slow
@pytest.mark.timeout(600)  # workers wait for the machine-wide CPU lease, which other runs may hold
@pytest.mark.parametrize("op", OPS)
def test_sample_is_ok_through_the_cpu_harness(op: str, tmp_path: Path) -> None:
    ref = load_spec(spec(op))
    # spares=0: no replacement worker is started (and killed) after the one evaluation. The
    # plausibility limit is raised: fused C beats eager's chain of ATen ops by 10-12x at the large
    # shapes on CI's VM (bucketize, feature_hashing), an honest figure for a reviewed sample; the
    # limit itself is tested below.
    settings = cpu_settings(tmp_path, spares=0, suspicious_speedup=1000.0)
    with EvaluatorPool(ref, get_platform("cpu"), settings) as pool:
        v = pool.evaluate_one(kernel("c", op).read_text(), "sample.py")
    assert v.status == Status.OK, f"{op}: {v.status} {v.message}\n{v.log_tail or ''}"
    assert v.correct is True
    assert v.candidate_kind == "c"
    assert v.timed is True
    assert {s.name for s in v.shapes} == {s.name for s in ref.shapes}
    assert all(s.correct for s in v.shapes)
    verdict = v.to_dict()
    assert verdict["speedup_vs_eager"] is not None and verdict["speedup_vs_eager"] > 0
    per_shape = ", ".join(f"{s.name} {s.speedup_vs_eager:.2f}x" for s in v.shapes if s.speedup_vs_eager)
    print(f"{op}: speedup_vs_eager {verdict['speedup_vs_eager']:.2f} ({per_shape})")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_correct_kernel_faster_than_the_plausibility_limit_is_flagged_not_rewarded(tmp_path: Path) -> None:
    """The plausibility limit through the real harness: a correct kernel whose speedup at some shape
    exceeds `suspicious_speedup` is `suspicious`, keeps its measurements, and earns no fitness."""
    op = "bucketize"  # several x faster than eager at its large shape on any CPU
    settings = cpu_settings(tmp_path, spares=0, suspicious_speedup=1.5)
    with EvaluatorPool(load_spec(spec(op)), get_platform("cpu"), settings) as pool:
        v = pool.evaluate_one(kernel("c", op).read_text(), "sample.py")
    assert v.status == Status.SUSPICIOUS, f"{v.status} {v.message}"
    assert v.correct is True and v.timed is True and v.fitness == 0.0
    assert v.flags and all("above 1.5x" in f for f in v.flags)
    assert "implausible" in v.message
