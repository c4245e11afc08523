"""Convolutions through the offline tuner (issue J): a reference with a 1-, 2- or 3-d convolution and
an elementwise epilogue is recognized (`trace.recognize`), generated as an implicit-GEMM Triton
candidate (`triton_conv`), passes the candidate guards, and computes what the reference computes
under the Triton interpreter: strides, padding, dilation, groups (depthwise too), transposed ones
(with output padding), a bias, per-channel and full epilogue tensors, at the default configuration
and at small tiles that leave ragged edges.
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
from tests.tuner_interp import interpret

HEADER = "import torch\nimport torch.nn as nn\n\n"
SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 2, "num_stages": 1}

REFERENCES = {
    "conv1d-strided-dilated": (
        "nn.Conv1d(3, 8, 5, stride=2, padding=2, dilation=2)", "torch.tanh(self.conv(x))",
        "[torch.randn(2, 3, 37)]",
    ),
    "conv2d-grouped-bias-epilogue": (
        "nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)", "torch.relu(self.conv(x)) * self.scale + 0.5",
        "[torch.randn(2, 4, 9, 11)]",
    ),
    "conv3d-mixed-geometry": (
        "nn.Conv3d(2, 5, (2, 3, 3), stride=(1, 2, 1), padding=(1, 0, 1), bias=False)", "self.conv(x)",
        "[torch.randn(1, 2, 5, 7, 6)]",
    ),
    "conv2d-depthwise": (
        "nn.Conv2d(4, 4, 3, padding=1, groups=4)", "self.conv(x) - 1.0",
        "[torch.randn(2, 4, 7, 9)]",
    ),
    "convT1d-output-padding": (
        "nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1)", "self.conv(x) * 2.0",
        "[torch.randn(2, 4, 13)]",
    ),
    "convT2d-grouped-dilated": (
        "nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2)", "torch.relu(self.conv(x))",
        "[torch.randn(2, 4, 5, 6)]",
    ),
    "convT3d-mixed-geometry": (
        "nn.ConvTranspose3d(2, 3, (2, 3, 3), stride=(2, 1, 2), padding=(0, 1, 1), bias=False)",
        "self.conv(x) + self.scale", "[torch.randn(1, 2, 3, 4, 5)]",
    ),
    "conv2d-residual": (
        "nn.Conv2d(3, 20, 3, padding=1)", "self.conv(x) + 0.5 * y",
        "[torch.randn(2, 3, 6, 5), torch.randn(2, 20, 6, 5)]",
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
                dims = self.conv.weight.dim() - 2
                self.scale = nn.Parameter(torch.rand(self.conv.out_channels, *[1] * dims) + 0.5)

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
    """Every reference recognized and generated twice (defaults, small tiles): id -> (spec, source)."""
    tmp = tmp_path_factory.mktemp("conv")
    out = {}
    for name in REFERENCES:
        path = _spec(tmp, name)
        graph, why = recognize(load_spec(path))
        assert graph is not None and graph.pattern == "conv", why
        assert variants(graph)[-1] == "triton-conv"  # a depthwise one has its direct template first
        out[name] = (str(path), generate(graph, template="triton-conv").source)
        out[f"{name}@small"] = (str(path), generate(graph, config=SMALL, template="triton-conv").source)
        if name in DRAFTED:  # the presets the tuner drafts after the default (3xTF32, other tiles)
            for i, cfg in enumerate(generate(graph).drafts):
                out[f"{name}@draft{i}"] = (str(path), generate(graph, config=cfg).source)
    return out


@pytest.fixture(scope="module")
def interpreted(
    generated: dict[str, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return interpret(generated, tmp_path_factory.mktemp("conv-run"), tol=1e-4)


DRAFTED = ("conv2d-grouped-bias-epilogue", "convT2d-grouped-dilated")
CASES = [*REFERENCES, *(f"{name}@small" for name in REFERENCES)]
CASES += [f"{name}@draft{i}" for name in DRAFTED for i in range(3)]


@pytest.mark.parametrize("case", CASES)
def test_generated_convolution_matches_the_reference_under_the_interpreter(
    case: str, interpreted: dict[str, str]
) -> None:
    assert interpreted[case] == "ok", interpreted[case]


@pytest.mark.parametrize("case", CASES)
def test_generated_convolution_passes_the_candidate_guards(
    case: str, generated: dict[str, tuple[str, str]]
) -> None:
    report = check_source(generated[case][1], accepted_kinds={"triton"}, platform="cuda")
    assert report.ok, report.violations


def test_the_register_tile_is_declared_and_its_defaults_fit(generated: dict[str, tuple[str, str]]) -> None:
    for case, (_, source) in generated.items():
        assert "TILE = ('BLOCK_M', 'BLOCK_N')" in source, case
        assert tunables.fits(source), (case, tunables.tile_per_thread(source))


@pytest.mark.gpu
@pytest.mark.parametrize("dot", ["ieee", "tf32x3"])
def test_generated_convolutions_on_cuda_at_larger_sizes(dot: str, tmp_path: Path) -> None:
    """Compiled on a GPU, each reference's kernel at sizes with many tiles, against float64."""
    import importlib.util

    import torch

    for name in REFERENCES:
        path = _spec(tmp_path, name)
        graph, why = recognize(load_spec(path))
        assert graph is not None, why
        cand = tmp_path / f"{path.stem}_gen.py"
        cand.write_text(generate(graph, config={"DOT": dot}, template="triton-conv").source)
        mods = []
        for file, module_name in ((path, f"{path.stem}_ref"), (cand, f"{path.stem}_gen")):
            spec = importlib.util.spec_from_file_location(module_name, file)
            assert spec is not None and spec.loader is not None
            mods.append(importlib.util.module_from_spec(spec))
            spec.loader.exec_module(mods[-1])
        ref, new = mods[0].Model().cuda().double(), mods[1].ModelNew().cuda()
        new.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
        torch.manual_seed(0)
        inputs = [x.repeat(8, 1, *([1] * (x.dim() - 2))).cuda() for x in mods[0].get_inputs()]
        with torch.no_grad():
            want = ref(*[x.double() for x in inputs])
            got = new(*inputs)
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert got.shape == want.shape and rel < 5e-6, (name, dot, rel)
