"""The split-K GEMM template (`triton_splitk.py`, issue K): for few output tiles and a long K, pass 1
is a grid of (tiles, batch, splits) programs, each storing the fp32 partial of its K range; pass 2
sums the partials in order, then adds the bias and runs the epilogue once.

Each reference here declares two shapes: a small one (`get_inputs()` as written, what the interpreter
runs) and a long one, traced on the meta device only, whose few tiles and long K make the tuner offer
the template (KernelBench 1/6's kind: 256 x 256 with K = 2**19). Under the Triton interpreter, every
generated candidate computes what the reference computes at strict fp32 tolerance, and runs exactly
the path its configuration and runtime shape ask for (the other path's kernels are set to None); the
template is drafted first (its ieee and 3xTF32 dots among the first drafts) for few tiles and a long
K, and never for square GEMMs, whose drafts stay as they were.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import triton_gemm, triton_splitk
from kernelevolve.synth.tuner.ir import GemmInfo, OpGraph, TensorArg
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from tests.tuner_interp import interpret, interpret_forced

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
# KernelBench level 1's 6_Matmul_with_large_K_dimension_: (batch, M, N, K).
LONG = (1, 256, 256, 1 << 19)

# name: (the constructor's body given n, k; forward's parameters; forward's expression; the inputs
# given b, m, n, k; the small shape (b, m, n, k))
REFERENCES = {
    "matmul": ("pass", "a, w", "torch.matmul(a, w)", "[_r(k, m, k), _r(k, k, n)]", (1, 32, 32, 2048)),
    # K = 2000: 63 slices of 32 (the last one half), 4 ranges of 16 slices, the last of 15
    "ragged": ("pass", "a, w", "torch.matmul(a, w)", "[_r(k, m, k), _r(k, k, n)]", (1, 32, 24, 2000)),
    "bmm": ("pass", "a, w", "torch.bmm(a, w)", "[_r(k, b, m, k), _r(k, b, k, n)]", (3, 20, 24, 1000)),
    # a given as [K, M], read transposed
    "matmul-at": ("pass", "a, w", "torch.matmul(a.t(), w)", "[_r(k, k, m), _r(k, k, n)]", (1, 24, 20, 1000)),
    # bias, then gelu, then + 0.5: per split, the bias and the 0.5 would be added SPLIT_K times
    "linear-gelu": (
        "self.fc = nn.Linear(k, n)", "x", "F.gelu(self.fc(x)) + 0.5", "[_r(k, m, k)]", (1, 16, 40, 1500),
    ),
}  # fmt: skip
SMALL_TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 2, "num_stages": 1}
# Appended to a candidate so that only one path can run: a launch of a kernel set to None fails.
SPLIT_ONLY = "\n_gemm_kernel = None  # the test's: the split path only\n"
ONE_PASS_ONLY = "\n_gemm_partial_kernel = _gemm_sum_kernel = None  # the test's: the one-pass kernel only\n"


def checked(only: str, *asserts: str) -> str:
    """Appended to a candidate: `only` (the path that must run), and each launch of that path's first
    kernel fails unless every assertion holds over its arguments (`given`, by name) and `kwargs`."""
    kernel = "_gemm_partial_kernel" if only == SPLIT_ONLY else "_gemm_kernel"
    lines = "".join(f"\n                    assert {a}" for a in asserts)
    return only + textwrap.dedent(f"""
        _real = {kernel}
        class _Checked:  # the test's: the launch's arguments checked first
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    given = dict(zip(_real.arg_names, args)){lines}
                    return _real[grid](*args, **kwargs)
                return launch
        {kernel} = _Checked()
        """)


B_K_CONTIGUOUS = 'given["stride_bk"] == 1, ("b is not K-contiguous", given["stride_bk"])'
K_PADDED = 'given["K"] % kwargs["BLOCK_K"] == 0, ("K is not padded", given["K"])'


def aligned(operand: str, k_contiguous: bool) -> str:
    """`operand` ("a" or "b") with the contiguous dim asked for, its rows a multiple of 16 elements."""
    other = {"a": "m", "b": "n"}[operand]
    unit, rows = (f"stride_{operand}k", f"stride_{operand}{other}")[:: 1 if k_contiguous else -1]
    return f'given["{unit}"] == 1 and given["{rows}"] % 16 == 0, ("layout", given["{unit}"], given["{rows}"])'


def padded(a_k_contiguous: bool, b_k_contiguous: bool) -> tuple[str, ...]:
    """PAD_K's assertions: K in whole slices, a and b laid out as asked, rows aligned."""
    return K_PADDED, aligned("a", a_k_contiguous), aligned("b", b_k_contiguous)


# case: (reference, the configuration beyond SMALL_TILE, the small shape instead of its own, which
# path must run). The interpreter's "auto" (4 SMs: 8 programs) splits a 32 x 32 output (4 tiles of
# 16 x 16; K = 2048: 64 slices) into 2 ranges, and leaves a 64 x 64 one (16 tiles) to the one-pass
# kernel; SPLIT_K 2 over K = 33,600 in 16-wide slices gives ranges of 1050 slices, past FOLD_ABOVE:
# the two-level sum inside a range. The 3xTF32 dot runs the same kernel with DOT "tf32x3".
CASES: dict[str, tuple[str, dict[str, int | str], tuple[int, int, int, int] | None, str]] = {
    "matmul@4": ("matmul", {"SPLIT_K": 4}, None, SPLIT_ONLY),
    "matmul@4-tf32x3": ("matmul", {"SPLIT_K": 4, "DOT": "tf32x3"}, None, SPLIT_ONLY),
    "ragged@4": ("ragged", {"SPLIT_K": 4}, None, SPLIT_ONLY),
    "bmm@8": ("bmm", {"SPLIT_K": 8}, None, SPLIT_ONLY),
    "linear-gelu@4": ("linear-gelu", {"SPLIT_K": 4}, None, SPLIT_ONLY),
    "linear-gelu@16": ("linear-gelu", {"SPLIT_K": 16}, None, SPLIT_ONLY),
    "matmul@auto": ("matmul", {"SPLIT_K": "auto"}, None, SPLIT_ONLY),
    "matmul@auto-many-tiles": ("matmul", {"SPLIT_K": "auto"}, (1, 64, 64, 2048), ONE_PASS_ONLY),
    "matmul@1": ("matmul", {"SPLIT_K": 1}, None, ONE_PASS_ONLY),
    "fold@2": ("matmul", {"SPLIT_K": 2, "BLOCK_K": 16}, (1, 16, 16, 33600), SPLIT_ONLY),
    # B_KMAJOR: b ([K, N], N contiguous) copied K-contiguous before either path's launch
    "matmul@4-tf32x3-kmajor": ("matmul", {"SPLIT_K": 4, "DOT": "tf32x3", "B_KMAJOR": 1}, None,
                               checked(SPLIT_ONLY, B_K_CONTIGUOUS)),
    "matmul@1-kmajor": ("matmul", {"SPLIT_K": 1, "B_KMAJOR": 1}, None, checked(ONE_PASS_ONLY, B_K_CONTIGUOUS)),
    "bmm@8-kmajor": ("bmm", {"SPLIT_K": 8, "B_KMAJOR": 1}, None, checked(SPLIT_ONLY, B_K_CONTIGUOUS)),
    # PAD_K: K = 2000 (1000, 1500, 1000) is not a multiple of the 32-wide slice: a and b copied into
    # zeroed buffers of whole slices, each keeping its contiguous dim, on either path; a given
    # transposed ([K, M]) too, and a b that B_KMAJOR asks K-contiguous (the padding's copy makes it so)
    "ragged@1-padk": ("ragged", {"SPLIT_K": 1, "PAD_K": 1}, None, checked(ONE_PASS_ONLY, *padded(True, False))),
    "ragged@4-padk": ("ragged", {"SPLIT_K": 4, "PAD_K": 1}, None, checked(SPLIT_ONLY, *padded(True, False))),
    "ragged@1-kmajor-padk": ("ragged", {"SPLIT_K": 1, "PAD_K": 1, "B_KMAJOR": 1, "DOT": "tf32x3"}, None,
                             checked(ONE_PASS_ONLY, *padded(True, True))),
    "bmm@8-padk": ("bmm", {"SPLIT_K": 8, "PAD_K": 1}, None, checked(SPLIT_ONLY, *padded(True, False))),
    "linear-gelu@1-padk": ("linear-gelu", {"SPLIT_K": 1, "PAD_K": 1, "DOT": "tf32x3"}, None,
                           checked(ONE_PASS_ONLY, *padded(True, True))),
    "at@1-padk": ("matmul-at", {"SPLIT_K": 1, "PAD_K": 1}, None, checked(ONE_PASS_ONLY, *padded(False, False))),
}  # fmt: skip


def _spec(tmp: Path, name: str, small: tuple[int, ...] | None = None, long: tuple[int, ...] = LONG) -> Path:
    init, params, expr, inputs, own_small = REFERENCES[name]
    b, m, n, k = small or own_small
    lb, lm, ln, lk = long
    shapes = {
        "small": {"weight": 0.5, "params": {}},
        "long": {"weight": 0.5, "params": {"b": lb, "m": lm, "n": ln, "k": lk}},
    }
    body = textwrap.indent(init, " " * 16).lstrip()
    path = tmp / f"{name.replace('-', '_')}_{b}_{m}_{n}_{k}.py"
    path.write_text(HEADER + textwrap.dedent(f"""
        KERNELEVOLVE = {{"shapes": {shapes!r}}}

        def _r(k, *size):  # products of about 1 / sqrt(k): sums of about 1
            return torch.randn(*size) / k ** 0.25

        class Model(nn.Module):
            def __init__(self, n={n}, k={k}):
                super().__init__()
                {body}

            def forward(self, {params}):
                return {expr}

        def get_inputs(b={b}, m={m}, n={n}, k={k}):
            return {inputs}

        def get_init_inputs(n={n}, k={k}):
            return [n, k]
        """))  # fmt: skip
    return path


def _graph(path: Path) -> OpGraph:
    graph, why = recognize(load_spec(path))
    assert graph is not None and graph.pattern == "gemm", why
    return graph


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, str]]:
    """Each case's split-K candidate: id -> (spec, source, the line that leaves the forward one path)."""
    tmp = tmp_path_factory.mktemp("splitk")
    out = {}
    for case, (name, knobs, small, only) in CASES.items():
        path = _spec(tmp, name, small)
        graph = _graph(path)
        assert variants(graph) == ["triton-gemm-splitk", "triton-gemm"], (case, variants(graph))
        config = {**SMALL_TILE, **knobs}
        out[case] = (str(path), generate(graph, config=config).source, only)
    return out


@pytest.fixture(scope="module")
def interpreted(
    generated: dict[str, tuple[str, str, str]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return interpret_forced(generated, tmp_path_factory.mktemp("splitk-run"), tol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_a_split_k_candidate_matches_the_reference_under_the_interpreter(
    case: str, interpreted: dict[str, str]
) -> None:
    """Each case runs only the path its configuration and shape ask for (the other's kernels are gone)."""
    assert interpreted[case] == "ok", interpreted[case]


def test_a_pipelines_gemm_stage_splits_too(tmp_path: Path) -> None:
    """A Linear then a softmax over its rows (a pipeline: the GEMM stage, then the row stage): the
    GEMM stage's few tiles and long K get split-K first, its kernels renamed apart (`_s0_...`), its
    SPLIT_K prefixed; under the interpreter, the split path only, it computes the reference."""
    REFERENCES["linear-softmax"] = (
        "self.fc = nn.Linear(k, n)", "x", "torch.softmax(self.fc(x), dim=1)", "[_r(k, m, k)]", (1, 8, 24, 1500),
    )  # fmt: skip
    try:
        path = _spec(tmp_path, "linear-softmax")
    finally:
        del REFERENCES["linear-softmax"]
    graph, why = recognize(load_spec(path))
    assert graph is not None and graph.pattern == "pipeline", why
    assert variants(graph)[:3] == [
        "triton-gemm-splitk+triton-row", "triton-gemm-row+fused", "triton-gemm+triton-row"
    ]  # fmt: skip
    config = {f"s0_{k}": v for k, v in {**SMALL_TILE, "SPLIT_K": 4}.items()}
    source = generate(graph, config=config).source
    assert "def _s0_gemm_partial_kernel(" in source and 'CONFIG["s0_SPLIT_K"]' in source
    only = SPLIT_ONLY.replace("_gemm_kernel", "_s0_gemm_kernel")
    results = interpret({"pipeline": (str(path), source + only)}, tmp_path, tol=1e-5)
    assert results == {"pipeline": "ok"}, results


def test_only_the_path_asked_for_runs(tmp_path: Path, generated: dict[str, tuple[str, str, str]]) -> None:
    """The path markers bite: the split case with its split kernels gone, and the one-pass case with
    the one-pass kernel gone, both fail."""
    swapped = {
        "matmul@4": (generated["matmul@4"][0], generated["matmul@4"][1] + ONE_PASS_ONLY),
        "matmul@1": (generated["matmul@1"][0], generated["matmul@1"][1] + SPLIT_ONLY),
    }
    results = interpret(swapped, tmp_path, tol=1e-5)
    assert all("NoneType" in r for r in results.values()), results


def test_the_k_major_check_bites_where_b_is_not_copied(
    tmp_path: Path, generated: dict[str, tuple[str, str, str]]
) -> None:
    """B_KMAJOR 0 (the ieee default) hands b to the kernel as given: the check of the kmajor cases fails."""
    spec, source, _ = generated["matmul@1"]
    assert 'CONFIG["B_KMAJOR"] and _sbk != 1' in source and "'B_KMAJOR': 0" in source
    results = interpret({"as-given": (spec, source + checked(ONE_PASS_ONLY, B_K_CONTIGUOUS))}, tmp_path, 1e-5)
    assert "b is not K-contiguous" in results["as-given"], results


def test_the_padding_check_bites_where_k_is_not_padded(
    tmp_path: Path, generated: dict[str, tuple[str, str, str]]
) -> None:
    """PAD_K 0 on a K of 2000 hands the kernel K as it is: the check of the padk cases fails."""
    spec, source, _ = generated["ragged@4"]
    assert "'PAD_K': 0" in source
    results = interpret({"as-is": (spec, source + checked(SPLIT_ONLY, *padded(True, False)))}, tmp_path, 1e-5)
    assert "K is not padded" in results["as-is"], results


def test_pad_k_is_on_by_default_for_an_unaligned_k_in_a_large_product() -> None:
    """KernelBench 1/8's 8205 x 2949 x 5921: on; 4096^3 (aligned) and a mat-vec of K = 2949 (thin:
    a pass over a, which the copy would double): off. Offered in all three."""
    for (m, n, k), on in (((8205, 5921, 2949), 1), ((4096, 4096, 4096), 0), ((2048, 1, 2949), 0)):
        gen = generate(_gemm_graph(m, n, k), template="triton-gemm")
        assert gen.tunables["PAD_K"] == [0, 1] and gen.config["PAD_K"] == on, (m, n, k)


def test_b_kmajor_is_offered_only_for_an_n_contiguous_b_and_a_tf32_dot(tmp_path: Path) -> None:
    """A Linear's weight ([N, K]) is K-contiguous already, and half operands take the native dot: no
    knob. A [K, N] b: off with the ieee default, on in the 3xTF32 drafts and under a TF32 default."""
    assert "B_KMAJOR" not in generate(_gemm_graph(4096, 4096, 4096)).tunables
    graph = _graph(_spec(tmp_path, "matmul"))
    graph.rows, graph.cols, graph.inner, graph.batch = {"s": 2048}, {"s": 4096}, {"s": 8192}, {"s": 1}
    gen = generate(graph, template="triton-gemm")
    assert gen.tunables["B_KMAJOR"] == [0, 1] and gen.config["B_KMAJOR"] == 0 and gen.config["DOT"] == "ieee"
    assert gen.drafts and all(d["B_KMAJOR"] == 1 and d["DOT"] == "tf32x3" for d in gen.drafts)
    assert generate(graph, precision="tf32", template="triton-gemm").config["B_KMAJOR"] == 1
    assert generate(graph, precision="low", template="triton-gemm").config["B_KMAJOR"] == 0
    half = _graph(_spec(tmp_path, "matmul"))
    half.tensors = [TensorArg(t.name, t.source, t.layout, "bfloat16") for t in half.tensors]
    assert "B_KMAJOR" not in triton_gemm.knobs(half, ["native"], True)[0]


@pytest.mark.parametrize("case", ["matmul@4", "linear-gelu@4", "bmm@8"])
def test_a_split_k_candidate_passes_the_candidate_guards(
    case: str, generated: dict[str, tuple[str, str, str]]
) -> None:
    report = check_source(generated[case][1], accepted_kinds={"triton"}, platform="cuda")
    assert report.ok, report.violations


def test_the_epilogue_runs_once_on_the_full_sum(generated: dict[str, tuple[str, str, str]]) -> None:
    """The partial kernel stores acc as it is; only the sum kernel reads the bias and applies gelu."""
    source = generated["linear-gelu@4"][1]
    partial = source[source.index("def _gemm_partial_kernel(") : source.index("def _gemm_sum_kernel(")]
    total = source[source.index("def _gemm_sum_kernel(") : source.index("class ModelNew")]
    assert "fc_bias" not in partial and "erf" not in partial and "out0_ptr" not in partial
    assert "tl.store(ws_ptr + part + m2 * N + n2, acc, mask=mask)" in partial
    assert "fc_bias" in total and "erf" in total and "for s in tl.static_range(SPLITS):" in total


def test_the_one_pass_kernel_is_the_gemm_templates_own(tmp_path: Path) -> None:
    """SPLIT_K 1 (or an auto that gives 1) launches triton-gemm's kernel, character for character."""
    graph = _graph(_spec(tmp_path, "linear-gelu"))
    split = generate(graph, config=SMALL_TILE).source
    plain = generate(graph, config=SMALL_TILE, template="triton-gemm").source
    kernel = plain[plain.index("@triton.jit\ndef _gemm_kernel(") : plain.index("class ModelNew")]
    assert kernel in split


# -- the auto rule and which graphs get the template ----------------------------------------------------


def _splits(tiles: int, k_tiles: int, sms: int, split_k: int | str = "auto", mn: int = 256 * 256) -> int:
    """The K ranges the generated forward's own lines (`split_count_lines`) choose."""
    from types import SimpleNamespace

    import triton

    scope = {
        "triton": triton, "CONFIG": {"SPLIT_K": split_k}, "_tiles": tiles, "_batch": 1, "_kt": k_tiles,
        "_M": mn, "_N": 1, "_device": SimpleNamespace(type="cuda", index=0), "_sm_count": lambda index: sms,
    }  # fmt: skip
    exec("\n".join(triton_splitk.split_count_lines()), scope)
    assert (
        scope["_split"] * scope["_kps"] >= k_tiles > (scope["_split"] - 1) * scope["_kps"]
    )  # no empty range
    return int(scope["_split"])


def test_auto_splits_aims_at_two_programs_per_sm_with_a_few_slices_each() -> None:
    # KernelBench 1/6 on an H100: 4 tiles of 128 x 128, 16384 slices of 32: 66 ranges for 264
    # programs, rounded down to 64 (256 programs of 256 slices each, no mask)
    assert _splits(4, 16384, 132) == 64
    assert _splits(16, 32768, 132) == 16  # a matvec: 17 rounded down
    assert _splits(1024, 128, 132) == 1  # 4096^3: enough tiles
    assert _splits(4, 40, 132) == 4  # a short K: 5 ranges of 8 slices, rounded down
    assert _splits(4, 64, 4) == 2  # the interpreter's 4 SMs
    assert _splits(4, 100, 132, split_k=8) == 8  # a fixed SPLIT_K as given: 13 slices a range
    assert _splits(4, 16384, 132, mn=1 << 22) == 16  # the workspace bound (2**26 values)


def _gemm_graph(m: int, n: int, k: int, batch: int = 1, dtype: str = "float32") -> OpGraph:
    """A Linear's gemm graph ("nk" weight, bias) with one spec shape; nothing traced."""
    tensors = [
        TensorArg("x", "input:0", "full", dtype),
        TensorArg("fc_weight", "param:fc.weight", "full", dtype),
        TensorArg("fc_bias", "param:fc.bias", "col", dtype),
    ]
    return OpGraph(
        "gemm", tensors, [], ["acc"], dtype=dtype, gemm=GemmInfo("x", "fc_weight", "nk", bias="fc_bias"),
        forward_args=["x"], rows={"s": batch * m}, cols={"s": n}, inner={"s": k}, batch={"s": batch},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("shape", "split_first"),
    [
        ((256, 256, 1 << 19), True),  # KernelBench 1/6: 4 tiles, 16384 slices
        ((2048, 1, 1 << 20), True),  # a matvec: 16 tiles of 128 x 16
        ((128, 8192, 8192), True),  # a batch of 128 through an 8192 x 8192 Linear: 64 tiles
        ((4096, 4096, 4096), False),  # KernelBench 1/1: 1024 tiles
        ((1024, 8192, 8192), False),  # KernelBench 2's large Linears: 512 tiles
        ((256, 256, 2048), False),  # few tiles, a short K: 64 slices
        ((1024, 2048, 65536), False),  # a long K, but 128 tiles: most SMs busy
    ],
)
def test_split_k_is_drafted_first_only_for_few_tiles_and_a_long_k(
    shape: tuple[int, int, int], split_first: bool
) -> None:
    graph = _gemm_graph(*shape)
    expected = ["triton-gemm-splitk", "triton-gemm"] if split_first else ["triton-gemm"]
    assert variants(graph) == expected
    assert triton_splitk.applies(graph) == split_first


def test_square_gemm_drafts_stay_as_they_were() -> None:
    """4096^3 and 1024 x 8192 x 8192: the default and the presets of triton-gemm, no SPLIT_K."""
    for m, n, k in ((4096, 4096, 4096), (1024, 8192, 8192)):
        graph = _gemm_graph(m, n, k)
        gen = generate(graph)
        parts = triton_gemm.build(graph, "strict_fp32")
        assert gen.template == "triton-gemm" and "SPLIT_K" not in gen.tunables
        assert gen.config == parts.defaults and gen.drafts == parts.drafts
        assert "_gemm_partial_kernel" not in gen.source


def test_the_tuner_drafts_split_k_first_with_both_dots(tmp_path: Path) -> None:
    """A 256 x 256 x 2**19 spec shape (traced on the meta device only): the first draft is split-K
    "auto" with the ieee dot, the one-pass default follows, then split-K with 3xTF32; SPLIT_K's
    fixed values are in the tuner's space."""
    from kernelevolve.synth.tuner.templates import bases_for

    spec = load_spec(_spec(tmp_path, "matmul"))
    bases, why = bases_for(spec, "cuda")
    assert [b.label for b in bases[:3]] == ["triton-gemm-splitk", "triton-gemm", "triton-gemm-splitk"], why
    first, second, third = bases[:3]
    assert first.config["SPLIT_K"] == "auto" and first.config["DOT"] == "ieee"
    assert "SPLIT_K" not in second.config and second.config["DOT"] == "ieee"
    assert third.config == {**first.config, "DOT": "tf32x3", "B_KMAJOR": 1}
    assert first.space is not None and {2, 4, 8, 16, 32, 1, "auto"} <= set(first.space["SPLIT_K"])


def test_half_inputs_split_with_the_native_dot() -> None:
    graph = _gemm_graph(256, 256, 1 << 19, dtype="bfloat16")
    gen = generate(graph, precision="low")
    assert gen.template == "triton-gemm-splitk" and gen.tunables["DOT"] == ["native"]
    assert gen.config["BLOCK_K"] == 64 and gen.config["SPLIT_K"] == "auto"


@pytest.mark.gpu
@pytest.mark.parametrize("dot", ["ieee", "tf32x3"])
def test_a_256_by_256_gemm_of_k_2_to_the_19_splits_on_cuda(tmp_path: Path, dot: str) -> None:
    """KernelBench 1/6's shape compiled on a GPU, split-K "auto" (the split path only): within 1e-5
    of float64 in norm (strict fp32 asks 5e-5) and 1e-4 per element, on uniform inputs."""
    import importlib.util

    import torch

    spec = _spec(tmp_path, "matmul", small=LONG)
    source = generate(_graph(spec), config={"DOT": dot}).source + SPLIT_ONLY
    (tmp_path / "cand.py").write_text(source)
    found = importlib.util.spec_from_file_location("splitk_cand", tmp_path / "cand.py")
    assert found is not None and found.loader is not None
    mod = importlib.util.module_from_spec(found)
    found.loader.exec_module(mod)
    torch.manual_seed(0)
    a, b = torch.rand(256, 1 << 19, device="cuda"), torch.rand(1 << 19, 256, device="cuda")
    got, want = mod.ModelNew()(a, b).double(), a.double() @ b.double()
    assert float((got - want).norm() / want.norm()) < 1e-5
    assert float(((got - want).abs() / want.abs()).max()) < 1e-4


def test_a_batched_b_is_drafted_once_more_wide_and_as_given(tmp_path: Path) -> None:
    """A b per batch item is as large as the product reads: copying it K-contiguous costs that pass
    again (KernelBench 1/3 on an H100: 3xTF32 32 x 256 with b as given 1.14x of cuBLAS fp32, every
    tile with b copied 0.96x at best). Its drafts end with that tile and b as given; a b shared by
    the batch (a matmul's) is not drafted so."""
    wide_as_given = {"BLOCK_M": 32, "BLOCK_N": 256, "DOT": "tf32x3", "B_KMAJOR": 0}

    def drafts(name: str, small: tuple[int, int, int, int]) -> list[dict[str, int | str]]:
        graph, why = recognize(load_spec(_spec(tmp_path, name, small=small)))
        assert graph is not None, why
        return triton_gemm.build(graph, "strict_fp32").drafts

    batched = drafts("bmm", (128, 512, 2048, 1024))
    assert wide_as_given.items() <= batched[-1].items(), batched[-1]
    assert [d["B_KMAJOR"] for d in batched] == [1, 1, 1, 0]  # the presets copy b, the last does not
    shared = drafts("matmul", (1, 2048, 4096, 8192))
    assert all(d["B_KMAJOR"] == 1 for d in shared) and len(shared) == 3
