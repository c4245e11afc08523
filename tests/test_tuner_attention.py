"""Attention through the offline tuner (issue K): a softmax between two batched matmuls is cut into a
pipeline of three stages (`stages.py`): the scores' batched GEMM with its epilogue (the scale, a
causal mask read from a buffer), the row softmax of the scores (the intermediate, so a reduction of
that stage's input), and the GEMM of the probabilities with V. `scaled_dot_product_attention`'s
decomposition (its scaled operands and `_safe_softmax` guard) is rewritten exactly first
(`aten_attention`). Each generated candidate computes what the reference computes under the Triton
interpreter at every variant, at small tiles and at the 3xTF32 draft; an attention that no pipeline
covers is refused with the attention preface and the stage's reason.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import c_codegen
from kernelevolve.synth.tuner.ir import OpGraph
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from tests.tuner_interp import interpret, on_cuda, recognized, stage_config

HEADER = "import math\n\nimport torch\nimport torch.nn as nn\n\n"
SMALL = {
    "triton-gemm": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 2, "num_stages": 1},
    "triton-row": {"ROWS": 2, "num_warps": 1},
    "triton-row-looped": {"CHUNK": 512, "ROWS": 1, "num_warps": 1},
    "triton-elementwise": {"BLOCK": 256, "ITERS": 2, "num_warps": 1},
    "triton-flash": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 2},
    "fused": {},
}  # fmt: skip
CAUSAL_BUFFER = 'self.register_buffer("bias", torch.tril(torch.ones({n}, {n})).view(1, 1, {n}, {n}))'
MANUAL = "att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))\n"
CAUSAL = "att = att.masked_fill(self.bias[:, :, :q.size(-2), :q.size(-2)] == 0, float('-inf'))\n"

# name: (the constructor's body, forward's body, each input's shape, the first stage's epilogue ops)
REFERENCES = {
    "sdpa": (
        "pass", "return torch.nn.functional.scaled_dot_product_attention(q, k, v)", (2, 2, 16, 32), ["mul"],
    ),
    "sdpa-wide-head": (  # a head dim wider than the sequence (KernelBench 1/97's 1024 over 512)
        "pass", "return torch.nn.functional.scaled_dot_product_attention(q, k, v)", (2, 2, 8, 40), ["mul"],
    ),
    "manual": ("pass", MANUAL + "return torch.softmax(att, dim=-1) @ v", (2, 2, 16, 32), ["mul"]),
    "causal": (  # MinGPT's: a corner of a larger tril buffer, masked to -inf before the softmax
        CAUSAL_BUFFER.format(n=24), MANUAL + CAUSAL + "return torch.softmax(att, dim=-1) @ v", (2, 2, 16, 32),
        ["mul", "eq", "where_nz"],
    ),
    "causal-whole-buffer": (  # a buffer as long as the sequence: its slice is a no-op (an `alias`)
        CAUSAL_BUFFER.format(n=16), MANUAL + CAUSAL + "return torch.softmax(att, dim=-1) @ v", (2, 2, 16, 32),
        ["mul", "eq", "where_nz"],
    ),
    "projected": (  # a projection first: q, k and v are slices of one intermediate (`aten_mask`)
        "self.proj = nn.Linear(32, 96)",
        "q, k, v = self.proj(q).split(32, dim=-1)\n" + MANUAL + "return torch.softmax(att, dim=-1) @ v",
        (2, 2, 16, 32), ["mul"],
    ),
    "relu-v": (  # V computed first: its own stage, whose intermediate the last GEMM reads beside the probabilities
        "pass", MANUAL + "return torch.softmax(att, dim=-1) @ torch.relu(v)", (2, 2, 16, 32), ["mul"],
    ),
}  # fmt: skip
STAGES = {"relu-v": ["elementwise", "gemm", "row", "gemm"], "projected": ["gemm", "gemm", "row", "gemm"]}


def _spec(tmp: Path, name: str, init: str, body: str, shape: tuple[int, ...]) -> Path:
    path = tmp / f"{name.replace('-', '_')}.py"
    inputs = ", ".join([f"torch.randn{shape}"] * 3)
    path.write_text(
        HEADER
        + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        + textwrap.indent(init, " " * 8)
        + "\n\n    def forward(self, q, k, v):\n"
        + textwrap.indent(body, " " * 8)
        + f"\n\n\ndef get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n"
    )
    return path


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, OpGraph]]:
    tmp = tmp_path_factory.mktemp("attention")
    return recognized(
        {name: _spec(tmp, name, init, body, shape) for name, (init, body, shape, _) in REFERENCES.items()}
    )


@pytest.fixture(scope="module")
def interpreted(
    graphs: dict[str, tuple[str, OpGraph]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Every reference at every variant's defaults, its default variant (the flash kernel where it
    applies) at small tiles, and its first draft (the scores' product at 3xTF32)."""
    generated = {}
    for name, (path, graph) in graphs.items():
        names = variants(graph)
        for template in names:
            generated[f"{name}@{template}"] = (path, generate(graph, template=template).source)
        generated[f"{name}@small"] = (path, generate(graph, config=stage_config(names[0], SMALL)).source)
        drafts = generate(graph).drafts
        assert drafts and "tf32x3" in [v for key, v in drafts[0].items() if key.endswith("_DOT")]
        generated[f"{name}@draft"] = (path, generate(graph, config=drafts[0]).source)
    # strict fp32: ieee products, and 3xTF32 (about fp32's rounding) for the drafts
    return interpret(generated, tmp_path_factory.mktemp("attention-run"), tol=1e-5)


@pytest.mark.parametrize("name", REFERENCES)
def test_attention_is_cut_into_gemm_softmax_gemm(name: str, graphs: dict[str, tuple[str, OpGraph]]) -> None:
    graph = graphs[name][1]
    assert graph.pattern == "pipeline", graph.description
    assert [s.pattern for s in graph.stages] == STAGES.get(name, ["gemm", "row", "gemm"])
    scores, softmax, output = graph.stages[-3:]
    first = len(graph.stages) - 3  # the intermediates before the scores' (relu(v)'s)
    assert scores.gemm is not None and scores.gemm.batched and output.gemm is not None and output.gemm.batched
    assert [op.op for op in scores.ops] == REFERENCES[name][3]  # the scale and mask: the GEMM's epilogue
    # The softmax reads the scores (the intermediate `_mid0`) as its input: a reduction of an input.
    assert [(t.source, t.dtype) for t in softmax.tensors] == [(f"input:{3 + first}", "float32")]
    assert {"amax", "sum", "exp"} <= {op.op for op in softmax.ops}
    assert any(t.source == f"input:{4 + first}" for t in output.tensors)  # the probabilities
    assert all(s.dtype == "float32" for s in graph.stages[:-1])


def test_sdpas_safe_softmax_guard_is_a_row_reduction_of_the_scores(
    graphs: dict[str, tuple[str, OpGraph]],
) -> None:
    """A row of -inf scores gives 0, not NaN: `amax == -inf` selects 0 (eq, where_nz) in the row stage."""
    softmax = graphs["sdpa"][1].stages[1]
    assert [op.op for op in softmax.ops][-2:] == ["eq", "where_nz"]
    assert [op.op for op in graphs["manual"][1].stages[1].ops][-1] == "div"


def test_the_causal_mask_is_read_from_the_buffers_corner_broadcast(
    graphs: dict[str, tuple[str, OpGraph]],
) -> None:
    scores = graphs["causal"][1].stages[0]
    assert [t.source for t in scores.tensors if t.source.startswith("expand:")] == [
        "expand:2,2,16,16:slice:3:0:16:slice:2:0:16:param:bias"
    ]
    source = generate(graphs["causal"][1]).source
    assert "self.bias[:, :, 0:16][:, :, :, 0:16].expand(2, 2, 16, 16).contiguous()" in source


@pytest.mark.parametrize(
    "case", [f"{n}@{w}" for n in REFERENCES for w in ("every-variant", "small", "draft")]
)
def test_generated_attention_matches_the_reference_under_the_interpreter(
    case: str, graphs: dict[str, tuple[str, OpGraph]], interpreted: dict[str, str]
) -> None:
    name, _, which = case.partition("@")
    keys = [f"{name}@{t}" for t in variants(graphs[name][1])] if which == "every-variant" else [case]
    for key in keys:
        assert interpreted[key] == "ok", (key, interpreted[key])


def test_generated_attention_passes_the_candidate_guards(graphs: dict[str, tuple[str, OpGraph]]) -> None:
    for name, (_, graph) in graphs.items():
        report = check_source(generate(graph).source, accepted_kinds={"triton"}, platform="cuda")
        assert report.ok, (name, report.violations)


@pytest.mark.parametrize(
    ("init", "body", "reason"),
    [
        (  # SDPA's attn_mask: a [T, T] tensor added to the scores, broadcast over batch and heads
            "self.register_buffer('m', torch.zeros(16, 16))",
            "return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.m)",
            "aten._softmax with a matmul in the graph",
        ),
        (  # softmaxes over alternate dims between the matmuls: one stage each, past the limit
            "pass",
            MANUAL + "for i in range(7):\n    att = torch.softmax(att, dim=-1 - i % 2) * 2.0\n"
            "return att @ torch.relu(v)",
            "a pipeline has at most 8 stages",
        ),
    ],
)
def test_an_attention_no_pipeline_covers_keeps_the_preface_and_the_stages_reason(
    init: str, body: str, reason: str, tmp_path: Path
) -> None:
    graph, why = recognize(load_spec(_spec(tmp_path, "refused", init, body, (2, 2, 16, 32))))
    assert graph is None
    assert why.startswith("attention (a softmax between two matmuls) is templated only as a pipeline"), why
    assert reason in why, why


@pytest.mark.gpu
def test_generated_attention_on_cuda_at_moderate_sizes(tmp_path: Path) -> None:
    """Compiled on a GPU, every variant against float64: a head dim of 64 over 256 positions, and one of
    1024 over 128 (KernelBench 1/97's wide head), plain, scaled by SDPA and causally masked."""
    cases = {
        "sdpa": ("pass", REFERENCES["sdpa"][1], (2, 4, 256, 64)),
        "sdpa-1024": ("pass", REFERENCES["sdpa"][1], (1, 2, 128, 1024)),
        "causal": (CAUSAL_BUFFER.format(n=320), REFERENCES["causal"][1], (2, 4, 256, 64)),
    }
    for name, (init, body, shape) in cases.items():
        path = _spec(tmp_path, name, init, body, shape)
        graph, why = recognize(load_spec(path))
        assert graph is not None, why
        for template in variants(graph):
            cand = tmp_path / f"{path.stem}_{template.replace('+', '_').replace('-', '_')}.py"
            cand.write_text(generate(graph, template=template).source)
            got, want = on_cuda(path, cand, repeat=1)  # a mask's expand is sized as traced
            rel = ((got.double() - want).norm() / want.norm()).item()
            assert got.shape == want.shape and rel < 5e-6, (name, template, rel)


def test_a_slice_of_an_input_or_a_parameter_is_read_through_the_wrapper(tmp_path: Path) -> None:
    """`aten_mask.slice_leaf` is not only for masks: a slice of an input, and a parameter's corner
    reduced, are fetched sliced by the wrapper; the CPU templates refuse them with a reason."""
    path = tmp_path / "slices.py"
    path.write_text(
        HEADER
        + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        + "        self.w = nn.Parameter(torch.randn(6, 20))\n\n"
        + "    def forward(self, x):\n        return x[:, 2:7] * 2 + self.w[1:3, :5].sum(0)\n\n\n"
        + "def get_inputs():\n    return [torch.randn(8, 16)]\n\n\ndef get_init_inputs():\n    return []\n"
    )
    graph, why = recognize(load_spec(path))
    assert graph is not None, why
    sources = {t.source for s in graph.stages for t in s.tensors}
    assert {"slice:1:2:7:input:0", "slice:1:0:5:slice:0:1:3:param:w"} <= sources, sources
    generated = {"slices": (str(path), generate(graph).source)}
    assert interpret(generated, tmp_path, tol=1e-6) == {"slices": "ok"}
    with pytest.raises(NotImplementedError, match="a slice of a tensor or a broadcast mask"):
        c_codegen.generate(graph.stages[1])


def test_a_sliced_input_of_a_matmul_or_a_convolution_is_fetched_sliced(tmp_path: Path) -> None:
    cases = {
        "linear": ("self.lin = nn.Linear(8, 12)", "return self.lin(x[:, 2:10])", "torch.randn(6, 16)"),
        "conv": (
            "self.conv = nn.Conv2d(3, 4, 3)",
            "return self.conv(x[:, :, 1:7])",
            "torch.randn(2, 3, 8, 8)",
        ),
    }
    generated = {}
    for name, (init, body, inputs) in cases.items():
        path = tmp_path / f"{name}.py"
        path.write_text(
            HEADER
            + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + f"        {init}\n\n    def forward(self, x):\n        {body}\n\n\n"
            + f"def get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n"
        )
        graph, why = recognize(load_spec(path))
        assert graph is not None and graph.pattern in ("gemm", "conv"), why
        assert any(t.source.startswith("slice:") for t in graph.tensors)
        generated[name] = (str(path), generate(graph).source)
    assert interpret(generated, tmp_path, tol=1e-4) == dict.fromkeys(cases, "ok")
