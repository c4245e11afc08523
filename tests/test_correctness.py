"""Output comparison (`kernelevolve.evaluate.correctness`): tolerance by dtype and precision policy.

Each case is an error a real kernel makes (reduction order, TF32, bf16 rounding, an all-zeros answer,
NaN) applied to a reference output, and the policy that must accept or refuse it.
"""

from __future__ import annotations

import pytest
import torch

from kernelevolve.evaluate.correctness import TOLERANCES, Tolerance, compare, same_bits, tolerance_for

STRICT = tolerance_for(torch.float32, "strict_fp32")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def softmax_ref() -> torch.Tensor:
    """Rows of 4096: every value is about 1/4096 = 2.4e-4, far below a fixed atol of 1e-2."""
    return torch.softmax(torch.randn(16, 4096, generator=gen(1)), dim=-1)


@pytest.fixture
def ref() -> torch.Tensor:
    return torch.randn(256, 256, generator=gen(2))


def with_relative_noise(ref: torch.Tensor, scale: float, seed: int = 3) -> torch.Tensor:
    return ref * (1 + scale * torch.randn(ref.shape, generator=gen(seed)))


# -- tolerances -----------------------------------------------------------------------------------


def test_tolerance_for_float32_follows_the_policy() -> None:
    assert tolerance_for(torch.float32, "strict_fp32") == TOLERANCES["fp32"]
    assert tolerance_for(torch.float32, "tf32") == TOLERANCES["tf32"]
    assert tolerance_for(torch.float32, "low") == TOLERANCES["bfloat16"]
    assert tolerance_for("torch.float32", "tf32") == TOLERANCES["tf32"]


def test_tolerances_order_by_precision() -> None:
    names = ["float64", "fp32", "tf32", "float16", "bfloat16"]
    rel_norms = [TOLERANCES[n].rel_norm for n in names]
    assert rel_norms == sorted(rel_norms)
    assert len(set(rel_norms)) == len(rel_norms)


def test_low_precision_dtypes_ignore_the_fp32_policy() -> None:
    for policy in ("strict_fp32", "tf32", "low"):
        assert tolerance_for(torch.bfloat16, policy) == TOLERANCES["bfloat16"]
        assert tolerance_for(torch.float16, policy) == TOLERANCES["float16"]
        assert tolerance_for(torch.float64, policy) == TOLERANCES["float64"]


def test_unknown_policy_raises() -> None:
    with pytest.raises(KeyError):
        tolerance_for(torch.float32, "fast")


def test_override_replaces_only_the_given_numbers() -> None:
    tol = tolerance_for(torch.float32, "strict_fp32", {"rel_norm": 1e-2})
    assert tol == Tolerance(TOLERANCES["fp32"].rtol, TOLERANCES["fp32"].atol, 1e-2)


def test_spec_override_takes_effect(ref: torch.Tensor) -> None:
    """A uniform 2e-4 relative error: inside rtol elementwise, outside the strict norm bound."""
    out = ref * (1 + 2e-4)
    strict = compare(out, ref, STRICT)
    assert not strict.passed and strict.check == "precision"
    assert strict.rel_norm_err == pytest.approx(2e-4, rel=1e-2)
    assert compare(out, ref, tolerance_for(torch.float32, "strict_fp32", {"rel_norm": 1e-3})).passed
    tight = tolerance_for(torch.float32, "tf32", {"rtol": 1e-5, "atol": 0.0})
    assert compare(out, ref, tight).check == "values"


# -- float outputs --------------------------------------------------------------------------------


def test_identical_tensors_pass(ref: torch.Tensor) -> None:
    result = compare(ref.clone(), ref, STRICT)
    assert result.passed and result.check is None
    assert result.max_abs_err == 0.0 and result.rel_norm_err == 0.0


def test_all_zeros_fails_on_small_outputs(softmax_ref: torch.Tensor) -> None:
    zeros = torch.zeros_like(softmax_ref)
    # The trap: a fixed absolute tolerance accepts an answer that computed nothing.
    assert float(softmax_ref.mean()) == pytest.approx(1 / 4096)
    assert torch.allclose(zeros, softmax_ref, atol=1e-2)
    for policy in ("strict_fp32", "tf32", "low"):
        result = compare(zeros, softmax_ref, tolerance_for(torch.float32, policy))
        assert not result.passed and result.check == "values", policy
        assert result.rel_norm_err == pytest.approx(1.0)


def test_honest_small_outputs_pass(softmax_ref: torch.Tensor) -> None:
    recomputed = torch.exp(torch.log(softmax_ref.double())).float()
    assert compare(recomputed, softmax_ref, STRICT).passed


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_or_inf_anywhere_fails(ref: torch.Tensor, bad: float) -> None:
    out = ref.clone()
    out[17, 42] = bad
    result = compare(out, ref, tolerance_for(torch.float32, "low", {"rtol": 1e9, "atol": 1e9}))
    assert not result.passed and result.check == "nan-inf"
    assert "1 NaN/inf" in result.message


def test_nan_in_a_low_precision_output_fails(ref: torch.Tensor) -> None:
    out = ref.to(torch.bfloat16)
    out[0, 0] = float("nan")
    assert compare(out, ref.to(torch.bfloat16), tolerance_for(torch.bfloat16, "low")).check == "nan-inf"


def test_bf16_rounding_fails_strict_but_passes_low(softmax_ref: torch.Tensor) -> None:
    rounded = softmax_ref.to(torch.bfloat16).to(torch.float32)
    strict = compare(rounded, softmax_ref, STRICT)
    assert not strict.passed and strict.check in ("values", "precision")
    assert compare(rounded, softmax_ref, tolerance_for(torch.float32, "low")).passed


def test_bf16_rounding_fails_tf32(ref: torch.Tensor) -> None:
    rounded = ref.to(torch.bfloat16).to(torch.float32)
    assert not compare(rounded, ref, tolerance_for(torch.float32, "tf32")).passed


def test_tf32_error_fails_strict_but_passes_tf32(ref: torch.Tensor) -> None:
    out = with_relative_noise(ref, 3e-4)
    strict = compare(out, ref, STRICT)
    assert not strict.passed and strict.check in ("values", "precision")
    assert strict.rel_norm_err > TOLERANCES["fp32"].rel_norm
    assert compare(out, ref, tolerance_for(torch.float32, "tf32")).passed


def test_reduction_order_noise_passes_strict(ref: torch.Tensor, softmax_ref: torch.Tensor) -> None:
    for r in (ref, softmax_ref):
        result = compare(with_relative_noise(r, 1e-7), r, STRICT)
        assert result.passed, result.message
        assert 0 < result.rel_norm_err < 1e-6


def test_one_wrong_element_fails(ref: torch.Tensor) -> None:
    out = ref.clone()
    out[3, 5] += 0.5
    result = compare(out, ref, tolerance_for(torch.float32, "low"))
    assert not result.passed and result.check == "values"
    assert "1 of 65536" in result.message
    assert result.max_abs_err == pytest.approx(0.5, rel=1e-5)


def test_comparison_does_not_modify_its_arguments(ref: torch.Tensor) -> None:
    out = with_relative_noise(ref, 1e-3)
    out_before, ref_before = out.clone(), ref.clone()
    compare(out, ref, STRICT)
    assert same_bits(out, out_before) and same_bits(ref, ref_before)


# -- type, shape, dtype ---------------------------------------------------------------------------


class Subclass(torch.Tensor):
    pass


def test_tensor_subclass_fails(ref: torch.Tensor) -> None:
    result = compare(ref.clone().as_subclass(Subclass), ref, STRICT)
    assert not result.passed and result.check == "output-type"
    assert "subclass" in result.message


def test_parameter_output_fails(ref: torch.Tensor) -> None:
    assert compare(torch.nn.Parameter(ref.clone()), ref, STRICT).check == "output-type"


def test_non_tensor_output_fails(ref: torch.Tensor) -> None:
    result = compare(ref.tolist(), ref, STRICT)
    assert result.check == "output-type" and "list" in result.message


def test_shape_mismatch_fails(ref: torch.Tensor) -> None:
    result = compare(ref.t().contiguous()[:, :128], ref, STRICT)
    assert not result.passed and result.check == "output-shape"
    assert "[256, 128]" in result.message
    assert compare(ref.reshape(-1), ref, STRICT).check == "output-shape"


def test_dtype_mismatch_fails(ref: torch.Tensor) -> None:
    result = compare(ref.double(), ref, tolerance_for(torch.float64, "low"))
    assert not result.passed and result.check == "output-dtype"
    assert compare(ref.half(), ref, STRICT).check == "output-dtype"


# -- integer and boolean outputs ------------------------------------------------------------------


def test_integer_outputs_must_match_exactly() -> None:
    ref = torch.arange(1000, dtype=torch.int64)
    loose = Tolerance(rtol=1.0, atol=1e6, rel_norm=1.0)
    assert compare(ref.clone(), ref, loose).passed
    out = ref.clone()
    out[10] += 1
    result = compare(out, ref, loose)
    assert not result.passed and result.check == "values"
    assert "1 of 1000" in result.message


def test_boolean_outputs_must_match_exactly() -> None:
    ref = torch.arange(10) % 3 == 0
    assert compare(ref.clone(), ref, STRICT).passed
    assert compare(~ref, ref, STRICT).check == "values"


# -- same_bits ------------------------------------------------------------------------------------


def test_same_bits_is_nan_safe() -> None:
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert not torch.equal(a, a.clone())  # why same_bits exists
    assert same_bits(a, a.clone())


def test_same_bits_on_a_0_dim_output() -> None:
    # a scalar loss (a fused linear + cross-entropy's mean) once raised "self.dim() cannot be 0 to view"
    loss = torch.tensor(2.5)
    assert same_bits(loss, loss.clone())
    assert not same_bits(loss, torch.tensor(-2.5))
    assert not same_bits(loss, loss.reshape(1))


def test_same_bits_distinguishes_signed_zero() -> None:
    assert torch.equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not same_bits(torch.tensor([0.0]), torch.tensor([-0.0]))


def test_same_bits_on_other_differences() -> None:
    a = torch.randn(4, 4, generator=gen(5))
    assert same_bits(a, a.t().contiguous().t())  # same values, different strides
    b = a.clone()
    b[2, 2] = torch.nextafter(b[2, 2], torch.tensor(float("inf")))
    assert not same_bits(a, b)
    assert not same_bits(a, a.double())
    assert not same_bits(a, a.reshape(2, 8))
    ints = torch.arange(5)
    assert same_bits(ints, ints.clone()) and not same_bits(ints, ints + 1)


# -- known bugs -----------------------------------------------------------------------------------


def test_nan_in_the_reference_does_not_pass_anything() -> None:
    ref = torch.tensor([float("nan"), 1.0, 2.0])
    assert not compare(torch.tensor([0.0, 999.0, -5.0]), ref, STRICT).passed


# -- an ill-conditioned output: judged no stricter than torch.compile ----------------------------------


def _centered_mean(x: torch.Tensor) -> torch.Tensor:
    """0 in exact arithmetic: what fp32 gives is rounding, |y| about 1e-8 (as level 2's
    23_Conv3d_GroupNorm_Mean, the mean of a group-normalized tensor)."""
    return (x - x.mean(-1, keepdim=True)).mean(-1)


def test_reference_noise_is_torch_compiles_distance_from_eager() -> None:
    from kernelevolve.evaluate.correctness import reference_noise

    x = torch.rand(64, 4096, generator=gen(3))
    eager = _centered_mean(x)
    other_order = (x - x.double().mean(-1, keepdim=True).float()).flip(-1).sum(-1) / x.shape[-1]
    (noise,) = reference_noise([eager], [other_order])
    assert 0.3 < noise <= 1.0  # all rounding: as far from each other as each is from 0
    well = torch.softmax(x, -1)
    assert reference_noise([well, torch.arange(3)], [well.clone(), torch.arange(3)]) == [0.0, 0.0]
    assert reference_noise([torch.zeros(4)], [torch.ones(4)]) == [0.0]  # no scale to be relative to


def test_an_ill_conditioned_output_is_judged_within_ten_times_its_noise() -> None:
    from kernelevolve.evaluate.correctness import NOISE_FACTOR, NOISE_ILL, reference_noise, widened

    x = torch.rand(64, 4096, generator=gen(4))
    ref = _centered_mean(x)
    # torch.compile's stand-in: the mean rounded otherwise (here, exactly), the sum in another order
    compiled = (x - x.double().mean(-1, keepdim=True).float()).flip(-1).sum(-1) / x.shape[-1]
    (noise,) = reference_noise([ref], [compiled])
    assert noise >= NOISE_ILL
    blocked = (x - x.mean(-1, keepdim=True)).reshape(64, 64, 64).sum(-1).sum(-1) / x.shape[-1]
    assert not compare(blocked, ref, STRICT).passed  # strict fp32 refuses another rounding
    tol = widened(STRICT, noise)
    assert tol.atol == tol.rel_norm == pytest.approx(NOISE_FACTOR * noise) and tol.rtol == STRICT.rtol
    assert compare(blocked, ref, tol).passed
    assert compare(torch.zeros_like(ref), ref, tol).passed  # the exact answer, closer than fp32's
    # What is no rounding still fails: a value off by 1e-4 where everything else is 1e-8, and bf16.
    assert not compare(ref + 1e-4, ref, tol).passed
    bf16 = _centered_mean(x.bfloat16()).float()
    assert not compare(bf16, ref, tol).passed
    # A well-conditioned output's noise (1e-7, or just under the line) leaves the tolerance as it is.
    assert widened(STRICT, 1e-7) == STRICT and widened(STRICT, 0.9 * NOISE_ILL) == STRICT
    assert widened(STRICT, None) == STRICT


CENTERED_SPEC = '''
"""An ill-conditioned output: rows centered, then averaged (0 in exact arithmetic)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)).mean(-1)


def get_inputs():
    return [torch.rand(64, 4096)]


def get_init_inputs():
    return []
'''

CENTERED_CANDIDATE = r'''
import torch
import torch.nn as nn
from kernelevolve.native import compile_c

_lib = compile_c(r"""
#include <stdint.h>
/* block sums of 64 (as a GPU block reduces), from the end of the row: another rounding than torch's */
static float block_sum(const float *v, int64_t n, float minus) {
    float total = 0.0f;
    for (int64_t b = n; b > 0; b -= 64) {
        float part = 0.0f;
        for (int64_t c = b - 1; c >= 0 && c >= b - 64; --c) part += v[c] - minus;
        total += part;
    }
    return total;
}
void centered_mean(const float *x, float *y, int64_t rows, int64_t cols, float shift) {
    for (int64_t r = 0; r < rows; ++r) {
        float m = block_sum(x + r * cols, cols, 0.0f) / (float)cols;
        y[r] = block_sum(x + r * cols, cols, m) / (float)cols + shift;
    }
}
""")


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty(x.shape[0], dtype=x.dtype)
        _lib.centered_mean(x, y, x.shape[0], x.shape[1], SHIFT)
        return y
'''


@pytest.mark.slow
def test_a_kernel_of_an_ill_conditioned_op_passes_where_compile_would_and_garbage_does_not(
    tmp_path: pytest.TempPathFactory,
) -> None:
    """End to end on the CPU, with torch.compile as a baseline: the worker measures compile's distance
    from eager before any candidate, notes it, and judges the output within 10x of it. An honest kernel
    that rounds in another order passes (strict fp32 alone refused it: level 2's 23_Conv3d_GroupNorm_Mean
    failed all 8 candidates so on an H100); one off by 1e-4 (no rounding) fails."""
    from pathlib import Path

    from kernelevolve import jobs
    from kernelevolve.evaluate import Status
    from tests.conftest import cpu_settings

    root = Path(str(tmp_path))
    spec = root / "centered_mean.py"
    spec.write_text(CENTERED_SPEC)
    honest, off = root / "honest.py", root / "off.py"
    honest.write_text(CENTERED_CANDIDATE.replace("SHIFT", "0.0"))
    off.write_text(CENTERED_CANDIDATE.replace("SHIFT", "1e-4"))
    settings = cpu_settings(root, baselines=["eager", "compile"], fitness_baseline="best")
    _, (good, bad) = jobs.evaluate(spec, [honest, off], settings)
    assert good.status in (Status.OK, Status.SUSPICIOUS) and good.correct, good.message
    assert any("ill-conditioned output" in n for n in good.method.notes), good.method.notes
    assert bad.status == Status.INCORRECT and not bad.correct, bad.message


def test_a_random_reference_gets_no_wider_tolerance() -> None:
    """Dropout in training mode (level 2's 66_Matmul_Dropout_Softmax): eager and torch.compile draw
    other masks, far apart, and that is no rounding; a candidate that skips the dropout must not pass
    on it. The worker measures the noise only of a reference that gives the same bits twice."""
    from types import SimpleNamespace

    from kernelevolve.evaluate.prepared import ShapeState, measure_noise

    x = torch.rand(64, 4096, generator=gen(5))
    spec = SimpleNamespace(backward=False, output_bytes=lambda name: 64 * 4)
    state = SimpleNamespace(notes=[], spec=spec)
    shape = SimpleNamespace(name="default")

    def dropout_mean(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(t, 0.5, True).mean(-1)

    random = ShapeState(shape=shape, reference=dropout_mean, compiled=dropout_mean)
    measure_noise(state, random, [x], torch)  # type: ignore[arg-type]
    assert random.noise is None and state.notes == []
    # torch.compile's stand-in: the mean rounded otherwise (exactly), the sum in another order
    compiled = lambda t: (t - t.double().mean(-1, keepdim=True).float()).flip(-1).sum(-1) / t.shape[-1]  # noqa: E731
    centered = ShapeState(shape=shape, reference=_centered_mean, compiled=compiled)
    measure_noise(state, centered, [x], torch)  # type: ignore[arg-type]
    assert centered.noise is not None and centered.noise[0] > 0.1
    assert len(state.notes) == 1 and "ill-conditioned output" in state.notes[0]
