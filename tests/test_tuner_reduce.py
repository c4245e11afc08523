"""Reductions over any dims through the offline tuner (issue J): a reference that reduces over a
middle dim, several trailing dims, all dims, grouped channels or the batch and spatial dims per
channel (and the norms built from those: RMS over channels, layer norm over [C, H, W], group,
instance and batch norm, L2 and Frobenius norms; a loss reduced to one value is the `scalar` pattern's, see
test_tuner_misc.py) is recognized (`trace.recognize`,
`aten_reduce`), generated as a Triton `row` candidate with an index plan (`triton_reduce`), passes
the candidate guards, and computes what the reference computes under the Triton interpreter, with the
single-pass template and with the looped one at a chunk that leaves several chunks per row. What it
cannot generate is refused with the reason.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import c_codegen
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from tests.tuner_interp import interpret, load_module

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

# name: (the constructor's body, forward's expression, inputs, whether the index plan is general)
REFERENCES = {
    "sum-middle": ("pass", "torch.sum(x, dim=1, keepdim=True)", "[torch.randn(3, 37, 5)]", True),
    "mean-middle": ("pass", "torch.mean(x, dim=1)", "[torch.randn(3, 37, 5)]", True),
    "amax-middle": ("pass", "torch.max(x, dim=1)[0]", "[torch.randn(3, 37, 5)]", True),
    "amin-middle-keepdim": ("pass", "torch.amin(x, dim=1, keepdim=True)", "[torch.randn(3, 37, 5)]", True),
    "centered-middle": (
        "pass", "(x - x.mean(dim=1, keepdim=True)) * y", "[torch.randn(3, 37, 5), torch.randn(3, 37, 5)]", True,
    ),
    "var-middle": ("pass", "torch.var(x, dim=1, keepdim=True) + 1.0", "[torch.randn(2, 37, 3, 4)]", True),
    "softmax-dim1": ("pass", "torch.softmax(x, dim=1) * 2.0", "[torch.randn(2, 37, 3, 5)]", True),
    "rmsnorm-dim1": (
        "pass", "x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)", "[torch.randn(2, 37, 4, 5)]", True,
    ),
    "layernorm-3d": (
        "self.ln = nn.LayerNorm((4, 8, 20))\n"
        "nn.init.uniform_(self.ln.weight, 0.5, 1.5)\nnn.init.uniform_(self.ln.bias, -0.5, 0.5)",
        "self.ln(x)", "[torch.randn(3, 4, 8, 20)]", False,
    ),
    "groupnorm": (
        "self.gn = nn.GroupNorm(3, 6)\n"
        "nn.init.uniform_(self.gn.weight, 0.5, 1.5)\nnn.init.uniform_(self.gn.bias, -0.5, 0.5)",
        "self.gn(x)", "[torch.randn(2, 6, 16, 20)]", True,
    ),
    "groupnorm-2d": (
        "self.gn = nn.GroupNorm(4, 600)\n"
        "nn.init.uniform_(self.gn.weight, 0.5, 1.5)\nnn.init.uniform_(self.gn.bias, -0.5, 0.5)",
        "torch.relu(self.gn(x))", "[torch.randn(5, 600)]", True,
    ),
    "instancenorm": ("self.norm = nn.InstanceNorm2d(4)", "self.norm(x)", "[torch.randn(3, 4, 24, 30)]", False),
    "batchnorm-train": (
        "self.bn = nn.BatchNorm2d(4)\n"
        "nn.init.uniform_(self.bn.weight, 0.5, 1.5)\nnn.init.uniform_(self.bn.bias, -0.5, 0.5)",
        "self.bn(x)", "[torch.randn(3, 4, 12, 20)]", True,
    ),
    "batchnorm1d-train": (
        "self.bn = nn.BatchNorm1d(6)\nnn.init.uniform_(self.bn.weight, 0.5, 1.5)",
        "torch.tanh(self.bn(x))", "[torch.randn(600, 6)]", True,
    ),
    "batchnorm-eval": (
        "self.bn = nn.BatchNorm2d(4)\n"
        "nn.init.uniform_(self.bn.weight, 0.5, 1.5)\nnn.init.uniform_(self.bn.bias, -0.5, 0.5)\n"
        "self.bn.running_mean.uniform_(-1.0, 1.0)\nself.bn.running_var.uniform_(0.5, 2.0)\nself.bn.eval()",
        "self.bn(x)", "[torch.randn(3, 4, 12, 20)]", True,
    ),
    "l2norm-dim1": ("pass", "x / torch.norm(x, p=2, dim=1, keepdim=True)", "[torch.randn(3, 37, 5)]", True),
    "l2norm-last": ("pass", "x / torch.norm(x, p=2, dim=1, keepdim=True)", "[torch.randn(5, 700)]", False),
    "frobenius": ("pass", "x / torch.norm(x, p='fro')", "[torch.randn(3, 8, 30)]", False),
    # What a later stage of a pipeline sees: the reduced value computed from a plain input.
    "groupnorm-after-ops": (
        "self.gn = nn.GroupNorm(8, 64)\nself.bias = nn.Parameter(torch.randn(64))\n"
        "nn.init.uniform_(self.gn.weight, 0.5, 1.5)",
        "torch.nn.functional.hardtanh(self.gn(x * torch.sigmoid(x) + self.bias))", "[torch.randn(10, 64)]", True,
    ),
    "batchnorm-after-ops": (
        "self.bn = nn.BatchNorm1d(64)\nself.scale = nn.Parameter(torch.randn(64))",
        "F.gelu(self.bn(x * self.scale))", "[torch.randn(33, 64)]", True,
    ),
    "instancenorm-after-ops": (
        "self.norm = nn.InstanceNorm3d(4)", "torch.clamp(self.norm(x * 2.0), -1.0, 1.0)",
        "[torch.randn(2, 4, 3, 5, 6)]", False,
    ),
    "softmax-dim1-epilogue": (
        "self.bias = nn.Parameter(torch.randn(6, 1, 1))",
        "torch.sigmoid((torch.softmax(x, dim=1) + self.bias) * 2.0)", "[torch.randn(2, 6, 7, 9)]", True,
    ),
    "softmax-sub-max-dim1": (
        "self.sub = nn.Parameter(torch.randn(6))",
        "torch.max(F.silu(torch.softmax(x, dim=1) - self.sub.view(1, -1, 1, 1)), dim=1)[0]",
        "[torch.randn(2, 6, 7, 9)]", True,
    ),
}  # fmt: skip
# Where memory runs along the rows, the looped template offers narrow chunks and tall tiles.
TALL = ["sum-middle", "mean-middle", "amax-middle", "amin-middle-keepdim", "centered-middle", "var-middle",
        "softmax-dim1", "rmsnorm-dim1", "l2norm-dim1", "softmax-dim1-epilogue", "softmax-sub-max-dim1"]  # fmt: skip
SMALL = {"ROWS": 2}
LOOPED = {"CHUNK": 512, "ROWS": 2}


def _spec(tmp: Path, name: str, init: str, expr: str, inputs: str) -> Path:
    args = "x, y" if "y" in expr.replace("torch.", "") else "x"
    path = tmp / f"{name.replace('-', '_')}.py"
    body = textwrap.indent(init, " " * 16).lstrip()
    path.write_text(HEADER + textwrap.dedent(f"""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                {body}

            def forward(self, {args}):
                return {expr}

        def get_inputs():
            return {inputs}

        def get_init_inputs():
            return []
        """))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Every reference recognized and generated three ways: id -> (spec, source)."""
    tmp = tmp_path_factory.mktemp("reduce")
    out = {}
    for name, (init, expr, inputs, general) in REFERENCES.items():
        path = _spec(tmp, name, init, expr, inputs)
        graph, why = recognize(load_spec(path))
        assert graph is not None and graph.pattern == "row", why
        assert graph.reduce is not None, name
        default = generate(graph, config=SMALL)
        assert ("s0," in default.source) == general, name  # the general index plan takes the sizes
        out[name] = (str(path), generate(graph).source)
        out[f"{name}@small"] = (str(path), default.source)
        out[f"{name}@looped"] = (
            str(path),
            generate(graph, template="triton-row-looped", config=LOOPED).source,
        )
        if name in TALL:  # several narrow chunks per row
            tall = generate(graph, template="triton-row-looped", config={"CHUNK": 16, "ROWS": 8})
            out[f"{name}@tall"] = (str(path), tall.source)
    return out


@pytest.fixture(scope="module")
def interpreted(
    generated: dict[str, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return interpret(generated, tmp_path_factory.mktemp("reduce-run"), tol=1e-5)


CASES = [f"{name}{how}" for name in REFERENCES for how in ("", "@small", "@looped")]
CASES += [f"{name}@tall" for name in TALL]


@pytest.mark.parametrize("case", CASES)
def test_generated_reduction_matches_the_reference_under_the_interpreter(
    case: str, interpreted: dict[str, str]
) -> None:
    assert interpreted[case] == "ok", interpreted[case]


@pytest.mark.parametrize("case", CASES)
def test_generated_reduction_passes_the_candidate_guards(
    case: str, generated: dict[str, tuple[str, str]]
) -> None:
    report = check_source(generated[case][1], accepted_kinds={"triton"}, platform="cuda")
    assert report.ok, report.violations


def test_the_iteration_space_is_the_reduced_value_s(tmp_path: Path) -> None:
    """Rows are the kept dims, cols the reduced ones; group norm splits the channels."""
    sizes = {}
    for name in ("mean-middle", "groupnorm", "batchnorm-train", "frobenius"):
        init, expr, inputs, _ = REFERENCES[name]
        graph, why = recognize(load_spec(_spec(tmp_path, name, init, expr, inputs)))
        assert graph is not None, why
        sizes[name] = (graph.rows["default"], graph.cols["default"])
    assert sizes == {
        "mean-middle": (3 * 5, 37),
        "groupnorm": (2 * 3, 2 * 16 * 20),
        "batchnorm-train": (4, 3 * 12 * 20),
        "frobenius": (1, 3 * 8 * 30),
    }
    assert variants(graph) == ["triton-row", "triton-row-looped"]


def test_batch_norm_s_buffer_updates_are_not_computed(tmp_path: Path) -> None:
    """num_batches_tracked += 1 (int64) is a buffer update only: the graph reads x, weight, bias."""
    init, expr, inputs, _ = REFERENCES["batchnorm-train"]
    graph, why = recognize(load_spec(_spec(tmp_path, "bn", init, expr, inputs)))
    assert graph is not None, why
    assert sorted(t.source for t in graph.tensors) == ["input:0", "param:bn.bias", "param:bn.weight"]


@pytest.mark.parametrize(
    ("init", "expr", "reason"),
    [
        ("self.gn = nn.GroupNorm(2, 4)", "self.gn(x).mean(dim=(2, 3), keepdim=True)", "group norm's"),
        ("pass", "torch.linalg.vector_norm(x, ord=0, dim=1)", "order 0"),
        ("pass", "torch.cumsum(x, dim=1)", "cumsum is templated only along the last dim"),
        ("pass", "x.sum(dim=1, keepdim=True).transpose(0, 2)", "a permuted view"),
    ],
)  # fmt: skip
def test_what_the_reduction_templates_cannot_generate_is_refused_with_the_reason(
    init: str, expr: str, reason: str, tmp_path: Path
) -> None:
    graph, why = recognize(load_spec(_spec(tmp_path, "refused", init, expr, "[torch.randn(4, 4, 6, 8)]")))
    assert graph is None and reason in why, why


def test_the_cpu_templates_say_they_do_not_reduce_over_other_dims(tmp_path: Path) -> None:
    init, expr, inputs, _ = REFERENCES["rmsnorm-dim1"]
    graph, why = recognize(load_spec(_spec(tmp_path, "cpu", init, expr, inputs)))
    assert graph is not None, why
    with pytest.raises(NotImplementedError, match="not over other dims"):
        c_codegen.generate(graph)


@pytest.mark.gpu
def test_generated_reductions_on_cuda_at_larger_sizes(tmp_path: Path) -> None:
    """Compiled on a GPU, each reference's kernels (both templates) with the batch dim 16 times
    larger, against the reference in float64."""
    import torch

    for name, (init, expr, inputs, _) in REFERENCES.items():
        path = _spec(tmp_path, name, init, expr, inputs)
        graph, why = recognize(load_spec(path))
        assert graph is not None, why
        mods = [load_module(path, f"{path.stem}_ref")]
        ref = mods[0].Model().cuda().double()
        torch.manual_seed(0)
        xs = [x.repeat(16, *[1] * (x.dim() - 1)).cuda() for x in mods[0].get_inputs()]
        with torch.no_grad():
            want = ref(*[x.double() for x in xs])
        for template in variants(graph):
            cand = tmp_path / f"{path.stem}_{template.replace('-', '_')}.py"
            cand.write_text(generate(graph, template=template).source)
            new = load_module(cand, cand.stem).ModelNew().cuda()
            new.load_state_dict(
                {k: v.float() if v.is_floating_point() else v for k, v in ref.state_dict().items()}
            )
            with torch.no_grad():
                got = new(*xs)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, msg=f"{name} {template}")


# A Frobenius norm whose lanes each take one large square (2**24) then many of 2.9, which fp32 rounds to
# +2 on a running sum past 2**24: summed lane by lane over 250 chunks of 512, the norm is off by ~6e-6;
# folded into an fp64 total every FOLD chunks, by less than 1e-6. (torch's own fp32 norm of it is off
# by 2e-5 on the CPU: the candidate is judged against float64.)
_ADVERSARY = "torch.cat([torch.full((1, 512), 4096.0), torch.full((249, 512), 2.9 ** 0.5)])"
_AGAINST_FP64 = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("cand", sys.argv[1])
cand = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cand)
x = {x}
got, want = cand.ModelNew()(x).double(), x.double() / torch.linalg.vector_norm(x.double())
print(float(((got - want).abs() / want.abs()).max()))
"""


def test_a_long_looped_sum_folds_its_lanes_into_an_fp64_total(tmp_path: Path) -> None:
    """The looped template's sums (a Frobenius norm over 128,000 values, 250 chunks of 512) stay
    within 1e-6 of float64 where a lane-by-lane fp32 sum is off by ~6e-6 (KernelBench 1/37's norm,
    over 1.9e9 values, was off by 5.6e-5). The fold's period leaves a ragged last group."""
    from kernelevolve.synth.tuner.triton_row import FOLD
    from tests.tuner_interp import interpret_script

    path = _spec(tmp_path, "fro-adversary", "pass", "x / torch.norm(x, p='fro')", f"[{_ADVERSARY}]")
    graph, why = recognize(load_spec(path))
    assert graph is not None, why
    source = generate(graph, template="triton-row-looped", config={"CHUNK": 512, "ROWS": 1}).source
    assert f"if i % {FOLD} == {FOLD - 1}:" in source and "tl.float64" in source
    assert 250 % FOLD != 0
    (tmp_path / "cand.py").write_text(source)
    out = interpret_script(_AGAINST_FP64.format(x=_ADVERSARY), str(tmp_path / "cand.py"))
    assert float(out.split()[-1]) < 1e-6, out


@pytest.mark.gpu
def test_a_frobenius_norm_of_2_to_the_28_values_on_cuda_against_float64(tmp_path: Path) -> None:
    """Compiled on a GPU, the looped template's Frobenius norm of 2**28 uniform values (one row of
    65,536 chunks) within 1e-6 of float64 (KernelBench 1/37's 1.9e9 values, summed lane by lane in fp32,
    were off by 5.6e-5)."""
    import torch

    path = _spec(tmp_path, "fro-large", "pass", "x / torch.norm(x, p='fro')", "[torch.rand(2**14, 2**14)]")
    graph, why = recognize(load_spec(path))
    assert graph is not None, why
    cand = tmp_path / "fro_large_cand.py"
    cand.write_text(generate(graph, template="triton-row-looped").source)
    torch.manual_seed(0)
    x = torch.rand(2**14, 2**14, device="cuda")
    with torch.no_grad():
        got = load_module(cand, cand.stem).ModelNew()(x).double()
    want = x.double() / torch.linalg.vector_norm(x.double())
    assert float((got - want).norm() / want.norm()) < 1e-6
