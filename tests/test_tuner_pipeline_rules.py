"""Pipelines whose later stages read a reduced value (issue J): the general rules that let them be
cut into templated stages, each proven under the Triton interpreter on a small spec of a KernelBench
problem's structure:

- a reduction over size-1 dims is a copy (`aten_unit`): `x.sum(1, keepdim=True)` followed by max,
  mean and logsumexp over the same dim (KernelBench 2/18), a mean then logsumexp, gelu and a
  residual add of the original input (2/51);
- a reduced value viewed with unit dims added or dropped is returned so viewed (`out_view`): an
  instance norm of an unsqueezed matmul result, squeezed back (2/28);
- a reduction over dims a view merged is a reduction over the dims merged (`aten_merge`): a softmax
  over the flattened spatial dims of a transposed convolution's result, viewed back (2/38);
- an elementwise output with unit dims is computed over the others (`aten_squeeze`): a reduced
  [N, 1] plus a [1, C, 1, 1] bias, an outer broadcast of shape [1, C, N, 1] (2/75);
- the forward's tensor constants (`torch.tensor(c)`: get_attr nodes) are copied into the stage that
  reads them (2/83's `torch.min(x, torch.tensor(min_value))`); its dropout, in training mode with
  p > 0, is refused: random numbers cannot match the reference's.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner.ir import OpGraph
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from tests.tuner_interp import interpret

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

# name: (the constructor's body, forward's body, forward's args, inputs, the expected stages' patterns)
REFERENCES = {
    "linear-sum-max-mean-lse-lse": (  # 2/18
        "self.linear = nn.Linear(16, 24)",
        "x = self.linear(x)\nx = torch.sum(x, dim=1, keepdim=True)\nx = torch.max(x, dim=1, keepdim=True)[0]\n"
        "x = torch.mean(x, dim=1, keepdim=True)\nx = torch.logsumexp(x, dim=1, keepdim=True)\n"
        "return torch.logsumexp(x, dim=1, keepdim=True)",
        "x", "[torch.randn(6, 16)]", ["gemm", "row"],
    ),
    "linear-max-sub-mean-gelu": (  # 2/80: x - x.mean(1) of a [N, 1] max is x - x, in the max's stage
        "self.gemm = nn.Linear(16, 24)",
        "x = torch.max(self.gemm(x), dim=1, keepdim=True).values\nreturn F.gelu(x - x.mean(dim=1, keepdim=True))",
        "x", "[torch.randn(6, 16)]", ["gemm", "row"],
    ),
    "linear-sub-mean-lse-gelu-residual": (  # 2/51
        "self.gemm = nn.Linear(16, 16)\nself.subtract = nn.Parameter(torch.randn(16))",
        "original_x = x.clone().detach()\nx = self.gemm(x) - self.subtract\nx = torch.mean(x, dim=1, keepdim=True)\n"
        "x = torch.logsumexp(x, dim=1, keepdim=True)\nreturn F.gelu(x) + original_x",
        "x", "[torch.randn(7, 16)]", ["gemm", "row"],
    ),
    "linear-instancenorm-squeeze-add-mul": (  # 2/28
        "self.bmm = nn.Linear(16, 24)\nself.instance_norm = nn.InstanceNorm2d(24)",
        "x = self.bmm(x)\nx = self.instance_norm(x.unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1)\n"
        "return (x + y) * y",
        "x, y", "[torch.randn(5, 16), torch.randn(5, 24)]", ["gemm", "row", "elementwise"],
    ),
    "conv-groupnorm-min-constant-clamp": (  # 2/83 with a dropout of p = 0
        "self.conv = nn.Conv2d(3, 8, 3)\nself.norm = nn.GroupNorm(4, 8)\nself.dropout = nn.Dropout(0.0)\n"
        "nn.init.uniform_(self.norm.weight, 0.5, 1.5)",
        "x = self.norm(self.conv(x))\nx = torch.min(x, torch.tensor(0.25, device=x.device))\n"
        "return self.dropout(torch.clamp(x, min=-0.5, max=1.0))",
        "x", "[torch.randn(2, 3, 7, 8)]", ["conv", "row"],
    ),
    "avgpool-convT3d-clamp-softmax-flat-scale": (  # 2/38: softmax over the flattened spatial dims
        "self.avg_pool = nn.AvgPool3d(2)\n"
        "self.conv_transpose = nn.ConvTranspose3d(2, 4, 3, stride=2, padding=1, output_padding=1)\n"
        "self.scale = nn.Parameter(torch.rand(1, 4, 1, 1, 1) + 0.5)",
        "x = torch.clamp(self.conv_transpose(self.avg_pool(x)), -0.2, 0.6)\nb, c, d, h, w = x.shape\n"
        "x = torch.softmax(x.view(b, c, -1), dim=2)\nreturn x.view(b, c, d, h, w) * self.scale",
        "x", "[torch.randn(2, 2, 4, 4, 6)]", ["pool", "conv", "row"],
    ),
    "flat-sum": ("pass", "return x.view(x.shape[0], -1).sum(1) * 2.0", "x", "[torch.randn(3, 4, 5)]", ["row"]),
    "flat-log-softmax": (
        "pass", "return torch.log_softmax(x.view(2, 3, -1), dim=2).view(2, 3, 4, 5) + 1.0", "x",
        "[torch.randn(2, 3, 4, 5)]", ["row"],
    ),
    "flat-mean-centered": (
        "pass", "return x - x.view(2, 3, -1).mean(2).view(2, 3, 1, 1)", "x", "[torch.randn(2, 3, 4, 5)]", ["row"],
    ),
    "linear-groupnorm-min-biasadd": (  # 2/75: a reduced [N, 1] plus a [1, C, 1, 1] bias is [1, C, N, 1]
        "self.gemm = nn.Linear(16, 8)\nself.group_norm = nn.GroupNorm(4, 8)\n"
        "self.bias = nn.Parameter(torch.randn(1, 8, 1, 1))",
        "x = self.group_norm(self.gemm(x))\nreturn torch.min(x, dim=1, keepdim=True)[0] + self.bias",
        "x", "[torch.randn(5, 16)]", ["gemm", "row", "row", "elementwise"],
    ),
    "outer-broadcast-unit-dims": (
        "self.bias = nn.Parameter(torch.randn(1, 8, 1, 1))", "return torch.sigmoid(x * 2.0 + self.bias) - x",
        "x", "[torch.randn(5, 1)]", ["elementwise"],
    ),
}  # fmt: skip


def _spec(tmp: Path, name: str, layers: str, body: str, args: str, inputs: str) -> Path:
    path = tmp / f"{name.replace('-', '_')}.py"
    path.write_text(
        HEADER
        + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        + textwrap.indent(layers, " " * 8)
        + f"\n\n    def forward(self, {args}):\n"
        + textwrap.indent(body, " " * 8)
        + f"\n\n\ndef get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return []\n"
    )
    return path


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, OpGraph | None, str]]:
    tmp = tmp_path_factory.mktemp("rules")
    out = {}
    for name, (layers, body, args, inputs, _) in REFERENCES.items():
        path = _spec(tmp, name, layers, body, args, inputs)
        graph, why = recognize(load_spec(path))
        out[name] = (str(path), graph, why)
    return out


@pytest.fixture(scope="module")
def generated(graphs: dict[str, tuple[str, OpGraph | None, str]]) -> dict[str, tuple[str, str]]:
    """Every recognized reference at each of its variants' defaults."""
    out = {}
    for name, (path, graph, _) in graphs.items():
        for template in variants(graph) if graph is not None else []:
            out[f"{name}@{template}"] = (path, generate(graph, template=template).source)
    return out


@pytest.fixture(scope="module")
def interpreted(
    generated: dict[str, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return interpret(generated, tmp_path_factory.mktemp("rules-run"), tol=1e-4)


@pytest.mark.parametrize("name", REFERENCES)
def test_the_reference_is_cut_into_the_expected_stages(
    name: str, graphs: dict[str, tuple[str, OpGraph | None, str]]
) -> None:
    _, graph, why = graphs[name]
    assert graph is not None, why
    patterns = [s.pattern for s in graph.stages] if graph.pattern == "pipeline" else [graph.pattern]
    assert patterns == REFERENCES[name][4]


@pytest.mark.parametrize("name", REFERENCES)
def test_every_variant_matches_the_reference_under_the_interpreter(
    name: str, interpreted: dict[str, str], generated: dict[str, tuple[str, str]]
) -> None:
    keys = [key for key in interpreted if key.startswith(name + "@")]
    assert keys, name
    assert all(interpreted[key] == "ok" for key in keys), {key: interpreted[key] for key in keys}
    for key in keys:
        report = check_source(generated[key][1], accepted_kinds={"triton"}, platform="cuda")
        assert report.ok, report.violations


def test_reductions_over_size_1_dims_leave_no_reduction_stage(
    graphs: dict[str, tuple[str, OpGraph | None, str]],
) -> None:
    """2/18's max, mean and two logsumexps of one value each are copies: one row stage, its sum."""
    graph = graphs["linear-sum-max-mean-lse-lse"][1]
    assert graph is not None
    assert [op.op for op in graph.stages[1].ops] == ["sum"]


def test_an_outer_broadcast_is_computed_over_the_output_s_non_unit_dims(
    graphs: dict[str, tuple[str, OpGraph | None, str]],
) -> None:
    """[5, 1] + [1, 8, 1, 1]: over [8, 5] the bias is one value per row, x one per column."""
    graph = graphs["outer-broadcast-unit-dims"][1]
    assert graph is not None and graph.out_view == (-1, 0, 1, -1)
    assert {t.layout for t in graph.tensors} == {"row", "col"}
    assert "triton-elementwise-2d" in variants(graph)


def test_a_reduction_over_merged_dims_is_one_over_the_dims_merged(
    graphs: dict[str, tuple[str, OpGraph | None, str]],
) -> None:
    """2/38's softmax over [b, c, d * h * w] is over dims 2, 3, 4 of the [b, c, d, h, w] value."""
    graph = graphs["avgpool-convT3d-clamp-softmax-flat-scale"][1]
    assert graph is not None and graph.stages[2].reduce is not None
    assert graph.stages[2].reduce.rank == 5 and graph.stages[2].reduce.reduced == (2, 3, 4)


def test_a_view_that_splits_a_reduced_dim_is_not_rewritten(tmp_path: Path) -> None:
    """[6, 20] viewed [6, 4, 5], summed over its last dim: a split, not a merge; still refused (the
    input read through a view that splits a dim is not placed in the reduced value's shape)."""
    path = _spec(tmp_path, "split", "pass", "return x.view(6, 4, 5).sum(2)", "x", "[torch.randn(6, 20)]")
    graph, why = recognize(load_spec(path))
    assert graph is None and "does not broadcast to the reduced value's [6, 4, 5]" in why, why


def test_a_reduction_over_size_1_dims_whose_indices_are_read_is_kept(tmp_path: Path) -> None:
    """max's indices over a size-1 dim are read: not a copy (its indices are refused as read)."""
    path = _spec(
        tmp_path, "indices", "pass", "return torch.max(x, dim=1, keepdim=True)[1].float() + x", "x",
        "[torch.randn(6, 1)]",
    )  # fmt: skip
    graph, why = recognize(load_spec(path))
    assert graph is None and "the indices of max/min is used" in why, why


def test_a_dropout_in_training_mode_is_refused_as_random_numbers(tmp_path: Path) -> None:
    layers, body, args, inputs, _ = REFERENCES["conv-groupnorm-min-constant-clamp"]
    path = _spec(tmp_path, "dropout", layers.replace("Dropout(0.0)", "Dropout(0.2)"), body, args, inputs)
    graph, why = recognize(load_spec(path))
    assert graph is None
    assert "aten.bernoulli: random numbers (dropout in training mode) are not templated" in why, why


def test_sdpa_is_cut_into_three_stages_once_its_scales_and_guard_are_rewritten(tmp_path: Path) -> None:
    """scaled_dot_product_attention (KernelBench 1/97) scales q and k apart and guards its softmax
    against rows of -inf; rewritten (`aten_attention`), it is the scores' GEMM, a row softmax and a
    second GEMM (issue K; `test_tuner_attention.py` runs them and has the refusals)."""
    path = _spec(
        tmp_path, "sdpa", "pass", "return F.scaled_dot_product_attention(q, k, v)", "q, k, v",
        "[torch.randn(2, 3, 8, 4), torch.randn(2, 3, 8, 4), torch.randn(2, 3, 8, 4)]",
    )  # fmt: skip
    graph, why = recognize(load_spec(path))
    assert graph is not None, why
    assert [s.pattern for s in graph.stages] == ["gemm", "row", "gemm"], why


def test_a_refused_graph_with_many_diamonds_after_a_softmax_is_refused_at_once(tmp_path: Path) -> None:
    """The attention check walks what a softmax of a matmul's result feeds: a value used twice, again
    and again (24 diamonds: 2^24 paths), is walked once per node, not once per path."""
    import time

    body = "t = torch.softmax(x @ w, dim=-1)\n"
    body += "for _ in range(24):\n    t = torch.sin(t) + torch.cos(t)\n"
    body += "return torch.sort(t, dim=-1).values"
    path = _spec(tmp_path, "diamonds", "pass", body, "x, w", "[torch.randn(8, 16), torch.randn(16, 12)]")
    start = time.monotonic()
    graph, why = recognize(load_spec(path))
    assert graph is None and "attention" not in why, why
    assert time.monotonic() - start < 60
