"""End to end on the CPU platform: Triton under the interpreter, a training spec, the `low` precision
policy, the torch.compile baseline through `jobs.evaluate`, and candidate expansion.

Every evaluation runs in real worker processes (a few seconds each): pools are shared per spec by
module-scoped fixtures, and each test evaluates as few candidates as it needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kernelevolve import jobs
from kernelevolve.config import Settings
from kernelevolve.errors import KernelevolveError, SpecError
from kernelevolve.evaluate import EvaluatorPool, Status
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from kernelevolve.store import Workspace
from tests.conftest import SPECS, cpu_settings
from tests.cpu_candidates import HONEST, TRITON_SOFTMAX

# Workers wait for the machine-wide CPU lease, which other kernelevolve processes may hold for a while.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def settings_for(tmp: Path, **overrides: object) -> Settings:
    return cpu_settings(tmp, **overrides)


def _pool(tmp_path_factory: pytest.TempPathFactory, spec: str, **overrides: Any) -> Iterator[EvaluatorPool]:
    tmp = tmp_path_factory.mktemp(spec)
    settings = replace(settings_for(tmp), **overrides)
    with EvaluatorPool(load_spec(SPECS / f"{spec}.py"), get_platform("cpu"), settings) as pool:
        yield pool


@pytest.fixture(scope="module")
def train_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluatorPool]:
    # A small linear layer's C forward and backward against eager autograd, whose per-call overhead
    # dominates: the CI VM measured 47x. The plausibility flag has its own test (test_kb_samples_c).
    yield from _pool(tmp_path_factory, "linear_train", suspicious_speedup=1000.0)


@pytest.fixture(scope="module")
def low_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluatorPool]:
    yield from _pool(tmp_path_factory, "scale_low")


# -- Triton on the CPU: the interpreter, correctness only -----------------------------------------


def test_triton_candidate_is_checked_under_the_interpreter_but_not_timed(
    softmax_pool: EvaluatorPool,
) -> None:
    v = softmax_pool.evaluate_one(TRITON_SOFTMAX, "triton_softmax.py")
    assert v.status == Status.OK, v.message
    assert v.correct is True
    assert v.timed is False
    assert v.candidate_kind == "triton"
    assert v.speedup_vs_eager is None and v.speedup_vs_compile is None
    assert v.method.timer.startswith("none (") and "interpreter" in v.method.timer
    assert "interpreter" in v.message
    assert [s.name for s in v.shapes] == ["narrow", "wide"]
    assert all(s.correct and s.candidate is None and s.eager is None for s in v.shapes)


TRITON_POINTER_CACHE = (
    TRITON_SOFTMAX.replace(
        """    def forward(self, x):
        x = x.contiguous()
""",
        """    def forward(self, x):
        x = x.contiguous()
        key = (x.data_ptr(), tuple(x.shape))
        if key in _CACHE:
            return _CACHE[key]
""",
    )
    .replace("        return y\n", "        _CACHE[key] = y\n        return y\n")
    .replace("class ModelNew(", "_CACHE = {}\n\n\nclass ModelNew(")
)


def test_a_triton_pointer_cache_is_caught_where_nothing_is_timed(softmax_pool: EvaluatorPool) -> None:
    """Under the CPU's interpreter nothing is timed, so the timed calls' refilled buffers never come:
    the correctness trials themselves refill the first trial's inputs in place, and the cache's
    stale answer fails there."""
    assert "_CACHE[key] = y" in TRITON_POINTER_CACHE and "if key in _CACHE" in TRITON_POINTER_CACHE
    v = softmax_pool.evaluate_one(TRITON_POINTER_CACHE, "triton_pointer_cache.py")
    assert v.status == Status.INCORRECT and not v.correct, v.message
    assert "refilled in place" in v.message


def test_broken_triton_candidate_is_incorrect(softmax_pool: EvaluatorPool) -> None:
    # Stores only the first half of every row's columns: the rest is whatever the allocator gave.
    broken = TRITON_SOFTMAX.replace(
        "tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, axis=0), mask=mask)",
        "tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, axis=0), mask=offs < n_cols // 2)",
    )
    assert broken != TRITON_SOFTMAX
    v = softmax_pool.evaluate_one(broken, "triton_half.py")
    assert v.status == Status.INCORRECT, v.message
    assert v.correct is False and v.timed is False and v.fitness == 0.0


# -- a training spec: forward and backward ---------------------------------------------------------

LINEAR_C = r"""
#include <stdint.h>

/* y[B, O] = x[B, I] @ w[O, I]^T + b[O] */
void linear_fwd(const float *x, const float *w, const float *b, float *y, int64_t B, int64_t I, int64_t O) {
    for (int64_t i = 0; i < B; ++i)
        for (int64_t o = 0; o < O; ++o) {
            float acc = b[o];
            for (int64_t k = 0; k < I; ++k) acc += x[i * I + k] * w[o * I + k];
            y[i * O + o] = acc;
        }
}

/* dx = gy @ w; dw = gy^T @ x (times dw_scale); db = column sums of gy */
void linear_bwd(const float *gy, const float *x, const float *w, float *dx, float *dw, float *db,
                int64_t B, int64_t I, int64_t O, float dw_scale) {
    for (int64_t i = 0; i < B; ++i)
        for (int64_t k = 0; k < I; ++k) {
            float acc = 0.0f;
            for (int64_t o = 0; o < O; ++o) acc += gy[i * O + o] * w[o * I + k];
            dx[i * I + k] = acc;
        }
    for (int64_t o = 0; o < O; ++o)
        for (int64_t k = 0; k < I; ++k) {
            float acc = 0.0f;
            for (int64_t i = 0; i < B; ++i) acc += gy[i * O + o] * x[i * I + k];
            dw[o * I + k] = dw_scale * acc;
        }
    for (int64_t o = 0; o < O; ++o) {
        float acc = 0.0f;
        for (int64_t i = 0; i < B; ++i) acc += gy[i * O + o];
        db[o] = acc;
    }
}
"""


HONEST_FWD_CALL = "_lib.linear_fwd(x, weight, bias, y, batch, n_in, n_out)"


def linear_candidate(
    dw_scale: float = 1.0, weight: str = "weight", bias: str = "bias", fwd_call: str = HONEST_FWD_CALL
) -> str:
    """A C linear layer with its own backward; `dw_scale` != 1 breaks dW, other names break sharing."""
    return f'''
import torch
import torch.nn as nn
from kernelevolve.native import compile_c

_lib = compile_c(r"""{LINEAR_C}""")


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        x, weight, bias = x.contiguous(), weight.contiguous(), bias.contiguous()
        batch, n_in = x.shape
        n_out = weight.shape[0]
        y = torch.empty((batch, n_out), dtype=x.dtype, device=x.device)
        {fwd_call}
        ctx.save_for_backward(x, weight)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        grad_y = grad_y.contiguous()
        batch, n_in = x.shape
        n_out = weight.shape[0]
        dx = torch.empty_like(x)
        dw = torch.empty_like(weight)
        db = torch.empty((n_out,), dtype=x.dtype, device=x.device)
        _lib.linear_bwd(grad_y, x, weight, dx, dw, db, batch, n_in, n_out, {dw_scale!r})
        return dx, dw, db


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.{weight} = nn.Parameter(torch.empty((n_out, n_in)))
        self.{bias} = nn.Parameter(torch.empty((n_out,)))

    def forward(self, x):
        return _Linear.apply(x, self.{weight}, self.{bias})
'''


def test_honest_training_candidate_passes_and_is_timed_forward_and_backward(
    train_pool: EvaluatorPool,
) -> None:
    v = train_pool.evaluate_one(linear_candidate(), "linear_honest.py")
    assert v.status == Status.OK, v.message + (v.log_tail or "")
    assert v.correct and v.timed
    assert v.candidate_kind == "c"
    assert v.method.timer == "perf_counter"
    assert all(s.correct and s.trials == 6 for s in v.shapes)
    assert all(s.candidate is not None and s.eager is not None for s in v.shapes)
    assert all(s.candidate.median_s > 0 and s.eager.median_s > 0 for s in v.shapes)  # type: ignore[union-attr]
    assert v.speedup_vs_eager is not None and v.speedup_vs_eager > 0


def test_wrong_weight_gradient_is_incorrect(train_pool: EvaluatorPool) -> None:
    v = train_pool.evaluate_one(linear_candidate(dw_scale=2.0), "linear_dw_x2.py")
    assert v.status == Status.INCORRECT, v.message
    assert "gradient" in v.message
    assert not v.timed and v.fitness == 0.0


def test_parameters_under_other_names_are_incorrect(train_pool: EvaluatorPool) -> None:
    v = train_pool.evaluate_one(linear_candidate(weight="w", bias="b"), "linear_renamed.py")
    assert v.status == Status.INCORRECT, v.message
    assert "parameters" in v.message and "names" in v.message


# The forward adds the bias through torch (aten.add) instead of in its kernel: compute, not glue.
BIAS_IN_TORCH = (
    "_lib.linear_fwd(x, weight, torch.zeros((n_out,), dtype=x.dtype, device=x.device), y, batch, n_in, "
    "n_out)\n        y = y + bias"
)


def test_forward_computing_in_torch_is_refused_for_training_specs(train_pool: EvaluatorPool) -> None:
    v = train_pool.evaluate_one(linear_candidate(fwd_call=BIAS_IN_TORCH), "linear_torch_bias.py")
    assert v.status == Status.GUARD_VIOLATION, v.message
    assert any(x.rule == "torch-compute" for x in v.violations) and "aten.add" in v.message


# -- the `low` precision policy --------------------------------------------------------------------

SCALE_BF16 = r'''
import torch
import torch.nn as nn
from kernelevolve.native import compile_c

_lib = compile_c(r"""
#include <stdint.h>
#include <string.h>

/* y = 3x + 1, every result truncated to bf16 precision */
void scale_bf16(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        float v = 3.0f * x[i] + 1.0f;
        uint32_t u;
        memcpy(&u, &v, 4);
        u &= 0xFFFF0000u;
        memcpy(&v, &u, 4);
        y[i] = v;
    }
}
""")


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.scale_bf16(x, y, x.numel())
        return y
'''


def test_bf16_rounding_passes_under_the_low_policy(low_pool: EvaluatorPool) -> None:
    v = low_pool.evaluate_one(SCALE_BF16, "scale_bf16.py")
    assert v.status == Status.OK, v.message
    assert v.correct and v.timed
    assert v.method.precision_policy == "low"
    # It really is bf16: its error is far above fp32 arithmetic, inside the bf16 tolerance.
    rel = max(s.rel_norm_err or 0.0 for s in v.shapes)
    assert 5e-5 < rel < v.method.tolerance["rel_norm"]


# -- a 0-dim output (a loss) ------------------------------------------------------------------------

MSE = r'''
import torch
import torch.nn as nn
from kernelevolve.native import compile_c

_lib = compile_c(r"""
#include <stdint.h>

/* out[0] = mean((x - y)^2), accumulated in double */
void mse(const float *x, const float *y, float *out, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) { double d = (double)x[i] - (double)y[i]; s += d * d; }
    out[0] = (float)(s / (double)n);
}
""")


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty((), dtype=x.dtype)
        _lib.mse(x.contiguous(), y.contiguous(), out, x.numel())
        return out
'''


def test_a_kernel_returning_a_0_dim_loss_is_checked_and_timed(tmp_path: Path) -> None:
    # The harness snapshots and compares outputs bitwise; a 0-dim output once broke that (GPU bench)
    with EvaluatorPool(load_spec(SPECS / "mse_loss.py"), get_platform("cpu"), settings_for(tmp_path)) as pool:
        v = pool.evaluate_one(MSE, "mse.py")
    assert v.status == Status.OK, v.message
    assert v.correct and v.timed


# -- the torch.compile baseline, through jobs.evaluate and the workspace --------------------------


def test_compile_baseline_on_the_cpu_through_jobs(tmp_path: Path) -> None:
    cand = tmp_path / "honest_softmax.py"
    cand.write_text(HONEST)
    settings = settings_for(tmp_path, baselines=["eager", "compile"], fitness_baseline="compile")
    spec, verdicts = jobs.evaluate(SPECS / "softmax.py", [cand], settings)
    assert len(verdicts) == 1
    v = verdicts[0]
    assert v.status == Status.OK, v.message + (v.log_tail or "")
    assert "compile" in v.method.baselines and not v.method.baseline_errors
    assert v.method.fitness_baseline == "compile"
    assert isinstance(v.speedup_vs_compile, float) and v.speedup_vs_compile > 0
    assert v.fitness == pytest.approx(v.speedup_vs_compile)
    assert all(s.compile is not None and s.speedup_vs_compile is not None for s in v.shapes)

    caches = [p for p in (settings.workspace / "cache").iterdir() if p.is_dir()]
    assert [p.name.startswith("compile-") for p in caches] == [True], caches
    assert spec.fingerprint in caches[0].name
    assert (caches[0] / "inductor-2").is_dir()  # the first prepared worker's compile cache, saved

    with Workspace.open(settings.workspace) as ws:
        stats = ws.stats()
        assert stats["specs"] == 1 and stats["candidates"] == 1 and stats["evaluations"] == 1
        assert ws.spec(spec.fingerprint) is not None
        rows = ws.evaluations(spec.fingerprint)
        assert len(rows) == 1
        row = rows[0]
        assert row["status"] == "ok" and row["correct"] is True
        assert row["candidate_hash"] == v.candidate_hash
        assert row["fitness"] == pytest.approx(v.fitness)
        assert row["speedup_vs_compile"] == pytest.approx(v.speedup_vs_compile)
        assert ws.candidate(v.candidate_hash)["source"] == HONEST  # type: ignore[index]


# -- expanding candidate paths -----------------------------------------------------------------------


def test_expand_candidates_takes_modelnew_files_of_a_folder_without_the_spec(tmp_path: Path) -> None:
    folder = tmp_path / "cands"
    folder.mkdir()
    spec = folder / "spec.py"
    spec.write_text("class Model: pass\n# ModelNew is mentioned here, but this is the spec\n")
    (folder / "b_kernel.py").write_text("class ModelNew: pass\n")
    (folder / "a_kernel.py").write_text("class ModelNew: pass\n")
    (folder / "helper.py").write_text("X = 1\n")
    (folder / "notes.txt").write_text("class ModelNew: pass\n")
    (folder / "sub").mkdir()
    (folder / "sub" / "c_kernel.py").write_text("class ModelNew: pass\n")
    single = tmp_path / "single.py"
    single.write_text("class ModelNew: pass\n")

    files = jobs.expand_candidates([folder, single], spec)
    assert files == [folder / "a_kernel.py", folder / "b_kernel.py", single]


def test_expand_candidates_refuses_a_missing_path(tmp_path: Path) -> None:
    # bad input (the CLI's exit 2), not a broken spec (exit 5)
    with pytest.raises(KernelevolveError, match="no such candidate") as caught:
        jobs.expand_candidates([tmp_path / "missing.py"], tmp_path / "spec.py")
    assert not isinstance(caught.value, SpecError)


def test_expand_candidates_refuses_a_folder_without_candidates(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("X = 1\n")
    with pytest.raises(KernelevolveError, match="no candidate files") as caught:
        jobs.expand_candidates([tmp_path], tmp_path / "spec.py")
    assert not isinstance(caught.value, SpecError)
