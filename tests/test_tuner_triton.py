"""The Triton code generator (`synth.tuner.triton_codegen`): hand-built OpGraphs in, candidate files
out. Every generated file must pass the candidate guards, declare well-formed tunables, and compute
what its spec's reference computes, for the default configuration and others.

Correctness runs under the Triton interpreter on CPU tensors, in one subprocess for all cases (the
interpreter is switched on by TRITON_INTERPRET before triton is imported, and stays out of this
process). The GPU test at the end runs the generated kernels compiled, on CUDA.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kernelevolve import tunables
from kernelevolve.evaluate.guards import check_source
from kernelevolve.synth.tuner.ir import GemmInfo, Op, OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_codegen import CodegenError, generate, variants
from kernelevolve.tunables import TunablesError
from tests.tuner_interp import SCRIPT_PRELUDE, interpret_script

SPECS = Path(__file__).parent / "specs"
SUITES = Path(__file__).parent.parent / "suites"

# -- graphs, as the tracer would build them from the tg_* specs ---------------------------------------


def ops_graph() -> OpGraph:
    x, y = TensorArg("x", "input:0", "full"), TensorArg("y", "input:1", "full")
    ops = [Op("p0", "abs", ("x",)), Op("p", "add", ("p0", 0.1)), Op("lk", "mul", (0.01, "x")),
           Op("tiny", "mul", ("x", 1e-6))]  # fmt: skip
    outs: list[tuple[str, tuple[Any, ...]]] = [
        ("add", ("x", "y")), ("sub", ("x", "y")), ("mul", ("x", "y")), ("div", ("x", "p")),
        ("maximum", ("x", "y")), ("minimum", ("x", "y")),
        ("pow", ("p", 2)), ("pow", ("p", 0.5)), ("pow", ("x", 3)), ("pow", ("p", -0.5)),
        ("pow", ("p", 1.7)), ("pow", ("x", 5)), ("pow", ("x", 6.0)), ("pow", ("p", -1)),
        ("pow", ("x", 0)), ("pow", ("p", -2.5)),
        ("neg", ("x",)), ("abs", ("x",)), ("exp", ("x",)), ("log", ("p",)), ("sqrt", ("p",)),
        ("rsqrt", ("p",)), ("reciprocal", ("p",)), ("square", ("x",)), ("tanh", ("x",)),
        ("sigmoid", ("x",)), ("relu", ("x",)), ("erf", ("x",)), ("silu", ("x",)), ("gelu", ("x",)),
        ("gelu_tanh", ("x",)), ("clamp", ("x", -0.5, None)), ("clamp", ("x", -0.5, 0.7)),
        ("where_gt0", ("x", "x", "lk")),
        ("log1p", ("p",)), ("log1p", ("tiny",)), ("expm1", ("x",)), ("expm1", ("tiny",)),
    ]  # fmt: skip
    ops += [Op(f"o{i}", name, args) for i, (name, args) in enumerate(outs)]
    return OpGraph(
        "elementwise", [x, y], ops, [f"o{i}" for i in range(len(outs))], forward_args=["x", "y"],
        rows={"tiny": 6}, cols={"tiny": 70}, description="every elementwise op",
    )  # fmt: skip


def elementwise_graph() -> OpGraph:
    tensors = [
        TensorArg("x", "input:0", "full"),
        TensorArg("scale", "param:scale", "col"),
        TensorArg("r", "input:1", "row"),
        TensorArg("shift", "param:shift", "scalar"),
    ]
    ops = [
        Op("a", "mul", ("x", "scale")), Op("h", "add", ("a", "r")), Op("g", "gelu_tanh", ("h",)),
        Op("c", "clamp", ("g", -1.0, 2.0)), Op("s", "sigmoid", ("x",)), Op("m", "mul", ("c", "s")),
        Op("shift2", "mul", ("shift", 2.0)), Op("y", "add", ("m", "shift2")),
        Op("t", "tanh", ("h",)), Op("t2", "pow", ("t", 2)),
    ]  # fmt: skip
    init = """
        def __init__(self, cols):
            super().__init__()
            self.scale = nn.Parameter(torch.randn(cols))
            self.register_buffer("shift", torch.tensor(0.5))
    """
    return OpGraph(
        "elementwise", tensors, ops, ["y", "t2"], forward_args=["x", "r"], init_source=init,
        rows={"tiny": 6}, cols={"tiny": 50}, description="scaled gelu_tanh, clamp, sigmoid gate",
    )  # fmt: skip


def gelu_bf16_graph() -> OpGraph:
    return OpGraph(
        "elementwise", [TensorArg("x", "input:0", "full", "bfloat16")], [Op("y", "gelu", ("x",))], ["y"],
        dtype="bfloat16", forward_args=["x"], rows={"tiny": 8}, cols={"tiny": 300},
    )  # fmt: skip


def softmax_graph() -> OpGraph:
    ops = [
        Op("m", "amax", ("x",)), Op("d", "sub", ("x", "m")), Op("e", "exp", ("d",)),
        Op("s", "sum", ("e",)), Op("y", "div", ("e", "s")), Op("ls", "log", ("s",)),
        Op("z", "sub", ("d", "ls")),
    ]  # fmt: skip
    return OpGraph(
        "row", [TensorArg("x", "input:0", "full")], ops, ["y", "z"], forward_args=["x"],
        rows={"narrow": 10, "wide": 3}, cols={"narrow": 100, "wide": 1500}, description="softmax, log-softmax",
    )  # fmt: skip


def rmsnorm_graph() -> OpGraph:
    ops = [
        Op("sq", "pow", ("x", 2)), Op("ms", "mean", ("sq",)), Op("v", "add", ("ms", 1e-6)),
        Op("rs", "rsqrt", ("v",)), Op("n", "mul", ("x", "rs")), Op("y", "mul", ("n", "w")),
    ]  # fmt: skip
    init = """
    def __init__(self, cols, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(cols))
        self.eps = eps
    """
    return OpGraph(
        "row", [TensorArg("x", "input:0", "full"), TensorArg("w", "param:weight", "col")], ops, ["y"],
        forward_args=["x"], init_source=init, rows={"narrow": 9, "wide": 3}, cols={"narrow": 96, "wide": 1100},
    )  # fmt: skip


def layernorm_graph() -> OpGraph:
    tensors = [
        TensorArg("x", "input:0", "full"),
        TensorArg("norm_weight", "param:norm.weight", "col"),
        TensorArg("norm_bias", "param:norm.bias", "col"),
    ]
    ops = [
        Op("mu", "mean", ("x",)), Op("d", "sub", ("x", "mu")), Op("d2", "mul", ("d", "d")),
        Op("var", "mean", ("d2",)), Op("ve", "add", ("var", 1e-5)), Op("rs", "rsqrt", ("ve",)),
        Op("n", "mul", ("d", "rs")), Op("w", "mul", ("n", "norm_weight")), Op("y", "add", ("w", "norm_bias")),
    ]  # fmt: skip
    init = "def __init__(self, cols):\n    super().__init__()\n    self.norm = nn.LayerNorm(cols)\n"
    return OpGraph(
        "row", tensors, ops, ["y"], forward_args=["x"], init_source=init,
        rows={"narrow": 7, "wide": 3}, cols={"narrow": 80, "wide": 1300}, description="layer norm",
    )  # fmt: skip


def rowmix_graph() -> OpGraph:
    tensors = [
        TensorArg("x", "input:0", "full"),
        TensorArg("r", "input:1", "row"),
        TensorArg("w", "param:w", "col"),
        TensorArg("s", "param:s", "scalar"),
    ]
    ops = [
        Op("lo", "amin", ("x",)), Op("hi", "amax", ("x",)), Op("ra", "abs", ("r",)),
        Op("d1", "sub", ("hi", "lo")), Op("d2", "add", ("d1", "ra")), Op("d3", "add", ("d2", 1.0)),
        Op("n", "sub", ("x", "lo")), Op("t0", "div", ("n", "d3")), Op("t1", "mul", ("t0", "w")),
        Op("t", "add", ("t1", "s")), Op("tt", "mul", ("t", "t")), Op("m2", "mean", ("tt",)),
        Op("m3", "add", ("m2", 1e-5)), Op("rs", "rsqrt", ("m3",)), Op("y", "mul", ("t", "rs")),
    ]  # fmt: skip
    init = """
    def __init__(self, cols):
        super().__init__()
        self.w = nn.Parameter(torch.randn(cols))
        self.s = nn.Parameter(torch.tensor(0.25))
    """
    return OpGraph(
        "row", tensors, ops, ["y", "t"], forward_args=["x", "r"], init_source=init,
        rows={"narrow": 6, "wide": 3}, cols={"narrow": 90, "wide": 1200},
    )  # fmt: skip


def outer_graph() -> OpGraph:
    tensors = [TensorArg("r", "input:0", "row"), TensorArg("c", "input:1", "col")]
    ops = [Op("a", "add", ("r", "c")), Op("y", "sigmoid", ("a",))]
    return OpGraph("elementwise", tensors, ops, ["y"], forward_args=["r", "c"], rows={"t": 7}, cols={"t": 45})


def linear_gelu_graph() -> OpGraph:
    tensors = [
        TensorArg("x", "input:0", "full"),
        TensorArg("fc_weight", "param:fc.weight", "full"),
        TensorArg("fc_bias", "param:fc.bias", "col"),
    ]
    init = """
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)
    """
    return OpGraph(
        "gemm", tensors, [Op("y", "gelu", ("acc",))], ["y"],
        gemm=GemmInfo("x", "fc_weight", "nk", bias="fc_bias"), forward_args=["x"], init_source=init,
        rows={"tiny": 10}, cols={"tiny": 24}, inner={"tiny": 40}, batch={"tiny": 1},
    )  # fmt: skip


def bmm_graph() -> OpGraph:
    tensors = [TensorArg(n, f"input:{i}", "full") for i, n in enumerate("abc")]
    ops = [Op("r", "relu", ("acc",)), Op("h", "mul", ("r", 0.5)), Op("y", "add", ("h", "c"))]
    return OpGraph(
        "gemm", tensors, ops, ["y"], gemm=GemmInfo("a", "b", "kn", batched=True), forward_args=["a", "b", "c"],
        rows={"tiny": 60}, cols={"tiny": 18}, inner={"tiny": 24}, batch={"tiny": 3},
    )  # fmt: skip


def scores_graph() -> OpGraph:
    tensors = [TensorArg("q", "input:0", "full"), TensorArg("k", "input:1", "full")]
    return OpGraph(
        "gemm", tensors, [Op("y", "mul", ("acc", 0.125))], ["y"], gemm=GemmInfo("q", "k", "nk", batched=True),
        forward_args=["q", "k"], rows={"tiny": 68}, cols={"tiny": 17}, inner={"tiny": 32}, batch={"tiny": 4},
    )  # fmt: skip


# -- cases: (graph, template, config, precision) x spec shape --------------------------------------


@dataclass
class Case:
    id: str
    spec: str
    graph: OpGraph
    params: dict[str, int] = field(default_factory=dict)
    template: str | None = None
    config: dict[str, Any] | None = None
    precision: str = "strict_fp32"
    tol: float = 1e-5  # rtol and atol


def _cases() -> list[Case]:
    ew, ops, bf = elementwise_graph(), ops_graph(), gelu_bf16_graph()
    sm, rms, ln = softmax_graph(), rmsnorm_graph(), layernorm_graph()
    lin, bmm, sc = linear_gelu_graph(), bmm_graph(), scores_graph()
    narrow_sm, wide_sm = {"batch": 2, "rows": 5, "cols": 100}, {"batch": 1, "rows": 3, "cols": 1500}
    cases = [
        Case("ops-default", "tg_ops.py", ops),
        Case("ops-persistent", "tg_ops.py", ops, template="triton-elementwise-persistent"),
        Case("ew-default", "tg_elementwise.py", ew),
        Case("ew-iters", "tg_elementwise.py", ew, config={"BLOCK": 256, "ITERS": 4, "num_warps": 2}),
        Case("ew-persistent", "tg_elementwise.py", ew, template="triton-elementwise-persistent",
             config={"BLOCK": 256, "WAVES": 1}),
        Case("ew-2d", "tg_elementwise.py", ew, template="triton-elementwise-2d"),
        Case(
            "ew-2d-tiles",
            "tg_elementwise.py",
            ew,
            template="triton-elementwise-2d",
            config={"BLOCK_R": 4, "BLOCK_C": 32, "num_warps": 2},
        ),
        Case("ew-bf16", "tg_gelu_bf16.py", bf, config={"BLOCK": 512}, precision="low", tol=2e-2),
    ]  # fmt: skip
    for name, spec, g, narrow, wide in [
        ("softmax", "tg_softmax.py", sm, narrow_sm, wide_sm),
        ("rmsnorm", "tg_rmsnorm.py", rms, {"rows": 9, "cols": 96}, {"rows": 3, "cols": 1100}),
        ("layernorm", "tg_layernorm.py", ln, {"rows": 7, "cols": 80}, {"rows": 3, "cols": 1300}),
    ]:
        cases += [
            Case(f"{name}-default", spec, g, narrow),
            Case(f"{name}-rows4", spec, g, narrow, config={"ROWS": 4, "num_warps": 2}),
            Case(f"{name}-rows32-wide", spec, g, wide, config={"ROWS": 32, "num_warps": 8}),
            Case(f"{name}-looped", spec, g, narrow, template="triton-row-looped"),
            Case(f"{name}-looped-chunks", spec, g, wide, template="triton-row-looped",
                 config={"CHUNK": 512, "ROWS": 2, "num_warps": 4}),
        ]  # fmt: skip
    mix, wide_mix = rowmix_graph(), {"rows": 3, "cols": 1200}
    cases += [
        Case("rowmix-default", "tg_rowmix.py", mix),
        Case("rowmix-looped", "tg_rowmix.py", mix, template="triton-row-looped"),
        Case("rowmix-looped-chunks", "tg_rowmix.py", mix, wide_mix, "triton-row-looped", {"CHUNK": 512}),
        Case("outer-default", "tg_outer.py", outer_graph()),
        Case("outer-2d", "tg_outer.py", outer_graph(), template="triton-elementwise-2d"),
        Case("linear-default", "tg_linear_gelu.py", lin),
        Case("linear-tiles", "tg_linear_gelu.py", lin, config={"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1}),
        Case("linear-tf32x3", "tg_linear_gelu.py", lin, config={"BLOCK_K": 64, "GROUP_M": 4, "DOT": "tf32x3"}),
        Case("linear-tf32", "tg_linear_gelu.py", lin, precision="tf32"),
        Case("linear-low", "tg_linear_gelu.py", lin, precision="low", config={"DOT": "tf32"}),
        Case("bmm-default", "tg_bmm.py", bmm),
        Case("bmm-tiles", "tg_bmm.py", bmm, config={"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}),
        Case("bmm-wide", "tg_bmm.py", bmm, config={"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 64}),
        # the presets the tuner drafts after the default (3xTF32, a wide-N tile clamped to this N)
        *[Case(f"bmm-draft{i}", "tg_bmm.py", bmm, config=d) for i, d in enumerate(generate(bmm).drafts)],
        Case("scores-default", "tg_scores.py", sc),
        Case("scores-tiles", "tg_scores.py", sc, config={"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1}),
        Case("scores-even-k", "tg_scores.py", sc, config={"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32}),
    ]  # fmt: skip
    return cases


CASES = _cases()


def _generate(case: Case) -> str:
    return generate(case.graph, case.config, case.precision, case.template).source


_RUNNER = r"""
import importlib.util, inspect, json, sys
import torch

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def call(fn, params):
    names = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in params.items() if k in names})

results = {}
for i, case in enumerate(json.load(open(sys.argv[1]))):
    try:
        ref_mod = load(case["spec"], f"tg_spec_{i}")
        cand = load(case["candidate"], f"tg_cand_{i}")
        torch.manual_seed(0)
        init = call(getattr(ref_mod, "get_init_inputs", lambda: []), case["params"])
        ref = ref_mod.Model(*init)
        with torch.no_grad():
            for p in ref.parameters():  # away from ones and zeros, so a skipped weight shows
                p.add_(torch.randn_like(p) * 0.5)
        new = cand.ModelNew(*init)
        new.load_state_dict(ref.state_dict())
        inputs = call(ref_mod.get_inputs, case["params"])
        with torch.no_grad():
            want, got = ref(*inputs), new(*inputs)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(want), f"{len(got)} outputs, expected {len(want)}"
        for j, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape and g.dtype == w.dtype, f"output {j}: {g.shape} {g.dtype} vs {w.shape} {w.dtype}"
            torch.testing.assert_close(g, w, rtol=case["tol"], atol=case["tol"], msg=lambda m, j=j: f"output {j}: {m}")
        results[case["id"]] = "ok"
    except Exception as exc:
        results[case["id"]] = f"{type(exc).__name__}: {exc}"
json.dump(results, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every case generated, written and run under the Triton interpreter in one subprocess."""
    tmp = tmp_path_factory.mktemp("triton-codegen")
    manifest = []
    for i, case in enumerate(CASES):
        path = tmp / f"cand_{i}.py"
        path.write_text(_generate(case))
        manifest.append(
            {
                "id": case.id,
                "spec": str(SPECS / case.spec),
                "candidate": str(path),
                "params": case.params,
                "tol": case.tol,
            }
        )
    (tmp / "cases.json").write_text(json.dumps(manifest))
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(tmp / "cases.json"), str(tmp / "results.json")],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp / "results.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_generated_kernel_matches_reference_under_interpreter(
    case: Case, interpreted: dict[str, str]
) -> None:
    assert interpreted[case.id] == "ok", interpreted[case.id]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_generated_source_passes_guards(case: Case) -> None:
    report = check_source(_generate(case), accepted_kinds=("triton",), platform="cuda")
    assert report.ok, (report.syntax_error, report.violations)
    assert report.kinds == {"triton"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_tunables_are_declared_and_rewritable(case: Case) -> None:
    gen = generate(case.graph, case.config, case.precision, case.template)
    declared = tunables.read(gen.source)
    assert declared == (gen.tunables, gen.config)
    assert all(gen.config[k] == v for k, v in (case.config or {}).items())
    other = {k: choices[0] for k, choices in gen.tunables.items()}
    rewritten = tunables.write(gen.source, other)
    assert tunables.read(rewritten) == (gen.tunables, other)
    assert rewritten.replace(tunables.format_config(other), tunables.format_config(gen.config)) == gen.source


# -- templates, defaults and errors -----------------------------------------------------------------


def test_variants_per_pattern_default_first() -> None:
    assert variants(elementwise_graph()) == [
        "triton-elementwise",
        "triton-elementwise-persistent",
        "triton-elementwise-2d",
    ]
    assert variants(ops_graph()) == ["triton-elementwise", "triton-elementwise-persistent"]
    assert variants(softmax_graph()) == ["triton-row", "triton-row-looped"]
    long_rows = softmax_graph()
    long_rows.cols = {"vocab": 131072}
    assert variants(long_rows)[0] == "triton-row-looped"
    assert generate(long_rows).template == "triton-row-looped"
    assert variants(bmm_graph()) == ["triton-gemm"]


def test_looped_pass_count_follows_reduction_stages() -> None:
    """Softmax's max and sum share a pass (online); layer norm needs mean, then variance, then the
    output: three passes; RMS norm two."""

    def loops(g: OpGraph) -> int:
        return generate(g, template="triton-row-looped").source.count("for i in range(NCHUNK):")

    assert loops(softmax_graph()) == 2
    assert loops(layernorm_graph()) == 3
    assert loops(rmsnorm_graph()) == 2
    assert loops(rowmix_graph()) == 3  # amin and amax together, then the mean, then the outputs


def test_defaults_follow_shapes_and_precision() -> None:
    assert generate(softmax_graph()).config == {"ROWS": "auto", "num_warps": "auto"}
    long_rows = softmax_graph()
    long_rows.cols = {"s": 65536}
    assert generate(long_rows).config == {"CHUNK": 4096, "ROWS": 1, "num_warps": 8}
    big = bmm_graph()
    big.rows, big.cols, big.batch = {"s": 8 * 4096}, {"s": 4096}, {"s": 8}
    cfg = generate(big).config
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["DOT"]) == (128, 128, "ieee")
    assert generate(big, precision="tf32").config["DOT"] == "tf32"
    assert generate(big, precision="low").config["DOT"] == "bf16"
    src = generate(linear_gelu_graph()).source
    assert "input_precision=DOT" in src and "fc_weight" in src


def test_gemm_drafts_are_presets_with_the_fast_dot_fitted_to_the_shape() -> None:
    big = bmm_graph()
    big.rows, big.cols, big.batch, big.inner = {"s": 8 * 4096}, {"s": 4096}, {"s": 8}, {"s": 4096}
    gen = generate(big)
    # strict fp32: the default tile with 3xTF32 first, then the wide-N and narrow-N tiles, all 3xTF32
    # with b copied K-contiguous; a batched b once more wide-N with b as given
    assert gen.drafts[0] == {**gen.config, "DOT": "tf32x3", "B_KMAJOR": 1}  # b copied K-contiguous
    assert [(d["BLOCK_M"], d["BLOCK_N"], d["num_warps"], d["B_KMAJOR"]) for d in gen.drafts[1:]] == [
        (32, 256, 4, 1),
        (128, 64, 4, 1),
        (32, 256, 4, 0),
    ]
    assert {d["DOT"] for d in gen.drafts} == {"tf32x3"}
    for d in gen.drafts:
        assert d != gen.config and set(d) == set(gen.tunables)
        assert all(v in gen.tunables[k] for k, v in d.items())
    # tf32: its default dot is already the fast one, so only the two other tiles are drafted (and
    # the batched b's wide tile as given)
    assert [d["DOT"] for d in generate(big, precision="tf32").drafts] == ["tf32", "tf32", "tf32"]
    # a narrow product (N = 1, a mat-vec) never drafts a tile wider than its default's
    matvec = bmm_graph()
    matvec.rows, matvec.cols, matvec.batch, matvec.inner = {"s": 2048}, {"s": 1}, {"s": 1}, {"s": 1 << 20}
    narrow = generate(matvec)
    assert narrow.drafts and all(int(d["BLOCK_N"]) <= int(narrow.config["BLOCK_N"]) for d in narrow.drafts)
    assert len({tuple(sorted(d.items())) for d in narrow.drafts}) == len(narrow.drafts)
    # a configuration given is a candidate, not a template: nothing to draft
    assert generate(big, config={"BLOCK_K": 16}).drafts == []


def test_the_tuner_drafts_gemm_presets_after_the_default_template() -> None:
    from kernelevolve.spec import load_spec
    from kernelevolve.synth.tuner.templates import bases_for

    spec = load_spec(SPECS / "tg_bmm.py")
    bases, why = bases_for(spec, "cuda", ("triton",))
    assert not why and [b.kind for b in bases] == ["template"] * len(bases) and len(bases) >= 3
    default, presets = bases[0], bases[1:]
    assert default.why == "" and all("DOT 'ieee'->'tf32x3'" in b.why for b in presets)
    for b in presets:  # the default's file with only its CONFIG line rewritten
        assert tunables.write(b.source, default.config) == default.source
        assert tunables.read(b.source) == (default.space, b.config)


@pytest.mark.parametrize("precision", ["strict_fp32", "tf32"])
def test_a_sample_of_the_computation_is_drafted_before_a_template_s_second_preset(precision: str) -> None:
    """fm_interaction (suites): the template at its default, its first preset, then the knowledge
    base's sample of this computation, inside the draft phase's 4 nodes; the template's further
    presets after it. Before, the default and three presets took the 4 drafts and the sample (the two
    products fused per sample) was never tried."""
    import dataclasses

    from kernelevolve.search.policies import SearchConfig
    from kernelevolve.spec import load_spec
    from kernelevolve.synth.tuner.templates import bases_for

    spec = dataclasses.replace(load_spec(SUITES / "recsys" / "fm_interaction.py"), precision=precision)
    bases, why = bases_for(spec, "cuda", ("triton",))
    kinds = [(b.kind, bool(b.why)) for b in bases]
    assert not why and kinds[:3] == [("template", False), ("template", True), ("sample", False)], kinds
    assert bases[2].label == "samples/triton-fm_interaction" and SearchConfig().draft >= 3
    assert kinds[3:] == [("template", True)] * (len(kinds) - 3) and len(kinds) > 4


def test_half_inputs_take_the_native_dot() -> None:
    g = linear_gelu_graph()
    g.tensors = [TensorArg(t.name, t.source, t.layout, "bfloat16") for t in g.tensors]
    g.dtype = "bfloat16"
    gen = generate(g, precision="strict_fp32")
    assert gen.tunables["DOT"] == ["native"] and gen.config["BLOCK_K"] == 64


def test_nk_weight_is_read_through_strides_not_copied() -> None:
    src = generate(linear_gelu_graph()).source
    assert "self.fc.weight\n" in src  # no .contiguous(), no transpose: strides swap instead
    assert "_sbk, _sbn = _b.stride(1), _b.stride(0)" in src


def test_bad_config_and_template_are_refused() -> None:
    with pytest.raises(TunablesError, match="not one of"):
        generate(softmax_graph(), {"ROWS": 3})
    with pytest.raises(TunablesError, match="no tunable"):
        generate(softmax_graph(), {"BLOCK": 1024})
    with pytest.raises(CodegenError, match="does not apply"):
        generate(softmax_graph(), template="triton-gemm")
    with pytest.raises(CodegenError, match="precision"):
        generate(softmax_graph(), precision="fp8")


def test_unsupported_graphs_are_refused() -> None:
    g = elementwise_graph()
    g.ops = [*g.ops, Op("q", "sum", ("x",))]
    g.outputs = ["q"]
    with pytest.raises(CodegenError, match="only `row` graphs reduce"):
        generate(g)
    g = softmax_graph()
    g.dtype = "float64"
    with pytest.raises(CodegenError, match="float64"):
        generate(g)
    g = softmax_graph()
    g.ops = [*g.ops, Op("q", "cumsum", ("x",))]
    with pytest.raises(CodegenError, match="cumsum"):
        generate(g)


def test_module_without_init_source_gets_a_plain_constructor() -> None:
    src = generate(softmax_graph()).source
    assert "    def __init__(self):\n        super().__init__()\n" in src
    assert "    def forward(self, x):\n" in src


# -- GPU --------------------------------------------------------------------------------------------


def _import_generated(path: Path, source: str) -> Any:
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.gpu
@pytest.mark.parametrize("template", ["triton-row", "triton-row-looped"])
def test_row_softmax_on_cuda(template: str, tmp_path: Path) -> None:
    import torch

    g = softmax_graph()
    g.rows, g.cols = {"decode": 256, "wide": 1024}, {"decode": 1024, "wide": 8192}
    mod = _import_generated(tmp_path / "softmax_gen.py", generate(g, template=template).source)
    model = mod.ModelNew().cuda()
    shapes = [(256, 1024), (1024, 8192), (37, 1000), (8192, 4096)]
    if template == "triton-row-looped":
        shapes += [(4, 40000), (64, 131072)]
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device="cuda") * 3
        y, z = model(x)
        torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(z, torch.log_softmax(x, -1), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "template", ["triton-elementwise", "triton-elementwise-persistent", "triton-elementwise-2d"]
)
def test_elementwise_on_cuda(template: str, tmp_path: Path) -> None:
    import torch
    import torch.nn.functional as F

    g = elementwise_graph()
    g.rows, g.cols = {"big": 8192}, {"big": 4096}
    mod = _import_generated(tmp_path / "ew_gen.py", generate(g, template=template).source)
    model = mod.ModelNew(4096).cuda()
    x, r = torch.randn(4, 2048, 4096, device="cuda"), torch.randn(4, 2048, 1, device="cuda")
    h = x * model.scale + r
    y, t2 = model(x, r)
    want = torch.clamp(F.gelu(h, approximate="tanh"), -1.0, 2.0) * torch.sigmoid(x) + model.shift * 2.0
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(t2, torch.tanh(h) ** 2, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("precision", "config", "dtype"),
    [
        ("strict_fp32", {}, "float32"),
        ("strict_fp32", {"DOT": "tf32x3"}, "float32"),
        ("low", {}, "float32"),
        ("strict_fp32", {}, "bfloat16"),
    ],
)
def test_linear_gelu_on_cuda(precision: str, config: dict[str, Any], dtype: str, tmp_path: Path) -> None:
    import torch
    import torch.nn.functional as F

    g = linear_gelu_graph()
    g.tensors = [TensorArg(t.name, t.source, t.layout, dtype) for t in g.tensors]
    g.dtype = dtype
    g.rows, g.cols, g.inner = {"s": 2048}, {"s": 3072}, {"s": 1024}
    mod = _import_generated(tmp_path / "lin_gen.py", generate(g, config, precision).source)
    model = mod.ModelNew(1024, 3072).cuda().to(getattr(torch, dtype))
    for shape in [(4, 512, 1024), (3, 37, 1024), (1000, 1024)]:
        x = torch.randn(*shape, device="cuda", dtype=getattr(torch, dtype))
        y = model(x)
        want = F.gelu(x.double() @ model.fc.weight.double().t() + model.fc.bias.double())
        rel = ((y.double() - want).norm() / want.norm()).item()
        limit = 5e-5 if precision == "strict_fp32" and dtype == "float32" else 1.6e-2
        assert y.shape == want.shape and y.dtype == x.dtype and rel < limit, (shape, rel)


def test_generated_file_is_readable() -> None:
    """The file is meant to be read (and edited) by people and LLMs: a docstring, the imports, then
    the knobs, then the kernels and the module."""
    src = generate(elementwise_graph()).source
    head = textwrap.dedent(src).splitlines()
    assert head[0].startswith('"""scaled gelu_tanh')
    assert src.index("TUNABLES = ") < src.index("@triton.jit") < src.index("class ModelNew")
    assert "_tanh" in src and "def _tanh(x)" in src


def test_templates_declare_their_tile_and_defaults_fit_the_registers() -> None:
    """TILE names the knobs of the register tile (`tunables.fits`); whatever the shapes, a template's
    default configuration is within THREAD_TILE_LIMIT elements per thread."""
    tiles = {
        "triton-elementwise": ("BLOCK",),
        "triton-elementwise-persistent": ("BLOCK",),
        "triton-elementwise-2d": ("BLOCK_R", "BLOCK_C"),
        "triton-row": None,  # ROWS "auto" and a per-shape width: sized in the forward
        "triton-row-looped": ("ROWS", "CHUNK"),
        "triton-gemm": ("BLOCK_M", "BLOCK_N"),
    }
    seen = set()
    for size in (1, 7, 64, 1000, 4096, 65536, 1 << 20):
        graphs = [elementwise_graph(), outer_graph(), softmax_graph(), layernorm_graph(), bmm_graph(), linear_gelu_graph()]  # fmt: skip
        for g in graphs:
            g.cols = dict.fromkeys(g.cols, size)
            g.rows = dict.fromkeys(g.rows, size)
            for name in variants(g):
                gen = generate(g, template=name)
                line = next((ln for ln in gen.source.splitlines() if ln.startswith("TILE = ")), None)
                want = tiles[name]
                assert line == (None if want is None else f"TILE = {want!r}"), (name, line)
                per_thread = tunables.tile_per_thread(gen.source)
                assert (per_thread is None) == (want is None), name
                assert tunables.fits(gen.source), (name, size, gen.config, per_thread)
                smem = tunables.smem_bytes(gen.config, tunables.declared_smem(gen.source))
                assert (smem is not None) == (name == "triton-gemm"), name  # the K loop's buffers
                assert smem is None or smem <= tunables.SMEM_PER_BLOCK["cuda:sm90"], (name, gen.config)
                seen.add(name)
    assert seen == set(tiles)
    # The soak's timeouts: ROWS 8 x CHUNK 8192 (2048 per thread) at one warp does not fit.
    looped = generate(
        softmax_graph(), {"CHUNK": 8192, "ROWS": 8, "num_warps": 1}, template="triton-row-looped"
    )
    assert tunables.tile_per_thread(looped.source) == 2048 and not tunables.fits(looped.source)


def test_the_gemm_templates_shared_memory_is_what_triton_asked_for() -> None:
    """The GEMM template's SMEM bound at the configurations that failed to compile on an H200 (Triton
    3.6's "out of resource: shared memory, Required: N"): exactly N, above sm_90's limit, so the tuner
    would not have proposed them; split-K and the fused cross-entropy declare the same K loop."""
    from kernelevolve.spec import load_spec
    from kernelevolve.synth.tuner.trace import recognize

    graph = linear_gelu_graph()
    failed = [  # (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, DOT) -> Required, from the H200 benches
        ((256, 256, 32, 4, "tf32"), 262144),
        ((128, 256, 32, 5, "tf32"), 245760),
        ((64, 256, 64, 4, "tf32x3"), 327680),
    ]
    source = generate(graph, template="triton-gemm", precision="tf32").source
    terms = tunables.declared_smem(source)
    for (bm, bn, bk, stages, dot), required in failed:
        cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_stages": stages, "DOT": dot}
        assert tunables.smem_bytes(cfg, terms) == required
        assert not tunables.smem_fits(cfg, terms, "cuda:sm90")
    fits = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "num_stages": 3}  # the TF32 default: 147456
    assert tunables.smem_bytes(fits, terms) == 147456 and tunables.smem_fits(fits, terms, "cuda:sm90")
    half = linear_gelu_graph()
    half.tensors = [TensorArg(t.name, t.source, t.layout, "bfloat16") for t in half.tensors]
    half.dtype = "bfloat16"
    half_terms = tunables.declared_smem(generate(half, template="triton-gemm").source)
    assert tunables.smem_bytes(fits, half_terms) == 147456 // 2  # 2-byte operands
    suites = Path(__file__).resolve().parents[1] / "suites"
    ce_graph, why = recognize(load_spec(suites / "llm" / "linear_cross_entropy.py"))
    assert ce_graph is not None, why
    fused = generate(ce_graph, template="triton-gemm-ce+fused")
    assert "SMEM = ((4, 's0_num_stages', 's0_BLOCK_M', 's0_BLOCK_K')," in fused.source


# A matvec whose products are one 2**24 then 2.9s (a[:, 0] * b[0] = 4096**2): in one fp32 accumulator
# each later 16-wide tile's 46.4 rounds to 46 past 2**24, off by 4.9e-5 over 2048 tiles; in two levels
# (FOLD tiles, then the total), by 1.6e-6.
_MATVEC = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    a = torch.full((8, 32768), 2.9 ** 0.5)
    a[:, 0] = 4096.0
    b = torch.full((32768, 1), 2.9 ** 0.5)
    b[0] = 4096.0
    return [a, b]


def get_init_inputs():
    return []
"""
_AGAINST_FP64 = """
import importlib.util, sys, torch
mods = []
for i, path in enumerate(sys.argv[1:]):
    spec = importlib.util.spec_from_file_location(f"m{i}", path)
    mods.append(importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mods[-1])
a, b = mods[0].get_inputs()
got, want = mods[1].ModelNew()(a, b).double(), a.double() @ b.double()
print(float(((got - want).abs() / want.abs()).max()))
"""


def test_a_long_k_loop_sums_in_two_levels(tmp_path: Path) -> None:
    """A gemm of K = 32768 in 16-wide tiles (2048 > FOLD_ABOVE) accumulates FOLD tiles, then folds them
    into a second total: within 1e-5 of float64 where one accumulator is off by 4.9e-5 (KernelBench
    1/4's matvec, K = 2**20, was off by 1.5e-4). Short K loops keep one accumulator."""
    from kernelevolve.spec import load_spec
    from kernelevolve.synth.tuner.trace import recognize
    from kernelevolve.synth.tuner.triton_gemm import FOLD_ABOVE

    (tmp_path / "matvec.py").write_text(_MATVEC)
    graph, why = recognize(load_spec(tmp_path / "matvec.py"))
    assert graph is not None and graph.pattern == "gemm", why
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
    source = generate(graph, config=config, template="triton-gemm").source  # not split-K's first draft
    assert "if kt % FOLD == FOLD - 1:" in source and f"_kt <= {FOLD_ABOVE}" in source
    assert FOLD_ABOVE < 32768 // 16
    (tmp_path / "cand.py").write_text(source)
    out = interpret_script(_AGAINST_FP64, str(tmp_path / "matvec.py"), str(tmp_path / "cand.py"))
    assert float(out.split()[-1]) < 1e-5, out


@pytest.mark.gpu
def test_a_matvec_of_k_2_to_the_20_on_cuda_against_float64(tmp_path: Path) -> None:
    """Compiled on a GPU at triton-gemm's default configuration, a matvec [256, 2**20] @ [2**20, 1] of uniform
    values (32768 K tiles) within 1e-5 of float64 (KernelBench 1/4 was off by 1.5e-4)."""
    import torch

    from kernelevolve.spec import load_spec
    from kernelevolve.synth.tuner.trace import recognize

    spec = _MATVEC.replace("torch.full((8, 32768), 2.9 ** 0.5)", "torch.rand(256, 2**20)")
    spec = spec.replace("torch.full((32768, 1), 2.9 ** 0.5)", "torch.rand(2**20, 1)").replace("4096.0", "0.5")
    (tmp_path / "matvec.py").write_text(spec)
    graph, why = recognize(load_spec(tmp_path / "matvec.py"))
    assert graph is not None, why
    mod = _import_generated(tmp_path / "matvec_gen.py", generate(graph, template="triton-gemm").source)
    torch.manual_seed(0)
    a, b = torch.rand(256, 2**20, device="cuda"), torch.rand(2**20, 1, device="cuda")
    got, want = mod.ModelNew()(a, b).double(), a.double() @ b.double()
    assert float((got - want).norm() / want.norm()) < 1e-5


# Each rounded TF32 dot (`triton_common.ROUNDED_DOTS`) against the product of its operands rounded in
# float64: the interpreter's dot is exact in fp32, so each rounding the kernel makes shows.
_ROUNDED_DOTS = (
    SCRIPT_PRELUDE
    + r"""
a, b = load(sys.argv[1], "spec").get_inputs()
emulated = {"tf32": a.double() @ b.double(), "tf32ra": nearest_tf32(a) @ b.double(),
            "tf32r": nearest_tf32(a) @ nearest_tf32(b)}
out = {}
for path in sys.argv[2:]:
    got = load(path, path.split("/")[-1][:-3]).ModelNew()(a, b).double()
    out[path.split("/")[-1][:-3]] = {k: float((got - w).norm() / w.norm()) for k, w in emulated.items()}
print(json.dumps(out))
"""
)
_MATMUL = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.rand(32, 64), torch.rand(64, 48)]


def get_init_inputs():
    return []
"""


def test_rounded_tf32_dots_round_the_operands_they_name(tmp_path: Path) -> None:
    """At TF32 the GEMM template offers Triton's truncating dot ("tf32", its default) and the dots that
    round a ("tf32ra") or both operands ("tf32r") to the nearest TF32 value first: each equals its own
    float64 emulation (to fp32 summation) and is as far from the others as a TF32 rounding is (all
    terms positive: the rounding's effect does not average out)."""
    from kernelevolve.spec import load_spec
    from kernelevolve.synth.tuner.trace import recognize
    from kernelevolve.synth.tuner.triton_common import DOT_CHOICES

    (tmp_path / "mm.py").write_text(_MATMUL)
    graph, why = recognize(load_spec(tmp_path / "mm.py"))
    assert graph is not None and graph.pattern == "gemm", why
    assert DOT_CHOICES["tf32"][:3] == ["tf32", "tf32ra", "tf32r"]
    small = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
    assert generate(graph, precision="tf32").config["DOT"] == "tf32"
    assert "_tf32_round" not in generate(graph, precision="strict_fp32").source  # no TF32 offered
    paths = []
    for dot in ("tf32", "tf32ra", "tf32r"):
        source = generate(
            graph, config={**small, "DOT": dot}, precision="tf32", template="triton-gemm"
        ).source
        assert check_source(source, {"triton"}, platform="cuda").ok
        (tmp_path / f"{dot}.py").write_text(source)
        paths.append(str(tmp_path / f"{dot}.py"))
    errs = json.loads(interpret_script(_ROUNDED_DOTS, str(tmp_path / "mm.py"), *paths))
    for dot, err in errs.items():
        assert err[dot] < 1e-6, errs
        assert all(e > 2e-5 for other, e in err.items() if other != dot), errs


@pytest.mark.gpu
def test_rounded_tf32_dots_on_cuda_against_float64(tmp_path: Path) -> None:
    """Compiled on a GPU, a [1024, 1024] product of uniform values at TF32: the truncating dot is biased
    (its error adds up over K: above 4e-4 of the norm), the rounded one is not (below 1e-4)."""
    import torch

    from kernelevolve.spec import load_spec
    from kernelevolve.synth.tuner.trace import recognize

    (tmp_path / "mm.py").write_text(_MATMUL)
    graph, why = recognize(load_spec(tmp_path / "mm.py"))
    assert graph is not None, why
    torch.manual_seed(0)
    a, b = torch.rand(1024, 1024, device="cuda"), torch.rand(1024, 1024, device="cuda")
    want = a.double() @ b.double()
    errs = {}
    for dot in ("tf32", "tf32r"):
        source = generate(graph, config={"DOT": dot}, precision="tf32", template="triton-gemm").source
        got = _import_generated(tmp_path / f"mm_{dot}.py", source).ModelNew()(a, b).double()
        errs[dot] = float((got - want).norm() / want.norm())
    assert errs["tf32"] > 4e-4 and errs["tf32r"] < 1e-4, errs
