"""A pipeline's fused pairs (issue K): the GEMM with a row epilogue (`triton_gemm_row.py`: the GEMM
stage and the row stage after it as one kernel, BLOCK_N the whole row), and the GEMM with the mean
cross-entropy of its output (`triton_gemm_ce.py`: per-tile logsumexp partials, the logits never
stored).

The references are the project's own small ones: an FFN (GEMM, GELU, RMSNorm, GEMM, RMSNorm: the
suites' ffn_block at toy widths) and a Linear then a softmax, each with widths that are not powers
of two, so the reductions' masks matter. Each declares a second, larger shape traced on the meta
device only. Under the Triton interpreter the fused candidates compute what the references compute
at strict fp32 tolerance (the ieee dot and the 3xTF32 draft); the pipeline offers the fused variant
second; rows longer than ROW_MAX_COLS are not fused; and a fused kernel whose reductions read the
tile's padding columns fails (the masks are what make it right). The cross-entropy: a Linear over a
50-class vocabulary in tiles of 16 (the last one partial), some targets the ignore index; fused only
where the loss is exactly the mean cross-entropy; its padding mask and its ignore-index test each
bite.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import triton_gemm_ce, triton_gemm_row
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from tests.tuner_interp import interpret, load_module

FFN = """
class Model(nn.Module):
    def __init__(self, dim=24, hidden=40):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(dim, hidden) / dim**0.5)
        self.w2 = nn.Parameter(torch.randn(hidden, dim) / hidden**0.5)
        self.g1 = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.g2 = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x):
        h = F.gelu(x @ self.w1)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.g1
        y = h @ self.w2
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * self.g2

def get_inputs(tokens=37, dim=24, hidden=40):
    return [torch.randn(tokens, dim)]

def get_init_inputs(dim=24, hidden=40):
    return [dim, hidden]
"""
SOFTMAX = """
class Model(nn.Module):
    def __init__(self, dim=72, out={out}):
        super().__init__()
        self.fc = nn.Linear(dim, out)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=-1)

def get_inputs(tokens=21, dim=72, out={out}):
    return [torch.randn(tokens, dim)]

def get_init_inputs(dim=72, out={out}):
    return [dim, out]
"""
CROSS_ENTROPY = """
class Model(nn.Module):
    def __init__(self, dim=72, vocab=50):
        super().__init__()
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, h, targets):
        return F.cross_entropy(self.lm_head(h), targets{extra}){after}

def get_inputs(tokens=37, dim=72, vocab=50):
    targets = torch.randint(0, vocab, (tokens,))
    targets[::5] = -100  # ignored rows
    return [torch.randn(tokens, dim), targets]

def get_init_inputs(dim=72, vocab=50):
    return [dim, vocab]
"""
FFN_FUSED = "triton-gemm-row+fused+triton-gemm-row+fused"
CE_FUSED = "triton-gemm-ce+fused"
SMALL = {"BLOCK_M": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 1}


def _spec(tmp: Path, name: str, body: str, large: dict[str, int]) -> Path:
    shapes = {"small": {"weight": 0.5, "params": {}}, "large": {"weight": 0.5, "params": large}}
    path = tmp / f"{name}.py"
    header = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
    path.write_text(header + f"\nKERNELEVOLVE = {{'shapes': {shapes!r}}}\n" + textwrap.dedent(body))
    return path


def _staged(template: str, config: dict[str, int | str]) -> dict[str, int | str]:
    """`config` for every fused GEMM stage of `template` (its keys prefixed `s<k>_`)."""
    return {
        f"s{k}_{key}": value
        for k, name in enumerate(template.split("+"))
        if name == triton_gemm_row.NAME
        for key, value in config.items()
    }


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("gemm_row")
    return {
        "ffn": _spec(tmp, "ffn", FFN, {"tokens": 4096, "dim": 256, "hidden": 512}),
        "softmax": _spec(tmp, "softmax", SOFTMAX.format(out=50), {"tokens": 2048, "out": 1000}),
        "softmax-wide": _spec(tmp, "softmax_wide", SOFTMAX.format(out=50), {"tokens": 2048, "out": 4000}),
        "ce": _spec(tmp, "ce", CROSS_ENTROPY.format(extra="", after=""), {"tokens": 2048, "vocab": 32000}),
        "ce-scaled": _spec(tmp, "ce_scaled", CROSS_ENTROPY.format(extra="", after=" * 2.0"), {}),
        "ce-sum": _spec(tmp, "ce_sum", CROSS_ENTROPY.format(extra=', reduction="sum"', after=""), {}),
    }


def test_the_pipeline_offers_the_fused_pairs_after_the_chain(specs: dict[str, Path]) -> None:
    """FFN: two GEMM + RMSNorm pairs, each one kernel (its function returns the row stage's output,
    and no function is written for the row stages); softmax after a Linear: one pair."""
    graph, why = recognize(load_spec(specs["ffn"]))
    assert graph is not None and [s.pattern for s in graph.stages] == ["gemm", "row", "gemm", "row"], why
    names = variants(graph)
    assert names[0] == "triton-gemm+triton-row+triton-gemm+triton-row", names
    assert names[1:3] == ["triton-chain+fused+fused+fused", FFN_FUSED], names  # the four as one, then pairs
    source = generate(graph, template=FFN_FUSED).source
    assert "def _stage0(" in source and "def _stage2(" in source
    assert "def _stage1(" not in source and "def _stage3(" not in source
    assert "_mid1 = _stage0(self, x)" in source and "return _stage2(self, x, _mid0, _mid1)" in source
    assert source.count("@triton.jit") == 2 and "tl.sum(tl.where(cmask," in source
    assert check_source(source, accepted_kinds={"triton"}, platform="cuda").ok  # the candidate guards

    graph, why = recognize(load_spec(specs["softmax"]))
    assert graph is not None, why
    assert variants(graph)[:2] == ["triton-gemm+triton-row", "triton-gemm-row+fused"], variants(graph)


def test_rows_longer_than_the_limit_are_not_fused(specs: dict[str, Path]) -> None:
    """A shape of 4000 columns (over ROW_MAX_COLS): a whole row's tile would not fit the registers."""
    graph, why = recognize(load_spec(specs["softmax-wide"]))
    assert graph is not None, why
    assert not any(triton_gemm_row.NAME in name for name in variants(graph)), variants(graph)


def test_the_fused_kernels_compute_the_references(specs: dict[str, Path], tmp_path: Path) -> None:
    """Under the interpreter, at strict fp32 tolerance: the ieee dot at a small tile (37 rows: three
    BLOCK_M tiles, the last partial; 40 and 24 columns in tiles of 64 and 32), the 3xTF32 default,
    and the softmax (amax's -inf fill, sum's 0 fill)."""
    cases = {}
    for name, template in (("ffn", FFN_FUSED), ("softmax", "triton-gemm-row+fused")):
        graph, _ = recognize(load_spec(specs[name]))
        assert graph is not None
        ieee = generate(graph, template=template, config=_staged(template, {**SMALL, "DOT": "ieee"}))
        cases[f"{name}-ieee"] = (str(specs[name]), ieee.source)
        default = generate(graph, template=template)
        assert set(_staged(template, {"DOT": "tf32x3"}).items()) <= set(default.config.items()), (
            default.config
        )
        cases[f"{name}-default"] = (str(specs[name]), default.source)
    results = interpret(cases, tmp_path, tol=1e-5)
    assert results == dict.fromkeys(cases, "ok"), results


def test_reductions_over_the_padding_fail(specs: dict[str, Path], tmp_path: Path) -> None:
    """The masks bite: with the reductions reading the tile's padding columns (past N, where the
    GEMM's wrapped loads put real products), the fused FFN and softmax are wrong."""
    cases = {}
    for name, template in (("ffn", FFN_FUSED), ("softmax", "triton-gemm-row+fused")):
        graph, _ = recognize(load_spec(specs[name]))
        assert graph is not None
        source = generate(graph, template=template, config=_staged(template, {**SMALL, "DOT": "ieee"})).source
        assert "cmask = n2 < N" in source and "tl.where(cmask, " in source
        cases[name] = (str(specs[name]), source.replace("cmask = n2 < N", "cmask = n2 >= 0"))
    results = interpret(cases, tmp_path, tol=1e-5)
    assert all(r.startswith("AssertionError: Tensor-likes are not close") for r in results.values()), results


@pytest.mark.gpu
def test_the_fused_ffn_block_is_right_on_cuda(tmp_path: Path) -> None:
    """The suites' ffn_block (128 -> 256 -> 128 at its own inputs, 4096 tokens): the fused variant at
    its default (3xTF32, whole 256- and 128-wide rows) and its drafts, compiled on a GPU, against the
    reference in float64."""
    from tests.tuner_interp import on_cuda

    path = Path(__file__).resolve().parent.parent / "suites" / "recsys" / "ffn_block.py"
    graph, why = recognize(load_spec(path))
    assert graph is not None, why
    generated = generate(graph, template=FFN_FUSED)
    for i, config in enumerate([generated.config, *generated.drafts]):
        cand = tmp_path / f"ffn_fused_{i}.py"
        cand.write_text(generate(graph, template=FFN_FUSED, config=config).source)
        got, want = on_cuda(path, cand, repeat=1)
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert got.shape == want.shape and rel < 5e-6, (config, rel)


def test_the_cross_entropy_is_fused_only_where_it_is_exactly_that(specs: dict[str, Path]) -> None:
    """The mean cross-entropy of a Linear's logits is offered fused, second; the loss doubled, or a sum
    reduction (other ops after the log-softmax), is not."""
    graph, why = recognize(load_spec(specs["ce"]))
    assert graph is not None and [s.pattern for s in graph.stages] == ["gemm", "scalar"], why
    assert variants(graph)[1] == CE_FUSED, variants(graph)
    fused = generate(graph, template=CE_FUSED)
    source = fused.source
    # the fused kernel's point is the GEMM at tensor-core speed: the precision's fast dot by default
    assert fused.config["s0_DOT"] == "tf32x3" and generate(graph).config["s0_DOT"] == "ieee"
    assert "def _stage1(" not in source and source.count("@triton.jit") == 3
    assert "IGNORE=-100" in source and "return _stage0(self, h, targets)" in source
    assert check_source(source, accepted_kinds={"triton"}, platform="cuda").ok  # the candidate guards
    for name in ("ce-scaled", "ce-sum"):
        graph, why = recognize(load_spec(specs[name]))
        assert graph is not None and graph.pattern == "pipeline", (name, why)
        assert not any(triton_gemm_ce.NAME in v for v in variants(graph)), (name, variants(graph))


def test_the_fused_cross_entropy_computes_the_reference(specs: dict[str, Path], tmp_path: Path) -> None:
    """Under the interpreter, at strict fp32 tolerance: tiles of 16 x 16 (four column tiles, the last
    of 2 columns; 37 rows, every fifth ignored) with the ieee dot, the 3xTF32 dot, and K padded."""
    graph, _ = recognize(load_spec(specs["ce"]))
    assert graph is not None
    small = {"s0_BLOCK_M": 16, "s0_BLOCK_N": 16, "s0_BLOCK_K": 16, "s0_num_warps": 2, "s0_num_stages": 1}
    ieee = generate(graph, template=CE_FUSED, config={**small, "s0_DOT": "ieee"}).source
    tf32x3 = generate(graph, template=CE_FUSED, config={**small, "s0_DOT": "tf32x3"}).source
    # K = 72 in slices of 32: padded to 96 with zeros, a and b copied (the GEMM template's forward)
    padded = generate(graph, template=CE_FUSED, config={**small, "s0_BLOCK_K": 32, "s0_PAD_K": 1}).source
    assert 'if CONFIG["s0_PAD_K"] and _K % _bk:' in padded
    cases = {
        name: (str(specs["ce"]), src) for name, src in (("ieee", ieee), ("tf32x3", tf32x3), ("pad-k", padded))
    }
    assert interpret(cases, tmp_path, tol=1e-5) == dict.fromkeys(cases, "ok")


def test_the_cross_entropys_masks_bite(specs: dict[str, Path], tmp_path: Path) -> None:
    """The padding columns of the last tile counted in the logsumexp, or the ignored rows counted in
    the mean: each is wrong."""
    graph, _ = recognize(load_spec(specs["ce"]))
    assert graph is not None
    small = {"s0_BLOCK_M": 16, "s0_BLOCK_N": 16, "s0_BLOCK_K": 16, "s0_num_warps": 2, "s0_DOT": "ieee"}
    source = generate(graph, template=CE_FUSED, config=small).source
    padding, ignored = "logit = tl.where(inside, ", "counted = rmask & (t != IGNORE)"
    assert padding in source and ignored in source
    cases = {
        "padding": (str(specs["ce"]), source.replace(padding, "logit = tl.where(n2 >= 0, ")),
        "ignored": (str(specs["ce"]), source.replace(ignored, "counted = rmask")),
    }
    results = interpret(cases, tmp_path, tol=1e-5)
    assert all(r.startswith("AssertionError: Scalars are not close") for r in results.values()), results


@pytest.mark.gpu
def test_the_fused_linear_cross_entropy_is_right_on_cuda(tmp_path: Path) -> None:
    """The suites' linear_cross_entropy at its own inputs (2048 tokens, 768 wide, 50304 classes): the
    fused variant at its default and its drafts (3xTF32 tiles), compiled on a GPU, against the
    reference in float64."""
    import torch

    path = Path(__file__).resolve().parent.parent / "suites" / "llm" / "linear_cross_entropy.py"
    graph, why = recognize(load_spec(path))
    assert graph is not None, why
    generated = generate(graph, template=CE_FUSED)

    spec_mod = load_module(path, "lce_ref")
    torch.manual_seed(0)
    ref = spec_mod.Model().cuda().double()
    h, targets = (x.cuda() for x in spec_mod.get_inputs())
    with torch.no_grad():
        want = ref(h.double(), targets)
    for i, config in enumerate([generated.config, *generated.drafts]):
        cand = tmp_path / f"lce_fused_{i}.py"
        cand.write_text(generate(graph, template=CE_FUSED, config=config).source)
        new = load_module(cand, cand.stem).ModelNew().cuda()
        new.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
        with torch.no_grad():
            got = new(h, targets)
        assert got.shape == want.shape and abs(got.double().item() - want.item()) < 1e-5 * abs(want.item()), (
            config, got.item(), want.item(),
        )  # fmt: skip
