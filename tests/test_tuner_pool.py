"""Pooling through the offline tuner (issue J): a reference whose main op is a 1-, 2- or 3-d max or
average pooling of an input, with an elementwise epilogue, is recognized (`trace.recognize`),
generated as a Triton candidate (`triton_pool`), passes the candidate guards, and computes what the
reference computes under the Triton interpreter: stride (and its default, the kernel), padding,
dilation, count_include_pad off, divisor_override, a NaN inside a max window, per-channel and full
epilogue tensors, at the default configuration and at a small block that leaves a ragged edge. What it
cannot generate is refused with the reason.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelevolve import tunables
from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import c_codegen
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from tests.tuner_interp import interpret, on_cuda

HEADER = "import torch\nimport torch.nn as nn\n\n"
SMALL = {"BLOCK": 64, "num_warps": 1}

# name: (the layer, channels, forward's expression, inputs)
REFERENCES = {
    "maxpool1d-dilated": (
        "nn.MaxPool1d(8, stride=1, padding=4, dilation=3)", 3, "self.pool(x)", "[torch.randn(2, 3, 40)]",
    ),
    "maxpool2d-epilogue": (
        "nn.MaxPool2d(4, stride=1, padding=1)", 4, "torch.relu(self.pool(x)) * self.scale + 0.5",
        "[torch.randn(2, 4, 9, 11)]",
    ),
    "maxpool3d-strided-dilated": (
        "nn.MaxPool3d(3, stride=2, padding=1, dilation=3)", 2, "self.pool(x)", "[torch.randn(1, 2, 9, 10, 11)]",
    ),
    "maxpool2d-nan": (
        "nn.MaxPool2d(3, stride=2, padding=1)", 2, "self.pool(x)",
        "[torch.randn(2, 2, 7, 9).index_put_((torch.tensor([0]), torch.tensor([1]), torch.tensor([3]), "
        "torch.tensor([4])), torch.tensor(float('nan')))]",
    ),
    "avgpool1d-padded": (
        "nn.AvgPool1d(8, stride=1, padding=4)", 3, "self.pool(x) - 1.0", "[torch.randn(2, 3, 40)]",
    ),
    "avgpool2d-default-stride": ("nn.AvgPool2d(3)", 3, "self.pool(x)", "[torch.randn(2, 3, 14, 13)]"),
    "avgpool2d-exclude-pad": (
        "nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)", 3, "torch.sigmoid(self.pool(x))",
        "[torch.randn(2, 3, 9, 8)]",
    ),
    "avgpool3d-divisor": (
        "nn.AvgPool3d(3, stride=2, padding=1, divisor_override=5)", 2, "self.pool(x) * self.scale",
        "[torch.randn(1, 2, 7, 8, 9)]",
    ),
    "maxpool2d-residual": (
        "nn.MaxPool2d(2)", 3, "self.pool(x) + 0.5 * y", "[torch.randn(2, 3, 8, 8), torch.randn(2, 3, 4, 4)]",
    ),
}  # fmt: skip


def _spec(tmp: Path, name: str, layer: str, channels: int, expr: str, inputs: str) -> Path:
    args = "x, y" if "y" in expr else "x"
    dims = int(layer.split("Pool")[1][0])
    path = tmp / f"{name.replace('-', '_')}.py"
    path.write_text(HEADER + textwrap.dedent(f"""
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.pool = {layer}
                self.scale = nn.Parameter(torch.rand({channels}, *[1] * {dims}) + 0.5)

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
    """Every reference recognized and generated twice (defaults, a small block): id -> (spec, source)."""
    tmp = tmp_path_factory.mktemp("pool")
    out = {}
    for name, case in REFERENCES.items():
        path = _spec(tmp, name, *case)
        graph, why = recognize(load_spec(path))
        assert graph is not None and graph.pattern == "pool", why
        assert variants(graph) == ["triton-pool"]
        out[name] = (str(path), generate(graph).source)
        out[f"{name}@small"] = (str(path), generate(graph, config=SMALL).source)
    return out


@pytest.fixture(scope="module")
def interpreted(
    generated: dict[str, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return interpret(generated, tmp_path_factory.mktemp("pool-run"), tol=1e-5, nan_marker="nan")


CASES = [*REFERENCES, *(f"{name}@small" for name in REFERENCES)]


@pytest.mark.parametrize("case", CASES)
def test_generated_pooling_matches_the_reference_under_the_interpreter(
    case: str, interpreted: dict[str, str]
) -> None:
    assert interpreted[case] == "ok", interpreted[case]


@pytest.mark.parametrize("case", CASES)
def test_generated_pooling_passes_the_candidate_guards(
    case: str, generated: dict[str, tuple[str, str]]
) -> None:
    report = check_source(generated[case][1], accepted_kinds={"triton"}, platform="cuda")
    assert report.ok, report.violations


def test_the_register_tile_is_declared_and_its_defaults_fit(generated: dict[str, tuple[str, str]]) -> None:
    for case, (_, source) in generated.items():
        assert "TILE = ('BLOCK',)" in source, case
        assert tunables.fits(source), (case, tunables.tile_per_thread(source))


def test_the_description_names_the_pooling(tmp_path: Path) -> None:
    graph, why = recognize(load_spec(_spec(tmp_path, "d", *REFERENCES["maxpool1d-dilated"])))
    assert graph is not None, why
    assert why == "max pool1d (kernel [1, 8], stride [1, 1], padding [0, 4], dilation [1, 3])"


@pytest.mark.parametrize(
    ("layer", "expr", "reason"),
    [
        ("nn.MaxPool2d(3, stride=2, ceil_mode=True)", "self.pool(x)", "ceil_mode"),
        ("nn.MaxPool2d(2, return_indices=True)", "self.pool(x)[1].float()", "the pooling's indices is used"),
        # A scan after the pooling is a second stage, refused with its reason (test_tuner_stages
        # covers the pipelines that are generated: compute before a pooling, a pooling of a pooling).
        ("nn.MaxPool2d(2)", "torch.cumsum(self.pool(x), dim=1)", "stage 2 of the pipeline (after max pool2d"),
    ],
)
def test_what_the_pool_template_cannot_generate_is_refused_with_the_reason(
    layer: str, expr: str, reason: str, tmp_path: Path
) -> None:
    graph, why = recognize(load_spec(_spec(tmp_path, "refused", layer, 3, expr, "[torch.randn(2, 3, 8, 8)]")))
    assert graph is None and reason in why, why


def test_the_cpu_templates_say_they_do_not_generate_poolings(tmp_path: Path) -> None:
    graph, why = recognize(load_spec(_spec(tmp_path, "cpu", *REFERENCES["avgpool2d-default-stride"])))
    assert graph is not None, why
    with pytest.raises(NotImplementedError, match="do not generate poolings"):
        c_codegen.generate(graph)


@pytest.mark.gpu
def test_generated_poolings_on_cuda_at_larger_sizes(tmp_path: Path) -> None:
    """Compiled on a GPU, each reference's kernel at sizes with many blocks, against float64."""
    import torch

    for name, case in REFERENCES.items():
        path = _spec(tmp_path, name, *case)
        graph, why = recognize(load_spec(path))
        assert graph is not None, why
        cand = tmp_path / f"{path.stem}_gen.py"
        cand.write_text(generate(graph).source)
        got, want = on_cuda(path, cand, repeat=16)
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6, equal_nan=True, msg=name)
