"""The tuner's front end: which references `trace.recognize` turns into an OpGraph, and which it refuses.

References are written inline (as files in tmp_path, the way specs arrive) or taken from tests/specs.
Tracing runs on the meta device: no harness, no compute; a few seconds for the whole module.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner.ir import OpGraph
from kernelevolve.synth.tuner.trace import recognize
from tests.conftest import SPECS

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def spec_file(tmp_path: Path, body: str, name: str = "ref") -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def graph_of(path: Path) -> OpGraph:
    graph, why = recognize(load_spec(path))
    assert graph is not None, why
    return graph


def refused(path: Path) -> str:
    graph, why = recognize(load_spec(path))
    assert graph is None, f"expected a refusal, got a {graph.pattern} graph"
    return why


def layouts(graph: OpGraph) -> dict[str, str]:
    return {t.source: t.layout for t in graph.tensors}


def ops(graph: OpGraph) -> list[str]:
    return [op.op for op in graph.ops]


def build_init(graph: OpGraph, *args: object) -> nn.Module:
    """ModelNew's constructor from init_source, in the namespace a generated candidate has."""
    namespace: dict[str, object] = {"torch": torch, "nn": nn, "math": __import__("math")}
    source = "class ModelNew(nn.Module):\n" + textwrap.indent(graph.init_source, "    ")
    exec(compile(source, "<init>", "exec"), namespace)  # our own generated text, in a test
    return namespace["ModelNew"](*args)  # type: ignore[operator]


# -- recognized patterns ---------------------------------------------------------------------------


def test_elementwise_chain_layouts_and_sizes_per_shape() -> None:
    graph = graph_of(SPECS / "ew_chain.py")
    assert graph.pattern == "elementwise"
    assert layouts(graph) == {"input:0": "full", "param:w": "col", "param:b": "col"}
    assert ops(graph) == ["mul", "add", "relu", "mul", "sigmoid", "add"]
    assert graph.ops[3].args[1] == 0.5  # the constant is inlined
    assert graph.rows == {"small": 64, "big": 2048} and graph.cols == {"small": 256, "big": 2048}
    assert graph.forward_args == ["x"] and len(graph.outputs) == 1
    assert graph.description == "elementwise chain: mul, add, relu, mul, sigmoid, add"


def test_softmax_is_a_row_reduction() -> None:
    graph = graph_of(SPECS / "softmax.py")
    assert graph.pattern == "row"
    assert ops(graph) == ["amax", "sub", "exp", "sum", "div"]
    assert graph.layout_of(graph.ops[0].out) == "row" and graph.layout_of(graph.outputs[0]) == "full"
    assert graph.rows == {"narrow": 32, "wide": 16} and graph.cols == {"narrow": 256, "wide": 4096}
    assert graph.description.startswith("row reduction over the last dim: amax, sub, exp, sum, div")


def test_rmsnorm_keeps_eps_and_reads_the_weight_per_column() -> None:
    graph = graph_of(SPECS / "rmsnorm.py")
    assert graph.pattern == "row"
    assert layouts(graph) == {"input:0": "full", "param:weight": "col"}
    assert ops(graph) == ["square", "mean", "add", "rsqrt", "mul", "mul"]
    assert graph.ops[2].args[1] == pytest.approx(1e-6)
    model = build_init(graph, 256)
    assert {k: v.shape for k, v in model.state_dict().items()} == {"weight": torch.Size([256])}


def test_layer_norm_module_decomposes_into_mean_and_variance(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        """
        EPS = 1e-5

        class Model(nn.Module):
            def __init__(self, n):
                super(Model, self).__init__()
                self.norm = nn.LayerNorm(n, eps=EPS)

            def forward(self, x):
                return self.norm(x)

        def get_inputs(n=96):
            return [torch.randn(2, 8, n)]

        def get_init_inputs(n=96):
            return [n]
        """,
    )
    graph = graph_of(path)
    assert graph.pattern == "row"
    assert ops(graph) == ["mean", "sub", "square", "mean", "add", "rsqrt", "mul", "mul", "add"]
    assert layouts(graph) == {"input:0": "full", "param:norm.weight": "col", "param:norm.bias": "col"}
    assert graph.rows == {"default": 16} and graph.cols == {"default": 96}
    # The constructor: super() bare, the spec's constant inlined, nothing named Model.
    assert "super().__init__()" in graph.init_source and "1e-05" in graph.init_source
    assert "Model" not in graph.init_source and "EPS" not in graph.init_source
    names = {k: v.shape for k, v in build_init(graph, 96).state_dict().items()}
    assert names == {"norm.weight": torch.Size([96]), "norm.bias": torch.Size([96])}


def test_linear_gelu_is_a_gemm_with_an_epilogue(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        """
        from torch.nn import Linear

        class Model(nn.Module):
            def __init__(self, n_in, n_out):
                super().__init__()
                self.fc = Linear(n_in, n_out)

            def forward(self, x):
                return F.gelu(self.fc(x))

        def get_inputs(b=2, s=8, n_in=32, **_):
            return [torch.randn(b, s, n_in)]

        def get_init_inputs(n_in=32, n_out=48):
            return [n_in, n_out]

        KERNELEVOLVE = {"shapes": {
            "a": {"params": {"b": 2, "s": 8, "n_in": 32, "n_out": 48}},
            "b": {"params": {"b": 4, "s": 4, "n_in": 64, "n_out": 16}},
        }}
        """,
    )
    graph = graph_of(path)
    assert graph.pattern == "gemm" and graph.gemm is not None
    assert graph.gemm.b_layout == "nk" and not graph.gemm.batched
    by_name = {t.name: t for t in graph.tensors}
    assert by_name[graph.gemm.a].source == "input:0"
    assert by_name[graph.gemm.b].source == "param:fc.weight"
    assert graph.gemm.bias is not None and by_name[graph.gemm.bias].layout == "col"
    assert [(op.op, op.args) for op in graph.ops] == [("gelu", ("acc",))]
    assert graph.rows == {"a": 16, "b": 16} and graph.cols == {"a": 48, "b": 16}
    assert graph.inner == {"a": 32, "b": 64} and graph.batch == {"a": 1, "b": 1}
    assert "nn.Linear(n_in, n_out)" in graph.init_source  # `from torch.nn import Linear` resolved


def test_bmm_with_a_transposed_operand(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        """
        class Model(nn.Module):
            def forward(self, a, b):
                return torch.relu(torch.bmm(a, b.transpose(1, 2))) * 2.0

        def get_inputs():
            return [torch.randn(3, 8, 16), torch.randn(3, 12, 16)]
        """,
    )
    graph = graph_of(path)
    assert graph.gemm is not None and graph.gemm.batched and graph.gemm.b_layout == "nk"
    assert ops(graph) == ["relu", "mul"]
    assert graph.batch == {"default": 3} and graph.rows == {"default": 24} and graph.inner == {"default": 16}


def test_four_dim_attention_scores_fold_their_batch_dims(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        """
        class Model(nn.Module):
            def forward(self, q, k):
                return torch.matmul(q, k.transpose(-1, -2)) * 0.125

        def get_inputs():
            return [torch.randn(2, 3, 10, 16), torch.randn(2, 3, 12, 16)]
        """,
    )
    graph = graph_of(path)
    assert graph.gemm is not None and graph.gemm.batched and graph.gemm.b_layout == "nk"
    assert (graph.batch, graph.rows, graph.cols, graph.inner) == ({"default": 6}, {"default": 60}, {"default": 12},
                                                                   {"default": 16})  # fmt: skip


def test_comparisons_become_where_gt0_with_exact_branches(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        """
        class Model(nn.Module):
            def forward(self, x, y):
                a = torch.where(x >= 0.5, x, y)      # x >= c  <=>  not (c - x > 0)
                return F.leaky_relu(a, 0.2) + torch.clamp(y, min=-1.0) + torch.softmax(x, -1) * torch.softmax(x, -1)

        def get_inputs():
            return [torch.randn(4, 32), torch.randn(4, 32)]
        """,
    )
    graph = graph_of(path)
    first = graph.ops[0]
    assert (first.op, first.args) == ("sub", (0.5, "x"))
    where = graph.ops[1]
    assert (where.op, where.args) == ("where_gt0", (first.out, "y", "x"))  # branches swapped for >=
    assert ("clamp", ("y", -1.0, None)) in [(op.op, op.args) for op in graph.ops]
    assert ops(graph).count("amax") == 1 and ops(graph).count("exp") == 1  # the two softmaxes are one


def test_per_row_and_scalar_tensors(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = nn.Parameter(torch.tensor(0.5))

            def forward(self, x, g):
                return x * g + self.scale

        def get_inputs():
            return [torch.randn(2, 3, 40), torch.randn(2, 3, 1)]
        """,
    )
    graph = graph_of(path)
    assert graph.pattern == "elementwise"
    assert layouts(graph) == {"input:0": "full", "input:1": "row", "param:scale": "scalar"}
    assert graph.rows == {"default": 6} and graph.cols == {"default": 40}


# -- refusals, with reasons ------------------------------------------------------------------------


def test_convolution_with_bias_and_a_per_channel_epilogue_is_a_conv_graph(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=1, groups=2)
                self.scale = nn.Parameter(torch.randn(6, 1, 1))

            def forward(self, x):
                return torch.relu(self.conv(x)) * self.scale + 0.5

        def get_inputs():
            return [torch.randn(2, 4, 9, 11)]
        """,
    )
    graph = graph_of(path)
    assert graph.pattern == "conv" and graph.conv is not None
    c = graph.conv
    assert (c.dims, c.stride, c.padding, c.dilation, c.groups) == (2, (2, 2), (1, 1), (1, 1), 2)
    assert layouts(graph) == {"input:0": "full", "param:conv.weight": "full", "param:conv.bias": "chan",
                              "param:scale": "chan"}  # fmt: skip
    assert ops(graph) == ["relu", "mul", "add"]
    # the implicit GEMM per group: rows 2 x 5 x 6 positions, 3 channels, 2 x 3 x 3 inner
    assert (graph.rows, graph.cols, graph.inner, graph.batch) == (
        {"default": 60},
        {"default": 3},
        {"default": 18},
        {"default": 2},
    )
    assert graph.description.startswith(
        "conv2d (stride [2, 2], padding [1, 1], dilation [1, 1], groups 2) + bias"
    )


@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        # After the convolution, a reshape of its result: the second stage's reason (test_tuner_stages
        # covers what a pipeline generates: a softmax, pooling, compute before the convolution).
        ("nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())", "stage 2 of the pipeline (after conv2d"),
        ("nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())", "which is neither the output's [1, 144]"),
    ],
)
def test_refuses_what_the_conv_template_cannot_generate(tmp_path: Path, layer: str, reason: str) -> None:
    path = spec_file(
        tmp_path,
        f"""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = {layer}

            def forward(self, x):
                return self.layer(x)

        def get_inputs():
            return [torch.randn(1, 3, 8, 8)]
        """,
    )
    assert reason in refused(path)


@pytest.mark.parametrize("layer", ["LSTM", "GRU", "RNN"])
def test_refuses_a_recurrent_layer_before_tracing_its_steps(tmp_path: Path, layer: str) -> None:
    """A recurrent layer decomposes into a cell per step and layer: level 3's 6-layer LSTM over 512
    steps took 39 s to trace on two cores, minutes on a loaded host. Tracing stops at the call (the
    reason says so: a trace of the cells would end at their first unsupported op instead)."""
    path = spec_file(
        tmp_path,
        f"""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.{layer}(16, 32, 4, batch_first=True)
                self.fc = nn.Linear(32, 8)

            def forward(self, x):
                out, _ = self.rnn(x)
                return self.fc(out[:, -1, :])

        def get_inputs():
            return [torch.randn(4, 200, 16)]
        """,
    )
    why = refused(path)
    assert (
        why
        == f"aten.{ {'LSTM': 'lstm', 'GRU': 'gru', 'RNN': 'rnn_tanh'}[layer] } (a recurrent layer) is not templated"
    )


@pytest.mark.parametrize(
    ("forward", "reason"),
    [
        ("return torch.cumsum(x, dim=0)", "cumsum is templated only along the last dim"),
        (
            "return x.sum(-1, keepdim=True).t()",
            "is not templated: transposed tensors are templated only as matmul",
        ),
        ("return x[:, ::2] * 2", "a slice is templated only of an input or parameter with step 1"),
        ("return (x * 2, x.sum(-1))", "outputs of different shapes"),
        ("return (x > 0).to(torch.int32)", "output dtype int32"),
        ("return x * x.long()", "only float data"),
        ("return torch.sort(x, -1).values @ x.t()", "aten.sort produces int64 data"),  # before a matmul
    ],
)
def test_refuses_what_the_templates_cannot_generate(tmp_path: Path, forward: str, reason: str) -> None:
    path = spec_file(
        tmp_path,
        f"""
        class Model(nn.Module):
            def forward(self, x):
                {forward}

        def get_inputs():
            return [torch.randn(8, 8)]
        """,
    )
    assert reason in refused(path)


def test_refuses_a_constant_that_depends_on_the_shape(tmp_path: Path) -> None:
    path = spec_file(
        tmp_path,
        """
        class Model(nn.Module):
            def forward(self, x):
                return x - x.var(-1, keepdim=True)  # unbiased: scaled by cols / (cols - 1)

        def get_inputs(cols=16):
            return [torch.randn(4, cols)]

        KERNELEVOLVE = {"shapes": {"a": {"params": {"cols": 16}}, "b": {"params": {"cols": 32}}}}
        """,
    )
    assert "different graph" in refused(path)


def test_refuses_training_specs_and_constructors_that_need_the_spec(tmp_path: Path) -> None:
    assert "backward" in refused(SPECS / "linear_train.py")
    path = spec_file(
        tmp_path,
        """
        def make_weight(n):
            return torch.ones(n)

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(make_weight(8))

            def forward(self, x):
                return x * self.w

        def get_inputs():
            return [torch.randn(4, 8)]
        """,
    )
    assert "make_weight" in refused(path)
