"""Depthwise convolutions through the offline tuner: a convolution with one input channel per group
(and a channel multiplier or not) gets the direct stencil template (`triton_depthwise`) before the
implicit GEMM, which computes it as GEMMs one channel deep; the candidate passes the guards and
computes what the reference computes under the Triton interpreter (1-, 2- and 3-d; stride, padding,
dilation; bias, per-channel and full epilogue tensors; a depthwise stage of a pipeline), at the
default configuration and at small blocks. A grouped convolution of several channels per group, or
a transposed one, does not get it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelevolve import tunables
from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from tests.tuner_interp import interpret, on_cuda

HEADER = "import torch\nimport torch.nn as nn\n\n"
SMALL = {"BLOCK": 64, "num_warps": 1}

REFERENCES = {
    "dw2d-square": ("nn.Conv2d(4, 4, 3, padding=1, groups=4)", "self.conv(x)", "[torch.randn(2, 4, 9, 11)]"),
    "dw2d-multiplier-strided-dilated": (
        "nn.Conv2d(3, 6, (3, 5), stride=(2, 1), padding=(2, 1), dilation=(2, 1), groups=3)",
        "torch.relu(self.conv(x)) * self.scale", "[torch.randn(2, 3, 10, 13)]",
    ),
    "dw1d-no-bias-residual": (
        "nn.Conv1d(5, 5, 4, stride=3, padding=2, groups=5, bias=False)", "self.conv(x) + 0.5 * y",
        "[torch.randn(3, 5, 29), torch.randn(3, 5, 10)]",
    ),
    "dw3d": ("nn.Conv3d(2, 4, (2, 3, 3), padding=(1, 1, 0), groups=2)", "torch.tanh(self.conv(x))",
             "[torch.randn(1, 2, 4, 6, 7)]"),
    "dw-separable": (
        "nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.Conv2d(4, 6, 1))", "self.conv(x)",
        "[torch.randn(2, 4, 7, 8)]",
    ),
}  # fmt: skip


def _spec(tmp: Path, name: str) -> Path:
    layer, expr, inputs = REFERENCES[name]
    args = "x, y" if "y" in expr else "x"
    path = tmp / f"{name.replace('-', '_')}.py"
    path.write_text(HEADER + textwrap.dedent(f"""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = {layer}
                last = self.conv[-1] if isinstance(self.conv, nn.Sequential) else self.conv
                dims = last.weight.dim() - 2
                self.scale = nn.Parameter(torch.rand(last.out_channels, *[1] * dims) + 0.5)

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
    """Every reference at its default (the direct template) and at small blocks: id -> (spec, source)."""
    tmp = tmp_path_factory.mktemp("depthwise")
    out = {}
    for name in REFERENCES:
        path = _spec(tmp, name)
        graph, why = recognize(load_spec(path))
        assert graph is not None, why
        first = variants(graph)[0]
        assert first.split("+")[0] == "triton-conv-depthwise", variants(graph)
        out[name] = (str(path), generate(graph).source)
        small = {f"s0_{k}": v for k, v in SMALL.items()} if graph.pattern == "pipeline" else SMALL
        out[f"{name}@small"] = (str(path), generate(graph, config=small).source)
    return out


@pytest.fixture(scope="module")
def interpreted(
    generated: dict[str, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return interpret(generated, tmp_path_factory.mktemp("depthwise-run"), tol=1e-4)


CASES = [*REFERENCES, *(f"{name}@small" for name in REFERENCES)]


@pytest.mark.parametrize("case", CASES)
def test_the_direct_depthwise_kernel_matches_the_reference_under_the_interpreter(
    case: str, interpreted: dict[str, str]
) -> None:
    assert interpreted[case] == "ok", interpreted[case]


@pytest.mark.parametrize("case", CASES)
def test_the_direct_depthwise_kernel_passes_the_candidate_guards(
    case: str, generated: dict[str, tuple[str, str]]
) -> None:
    source = generated[case][1]
    report = check_source(source, accepted_kinds={"triton"}, platform="cuda")
    assert report.ok, report.violations
    assert "_depthwise_kernel" in source and tunables.fits(source)


def test_grouped_and_transposed_convolutions_keep_the_implicit_gemm(tmp_path: Path) -> None:
    for layer in (
        "nn.Conv2d(4, 6, 3, groups=2)",
        "nn.ConvTranspose2d(4, 4, 3, groups=4)",
        "nn.Conv2d(4, 4, 1)",
    ):
        REFERENCES["probe"] = (layer, "self.conv(x)", "[torch.randn(1, 4, 8, 8)]")
        try:
            graph, why = recognize(load_spec(_spec(tmp_path, "probe")))
        finally:
            del REFERENCES["probe"]
        assert graph is not None, why
        assert "triton-conv-depthwise" not in variants(graph), layer
        assert variants(graph)[0] == "triton-conv"


@pytest.mark.gpu
def test_the_direct_depthwise_kernel_on_cuda_at_larger_sizes(tmp_path: Path) -> None:
    """Compiled on a GPU, each reference's direct kernel at sizes with many blocks, against float64."""
    for name in REFERENCES:
        path = _spec(tmp_path, name)
        graph, why = recognize(load_spec(path))
        assert graph is not None, why
        cand = tmp_path / f"{path.stem}_gen.py"
        cand.write_text(generate(graph).source)
        got, want = on_cuda(path, cand, repeat=16)
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert got.shape == want.shape and rel < 5e-6, (name, rel)
