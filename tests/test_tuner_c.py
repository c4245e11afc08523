"""The tuner's CPU back end: generated C candidates pass the guards, are correct under the real harness
at several configurations, and the fused elementwise chain beats eager at a multi-MB shape.

Harness evaluations run in real worker processes (5-15 s each on two cores): one pool per spec, few
candidates, and correctness-only configurations narrowed to the small shapes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelevolve import tunables as tn
from kernelevolve.evaluate import EvaluatorPool, Status
from kernelevolve.evaluate.guards import check_source
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import c_codegen
from kernelevolve.synth.tuner.ir import Generated, OpGraph
from kernelevolve.synth.tuner.trace import recognize
from tests.conftest import SPECS, cpu_settings


def graph_for(name: str) -> OpGraph:
    graph, why = recognize(load_spec(SPECS / f"{name}.py"))
    assert graph is not None, why
    return graph


@pytest.fixture(scope="module")
def ew_chain() -> Generated:
    return c_codegen.generate(graph_for("ew_chain"))


@pytest.fixture(scope="module")
def rmsnorm() -> Generated:
    return c_codegen.generate(graph_for("rmsnorm"))


def configs(gen: Generated, n: int, seed: int = 0) -> list[dict[str, int | str]]:
    rng = random.Random(seed)
    return [gen.config] + [{k: rng.choice(v) for k, v in gen.tunables.items()} for _ in range(n)]


# -- the files, statically -------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["ew_chain", "rmsnorm", "softmax", "scale_low"])
def test_generated_sources_pass_the_guards_at_every_sampled_config(spec: str) -> None:
    gen = c_codegen.generate(graph_for(spec))
    assert tn.read(gen.source) == (gen.tunables, gen.config)
    for cfg in configs(gen, 6):
        source = tn.write(gen.source, cfg)
        report = check_source(source, accepted_kinds=("c",), platform="cpu")
        assert report.ok, report.violations
        assert report.kinds == {"c"}
    assert "-ffast-math" not in gen.source


def test_templates_and_tunables_follow_the_graph(ew_chain: Generated, rmsnorm: Generated) -> None:
    assert ew_chain.template == "c-elementwise" and "keep" not in ew_chain.tunables
    assert ew_chain.tunables["math"] == ["poly", "libm"]  # sigmoid is transcendental
    assert rmsnorm.template == "c-row" and "math" not in rmsnorm.tunables
    flat = c_codegen.generate(graph_for("scale_low"))
    assert flat.template == "c-flat" and flat.tunables["chunk"][0] == 4096  # elements per block
    softmax = c_codegen.generate(graph_for("softmax"))
    assert softmax.tunables["keep"] == ["scratch", "recompute"]  # exp(x - max) is needed twice
    # Every knob reaches the compiler: each value is spelled in a -D flag or a C `#if`.
    for name in (
        "KE_THREADS",
        "KE_CHUNK",
        "KE_GRAIN",
        "KE_SCHEDULE",
        "KE_SIMD",
        "KE_UNROLL",
        "KE_POLY",
        "KE_KEEP",
    ):
        assert f"-D{name}=" in softmax.source
        assert name in softmax.source.split('C_SOURCE = r"""')[1].split('"""')[0]


def test_refuses_gemm_other_dtypes_and_unknown_configs(tmp_path: Path, ew_chain: Generated) -> None:
    graph = graph_for("ew_chain")
    with pytest.raises(ValueError, match="not one of"):
        c_codegen.generate(graph, {"threads": 3})
    with pytest.raises(ValueError, match="not a tunable"):
        c_codegen.generate(graph, {"BLOCK": 128})
    graph.pattern = "gemm"
    with pytest.raises(NotImplementedError, match="GEMM"):
        c_codegen.generate(graph)
    graph.pattern, graph.dtype = "elementwise", "bfloat16"
    with pytest.raises(NotImplementedError, match="fp32"):
        c_codegen.generate(graph)


# -- the harness: correct, and fast ----------------------------------------------------------------


def _pool(tmp_path_factory: pytest.TempPathFactory, spec: str, **settings: object) -> Iterator[EvaluatorPool]:
    tmp = tmp_path_factory.mktemp(spec)
    platform = get_platform("cpu")
    with EvaluatorPool(load_spec(SPECS / f"{spec}.py"), platform, cpu_settings(tmp, **settings)) as pool:
        yield pool


@pytest.fixture(scope="module")
def ew_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluatorPool]:
    # Eager's own time at 16 MB swings 13-60 ms on two shared vCPUs (each of its six ops wakes an
    # OpenMP team), so an honest fused kernel at ~3.6 ms can pass the default 10x review flag.
    yield from _pool(tmp_path_factory, "ew_chain", suspicious_speedup=50.0)


@pytest.fixture(scope="module")
def rms_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluatorPool]:
    yield from _pool(tmp_path_factory, "rmsnorm")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fused_elementwise_chain_beats_eager_at_16_mb(ew_pool: EvaluatorPool, ew_chain: Generated) -> None:
    v = ew_pool.evaluate_one(ew_chain.source, "c_ew_chain.py")
    assert v.status == Status.OK, v.message
    assert v.correct is True and v.candidate_kind == "c"
    big = next(s for s in v.shapes if s.name == "big")
    # Eager makes six passes over 16 MB and allocates five temporaries; the fused kernel one pass.
    # Measured 3.6-11x here (fused ~3 ms; eager 13-60 ms, its thread wake-ups are noisy); 1.0 is the claim.
    assert big.speedup_vs_eager is not None and big.speedup_vs_eager > 1.0, big


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "cfg",
    [
        {"threads": 1, "vec": "auto", "unroll": 4, "math": "libm", "schedule": "dynamic", "chunk": 1},
        {"threads": 2, "grain": 4096, "vec": "simd", "unroll": 1, "math": "poly", "chunk": 64},
    ],
)
def test_elementwise_configs_are_correct(
    ew_pool: EvaluatorPool, ew_chain: Generated, cfg: dict[str, object]
) -> None:
    source = tn.write(ew_chain.source, {**ew_chain.config, **cfg})
    v = ew_pool.evaluate_one(source, "c_ew_chain_cfg.py", shapes=["small"], timing_budget_s=0.02)
    assert v.status == Status.OK, v.message
    assert v.correct is True


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"threads": 2, "grain": 4096, "vec": "auto", "unroll": 4, "schedule": "dynamic", "chunk": 1},
    ],
)
def test_rmsnorm_configs_are_correct(
    rms_pool: EvaluatorPool, rmsnorm: Generated, cfg: dict[str, object]
) -> None:
    source = tn.write(rmsnorm.source, {**rmsnorm.config, **cfg})
    v = rms_pool.evaluate_one(source, "c_rmsnorm.py", timing_budget_s=0.02)
    assert v.status == Status.OK, v.message
    assert v.correct is True and v.timed is True


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_wrong_kernel_is_caught(rms_pool: EvaluatorPool, rmsnorm: Generated) -> None:
    """The configurations above pass because they are right: the same file with rsqrt turned into a
    reciprocal does not."""
    broken = rmsnorm.source.replace("(1.0f / sqrtf(", "(1.0f / (")
    assert broken != rmsnorm.source
    v = rms_pool.evaluate_one(broken, "c_rmsnorm_broken.py", timing_budget_s=0.02)
    assert v.status == Status.INCORRECT, v.message


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_flat_blocks_are_correct(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Only full and scalar tensors: the blocked 1-D kernel, with blocks and streams that leave tails."""
    gen = c_codegen.generate(graph_for("ew_flat"), {"chunk": 4096, "grain": 4096, "unroll": 4})
    assert gen.template == "c-flat"
    for pool in _pool(tmp_path_factory, "ew_flat"):
        v = pool.evaluate_one(gen.source, "c_flat.py", timing_budget_s=0.02)
        assert v.status == Status.OK, v.message
        assert v.correct is True


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "cfg",
    [
        {"keep": "scratch", "math": "poly", "unroll": 4, "grain": 4096},
        {"keep": "recompute", "math": "libm", "vec": "auto", "unroll": 1},
    ],
)
def test_softmax_configs_are_correct(softmax_pool: EvaluatorPool, cfg: dict[str, object]) -> None:
    gen = c_codegen.generate(graph_for("softmax"), cfg)
    v = softmax_pool.evaluate_one(gen.source, "c_softmax.py", timing_budget_s=0.02)
    # Correctness is what is asserted: 20 ms of timing on a shared 2-core machine can flag a speedup
    # as implausible (an eager call slowed 20x by a neighbour), which is `suspicious`, still correct.
    assert v.status in (Status.OK, Status.SUSPICIOUS), v.message
    assert v.correct is True


# -- the exponential family: elu, selu, celu (expm1) and softplus, mish (log1p) ------------------------

ACTIVATIONS = {
    "elu": "F.elu(x, alpha=1.3)",
    "selu": "torch.selu(x)",
    "celu": "F.celu(x, alpha=0.7)",
    "softplus": "F.softplus(x)",
    "mish": "F.mish(x)",
}


def test_the_exponential_family_is_templated_and_correct_in_c(tmp_path: Path) -> None:
    """Level 1's 27_SELU_, 29_Softplus and 31_ELU and level 2's Mish chains were not templated
    (`aten.elu`, `aten.log1p`); now each traces to expm1 or log1p and the C template is correct under
    the harness, inputs drawn around 0, where a plain exp(x) - 1 or log(1 + x) loses digits."""
    from kernelevolve import jobs

    files = []
    for name, expr in ACTIVATIONS.items():
        spec = tmp_path / f"{name}.py"
        spec.write_text(
            "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
            f"class Model(nn.Module):\n    def forward(self, x):\n        return {expr}\n\n"
            "def get_inputs():\n    return [torch.randn(64, 1000) * torch.logspace(-7, 1, 1000)]\n"
        )
        graph = graph_for_path(spec)
        assert {"expm1", "log1p"} & {op.op for op in graph.ops}, (name, [op.op for op in graph.ops])
        cand = tmp_path / f"{name}_c.py"
        cand.write_text(c_codegen.generate(graph).source)
        files.append((spec, cand))
    for spec, cand in files:
        _, (verdict,) = jobs.evaluate(spec, [cand], cpu_settings(tmp_path, timing_budget_s=0.2))
        assert verdict.correct, (spec.stem, verdict.message)


def graph_for_path(path: Path) -> OpGraph:
    graph, why = recognize(load_spec(path))
    assert graph is not None, why
    return graph
