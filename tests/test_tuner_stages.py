"""Pipelines of stages through the offline tuner (issue J): a reference that no single template covers
(a convolution or matmul whose epilogue is followed by a pooling, a softmax, a reduction, another
pooling) is cut into stages (`stages.py`), each a templated graph, generated as one Triton candidate
(`triton_stages`: each stage's kernels, renamed apart, with their own prefixed tunables, run in order
through fp32 intermediates), passes the candidate guards, and computes what the reference computes
under the Triton interpreter, at the default configuration of every variant and at small tiles. A
stage no template covers is refused with that stage's reason.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelevolve import tunables
from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import c_codegen
from kernelevolve.synth.tuner.ir import OpGraph
from kernelevolve.synth.tuner.stages import MAX_STAGES
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from tests.tuner_interp import interpret, on_cuda, recognized, stage_config

HEADER = "import torch\nimport torch.nn as nn\n\n"
# Small tiles per stage template (ragged edges at these sizes).
SMALL = {
    "triton-conv": {
        "BLOCK_M": 16,
        "BLOCK_N": 16,
        "BLOCK_K": 16,
        "GROUP_M": 1,
        "num_warps": 2,
        "num_stages": 1,
    },
    "triton-gemm": {
        "BLOCK_M": 16,
        "BLOCK_N": 16,
        "BLOCK_K": 16,
        "GROUP_M": 1,
        "num_warps": 2,
        "num_stages": 1,
    },
    "triton-pool": {"BLOCK": 64, "num_warps": 1},
    "triton-row": {"ROWS": 2, "num_warps": 1},
    "triton-row-looped": {"CHUNK": 512, "ROWS": 1, "num_warps": 1},
    "triton-elementwise": {"BLOCK": 256, "ITERS": 2, "num_warps": 1},
    "triton-elementwise-2d": {"BLOCK_R": 2, "BLOCK_C": 32, "num_warps": 1},
    "triton-elementwise-persistent": {"BLOCK": 256, "WAVES": 1, "num_warps": 1},
}

# name: (the layers, forward's body, inputs, the stages' patterns)
REFERENCES = {
    "conv2d-relu-maxpool": (
        "self.conv = nn.Conv2d(3, 5, 3, padding=1)\nself.pool = nn.MaxPool2d(2)",
        "return self.pool(torch.relu(self.conv(x)))",
        "[torch.randn(2, 3, 8, 9)]", ["conv", "pool"],
    ),
    "conv2d-tanh-avgpool-sigmoid": (
        "self.conv = nn.Conv2d(3, 4, 3)\nself.pool = nn.AvgPool2d(2, stride=2, padding=1, count_include_pad=False)\n"
        "self.scale = nn.Parameter(torch.rand(4, 1, 1) + 0.5)",
        "return torch.sigmoid(self.pool(torch.tanh(self.conv(x)) - 0.5) * self.scale)",
        "[torch.randn(2, 3, 9, 10)]", ["conv", "pool"],
    ),
    "conv2d-maxpool-avgpool": (
        "self.conv = nn.Conv2d(3, 4, 3, padding=1)\nself.pool1 = nn.MaxPool2d(2)\nself.pool2 = nn.AvgPool2d(2)",
        "return self.pool2(self.pool1(self.conv(x))) * 2.0",
        "[torch.randn(2, 3, 10, 12)]", ["conv", "pool", "pool"],
    ),
    "conv2d-maxpool-logsoftmax": (  # a third stage that reduces over the last dim
        "self.conv = nn.Conv2d(3, 4, 3, padding=1)\nself.pool = nn.MaxPool2d(2)",
        "return torch.log_softmax(self.pool(self.conv(x)), dim=-1)",
        "[torch.randn(2, 3, 8, 12)]", ["conv", "pool", "row"],
    ),
    "conv1d-maxpool1d": (
        "self.conv = nn.Conv1d(3, 4, 3)\nself.pool = nn.MaxPool1d(3, stride=2)",
        "return self.pool(self.conv(x) * 0.5)",
        "[torch.randn(2, 3, 21)]", ["conv", "pool"],
    ),
    "convT3d-leaky-maxpool": (
        "self.conv = nn.ConvTranspose3d(2, 3, 3, stride=2, padding=1)\nself.pool = nn.MaxPool3d(2)",
        "return self.pool(torch.nn.functional.leaky_relu(self.conv(x), 0.2) * 2.0)",
        "[torch.randn(1, 2, 3, 4, 3)]", ["conv", "pool"],
    ),
    "linear-gelu-softmax": (
        "self.linear = nn.Linear(16, 24)", "return torch.softmax(torch.nn.functional.gelu(self.linear(x)), dim=1)",
        "[torch.randn(6, 16)]", ["gemm", "row"],
    ),
    "linear-sum-scale-residual": (
        "self.linear = nn.Linear(16, 24)",
        "y = self.linear(x) / 2.0\nreturn y - y.sum(dim=-1, keepdim=True) * 0.1",
        "[torch.randn(7, 16)]", ["gemm", "row"],
    ),
    "linear-layernorm-relu": (
        "self.linear = nn.Linear(16, 24)\nself.norm = nn.LayerNorm(24)",
        "return torch.relu(self.norm(self.linear(x)))",
        "[torch.randn(5, 16)]", ["gemm", "row"],
    ),
    "maxpool-conv": (  # compute before a convolution: the pooling is its own stage
        "self.pool = nn.MaxPool2d(2)\nself.conv = nn.Conv2d(3, 4, 3)",
        "return self.conv(self.pool(x) + 1.0)",
        "[torch.randn(2, 3, 12, 10)]", ["pool", "conv"],
    ),
    "conv2d-softmax-lastdim": (
        "self.conv = nn.Conv2d(3, 4, 3)", "return torch.softmax(self.conv(x), dim=-1) + 1.0",
        "[torch.randn(2, 3, 7, 9)]", ["conv", "row"],
    ),
    "relu-maxpool-maxpool": (  # compute before a pooling, then a pooling of the pooling
        "self.pool = nn.MaxPool2d(2)", "return self.pool(self.pool(torch.relu(x)))",
        "[torch.randn(2, 3, 9, 12)]", ["elementwise", "pool", "pool"],
    ),
    "linear-maxpool1d-sum": (  # a 1-d pooling of the matmul's result viewed [N, 1, F] (KernelBench 2/55)
        "self.linear = nn.Linear(16, 24)\nself.pool = nn.MaxPool1d(2)",
        "return self.pool(self.linear(x).unsqueeze(1)).squeeze(1).sum(dim=1) * 0.5",
        "[torch.randn(5, 16)]", ["gemm", "pool", "row"],
    ),
    "linear-avgpool1d-gelu-max": (  # the same with an average (KernelBench 2/98)
        "self.linear = nn.Linear(16, 32)\nself.pool = nn.AvgPool1d(4)",
        "y = torch.nn.functional.gelu(self.pool(self.linear(x).unsqueeze(1)).squeeze(1))\n"
        "return torch.max(y * 2.0, dim=1).values",
        "[torch.randn(6, 16)]", ["gemm", "pool", "row"],
    ),
    "conv3d-groupnorm-mean": (  # KernelBench 2/23's structure, its norm's affine not the identity
        "self.conv = nn.Conv3d(2, 6, 3)\nself.norm = nn.GroupNorm(3, 6)\n"
        "nn.init.uniform_(self.norm.weight)\nnn.init.uniform_(self.norm.bias)",
        "return self.norm(self.conv(x)).mean(dim=[1, 2, 3, 4])",
        "[torch.randn(2, 2, 6, 7, 8)]", ["conv", "row", "row"],
    ),
    "relu-matmul": (  # compute before a matmul
        "pass", "return torch.relu(x) @ x.t()", "[torch.randn(9, 12)]", ["elementwise", "gemm"],
    ),
}  # fmt: skip


def _spec(tmp: Path, name: str, layers: str, body: str, inputs: str) -> Path:
    path = tmp / f"{name.replace('-', '_')}.py"
    path.write_text(
        HEADER
        + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        + textwrap.indent(layers, " " * 8)
        + "\n\n    def forward(self, x):\n"
        + textwrap.indent(body, " " * 8)
        + f"\n\n\ndef get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return []\n"
    )
    return path


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, OpGraph]]:
    tmp = tmp_path_factory.mktemp("stages")
    return recognized(
        {
            name: _spec(tmp, name, layers, body, inputs)
            for name, (layers, body, inputs, _) in REFERENCES.items()
        }
    )


@pytest.fixture(scope="module")
def generated(graphs: dict[str, tuple[str, OpGraph]]) -> dict[str, tuple[str, str]]:
    """Every reference at every variant's defaults, and its default variant at small tiles."""
    out = {}
    for name, (path, graph) in graphs.items():
        names = variants(graph)
        for template in names:
            out[f"{name}@{template}"] = (path, generate(graph, template=template).source)
        out[f"{name}@small"] = (path, generate(graph, config=stage_config(names[0], SMALL)).source)
        drafts = generate(graph).drafts
        if drafts:  # the first preset the tuner drafts (a GEMM's or convolution's stage, 3xTF32)
            out[f"{name}@draft"] = (path, generate(graph, config=drafts[0]).source)
    return out


@pytest.fixture(scope="module")
def interpreted(
    generated: dict[str, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return interpret(generated, tmp_path_factory.mktemp("stages-run"), tol=1e-4)


@pytest.mark.parametrize("name", REFERENCES)
def test_the_reference_is_cut_into_the_expected_stages(
    name: str, graphs: dict[str, tuple[str, OpGraph]]
) -> None:
    graph = graphs[name][1]
    assert graph.pattern == "pipeline"
    assert [s.pattern for s in graph.stages] == REFERENCES[name][3]
    assert graph.description.startswith(f"pipeline of {len(graph.stages)} stages: ")
    # Every intermediate is fp32 and read by a later stage as the extra argument `_mid<j>`.
    assert all(s.dtype == "float32" for s in graph.stages[:-1])
    for k, stage in enumerate(graph.stages[1:]):
        assert f"_mid{k}" in stage.forward_args
        assert any(t.name.startswith("_mid") and t.dtype == "float32" for t in stage.tensors)


def test_the_interpreter_ran_every_variant(generated: dict[str, tuple[str, str]]) -> None:
    assert "linear-gelu-softmax@triton-gemm+triton-row-looped" in generated
    assert len(generated) >= 2 * len(REFERENCES)


@pytest.mark.parametrize("case", [f"{n}@small" for n in REFERENCES] + [f"{n}@default" for n in REFERENCES])
def test_generated_pipelines_match_the_reference_under_the_interpreter(
    case: str, graphs: dict[str, tuple[str, OpGraph]], interpreted: dict[str, str]
) -> None:
    name, _, which = case.partition("@")
    keys = [f"{name}@small"] if which == "small" else [f"{name}@{t}" for t in variants(graphs[name][1])]
    keys += [k for k in interpreted if k == f"{name}@draft" and which == "small"]
    for key in keys:
        assert interpreted[key] == "ok", (key, interpreted[key])


def test_generated_pipelines_pass_the_candidate_guards(generated: dict[str, tuple[str, str]]) -> None:
    for case, (_, source) in generated.items():
        report = check_source(source, accepted_kinds={"triton"}, platform="cuda")
        assert report.ok, (case, report.violations)


def test_each_stage_has_its_own_prefixed_tunables_and_tile(graphs: dict[str, tuple[str, OpGraph]]) -> None:
    graph = graphs["conv2d-maxpool-avgpool"][1]
    gen = generate(graph)
    assert gen.template == "triton-conv+triton-pool+triton-pool"
    assert {"s0_BLOCK_M", "s0_DOT", "s1_BLOCK", "s1_num_warps", "s2_BLOCK", "s2_num_warps"} <= set(
        gen.tunables
    )
    declared = tunables.read(gen.source)
    assert declared is not None and declared[1] == gen.config
    assert tunables.declared_tile(gen.source) == ("s0_BLOCK_M", "s0_BLOCK_N", "s1_BLOCK", "s2_BLOCK")
    assert tunables.fits(gen.source)
    for k in range(3):  # each stage's kernel renamed apart, launched by its own stage function
        assert f"def _stage{k}(" in gen.source
    assert "def _s1_pool_kernel(" in gen.source and "def _s2_pool_kernel(" in gen.source
    assert 'CONFIG["s2_BLOCK"]' in gen.source and 'CONFIG["BLOCK"]' not in gen.source
    with pytest.raises(ValueError, match="no tunable 'BLOCK'"):
        generate(graph, config={"BLOCK": 64})


def test_a_pipeline_drafts_its_main_stages_presets_with_the_other_stages_at_their_defaults(
    graphs: dict[str, tuple[str, OpGraph]],
) -> None:
    gen = generate(graphs["linear-gelu-softmax"][1])
    assert gen.template.startswith("triton-gemm+") and len(gen.drafts) >= 2
    for d in gen.drafts:
        changed = {k for k in d if d[k] != gen.config[k]}
        assert changed and all(k.startswith("s0_") for k in changed), changed
        assert d["s0_DOT"] == "tf32x3" and set(d) == set(gen.config)
    assert all(tunables.config_fits(d, tunables.declared_tile(gen.source)) for d in gen.drafts)
    assert generate(graphs["linear-gelu-softmax"][1], config={"s0_BLOCK_K": 16}).drafts == []


def test_each_stage_tile_is_checked_against_its_own_warps() -> None:
    tile = ("s0_BLOCK_M", "s0_BLOCK_N", "s1_BLOCK")
    config = {"s0_BLOCK_M": 256, "s0_BLOCK_N": 256, "s0_num_warps": 2, "s1_BLOCK": 64, "s1_num_warps": 1}
    assert tunables.per_thread(config, tile) == 256 * 256 / 64  # the conv's tile, over its own 2 warps
    assert not tunables.config_fits(config, tile)
    config |= {"s0_BLOCK_M": 64, "s0_BLOCK_N": 64, "s0_num_warps": 8, "s1_BLOCK": 2048}
    assert tunables.per_thread(config, tile) == 2048 / 32  # now the pooling's is the larger
    assert tunables.per_thread({"s0_BLOCK": 64, "s0_num_warps": "auto"}, ("s0_BLOCK",)) is None
    assert tunables.per_thread({"BLOCK": 1024, "num_warps": 4}, ("BLOCK",)) == 8  # unprefixed as before


@pytest.mark.parametrize(
    ("layers", "body", "reason"),
    [
        (  # the stage after the convolution is not templated: its own reason, named as that stage
            "self.conv = nn.Conv2d(3, 4, 3)",
            "return torch.cumsum(self.conv(x), dim=1)",
            "stage 2 of the pipeline (after conv2d (stride [1, 1], padding [0, 0], dilation [1, 1]) + bias) "
            "is not templated: cumsum is templated only along the last dim of the output's shape [2, 4, 6, 6]",
        ),
        (  # the third stage, after a pooling that is the second
            "self.conv = nn.Conv2d(3, 4, 3)\nself.pool = nn.MaxPool2d(2)",
            "return torch.cumsum(self.pool(torch.relu(self.conv(x))), dim=1)",
            "stage 3 of the pipeline (after max pool2d (kernel [2, 2], stride [2, 2], padding [0, 0], "
            "dilation [1, 1])) is not templated: cumsum is templated only along the last dim of the output's "
            "shape [2, 4, 3, 3]",
        ),
        (  # no cut gives a templated first stage: the whole graph's reason
            "self.conv = nn.Conv2d(3, 4, 3)",
            "return self.conv(torch.sort(x, dim=-1).values)",
            "aten.sort produces int64 data; only float data is templated",
        ),
    ],
)
def test_a_stage_no_template_covers_is_refused_with_its_reason(
    layers: str, body: str, reason: str, tmp_path: Path
) -> None:
    graph, why = recognize(load_spec(_spec(tmp_path, "refused", layers, body, "[torch.randn(2, 3, 8, 8)]")))
    assert graph is None and why == reason, why


# Stages that reduce over other dims than the last, or to one value per row (a sum over the last dim
# as the output), through the row template's reductions over any dims (`aten_reduce`): pipelines,
# correct under the interpreter at every variant.
OTHER_REDUCTIONS = {
    "linear-sum-scale": (
        "self.linear = nn.Linear(16, 24)", "return self.linear(x).sum(dim=1, keepdim=True) * 0.5",
        "[torch.randn(6, 16)]", ["gemm", "row"],
    ),
    "linear-logsumexp-leaky": (
        "self.linear = nn.Linear(16, 24)",
        "y = torch.logsumexp(self.linear(x), dim=1, keepdim=True)\nreturn torch.nn.functional.leaky_relu(y, 0.01)",
        "[torch.randn(6, 16)]", ["gemm", "row"],
    ),
    "conv2d-groupnorm": (
        "self.conv = nn.Conv2d(3, 8, 3)\nself.gn = nn.GroupNorm(4, 8)",
        "return torch.sigmoid(self.gn(torch.relu(self.conv(x))))", "[torch.randn(2, 3, 7, 8)]", ["conv", "row"],
    ),
    "conv3d-softmax-maxpool-maxpool": (
        "self.conv = nn.Conv3d(2, 4, 3)\nself.p1 = nn.MaxPool3d(2)\nself.p2 = nn.MaxPool3d(2)",
        "return self.p2(self.p1(torch.softmax(self.conv(x), dim=1)))", "[torch.randn(1, 2, 10, 10, 11)]",
        ["conv", "row", "pool", "pool"],
    ),
    "conv2d-gelu-global-avgpool": (
        "self.conv = nn.Conv2d(3, 5, 3)", "return torch.nn.functional.gelu(self.conv(x)).mean(dim=[2, 3])",
        "[torch.randn(2, 3, 7, 8)]", ["conv", "row"],
    ),
    # Two reductions over different dims, a result without keepdim broadcast back: a row stage per
    # reduction, its result an intermediate of the next.
    "mean-dim1-plus-mean-dim2": (
        "pass", "return x.mean(dim=1, keepdim=True) + x.mean(dim=2, keepdim=True)", "[torch.randn(2, 5, 6, 7)]",
        ["row", "row"],
    ),
    "sum0-plus-amax1": (
        "pass", "return x / x.sum(0, keepdim=True) + x.amax(1, keepdim=True)", "[torch.randn(6, 7)]", ["row", "row"],
    ),
    "sub-mean-without-keepdim": (
        "pass", "return x - x.mean(dim=1)", "[torch.randn(6, 6)]", ["row", "elementwise"],
    ),
    "conv2d-softmax-channels": (
        "self.conv = nn.Conv2d(4, 4, 3)", "return torch.softmax(self.conv(x), dim=1)", "[torch.randn(2, 4, 7, 8)]",
        ["conv", "row"],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def other_reductions(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, tuple[OpGraph | None, str]], dict[str, str]]:
    """Each reference's graph (or None) and reason; the recognized ones' results under the
    interpreter at every variant (case id -> "ok" or why not)."""
    tmp = tmp_path_factory.mktemp("stages-other")
    graphs: dict[str, tuple[OpGraph | None, str]] = {}
    generated = {}
    for name, (layers, body, inputs, _) in OTHER_REDUCTIONS.items():
        path = _spec(tmp, name, layers, body, inputs)
        graph, why = recognize(load_spec(path))
        graphs[name] = (graph, why)
        for template in variants(graph) if graph is not None else []:
            generated[f"{name}@{template}"] = (str(path), generate(graph, template=template).source)
    return graphs, interpret(generated, tmp, tol=1e-4) if generated else {}


@pytest.mark.parametrize("name", OTHER_REDUCTIONS)
def test_a_stage_reducing_over_other_dims_is_generated_correctly(
    name: str, other_reductions: tuple[dict[str, tuple[OpGraph | None, str]], dict[str, str]]
) -> None:
    (graph, why), runs = other_reductions[0][name], other_reductions[1]
    assert graph is not None, why
    assert [s.pattern for s in graph.stages] == OTHER_REDUCTIONS[name][3]
    keys = [key for key in runs if key.startswith(name + "@")]
    assert keys and all(runs[key] == "ok" for key in keys), runs


def test_a_pipeline_of_more_than_eight_stages_is_refused_with_the_limit(tmp_path: Path) -> None:
    path = _spec(
        tmp_path, "nine", "self.conv = nn.Conv2d(3, 3, 3, padding=1)\nself.pool = nn.MaxPool2d(2)",
        "for _ in range(4):\n    x = self.conv(self.pool(x))\nreturn self.pool(x)", "[torch.randn(1, 3, 64, 64)]",
    )  # fmt: skip
    graph, why = recognize(load_spec(path))
    assert graph is None and why.startswith(f"stage {MAX_STAGES} of the pipeline (after max pool2d"), why
    assert why.endswith(f"(and a pipeline has at most {MAX_STAGES} stages)"), why
    assert MAX_STAGES == 8
    seven = _spec(
        tmp_path, "seven", "self.conv = nn.Conv2d(3, 3, 3, padding=1)\nself.pool = nn.MaxPool2d(2)",
        "for _ in range(3):\n    x = self.conv(self.pool(x))\nreturn self.pool(x)", "[torch.randn(1, 3, 32, 32)]",
    )  # fmt: skip
    graph, why = recognize(load_spec(seven))
    assert graph is not None and [s.pattern for s in graph.stages] == ["pool", "conv"] * 3 + ["pool"], why
    assert interpret({"seven": (str(seven), generate(graph).source)}, tmp_path, tol=1e-4) == {"seven": "ok"}


def test_the_cpu_templates_say_they_do_not_generate_pipelines(graphs: dict[str, tuple[str, OpGraph]]) -> None:
    with pytest.raises(NotImplementedError, match="do not generate pipelines"):
        c_codegen.generate(graphs["conv2d-relu-maxpool"][1])


def test_a_spec_with_two_shapes_gives_one_pipeline_with_each_stage_sized_per_shape(tmp_path: Path) -> None:
    path = _spec(
        tmp_path, "shapes", "self.conv = nn.Conv2d(3, 4, 3)\nself.pool = nn.MaxPool2d(2)",
        "return self.pool(self.conv(x))", "[torch.randn(2, 3, 8, 8)]",
    )  # fmt: skip
    path.write_text(
        path.read_text().replace(
            "def get_inputs():\n    return [torch.randn(2, 3, 8, 8)]",
            "KERNELEVOLVE = {'shapes': {'small': {'weight': 1, 'params': {'h': 8}}, "
            "'large': {'weight': 1, 'params': {'h': 16}}}}\n\n\n"
            "def get_inputs(h=8):\n    return [torch.randn(2, 3, h, h)]",
        )
    )
    spec = load_spec(path)
    assert spec.names == ["small", "large"]
    graph, why = recognize(spec)
    assert graph is not None, why
    for stage in graph.stages:
        assert len(stage.rows) == 2, stage.rows


@pytest.mark.gpu
def test_generated_pipelines_on_cuda_at_larger_sizes(tmp_path: Path) -> None:
    """Compiled on a GPU, each reference's pipeline (every variant) at a batch 8 times larger, against
    float64."""
    for name, (layers, body, inputs, _) in REFERENCES.items():
        path = _spec(tmp_path, name, layers, body, inputs)
        graph, why = recognize(load_spec(path))
        assert graph is not None, why
        for template in variants(graph):
            cand = tmp_path / f"{path.stem}_{template.replace('+', '_').replace('-', '_')}.py"
            cand.write_text(generate(graph, template=template).source)
            got, want = on_cuda(path, cand, repeat=8)
            rel = ((got.double() - want).norm() / want.norm()).item()
            assert got.shape == want.shape and rel < 5e-6, (name, template, rel)


def test_a_main_ops_result_viewed_with_unit_dims_is_returned_so_viewed(tmp_path: Path) -> None:
    """A matmul's result with a unit dim added (one template, no pipeline) and a pooling's with one
    dropped: the wrapper returns the output in the reference's shape (`OpGraph.out_view`)."""
    cases = {
        "linear-unsqueeze": ("self.linear = nn.Linear(16, 24)", "return self.linear(x).unsqueeze(1) * 2.0",
                             "[torch.randn(5, 16)]", "gemm", (0, -1, 1)),
        "linear-unsqueeze-add": ("self.linear = nn.Linear(16, 24)\nself.y = nn.Parameter(torch.randn(5, 1, 24))",
                                 "return self.linear(x).unsqueeze(1) + self.y",
                                 "[torch.randn(5, 16)]", "gemm", (0, -1, 1)),
        "maxpool1d-squeeze": ("self.pool = nn.MaxPool1d(2)", "return self.pool(x).squeeze(1) + 1.0",
                              "[torch.randn(3, 1, 10)]", "pool", (0, 2)),
    }  # fmt: skip
    generated = {}
    for name, (layers, body, inputs, pattern, view) in cases.items():
        path = _spec(tmp_path, name, layers, body, inputs)
        graph, why = recognize(load_spec(path))
        assert graph is not None, why
        assert (graph.pattern, graph.out_view) == (pattern, view)
        generated[name] = (str(path), generate(graph).source)
    assert interpret(generated, tmp_path, tol=1e-4) == dict.fromkeys(cases, "ok")


def test_a_pipeline_drafts_every_stage_at_its_first_preset_together_first() -> None:
    """At strict fp32 a GEMM stage's first preset is its fast dot (3xTF32): the suites' sdpa_mlp_block
    (four GEMM stages beside the flash kernel) drafts all four at it together before each alone,
    where before its search ended with three of them at IEEE (0.60x of torch.compile, H200)."""
    from kernelevolve.synth.tuner.triton_codegen import generate, variants

    spec = load_spec(Path(__file__).resolve().parents[1] / "suites" / "llm" / "sdpa_mlp_block.py")
    graph, why = recognize(spec)
    assert graph is not None, why
    generated = generate(graph, template=variants(graph)[0], precision="strict_fp32")
    gemms = ["s0_DOT", "s4_DOT", "s5_DOT", "s6_DOT"]
    assert [generated.config[k] for k in gemms] == ["ieee"] * 4  # the defaults
    first, *alone = generated.drafts
    assert [first[k] for k in gemms] == ["tf32x3"] * 4
    assert alone and all(sum(d[k] == "tf32x3" for k in gemms) <= 1 for d in alone)  # one stage's preset each
