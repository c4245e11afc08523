"""The project's own suites (`suites/recsys`, `suites/llm`): every spec loads, describes itself, runs
its reference on the CPU at its lightest shape, is refused as its own candidate (it is no kernel), and
is covered on CUDA by the tuner: a generated template or a knowledge-base code sample applies."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from kernelevolve.bench.runner import discover
from kernelevolve.evaluate import EvaluatorPool, Status
from kernelevolve.platforms import get_platform
from kernelevolve.spec import Spec, call_get_init_inputs, call_get_inputs, import_spec_module, load_spec
from tests.conftest import cpu_settings

ROOT = Path(__file__).parent.parent / "suites"
SUITES = ("recsys", "llm")
SPECS = [p for suite in SUITES for p in discover(ROOT / suite)]
IDS = [f"{p.parent.name}/{p.stem}" for p in SPECS]


def _lightest(spec: Spec) -> str:
    sizes = {s.name: spec.footprint_bytes(s.name) for s in spec.shapes}
    known = {k: v for k, v in sizes.items() if v is not None}
    if known:
        return min(known, key=lambda k: known[k])
    return min(
        spec.shapes, key=lambda s: math.prod(abs(v) or 1 for v in s.params.values() if isinstance(v, int))
    ).name


def test_both_suites_are_populated() -> None:
    for suite in SUITES:
        assert len(discover(ROOT / suite)) >= 5, suite
    names = [load_spec(p, probe=False).name for p in SPECS]
    assert len(names) == len(set(names)), "two suite specs share a name"


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_spec_describes_itself(path: Path) -> None:
    spec = load_spec(path)
    assert spec.name == path.stem
    assert len(spec.description) > 20
    assert len(spec.shapes) >= 2 and math.isclose(sum(s.weight for s in spec.shapes), 1.0)
    module = import_spec_module(path)
    assert module.__doc__ and len(module.__doc__.split()) >= 40, "the docstring says what it models"


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_reference_runs_on_the_cpu_at_its_lightest_shape(path: Path) -> None:
    import torch

    spec = load_spec(path)
    shape = spec.shape(_lightest(spec))
    module = import_spec_module(path)
    torch.manual_seed(0)
    inputs = call_get_inputs(spec, module, shape)
    model = module.Model(*call_get_init_inputs(spec, module, shape))
    start = time.perf_counter()
    with torch.no_grad():
        out = model(*inputs)
    assert time.perf_counter() - start < 30
    outs = out if isinstance(out, tuple | list) else [out]
    for o in outs:
        assert isinstance(o, torch.Tensor)
        if o.is_floating_point():
            assert torch.isfinite(o).all()


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_the_reference_as_a_candidate_is_a_guard_violation(path: Path, tmp_path: Path) -> None:
    spec = load_spec(path)
    source = spec.source.replace("class Model(", "class ModelNew(")
    pool = EvaluatorPool(spec, get_platform("cpu"), cpu_settings(tmp_path))
    verdict = pool.evaluate_one(source, "reference_as_candidate.py")  # static guards: no worker started
    assert verdict.status == Status.GUARD_VIOLATION, verdict.message
    assert verdict.message


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_the_tuner_covers_the_spec_on_cuda(path: Path) -> None:
    from kernelevolve.knowledge.samples import applicable_samples
    from kernelevolve.synth.tuner.templates import templates_for

    spec = load_spec(path)
    templates, why = templates_for(spec, "cuda", ("triton",))
    samples = applicable_samples(spec, "triton")
    assert templates or samples, f"no template ({why}) and no Triton sample computes {spec.name}"
