"""Reference outputs shared within a pool (`kernelevolve.evaluate.references`): the first worker
computes them before any candidate and writes them for its pool; later workers load them instead of
calling the reference (no device lease at start-up), and judge candidates exactly as before. The
tricks: a file changed after the pool hashed it, a file for another spec, and a candidate that
rewrites what its worker shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kernelevolve.evaluate import references
from kernelevolve.evaluate.correctness import Sampled
from kernelevolve.evaluate.pool import EvaluatorPool
from kernelevolve.evaluate.prepared import CaseState, Prepared, ShapeState
from kernelevolve.evaluate.verdict import Status, Verdict
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec

from .conftest import SPECS, cpu_settings
from .cpu_candidates import HONEST, candidate

# The honest C softmax, its results rounded to bf16: wrong under the spec's strict fp32
BF16 = candidate("""
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 1)
        return y
""")  # fmt: skip


def _pool(tmp: Path, spec: str = "softmax", share: str = "always", **options: object) -> EvaluatorPool:
    """A CPU pool sharing its references (under "auto" a CPU's cheap outputs are never worth it)."""
    settings = cpu_settings(tmp, share_references=share)
    return EvaluatorPool(load_spec(SPECS / f"{spec}.py"), get_platform("cpu"), settings, **options)  # type: ignore[arg-type]


def _how(pool: EvaluatorPool) -> str:
    """How the last worker taken got its reference outputs: "computed" or "loaded"."""
    assert pool.device_info is not None
    return str(pool.device_info["references"])


def _refusals(v: Verdict) -> list[str]:
    return [n for n in v.method.notes if "shared reference outputs were not used" in n]


def test_later_workers_load_the_shared_outputs_and_judge_as_before(tmp_path: Path) -> None:
    with _pool(tmp_path) as pool:
        first = pool.evaluate_one(HONEST, "honest.py")
        assert first.status == Status.OK and _how(pool) == "computed"
        assert "start:reference_outputs_wait" in first.phases  # it computed them under the lease
        assert pool._references.given is not None
        path, digest = pool._references.given.path, pool._references.given.sha256
        assert path.parent.name.startswith("kernelevolve-references-")  # the pool's, not a worker's
        assert path.stat().st_mode & 0o222 == 0  # read-only
        assert references.sha256_of(path) == digest
        honest = pool.evaluate_one(HONEST, "honest_again.py")
        assert honest.status == Status.OK and _how(pool) == "loaded"
        assert "start:reference_outputs_wait" not in honest.phases and not _refusals(honest)
        wrong = pool.evaluate_one(BF16, "bf16.py")
        assert _how(pool) == "loaded"
        assert wrong.status == Status.INCORRECT, wrong.message  # the loaded outputs still judge
    assert not path.exists()  # the pool's folder goes with it


def test_a_file_changed_after_the_pool_hashed_it_is_not_used(tmp_path: Path) -> None:
    """The forgery that would matter: the shared outputs replaced by what a wrong kernel returns
    (rounded to bf16), so that it passes. The hash the pool took refuses the file; the worker
    computes its own outputs, and the wrong kernel fails."""
    with _pool(tmp_path) as pool:
        assert pool.evaluate_one(HONEST, "honest.py").status == Status.OK
        assert pool._references.given is not None
        path = pool._references.given.path
        blob = torch.load(path, weights_only=True)
        for shape in blob["shapes"]:
            for trial in shape["trials"]:
                trial["outputs"] = [o.to(torch.bfloat16).to(torch.float32) for o in trial["outputs"]]
        forged = path.with_name("forged.pt")
        torch.save(blob, forged)
        os.replace(forged, path)
        pool.evaluate_one(HONEST, "honest_again.py")  # a worker started before the forgery, maybe
        wrong = pool.evaluate_one(BF16, "bf16.py")
        assert wrong.status == Status.INCORRECT, wrong.message
        assert _how(pool) == "computed"
        assert any("not the one the pool hashed" in n for n in _refusals(wrong)), wrong.method.notes


def test_a_file_for_another_spec_is_not_used(tmp_path: Path) -> None:
    with _pool(tmp_path / "a") as softmax:
        assert softmax.evaluate_one(HONEST, "honest.py").status == Status.OK
        other = softmax._references.given
        assert other is not None
        flat = _pool(tmp_path / "b", "ew_flat", static_guards=False)
        flat._references.given = other  # as if the pools had mixed their files up, before any worker starts
        with flat:
            v = flat.evaluate_one(HONEST, "honest.py")  # the wrong op for ew_flat: only its notes matter
            assert any("another spec" in n for n in _refusals(v)), v.method.notes
            assert _how(flat) == "computed"


def test_a_candidate_cannot_rewrite_what_its_worker_shared(tmp_path: Path) -> None:
    """The first worker's candidate overwrites the file its worker wrote for the pool. The pool took
    the file out of the worker's folder before it handed over the candidate, so the write lands in a
    file no one reads: later workers load the outputs the worker computed before any candidate."""
    prelude = """
import os as _os
with open(_os.path.join(_os.getcwd(), "references.pt"), "wb") as _f:
    _f.write(b"forged")
"""
    with _pool(tmp_path, static_guards=False) as pool:
        pool.evaluate_one(candidate(prelude=prelude), "rewrites.py")
        assert pool._references.given is not None
        path, digest = pool._references.given.path, pool._references.given.sha256
        assert path.read_bytes()[:6] != b"forged" and references.sha256_of(path) == digest
        v = pool.evaluate_one(HONEST, "honest.py")
        assert v.status == Status.OK and _how(pool) == "loaded" and not _refusals(v)


@pytest.mark.parametrize("share", ["auto", "never"])
def test_outputs_cheaper_to_compute_than_to_load_are_not_shared(tmp_path: Path, share: str) -> None:
    """The CPU softmax spec's outputs take milliseconds to compute: under "auto" no worker shares them
    (nor under "never"), and every worker computes its own."""
    with _pool(tmp_path, share=share) as pool:
        for name in ("one.py", "two.py", "three.py"):
            assert pool.evaluate_one(HONEST, name).status == Status.OK
            assert _how(pool) == "computed"
        assert pool._references.given is None


def test_auto_shares_where_computing_held_the_lease_longer_than_loading_takes() -> None:
    from types import SimpleNamespace

    state = _state([torch.empty(1 << 20, dtype=torch.int8)])  # 1 MiB of outputs
    state.settings = SimpleNamespace(share_references="auto")  # type: ignore[assignment]
    load = references.LOAD_SECONDS + (1 << 20) / references.LOAD_BYTES_PER_S
    assert not references.worth_sharing(state, 0.3, torch)  # a small spec's references on an H100
    assert not references.worth_sharing(state, load * 0.99, torch)
    assert references.worth_sharing(state, load * 1.01, torch)
    state.settings = SimpleNamespace(share_references="always")  # type: ignore[assignment]
    assert references.worth_sharing(state, 0.0, torch)
    state.settings = SimpleNamespace(share_references="never")  # type: ignore[assignment]
    assert not references.worth_sharing(state, 1e6, torch)


def test_share_references_takes_three_values(tmp_path: Path) -> None:
    from kernelevolve.errors import WorkspaceError

    with pytest.raises(WorkspaceError, match="share_references must be one of auto, always, never"):
        cpu_settings(tmp_path, share_references="sometimes")


def _state(outputs: list[object]) -> Prepared:
    state = Prepared(platform=None, device=torch.device("cpu"), settings=None, notes=[], info={})  # type: ignore[arg-type]
    st = ShapeState(shape=None, reference=None)
    st.cases = [CaseState(case=None, digest=[], ref_outputs=outputs)]
    state.shapes = [st]
    return state


def test_sampled_or_large_outputs_are_not_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(64, 64)
    assert references._on_host(_state([x]), torch) is not None
    sample = Sampled.of(x, 16, torch.Generator().manual_seed(0))
    assert references._on_host(_state([x, sample]), torch) is None  # its positions stay this worker's
    monkeypatch.setattr(references, "SHARE_MAX_BYTES", x.nbytes - 1)
    assert references._on_host(_state([x]), torch) is None


def test_loaded_outputs_go_to_the_device_of_the_trial() -> None:
    on_host = torch.arange(4.0)
    meta = torch.device("meta")
    moved = references.on_device([on_host, 3], meta)
    assert moved[0].device == meta and moved[1] == 3
    assert references.on_device([on_host], torch.device("cpu"))[0] is on_host  # already there: no copy


@pytest.mark.gpu
def test_on_a_gpu_later_workers_load_without_the_lease_and_judge_as_before(tmp_path: Path) -> None:
    """On a GPU the loaded outputs stay on the host until a trial's call has run: the honest Triton
    softmax passes and the same kernel leaving the last row unwritten fails, in workers that loaded
    them."""
    from tests import gpu_candidates as gc
    from tests.conftest import harness_settings

    wrong = gc.triton_candidate("""
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        launch(x[:-1], y[:-1])
        return y
""")  # fmt: skip
    settings = harness_settings(
        tmp_path, "cuda", timing_budget_s=0.3, compile_timeout_s=120, share_references="always"
    )
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cuda"), settings) as pool:
        seen = []
        for i in range(3):  # the spare started beside the first worker computed its own too
            v = pool.evaluate_one(gc.HONEST, f"honest{i}.py")
            assert v.status == Status.OK, v.message
            seen.append(_how(pool))
        assert seen[0] == "computed" and seen[-1] == "loaded", seen
        assert "start:reference_outputs_wait" not in v.phases and not _refusals(v)
        bad = pool.evaluate_one(wrong, "bf16.py")
        assert _how(pool) == "loaded"
        assert bad.status == Status.INCORRECT, bad.message
