"""One adversarial candidate per guard and per check, each beside the honest candidate that passes.

Tricks run end to end in real workers on the CPU platform (C kernels compiled natively). Where a
trick is caught by the static guards, a second test turns the static guards off and shows that the
runtime layer catches it on its own.
"""

from __future__ import annotations

import threading
import time

import pytest

from kernelevolve.evaluate import EvaluatorPool, Status
from tests.cpu_candidates import HONEST, candidate

pytestmark = pytest.mark.slow


def rules(verdict) -> set[str]:
    return {v.rule for v in verdict.violations}


def test_honest_candidate_passes(softmax_pool: EvaluatorPool) -> None:
    v = softmax_pool.evaluate_one(HONEST, "honest.py")
    assert v.status == Status.OK, v.message
    assert v.correct and v.timed
    assert [s.name for s in v.shapes] == ["narrow", "wide"]
    assert all(s.correct and s.trials == 6 for s in v.shapes)  # 3 seeds x 2 distributions
    assert all(s.rel_norm_err is not None and s.rel_norm_err < 1e-5 for s in v.shapes)
    assert v.speedup_vs_eager is not None and v.speedup_vs_eager > 0
    assert v.method.checked_timed_calls >= 6 and v.method.interleaved
    assert v.method.timer == "perf_counter"


# -- reference reuse and fallbacks ----------------------------------------------------------------


def test_subclassing_the_reference_is_refused(softmax_pool: EvaluatorPool) -> None:
    v = softmax_pool.evaluate_one(candidate(base="Model"), "subclass.py")
    assert v.status == Status.GUARD_VIOLATION
    assert "reference" in rules(v)


def test_torch_fallback_is_refused_statically(softmax_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, 1, 0)
        return torch.softmax(x, dim=-1)
"""
    v = softmax_pool.evaluate_one(candidate(forward), "torch_fallback.py")
    assert v.status == Status.GUARD_VIOLATION and "torch-compute" in rules(v)


def test_torch_fallback_through_a_method_is_caught_at_run_time(unguarded_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, 1, 0)
        return x.softmax(-1)
"""
    v = unguarded_pool.evaluate_one(candidate(forward), "method_fallback.py")
    assert v.status == Status.GUARD_VIOLATION, v.message
    assert "torch-compute" in rules(v) and "aten._softmax" in v.message


def test_try_except_fallback_is_refused(softmax_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        try:
            y = torch.empty_like(x)
            _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 0)
            return y
        except Exception:
            return torch.softmax(x, -1)
"""
    v = softmax_pool.evaluate_one(candidate(forward), "try_fallback.py")
    assert v.status == Status.GUARD_VIOLATION and "try-fallback" in rules(v)


def test_try_except_fallback_that_fires_is_caught_at_run_time(unguarded_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        try:
            _lib.softmax_rows(x, x, x.shape[1], 0, 1, 0, 0)  # wrong argument count: raises
        except TypeError:
            _lib.softmax_rows(x.clone(), torch.empty_like(x), x.shape[1], 0, 1, 0)
            return x.softmax(-1)
"""
    v = unguarded_pool.evaluate_one(candidate(forward), "try_fires.py")
    assert v.status == Status.GUARD_VIOLATION and "torch-compute" in rules(v), v.message


# -- caching ----------------------------------------------------------------------------------------

SLOW_ON_MISS = """
        y = torch.empty_like(x)
        for _ in range(20):
            _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 0)
"""


def test_caching_by_pointer_cannot_win(softmax_pool: EvaluatorPool) -> None:
    forward = f"""
    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        if key in _CACHE:
            return _CACHE[key]
{SLOW_ON_MISS}
        _CACHE[key] = y
        return y
"""
    v = softmax_pool.evaluate_one(candidate(forward, prelude="_CACHE = {}"), "pointer_cache.py")
    # Timed calls reuse the same buffers with new contents: a pointer hit returns a stale answer.
    assert v.status == Status.INCORRECT, v.message


def test_caching_by_value_cannot_win(softmax_pool: EvaluatorPool) -> None:
    forward = f"""
    def forward(self, x):
        key = (tuple(x.shape), x[0, 0].item(), x[-1, -1].item())
        if key in _CACHE:
            return _CACHE[key]
{SLOW_ON_MISS}
        _CACHE[key] = y
        return y
"""
    v = softmax_pool.evaluate_one(candidate(forward, prelude="_CACHE = {}"), "value_cache.py")
    # Every timed call gets new contents, so every call misses and pays the slow path: no speedup.
    assert v.status == Status.OK, v.message
    assert v.speedup_vs_eager is not None and v.speedup_vs_eager < 1.0


# -- outputs ----------------------------------------------------------------------------------------


def test_tensor_subclass_output_is_refused(softmax_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 0)
        return y.as_subclass(Sneaky)
"""
    v = softmax_pool.evaluate_one(
        candidate(forward, prelude="class Sneaky(torch.Tensor):\n    pass"), "subclass_out.py"
    )
    assert v.status == Status.INCORRECT and "plain torch.Tensor" in v.message


def test_partial_output_is_caught(softmax_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0] // 2, 0)
        return y
"""
    v = softmax_pool.evaluate_one(candidate(forward), "partial.py")
    assert v.status == Status.INCORRECT, v.message


def test_stale_memory_does_not_pass(softmax_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        scratch = torch.empty_like(x)
        _lib.softmax_rows(x, scratch, x.shape[1], 0, x.shape[0], 0)
        del scratch
        return torch.empty_like(x)  # whatever the allocator hands back
"""
    v = softmax_pool.evaluate_one(candidate(forward), "stale.py")
    assert v.status == Status.INCORRECT, v.message
    assert "NaN" in v.message or "elements" in v.message


def test_zeros_on_small_magnitude_outputs_fail(softmax_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 0)
        return torch.zeros_like(x)
"""
    v = softmax_pool.evaluate_one(candidate(forward), "zeros.py")
    # Softmax rows of 256 to 4096 columns are ~1e-3..1e-4: a fixed atol of 1e-2 would pass zeros.
    assert v.status == Status.INCORRECT, v.message


def test_input_mutation_is_caught(softmax_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        _lib.softmax_rows(x, x, x.shape[1], 0, x.shape[0], 0)
        return x.clone()
"""
    v = softmax_pool.evaluate_one(candidate(forward), "mutate.py")
    assert v.status == Status.INCORRECT and "input-mutation" in rules(v), v.message


def test_precision_downgrade_under_strict_policy_is_caught(softmax_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 1)  # results rounded to bf16
        return y
"""
    v = softmax_pool.evaluate_one(candidate(forward), "bf16.py")
    assert v.status == Status.INCORRECT, v.message
    assert "precision" in v.message or "elements outside" in v.message


# -- patching, flags, threads -------------------------------------------------------------------------


def test_timer_patching_is_refused_statically(softmax_pool: EvaluatorPool) -> None:
    prelude = "import time\ntime.perf_counter = lambda: 0.0"
    v = softmax_pool.evaluate_one(candidate(prelude=prelude), "timer_static.py")
    assert v.status == Status.GUARD_VIOLATION and {"import", "patching"} <= rules(v)


def test_timer_patching_is_caught_at_run_time(unguarded_pool: EvaluatorPool) -> None:
    prelude = "import time\n_real = time.perf_counter_ns\ntime.perf_counter_ns = lambda: _real() // 1000"
    v = unguarded_pool.evaluate_one(candidate(prelude=prelude), "timer_runtime.py")
    assert v.status == Status.GUARD_VIOLATION and "patching" in rules(v), v.message
    assert "time.perf_counter_ns" in v.message


def test_patching_torch_is_caught_at_run_time(unguarded_pool: EvaluatorPool) -> None:
    prelude = "setattr(torch, 'allclose', lambda *a, **k: True)"
    v = unguarded_pool.evaluate_one(candidate(prelude=prelude), "patch_torch.py")
    assert v.status == Status.GUARD_VIOLATION and "torch.allclose" in v.message


def test_global_flag_change_is_refused_statically(softmax_pool: EvaluatorPool) -> None:
    prelude = "torch.backends.cudnn.allow_tf32 = True\ntorch.set_num_threads(1)"
    v = softmax_pool.evaluate_one(candidate(prelude=prelude), "flags_static.py")
    assert v.status == Status.GUARD_VIOLATION and "forbidden-api" in rules(v)


def test_global_flag_change_is_caught_at_run_time(unguarded_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        torch.set_num_threads(1)
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 0)
        return y
"""
    v = unguarded_pool.evaluate_one(candidate(forward), "flags_runtime.py")
    assert v.status == Status.GUARD_VIOLATION and "global-flags" in rules(v), v.message


LATE_THREAD = """
    def forward(self, x):
        y = torch.empty_like(x)
        rows = x.shape[0]
        _lib.softmax_rows(x, y, x.shape[1], 0, rows // 2, 0)
        def finish():
            time.sleep(0.05)
            _lib.softmax_rows(x, y, x.shape[1], rows // 2, rows, 0)
        threading.Thread(target=finish).start()
        return y
"""


def test_late_threads_are_refused_statically(softmax_pool: EvaluatorPool) -> None:
    v = softmax_pool.evaluate_one(candidate(LATE_THREAD, prelude="import threading, time"), "late_static.py")
    assert v.status == Status.GUARD_VIOLATION and "import" in rules(v)


def test_late_threads_are_caught_at_run_time(unguarded_pool: EvaluatorPool) -> None:
    v = unguarded_pool.evaluate_one(
        candidate(LATE_THREAD, prelude="import threading, time"), "late_runtime.py"
    )
    assert v.status == Status.GUARD_VIOLATION and "threads" in rules(v), v.message


def test_no_kernel_launched_is_refused(unguarded_pool: EvaluatorPool) -> None:
    forward = """
    def forward(self, x):
        y = torch.empty_like(x)
        y.copy_(x)
        return y  # compiles a kernel but never launches it (and is wrong anyway)
"""
    v = unguarded_pool.evaluate_one(candidate(forward), "no_launch.py")
    assert v.status in (Status.INCORRECT, Status.GUARD_VIOLATION)


def test_the_harness_is_healthy_after_the_tricks(
    softmax_pool: EvaluatorPool, unguarded_pool: EvaluatorPool
) -> None:
    for pool in (softmax_pool, unguarded_pool):
        v = pool.evaluate_one(HONEST, "honest_again.py")
        assert v.status == Status.OK, v.message


def test_a_late_thread_reusing_an_earlier_threads_ident_is_still_new() -> None:
    """An ended thread's ident goes to the next thread at once: a candidate's late thread in a trial
    could take the ident of the first call's late thread, which was running when correctness began,
    and pass for it (the runtime check then missed it, and only the output check caught the trick,
    as INCORRECT, now and then in CI). Threads are told apart by their objects."""
    from kernelevolve.evaluate.runtime import new_threads, python_threads

    first = threading.Thread(target=time.sleep, args=(0.01,))
    first.start()
    before = python_threads()  # the first call's late thread still runs
    first.join()
    for _ in range(20):  # glibc hands the ended thread's ident to the next one, nearly always at once
        late = threading.Thread(target=time.sleep, args=(0.5,))
        late.start()
        if late.ident == first.ident:
            break
        late.join()
    if late.ident != first.ident:
        late.join()
        pytest.skip("this platform gave no ended thread's ident to a new one")
    assert new_threads(before) == [late.ident]
    late.join()
    assert new_threads(before) == []
