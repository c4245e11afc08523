"""The split-row template (`triton_split.py`, issue K): for a few very long rows, each pass over the
data is a grid of (rows, splits) programs whose partials (fp64 for sums) are combined per row.

Each reference here declares two shapes: a small one (`get_inputs()` as written, what the interpreter
runs) and a long one, traced on the meta device only, whose few long rows make the tuner offer the
template. Under the Triton interpreter, with SPLITS forced above 1 (and "auto", which takes 4 SMs off
CUDA), every generated candidate computes what the reference computes; the forward takes the split
path exactly where its runtime shape asks for it; the partial sums stay within 1e-6 of float64 where a
lane-by-lane fp32 sum would not; the template is drafted first for a few long rows and never for many
or short ones; what it cannot split is refused with the reason.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import triton_split
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from kernelevolve.synth.tuner.triton_common import CodegenError
from tests.tuner_interp import interpret_forced, interpret_script

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
# KernelBench level 1's 40_LayerNorm: 16 rows of 4,194,304 values.
LONG = (16, 64, 256, 256)

# name: (the constructor's body given b, c, d; forward's expression; the small shape (a, b, c, d);
# the long shape; whether the inputs are positive)
REFERENCES = {
    "layernorm": (
        "self.ln = nn.LayerNorm((b, c, d))\n"
        "nn.init.uniform_(self.ln.weight, 0.5, 1.5)\nnn.init.uniform_(self.ln.bias, -0.5, 0.5)",
        "self.ln(x)", (2, 4, 16, 32), LONG, False,
    ),
    "frobenius": ("pass", "x / torch.norm(x, p='fro')", (3, 7, 5, 10), (112, 64, 512, 512), True),
    "mean-var": (
        "pass", "torch.var(x, dim=(1, 2, 3), correction=0, keepdim=True) + x.mean(dim=(1, 2, 3), keepdim=True)",
        (3, 4, 10, 30), LONG, False,
    ),
    "batchnorm": (
        "self.bn = nn.BatchNorm2d(b)\n"
        "nn.init.uniform_(self.bn.weight, 0.5, 1.5)\nnn.init.uniform_(self.bn.bias, -0.5, 0.5)",
        "self.bn(x)", (4, 3, 20, 30), (64, 64, 512, 512), False,
    ),
    "groupnorm": (
        "self.gn = nn.GroupNorm(2, b)\nnn.init.uniform_(self.gn.weight, 0.5, 1.5)",
        "torch.relu(self.gn(x))", (2, 4, 16, 32), LONG, False,
    ),
    "softmax": ("pass", "torch.softmax(x, dim=3) * 2.0", (1, 1, 2, 3000), (1, 1, 4, 1 << 22), False),
    "logsumexp": ("pass", "torch.logsumexp(x, dim=3)", (1, 1, 2, 3000), (1, 1, 4, 1 << 22), False),
    "min-max": (
        "pass",
        "(x - x.amin(dim=(1, 2, 3), keepdim=True)) / "
        "(x.amax(dim=(1, 2, 3), keepdim=True) - x.amin(dim=(1, 2, 3), keepdim=True))",
        (2, 4, 16, 32), LONG, False,
    ),
    "sum": ("pass", "torch.sum(x, dim=(1, 2, 3)) * 0.5", (2, 4, 16, 32), LONG, False),
}  # fmt: skip
# Other references: where memory runs along the rows (a sum over dim 1, the innermost dim kept).
OTHERS = {
    "sum-dim1": ("pass", "torch.sum(x, dim=1, keepdim=True)", (2, 40, 3, 1), (2, 1 << 20, 2, 1), False),
    # A pipeline's stage: a convolution, then a batch norm over its output (KernelBench 2/73's kind).
    "conv-batchnorm": (
        "self.conv = nn.Conv2d(b, 4, 3)\nself.bn = nn.BatchNorm2d(4)\nnn.init.uniform_(self.bn.weight, 0.5, 1.5)",
        "self.bn(self.conv(x))", (3, 2, 30, 40), (64, 2, 256, 256), False,
    ),
}  # fmt: skip
FORCED = {"CHUNK": 512, "SPLITS": 4}
# Appended to a candidate so that only one path can run: a launch of a kernel set to None fails.
SPLIT_ONLY = "\n_row_looped_kernel = None  # the test's: the split path only\n"
LOOPED_ONLY = "\n_split_pass1_kernel = _split_out_kernel = None  # the test's: the looped fallback only\n"
# case: (reference, config, the small shape instead of its own, which path the forward must take).
# The interpreter's "auto" (4 SMs) splits 2 rows of 8192 into 4 slices, and leaves 2 rows of 2048 (one
# slice of 4 chunks) and 64 rows (enough programs) to the looped kernel; SPLITS 2 over 17,000 columns
# leaves each slice 17 chunks, past a FOLD and ragged at the end.
EXTRA = {
    "layernorm@auto": ("layernorm", {"CHUNK": 512}, (2, 4, 32, 64), SPLIT_ONLY),
    "layernorm@auto-short": ("layernorm", {"CHUNK": 512}, None, LOOPED_ONLY),
    "softmax@auto-many-rows": ("softmax", {"CHUNK": 512}, (1, 1, 64, 3000), LOOPED_ONLY),
    "frobenius@fold": ("frobenius", {"CHUNK": 512, "SPLITS": 2}, (1, 1, 1, 17000), SPLIT_ONLY),
    "batchnorm@8": ("batchnorm", {"CHUNK": 512, "SPLITS": 8}, None, SPLIT_ONLY),
}


def _spec(
    tmp: Path, name: str, small: tuple[int, ...] | None = None, long: tuple[int, ...] | None = None
) -> Path:
    init, expr, own_small, own_long, positive = {**REFERENCES, **OTHERS}[name]
    a, b, c, d = small or own_small
    la, lb, lc, ld = long or own_long
    shapes = {
        "small": {"weight": 0.5, "params": {}},
        "long": {"weight": 0.5, "params": {"a": la, "b": lb, "c": lc, "d": ld}},
    }
    draw = "torch.rand" if positive else "torch.randn"
    body = textwrap.indent(init, " " * 16).lstrip()
    path = tmp / f"{name.replace('-', '_')}_{a}_{b}_{c}_{d}.py"
    path.write_text(HEADER + textwrap.dedent(f"""
        KERNELEVOLVE = {{"shapes": {shapes!r}}}

        class Model(nn.Module):
            def __init__(self, b={b}, c={c}, d={d}):
                super().__init__()
                {body}

            def forward(self, x):
                return {expr}

        def get_inputs(a={a}, b={b}, c={c}, d={d}):
            return [{draw}(a, b, c, d)]

        def get_init_inputs(b={b}, c={c}, d={d}):
            return [b, c, d]
        """))  # fmt: skip
    return path


def _graph(path: Path):  # type: ignore[no-untyped-def]
    graph, why = recognize(load_spec(path))
    assert graph is not None and graph.pattern == "row", why
    return graph


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, str]]:
    """Every reference's split candidate, SPLITS forced to 4 (and the extra configurations): id ->
    (spec, source, the line that leaves the forward one path)."""
    tmp = tmp_path_factory.mktemp("split")
    out = {}
    for name in REFERENCES:
        path = _spec(tmp, name)
        graph = _graph(path)
        assert variants(graph)[0] == "triton-row-split", (name, variants(graph))
        source = generate(graph, template="triton-row-split", config=FORCED).source
        out[name] = (str(path), source, SPLIT_ONLY)
    path = _spec(tmp, "conv-batchnorm")
    graph, why = recognize(load_spec(path))
    assert graph is not None and graph.pattern == "pipeline", why
    assert variants(graph)[0] == "triton-conv+triton-row-split", variants(graph)
    source = generate(graph, config={"s1_CHUNK": 512, "s1_SPLITS": 2}).source
    out["conv-batchnorm"] = (str(path), source, SPLIT_ONLY.replace("_row_looped", "_s1_row_looped"))
    for case, (name, config, small, only) in EXTRA.items():
        path = _spec(tmp, name, small)
        source = generate(_graph(path), template="triton-row-split", config=config).source
        out[case] = (str(path), source, only)
    return out


@pytest.fixture(scope="module")
def interpreted(
    generated: dict[str, tuple[str, str, str]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return interpret_forced(generated, tmp_path_factory.mktemp("split-run"), tol=1e-5)


CASES = [*REFERENCES, *EXTRA, "conv-batchnorm"]


@pytest.mark.parametrize("case", CASES)
def test_a_split_candidate_matches_the_reference_under_the_interpreter(
    case: str, interpreted: dict[str, str]
) -> None:
    """Each case runs only the path its shape asks for (the other's kernels are gone)."""
    assert interpreted[case] == "ok", interpreted[case]


@pytest.mark.parametrize("case", CASES)
def test_a_split_candidate_passes_the_candidate_guards(
    case: str, generated: dict[str, tuple[str, str, str]]
) -> None:
    report = check_source(generated[case][1], accepted_kinds={"triton"}, platform="cuda")
    assert report.ok, report.violations


def test_the_passes_follow_the_reduction_stages(generated: dict[str, tuple[str, str, str]]) -> None:
    """k reduction stages, k split passes and the output pass: layer norm's mean, then its variance;
    softmax's max and sum of exponentials share one pass (the online rescaling); an output of one
    value per row is stored by one program per row."""
    kernels = {
        case: sorted(set(re.findall(r"def (_split_\w+_kernel)\(", generated[case][1])))
        for case in ("layernorm", "softmax", "sum")
    }
    assert kernels == {
        "layernorm": ["_split_out_kernel", "_split_pass1_kernel", "_split_pass2_kernel"],
        "softmax": ["_split_out_kernel", "_split_pass1_kernel"],
        "sum": ["_split_out_kernel", "_split_pass1_kernel"],
    }
    assert "_split_out_kernel[(_rows, 1)]" in generated["sum"][1]
    assert "_split_out_kernel[(_rows, _splits)]" in generated["layernorm"][1]


_AGAINST_FP64 = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("cand", sys.argv[1])
cand = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cand)
cand._row_looped_kernel = None
x = torch.cat([torch.full((1, 512), 4096.0), torch.full((249, 512), 2.9 ** 0.5)]).view(1, 1, 250, 512)
got, want = cand.ModelNew()(x).double(), x.double() / torch.linalg.vector_norm(x.double())
print(float(((got - want).abs() / want.abs()).max()))
"""


def test_the_split_partial_sums_fold_their_lanes_into_fp64(tmp_path: Path) -> None:
    """A Frobenius norm whose lanes take one large square (2**24), then many of 2.9 that fp32 rounds
    on a running sum past 2**24 (test_tuner_reduce's adversary: ~6e-6 off summed lane by lane), in
    2 slices of 125 chunks: each slice's lanes fold into an fp64 partial every FOLD chunks, and the
    partials are combined in fp64: within 1e-6 of float64."""
    from kernelevolve.synth.tuner.triton_row import FOLD

    path = _spec(tmp_path, "frobenius", (1, 1, 250, 512))
    source = generate(_graph(path), template="triton-row-split", config={"CHUNK": 512, "SPLITS": 2}).source
    assert f"if i % {FOLD} == {FOLD - 1}:" in source and "dtype=torch.float64" in source
    (tmp_path / "cand.py").write_text(source)
    out = interpret_script(_AGAINST_FP64, str(tmp_path / "cand.py"))
    assert float(out.split()[-1]) < 1e-6, out


# -- which graphs get the template --------------------------------------------------------------------


def test_the_split_template_is_drafted_first_for_a_few_long_rows(tmp_path: Path) -> None:
    """16 rows of 4M values (KernelBench 1/40's layer norm): the split template is the tuner's first
    draft, SPLITS "auto"; the looped template follows, and no single-pass one (4M values in
    registers would compile for minutes: `triton_row.SINGLE_PASS_LIMIT_COLS`)."""
    from kernelevolve.synth.tuner.templates import bases_for

    spec = load_spec(_spec(tmp_path, "layernorm"))
    bases, why = bases_for(spec, "cuda")
    assert [b.label for b in bases[:2]] == ["triton-row-split", "triton-row-looped"], why
    assert "triton-row" not in {b.label for b in bases}
    assert bases[0].config["SPLITS"] == "auto" and "SPLITS" in (bases[0].space or {})
    assert "SPLITS" not in (bases[1].space or {})


@pytest.mark.parametrize(
    ("long", "expected"),
    [
        ((1, 1, 4096, 1024), ["triton-row", "triton-row-looped"]),  # many short rows: unchanged
        ((1, 1, 16, 8192), ["triton-row", "triton-row-looped"]),  # few rows, short enough for registers
        ((1, 1, 4096, 32768), ["triton-row-looped", "triton-row"]),  # many long rows: enough programs
        ((1, 1, 16, 32768), ["triton-row-split", "triton-row-looped", "triton-row"]),
        ((1, 1, 16, 65536), ["triton-row-split", "triton-row-looped", "triton-row"]),  # at the limit
        # past it: no single pass (level 1's 23_Softmax, 393216 columns, timed out compiling one)
        ((1, 1, 4096, 65537), ["triton-row-looped"]),
        ((1, 1, 16, 1 << 19), ["triton-row-split", "triton-row-looped"]),
    ],
)
def test_the_split_template_is_offered_only_for_a_few_long_rows(
    long: tuple[int, ...], expected: list[str], tmp_path: Path
) -> None:
    graph = _graph(_spec(tmp_path, "softmax", long=long))
    assert variants(graph) == expected


def test_what_the_split_template_cannot_split_is_refused_with_the_reason(tmp_path: Path) -> None:
    """A sum over dim 1 of [2, 2**20, 2]: 4 rows of 2**20 values, but a row's values lie 2 apart in
    memory (the innermost dim is kept): the looped template's tall tiles serve it, not one row per
    program."""
    graph = _graph(_spec(tmp_path, "sum-dim1"))
    assert "triton-row-split" not in variants(graph)
    assert "memory runs along the rows" in triton_split.refusal(graph)
    with pytest.raises(CodegenError, match="memory runs along the rows"):
        triton_split.build(graph, "strict_fp32")


# -- on a GPU ---------------------------------------------------------------------------------------------

# Moderately large shapes, few rows each: what "auto" splits on any GPU of 16 SMs or more.
GPU_SHAPES = {
    "layernorm": (4, 32, 128, 128),
    "frobenius": (1, 16, 1024, 1024),
    "mean-var": (4, 32, 128, 128),
    "batchnorm": (8, 16, 256, 256),
    "groupnorm": (4, 32, 128, 128),
    "softmax": (1, 1, 4, 1 << 20),
    "logsumexp": (1, 1, 4, 1 << 20),
    "min-max": (4, 32, 128, 128),
    "sum": (4, 32, 128, 128),
}


@pytest.mark.gpu
def test_split_candidates_on_cuda_at_larger_sizes(tmp_path: Path) -> None:
    """Compiled on a GPU, every reference's split candidate ("auto", the tuner's draft, and SPLITS 64)
    at a shape of a few rows of 2**19 to 2**24 values, the split path only, against float64 within the
    strict fp32 tolerance (a relative norm of 5e-5; 1e-5 here)."""
    from tests.tuner_interp import on_cuda

    assert set(GPU_SHAPES) == set(REFERENCES)
    for name, shape in GPU_SHAPES.items():
        path = _spec(tmp_path, name, shape)
        graph = _graph(path)
        for config in ({}, {"SPLITS": 64}):
            cand = tmp_path / f"{path.stem}_split_{len(config)}.py"
            cand.write_text(generate(graph, template="triton-row-split", config=config).source + SPLIT_ONLY)
            got, want = on_cuda(path, cand, repeat=1)
            rel = ((got.double() - want).norm() / want.norm()).item()
            assert got.shape == want.shape and rel < 1e-5, (name, config, rel)
