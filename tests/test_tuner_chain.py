"""The chain template (issue K, `triton_chain.py`): a pipeline's GEMM, RMSNorm, GEMM, RMSNorm as one
kernel, the hidden never stored, the first RMSNorm's row scale deferred to the end.

The references are the project's own small FFNs (37 tokens, 24 -> 40 -> 24: widths that are no
multiple of the blocks, so each mask matters): `test_tuner_fusions.FFN` (the suites' ffn_block at toy
widths) and CHAINED, a GEMM, a row stage, a GEMM and a softmax. Under the Triton interpreter the
chain computes them at strict fp32 tolerance with the IEEE dots, its 3xTF32 default, and the weights
read as given or copied. The adversarial cases use CHAINED: ffn_block's last RMSNorm undoes any
scale of its rows, so a wrong deferred scale would not show there; a softmax does not. With the
hidden chunk's sum reading the padding columns, or without the deferred scale, the chain is wrong
(each shown). What does not defer (a mean subtracted, a row maximum added) is not offered, with the
reason.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import triton_chain
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from tests.test_tuner_fusions import FFN
from tests.tuner_interp import interpret

CHAIN = "triton-chain+fused+fused+fused"
SMALL = {"s0_BLOCK_M": 16, "s0_BLOCK_H": 16, "s0_BLOCK_K": 16, "s0_num_warps": 4, "s0_num_stages": 1}
HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def _spec(tmp: Path, name: str, body: str) -> Path:
    path = tmp / f"{name}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return path


@pytest.fixture(scope="module")
def ffn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _spec(tmp_path_factory.mktemp("chain"), "ffn", FFN)


def test_the_chain_computes_the_ffn(ffn: Path, tmp_path: Path) -> None:
    graph, why = recognize(load_spec(ffn))
    assert graph is not None and CHAIN in variants(graph), (why, graph and variants(graph))
    cases = {}
    default = generate(graph, template=CHAIN)
    assert default.config["s0_DOT"] == default.config["s0_DOT2"] == "tf32x3"  # strict's fast dot
    assert check_source(default.source, accepted_kinds={"triton"}, platform="cuda").ok
    assert default.source.count("@triton.jit") == 1 and "def _stage1(" not in default.source
    cases["default"] = (str(ffn), default.source)
    for copy in (0, 1):
        config = {**SMALL, "s0_DOT": "ieee", "s0_DOT2": "ieee", "s0_B_KMAJOR": copy}
        cases[f"ieee-copy{copy}"] = (str(ffn), generate(graph, template=CHAIN, config=config).source)
    tf32x3 = {**SMALL, "s0_BLOCK_H": 32, "s0_BLOCK_K": 32}  # 40 hidden: a whole chunk, then 8 columns
    cases["tf32x3-h32"] = (str(ffn), generate(graph, template=CHAIN, config=tf32x3).source)
    assert interpret(cases, tmp_path, tol=1e-5) == dict.fromkeys(cases, "ok")


RMS = "h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)"


def test_the_chains_sum_mask_and_deferred_scale_bite(tmp_path: Path) -> None:
    """The hidden chunk's sum over the padding columns (where the wrapped loads put real products), or
    the row scale left out: each is wrong, where the one as written is right."""
    ffn = _spec(tmp_path, "chained", CHAINED.format(between=RMS))
    graph, _ = recognize(load_spec(ffn))
    assert graph is not None
    source = generate(graph, template=CHAIN, config={**SMALL, "s0_DOT": "ieee", "s0_DOT2": "ieee"}).source
    sums = "_sum0 += tl.sum(tl.where(hmask, "
    scale = "acc = acc2 * (v_c2_v3)  # each row's deferred scale"
    assert sums in source and scale in source, source
    cases = {
        "as-written": (str(ffn), source),
        "sum-padding": (str(ffn), source.replace(sums, "_sum0 += tl.sum(tl.where(h2 >= 0, ")),
        "no-scale": (str(ffn), source.replace(scale, "acc = acc2")),
    }
    results = interpret(cases, tmp_path, tol=1e-5)
    assert results.pop("as-written") == "ok"
    assert all(r.startswith("AssertionError: Tensor-likes are not close") for r in results.values()), results


CHAINED = """
class Model(nn.Module):
    def __init__(self, dim=24, hidden=40):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(dim, hidden) / dim**0.5)
        self.w2 = nn.Parameter(torch.randn(hidden, dim) / hidden**0.5)

    def forward(self, x):
        h = F.gelu(x @ self.w1)
        h = {between}
        y = h @ self.w2
        return torch.softmax(y, dim=-1)

def get_inputs(tokens=37, dim=24):
    return [torch.randn(tokens, dim)]

def get_init_inputs(dim=24, hidden=40):
    return [dim, hidden]
"""


@pytest.mark.parametrize(
    ("between", "why"),
    [
        ("h - h.mean(-1, keepdim=True)", "mixes the hidden and its row's values"),
        ("h + h.amax(-1, keepdim=True)", "amax over the hidden row"),
        (RMS, None),  # the RMSNorm without its gain: defers
        ("h / h.abs().sum(-1, keepdim=True)", None),  # a division by a row value defers too
    ],
)
def test_only_a_row_scale_defers(between: str, why: str | None, tmp_path: Path) -> None:
    path = _spec(tmp_path, "between", CHAINED.format(between=between))
    graph, found = recognize(load_spec(path))
    assert graph is not None and [s.pattern for s in graph.stages] == ["gemm", "row", "gemm", "row"], found
    plan = triton_chain.deferral(graph.stages[1], "_mid0")
    offered = CHAIN in variants(graph)
    if why is None:
        assert not isinstance(plan, str) and offered, plan
        case = {
            "chain": (
                str(path),
                generate(graph, template=CHAIN, config={**SMALL, "s0_DOT": "ieee", "s0_DOT2": "ieee"}).source,
            )
        }
        assert interpret(case, tmp_path, tol=1e-5) == {"chain": "ok"}
    else:
        assert isinstance(plan, str) and why in plan and not offered, plan


@pytest.mark.gpu
def test_the_chain_is_right_on_cuda_at_the_suites_ffn_block(tmp_path: Path) -> None:
    """The suites' ffn_block (128 -> 256 -> 128, 4096 tokens): the chain at its default (3xTF32 both
    products) and its drafts, compiled on a GPU, against the reference in float64."""
    from tests.tuner_interp import on_cuda

    path = Path(__file__).resolve().parent.parent / "suites" / "recsys" / "ffn_block.py"
    graph, why = recognize(load_spec(path))
    assert graph is not None, why
    generated = generate(graph, template=CHAIN)
    for i, config in enumerate([generated.config, *generated.drafts]):
        cand = tmp_path / f"chain_{i}.py"
        cand.write_text(generate(graph, template=CHAIN, config=config).source)
        got, want = on_cuda(path, cand, repeat=1)
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert got.shape == want.shape and rel < 5e-6, (config, rel)


def test_a_residual_of_x_after_the_second_gemm_is_not_chained(tmp_path: Path) -> None:
    """x read again after the second GEMM (a residual) would be one kernel argument in two layouts:
    refused with the reason, the pairs still offered."""
    body = CHAINED.format(between=RMS).replace(
        "return torch.softmax(y, dim=-1)", "return torch.softmax(y + x, dim=-1)"
    )
    path = _spec(tmp_path, "residual", body)
    graph, why = recognize(load_spec(path))
    assert graph is not None and len(graph.stages) == 4, why
    assert triton_chain._why_not(*graph.stages, 0) == "the second GEMM's stages read ['x'] too"
    assert CHAIN not in variants(graph) and any("triton-gemm-row" in v for v in variants(graph))
