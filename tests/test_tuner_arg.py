"""argmax and argmin through the offline tuner (issue J): a reference that takes the index of the
largest or smallest value over a dim (a middle one, the last, every dim; keepdim or not; after an
elementwise prologue) is recognized as an `arg` graph (`aten_arg`), generated as a Triton candidate
(`triton_arg`), passes the candidate guards, and returns exactly torch's int64 indices under the
Triton interpreter: ties to the first index, NaN first, rows of -inf or +inf, across chunks.
What it cannot generate is refused with the reason.
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
from tests.tuner_interp import interpret

HEADER = "import torch\nimport torch.nn as nn\n\n"

# name: (forward's expression, the input's shape, the -inf and +inf rows' indexing, a cast)
REFERENCES = {
    "argmax-middle": ("torch.argmax(x, dim=1)", "(3, 37, 5)", "[1, :, 2]", "[2, :, 4]", ""),
    "argmin-middle": ("torch.argmin(x, dim=1)", "(3, 37, 5)", "[1, :, 2]", "[2, :, 4]", ""),
    "argmax-last": ("torch.argmax(x, dim=-1)", "(6, 100)", "[3]", "[4]", ""),
    "argmin-last-keepdim": ("torch.argmin(x, dim=1, keepdim=True)", "(6, 100)", "[3]", "[4]", ""),
    "argmax-every-dim": ("torch.argmax(x)", "(4, 9, 7)", "[0]", "[1]", ""),
    "argmin-first-dim": ("torch.argmin(x, 0)", "(40, 3, 2)", "[:, 1, 1]", "[:, 2, 0]", ""),
    "argmax-bf16": ("torch.argmax(x, dim=2)", "(3, 5, 50)", "[0, 1]", "[1, 1]", ".bfloat16()"),
    "argmax-prologue": ("torch.argmax(x * 2.0 - y, dim=1)", "(3, 37, 5)", "[1, :, 2]", "[2, :, 4]", ""),
}
SMALL = {"CHUNK": 8, "ROWS": 4}  # several chunks per row: ties and NaN across chunk boundaries
WIDE = {"CHUNK": 64, "ROWS": 1}


def _spec(tmp: Path, name: str) -> Path:
    """A spec whose input holds many ties (small integers), NaN in a few places, and a whole row of
    -inf and one of +inf."""
    expr, shape, inf_row, sup_row, cast = REFERENCES[name]
    prologue = "y" in expr.replace("torch.", "")
    args, extra = ("x, y", ", torch.randint(0, 2, (37, 1)).float()") if prologue else ("x", "")
    path = tmp / f"{name.replace('-', '_')}.py"
    path.write_text(HEADER + textwrap.dedent(f"""
        class Model(nn.Module):
            def forward(self, {args}):
                return {expr}


        def get_inputs():
            torch.manual_seed(1)
            x = torch.randint(0, 4, {shape}).float()
            flat = x.view(-1)
            flat[torch.randperm(flat.numel())[:3]] = float("nan")
            x{inf_row} = float("-inf")
            x{sup_row} = float("inf")
            return [x{cast}{extra}]


        def get_init_inputs():
            return []
        """))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("arg")
    out = {}
    for name in REFERENCES:
        path = _spec(tmp, name)
        graph, why = recognize(load_spec(path))
        assert graph is not None and graph.pattern == "arg", why
        assert graph.dtype == "int64" and variants(graph) == ["triton-arg"]
        out[name] = (str(path), generate(graph).source)
        out[f"{name}@small"] = (str(path), generate(graph, config=SMALL).source)
        out[f"{name}@wide"] = (str(path), generate(graph, config=WIDE).source)
    return out


@pytest.fixture(scope="module")
def interpreted(
    generated: dict[str, tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return interpret(generated, tmp_path_factory.mktemp("arg-run"), tol=0.0)


CASES = [f"{name}{how}" for name in REFERENCES for how in ("", "@small", "@wide")]


@pytest.mark.parametrize("case", CASES)
def test_generated_argmax_matches_torch_exactly_under_the_interpreter(
    case: str, interpreted: dict[str, str]
) -> None:
    assert interpreted[case] == "ok", interpreted[case]


@pytest.mark.parametrize("case", CASES)
def test_generated_argmax_passes_the_candidate_guards(
    case: str, generated: dict[str, tuple[str, str]]
) -> None:
    report = check_source(generated[case][1], accepted_kinds={"triton"}, platform="cuda")
    assert report.ok, report.violations


def test_the_inputs_hold_ties_nan_and_infinite_rows(tmp_path: Path) -> None:
    """The cases above exercise what they claim: the reference's answer depends on the tie-break."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("argmax_middle", _spec(tmp_path, "argmax-middle"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (x,) = module.get_inputs()
    assert bool(x.isnan().any()) and bool((x[1, :, 2] == float("-inf")).all())
    rows = x.permute(0, 2, 1).reshape(-1, 37)
    finite = rows[~rows.isnan().any(dim=1) & rows.isfinite().all(dim=1)]
    assert int(((finite == finite.max(dim=1, keepdim=True).values).sum(dim=1) > 1).sum()) > 0


def _refusal(tmp: Path, body: str, inputs: str = "[torch.randn(3, 7, 5)]", dtype: str = "") -> str:
    path = tmp / "refused.py"
    ext = f'\nKERNELEVOLVE = {{"dtype": "{dtype}"}}\n' if dtype else ""
    path.write_text(HEADER + textwrap.dedent(f"""
        class Model(nn.Module):
            def forward(self, x):
                return {body}


        def get_inputs():
            return {inputs}


        def get_init_inputs():
            return []
        """) + ext)  # fmt: skip
    graph, why = recognize(load_spec(path))
    assert graph is None
    return why


def test_what_the_arg_template_cannot_do_is_refused_with_the_reason(tmp_path: Path) -> None:
    assert "used as data" in _refusal(tmp_path, "torch.argmax(x, dim=1) + 1")
    # exp and sqrt may round otherwise than torch's: not in the arg graph, nor as a stage before it.
    inexact = _refusal(tmp_path, "torch.argmax(torch.exp(x) + torch.sqrt(x), dim=1)")
    assert "need not be torch's to the bit" in inexact
    assert "an earlier stage computed" in _refusal(tmp_path, "torch.argmax(x @ x.transpose(1, 2), dim=1)")
    # A half-precision prologue: torch rounds x * 3 to float16; neither the arg graph nor a stage takes it.
    half = _refusal(tmp_path, "torch.argmax(x * 3.0, dim=1)", dtype="float16")
    assert "need not be torch's to the bit" in half
    assert "used as data (a float32 output)" in _refusal(tmp_path, "torch.argmax(x, dim=1).float()")
    assert "different dtypes" in _refusal(tmp_path, "torch.max(x, dim=1)")


def test_the_cpu_generator_refuses_arg_graphs(tmp_path: Path) -> None:
    graph, why = recognize(load_spec(_spec(tmp_path, "argmax-last")))
    assert graph is not None, why
    with pytest.raises(NotImplementedError, match="CPU templates"):
        c_codegen.generate(graph)


def test_the_arg_kernel_is_compiled_without_fused_multiply_adds(tmp_path: Path) -> None:
    """torch rounds a prologue's x * c - y twice (two kernels); Triton contracts them into one FMA by
    default, whose single rounding moves a value by an ulp and an index with it."""
    graph, why = recognize(load_spec(_spec(tmp_path, "argmax-prologue")))
    assert graph is not None, why
    assert "enable_fp_fusion=False" in generate(graph).source


@pytest.mark.gpu
def test_triton_without_fp_fusion_rounds_a_multiply_add_as_torch_does() -> None:
    """What the arg template relies on, on this GPU's Triton: with fusion (the default) x * 1.3 - y
    differs from torch's in some elements; with `enable_fp_fusion=False`, in none."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def mul_sub(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x * 1.3 - y, mask=mask)

    torch.manual_seed(0)
    x, y = torch.rand(1 << 20, device="cuda") + 1, torch.rand(1 << 20, device="cuda")
    want = x * 1.3 - y
    differs = {}
    for fusion in (True, False):
        out = torch.empty_like(x)
        mul_sub[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024, enable_fp_fusion=fusion)
        differs[fusion] = int((out != want).sum())
    assert differs[False] == 0, differs
    assert differs[True] > 0, differs  # else the test shows nothing: fusion changed no value
