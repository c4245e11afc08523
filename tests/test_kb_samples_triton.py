"""The knowledge base's Triton samples (`knowledge/docs/samples/triton/<op>.py`): each is a candidate
for its spec (`samples/specs/<op>.py`) and must stay one.

- CPU (CI): every sample, run under the Triton interpreter on CPU tensors, matches its spec's
  reference at the spec's first shape, at its CONFIG and at a configuration with every tunable moved.
  The interpreter is switched on by TRITON_INTERPRET before triton is imported, so all samples run
  in one subprocess, away from this process (about a minute on two cores).
- Their tunables, guards and documents are checked in `test_kb_samples.py`.
- GPU (marker `gpu`): every sample goes through the real harness on CUDA at every shape of its spec.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kernelevolve import tunables
from kernelevolve.evaluate import EvaluatorPool, Status
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from tests.conftest import harness_settings
from tests.kb_samples import TRITON_OPS as OPS
from tests.kb_samples import kernel, spec
from tests.tuner_interp import SCRIPT_LOAD

# The interpreter computes tl.dot in fp32 whatever input_precision says, so the tf32 samples are held
# to fp32-level agreement here; the GPU run applies the harness's own tolerances.
TOL = {"strict_fp32": 1e-5, "tf32": 1e-4}


_RUNNER = (
    SCRIPT_LOAD
    + r"""
import inspect

def call(fn, params):
    names = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in params.items() if k in names})

results = {}
for i, case in enumerate(json.load(open(sys.argv[1]))):
    try:
        ref_mod = load(case["spec"], f"kb_spec_{i}")
        cand = load(case["candidate"], f"kb_cand_{i}")
        torch.manual_seed(0)
        init = call(getattr(ref_mod, "get_init_inputs", lambda: []), case["params"])
        ref = ref_mod.Model(*init)
        new = cand.ModelNew(*init)
        new.load_state_dict(ref.state_dict())
        inputs = call(ref_mod.get_inputs, case["params"])
        with torch.no_grad():
            want, got = ref(*inputs), new(*inputs)
        assert type(got) is torch.Tensor, f"output is {type(got).__name__}"
        assert got.shape == want.shape and got.dtype == want.dtype, (
            f"{got.shape} {got.dtype} vs {want.shape} {want.dtype}"
        )
        if want.is_floating_point():
            torch.testing.assert_close(got, want, rtol=case["tol"], atol=case["tol"])
        else:
            assert torch.equal(got, want), f"{int((got != want).sum())} of {want.numel()} ids differ"
        results[case["op"]] = "ok"
    except Exception as exc:
        results[case["op"]] = f"{type(exc).__name__}: {exc}"
json.dump(results, open(sys.argv[2], "w"))
"""
)


def _other_config(source: str) -> dict[str, Any]:
    """Every tunable moved off its default, to its first other choice: the kernels must stay correct
    wherever the tuner takes them, not only at CONFIG."""
    declared = tunables.read(source)
    assert declared is not None
    choices, config = declared
    return {k: next((c for c in v if c != config[k]), config[k]) for k, v in choices.items()}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every sample, at its CONFIG and at another configuration, run under the Triton interpreter in
    one subprocess: case id ("<op>" or "<op>@other") -> "ok" or the failure."""
    tmp = tmp_path_factory.mktemp("kb-triton")
    manifest = []
    for op in OPS:
        ref = load_spec(spec(op))
        params = ref.shapes[0].params
        source = kernel("triton", op).read_text()
        other = tmp / f"{op}_other.py"
        other.write_text(tunables.write(source, _other_config(source)))
        for case_id, path in ((op, kernel("triton", op)), (f"{op}@other", other)):
            manifest.append(
                {"op": case_id, "spec": str(spec(op)), "candidate": str(path), "params": params,
                 "tol": TOL[ref.precision]}
            )  # fmt: skip
    (tmp / "cases.json").write_text(json.dumps(manifest))
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(tmp / "cases.json"), str(tmp / "results.json")],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp / "results.json").read_text())


@pytest.mark.parametrize("op", OPS)
def test_sample_matches_reference_under_interpreter(op: str, interpreted: dict[str, str]) -> None:
    assert interpreted[op] == "ok", interpreted[op]


@pytest.mark.parametrize("op", OPS)
def test_sample_at_other_config_matches_reference(op: str, interpreted: dict[str, str]) -> None:
    assert interpreted[f"{op}@other"] == "ok", (
        _other_config(kernel("triton", op).read_text()),
        interpreted[f"{op}@other"],
    )


# -- GPU --------------------------------------------------------------------------------------------


# Samples whose reference is slow enough on a GPU that an honest kernel may pass 10x it, which the
# harness flags by policy: `torch.segment_reduce` on CUDA (jagged_sum: 7.4-17.7x on an H100).
TENFOLD = {"jagged_sum"}


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_sample_is_ok_on_cuda(op: str, tmp_path: Path) -> None:
    """The real harness at every shape: correct, guarded, timed against eager."""
    settings = harness_settings(tmp_path, "cuda", timing_budget_s=0.3, compile_timeout_s=120)
    ref = load_spec(spec(op))
    with EvaluatorPool(ref, get_platform("cuda"), settings) as pool:
        v = pool.evaluate_one(kernel("triton", op).read_text(), "sample.py")
    per_shape = {s.name: s.speedup_vs_eager for s in v.shapes}
    summary = f"{op}: {v.status} speedup_vs_eager {v.speedup_vs_eager} per shape {per_shape}"
    print(summary)
    if op in TENFOLD and v.status == Status.SUSPICIOUS:
        # Flagged by policy (above 10x a baseline), not wrong: correct, and inside the roofline.
        assert v.correct and v.flags, summary
        assert all("faster than" in f and "roofline" not in f for f in v.flags), v.flags
        assert all(s.roofline_fraction is None or s.roofline_fraction <= 1.0 for s in v.shapes), summary
    else:
        assert v.status == Status.OK, f"{summary}: {v.message}"
    assert set(per_shape) == {s.name for s in ref.shapes}, summary
    assert v.speedup_vs_eager is not None, summary
