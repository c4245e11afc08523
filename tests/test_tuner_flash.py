"""Attention's three stages as one flash-attention kernel (`triton_flash`, issue K), and a constant
made from a size where a spec's shapes differ (`shape_consts`).

The flash variant is offered first in every attention pipeline, before the stage-by-stage one, and
is the default template (test_tuner_attention's references run it under the interpreter at every
variant); here: what it fuses and refuses, its masking of the keys
past the sequence's end and SDPA's guard for a row that sees no key, each shown to matter by the
generated file with that line taken out; the suites' attention, whose scale is 1/sqrt(head dim) at
head dims of 64 and 128 and whose shapes include a batch of one, templated once for all its shapes
and correct at two of them; a constant that is no power of a size still refused, with the reason.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path

import pytest
import torch

from kernelevolve.evaluate.guards import check_source
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import shape_consts, shape_views, triton_gemm
from kernelevolve.synth.tuner.aten_attention import causal_mask
from kernelevolve.synth.tuner.ir import GemmInfo, Op, OpGraph, TensorArg
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate, variants
from kernelevolve.synth.tuner.triton_common import CodegenError, check_graph
from tests.tuner_interp import SCRIPT_PRELUDE, interpret, interpret_script

FLASH = "triton-flash+fused+fused"
SMALL = {"s0_BLOCK_M": 16, "s0_BLOCK_N": 16, "s0_DOT": "ieee", "s0_num_warps": 2}
SUITES = Path(__file__).resolve().parents[1] / "suites"

ATTENTION = '''"""Attention over [B, H, S, D]{note}."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, q, k, v):
{body}


def get_inputs(batch: int = {b}, heads: int = 2, seq: int = {s}, dim: int = {d}):
    return [torch.randn(batch, heads, seq, dim) for _ in range(3)]


def get_init_inputs():
    return []
{extra}'''


def _spec(tmp: Path, name: str, body: str, *, init: str = "pass", b: int = 2, s: int = 40, d: int = 16,
          extra: str = "", note: str = "") -> Path:  # fmt: skip
    path = tmp / f"{name}.py"
    path.write_text(
        ATTENTION.format(
            note=note, init=textwrap.indent(init, " " * 8), body=textwrap.indent(body, " " * 8),
            b=b, s=s, d=d, extra=extra,
        )
    )  # fmt: skip
    return path


def _graph(path: Path) -> OpGraph:
    graph, why = recognize(load_spec(path))
    assert graph is not None, why
    return graph


MANUAL = "att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\nreturn torch.softmax(att, dim=-1) @ v"
DEAD_ROW = (  # query 3 sees no key: the reference's softmax of a row of -inf
    "m = torch.tril(torch.ones(48, 48))\nm[3] = 0.0\nself.register_buffer('bias', m.view(1, 1, 48, 48))"
)
MASKED = (
    "att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
    "att = att.masked_fill(self.bias[:, :, :q.size(-2), :q.size(-2)] == 0, float('-inf'))\n"
)


def test_the_flash_variant_is_offered_first_and_writes_one_kernel(tmp_path: Path) -> None:
    graph = _graph(_spec(tmp_path, "manual", MANUAL))
    assert [s.pattern for s in graph.stages] == ["gemm", "row", "gemm"]
    assert variants(graph)[:2] == [FLASH, "triton-gemm+triton-row+triton-gemm"]
    gen = generate(graph)
    assert gen.template == FLASH
    assert len(re.findall(r"^@triton\.jit", gen.source, re.M)) == 1
    assert "_s0_flash_kernel[" in gen.source and "_stage1" not in gen.source
    assert gen.config["s0_DOT"] == "tf32x3"  # strict fp32's fast dot, within its tolerance
    at_tf32 = generate(graph, template=FLASH, precision="tf32").source  # TF32 operands rounded first
    assert re.findall(r"^def (\w+)\(", at_tf32, re.M)[:2] == ["_tf32_round", "_s0_flash_kernel"]
    assert "_tf32_round" not in gen.source
    assert gen.drafts and all(d != gen.config for d in gen.drafts)
    report = check_source(gen.source, accepted_kinds={"triton"}, platform="cuda")
    assert report.ok, report.violations


@pytest.mark.parametrize(
    ("body", "d", "why"),
    [
        ("att = q @ k.transpose(-2, -1)\nreturn torch.log_softmax(att, dim=-1) @ v", 16, "a log-softmax"),
        (
            "att = q @ k.transpose(-2, -1)\nreturn (torch.softmax(att, dim=-1) * 2.0) @ v",
            16,
            "more than a softmax",
        ),
        (
            "att = q @ k.transpose(-2, -1)\nreturn torch.softmax(att, dim=-1) @ v + 1.0",
            16,
            "an epilogue after V",
        ),
        (MANUAL, 320, "a head dim above MAX_HEAD"),
    ],
)
def test_what_is_not_exactly_attention_is_not_fused(body: str, d: int, why: str, tmp_path: Path) -> None:
    graph = _graph(_spec(tmp_path, "other", body, d=d, s=24))
    assert graph.pattern == "pipeline", why
    assert not any("triton-flash" in v for v in variants(graph)), why


def test_keys_past_the_end_and_a_row_that_sees_no_key(tmp_path: Path) -> None:
    """40 keys in blocks of 16: the last block's 8 past the end must count for nothing (else each adds
    exp(0 - max) to the row's sum); a query whose scores are all -inf gives NaN under torch.softmax,
    as the reference does, and 0 under SDPA's safe softmax (its guard). Each line taken out of the
    generated file fails its case: the checks bite."""
    manual = _spec(tmp_path, "manual", MANUAL, s=40)
    dead = _spec(tmp_path, "dead", MASKED + "return torch.softmax(att, dim=-1) @ v", init=DEAD_ROW, s=40)
    dead_sdpa = _spec(  # SDPA's safe softmax, spelled as its decomposition is rewritten (`aten_attention`)
        tmp_path, "dead_sdpa", MASKED + "p = torch.softmax(att, dim=-1)\n"
        "return torch.where(att.amax(-1, keepdim=True) == float('-inf'), 0.0, p) @ v", init=DEAD_ROW, s=40,
    )  # fmt: skip
    sources = {}
    for path in (manual, dead, dead_sdpa):
        graph = _graph(path)
        assert variants(graph)[0] == FLASH, (path.stem, variants(graph))
        sources[path.stem] = (str(path), generate(graph, template=FLASH, config=SMALL).source)
    pad = '    s = tl.where(n2 < N, v_v0, float("-inf"))'
    guard = '    o = tl.where(m_i[:, None] == float("-inf"), 0.0, o)\n'
    assert (
        pad in sources["manual"][1] and guard in sources["dead_sdpa"][1] and guard not in sources["dead"][1]
    )
    cases = {
        "manual": sources["manual"],
        "dead-nan": sources["dead"],
        "dead_sdpa": sources["dead_sdpa"],
        "manual-unpadded": (sources["manual"][0], sources["manual"][1].replace(pad, "    s = v_v0")),
        "dead_sdpa-unguarded": (sources["dead_sdpa"][0], sources["dead_sdpa"][1].replace(guard, "")),
    }
    got = interpret(cases, tmp_path, tol=1e-5, nan_marker="nan")
    assert got["manual"] == got["dead-nan"] == got["dead_sdpa"] == "ok", got
    assert got["manual-unpadded"] != "ok" and got["dead_sdpa-unguarded"] != "ok", got


def test_the_suites_attention_is_templated_once_for_its_shapes(tmp_path: Path) -> None:
    """Head dims of 64 and 128 (a scale of 1/8 and 1/sqrt(128)) and a batch of one: one graph, the
    scale a scalar made from q's last size at each call; the candidate is correct at a batch of one
    with a head dim of 32 and at a batch of three with one of 16 (shapes it was not traced at)."""
    graph = _graph(SUITES / "llm" / "attention.py")
    scores = graph.stages[0]
    made = [t for t in scores.tensors if t.source.startswith("dim:")]
    assert [(t.source, t.layout) for t in made] == [("dim:0:3:0.5", "scalar")]
    assert [op.args for op in scores.ops] == [("acc", made[0].name)]
    assert set(scores.rows) == {"batch", "prefill", "long"}
    assert variants(graph)[0] == FLASH
    cases = {}
    for template in variants(graph)[:2]:
        source = generate(graph, template=template, config=SMALL if template == FLASH else None).source
        assert "torch.full((), float(q.shape[3]) ** 0.5" in source
        for b, d in ((1, 32), (3, 16)):
            path = _spec(tmp_path, f"at_b{b}_d{d}", MANUAL, b=b, s=24, d=d)
            cases[f"{template}@b{b}d{d}"] = (str(path), source)
    assert interpret(cases, tmp_path, tol=1e-5) == dict.fromkeys(cases, "ok")


def test_a_constant_that_is_no_power_of_a_size_is_still_refused(tmp_path: Path) -> None:
    shapes = '\nKERNELEVOLVE = {"shapes": {"a": {"params": {"dim": 16}}, "b": {"params": {"dim": 32}}}}\n'
    path = _spec(tmp_path, "plus_one", "return q * (q.shape[-1] + 1.0) + k", extra=shapes)
    graph, why = recognize(load_spec(path))
    assert graph is None
    assert "not as a power of one of the inputs' sizes" in why, why
    scaled = _spec(tmp_path, "scaled", "return q / math.sqrt(q.shape[-1]) + k", extra=shapes)
    graph = _graph(scaled)
    assert [t.source for t in graph.tensors if t.layout == "scalar"] == ["dim:0:3:0.5"]


def test_unify_fits_each_power_and_leaves_equal_constants_inlined() -> None:
    def graph(c: float, same: float) -> OpGraph:
        x = TensorArg("x", "input:0", "full")
        ops = [Op("v0", "mul", ("x", c)), Op("v1", "add", ("v0", same))]
        return OpGraph(pattern="elementwise", tensors=[x], ops=ops, outputs=["v1"], dtype="float32")

    shapes: list[list[tuple[int, ...] | None]] = [[(4, 8)], [(4, 32)]]
    for power in shape_consts.POWERS:
        g8, g32 = (graph(float(n) ** power, 2.5) for n in (8, 32))
        unified = shape_consts.unify([g8, g32], shapes)
        assert unified is not None
        assert unified[0].ops == unified[1].ops and unified[0].ops[1].args == ("v0", 2.5)
        (made,) = [t for t in unified[0].tensors if t.layout == "scalar"]
        assert made.source == f"dim:0:1:{power}" and unified[0].ops[0].args == ("x", made.name)
        x = torch.zeros(4, 32)
        got = eval(shape_consts.dim_expr(made.source, ["x"]), {"torch": torch, "x": x})
        assert math.isclose(float(got), 32.0**power, rel_tol=1e-6)
    assert shape_consts.unify([graph(3.0, 2.5), graph(7.0, 2.5)], shapes) is None  # 3 and 7: no size
    assert shape_consts.unify([graph(8.0, 2.5), graph(32.0, 1.5)], shapes) is None  # 2.5 then 1.5: no size


CAUSAL = "return F.scaled_dot_product_attention(q, k, v, is_causal=True)"


def test_sdpas_causal_mask_is_the_causal_op_and_the_flash_kernel_skips_blocks_after_the_diagonal(
    tmp_path: Path,
) -> None:
    """`is_causal=True` (a mask made from two aranges) is the scores' `causal` op; the flash kernel loads
    no key block after a query block's last row and runs the longest rows first. Correct at 40
    positions in blocks of 16 and 32, with 24 queries over 40 keys (the mask's top-left alignment),
    and at the suites' attention_causal; the mask taken out, or the bound one block short, fails."""
    graph = _graph(SUITES / "llm" / "attention_causal.py")
    assert [op.op for op in graph.stages[0].ops] == ["mul", "causal"]
    assert variants(graph)[0] == FLASH
    square = _spec(tmp_path, "square", CAUSAL, s=40)
    wide = _spec(tmp_path, "wide", CAUSAL.replace("(q, k, v,", "(q[:, :, :24], k, v,"), s=40)
    cases = {}
    for path in (square, wide):
        g = _graph(path)
        for template in variants(g):
            cases[f"{path.stem}@{template}"] = (str(path), generate(g, template=template).source)
    flash = generate(_graph(square), template=FLASH, config={**SMALL, "s0_BLOCK_N": 32}).source
    bound = "    hi = tl.minimum(N, (pid_m + 1) * BLOCK_M)"
    mask = '        v_v1 = tl.where(n2 > m2, float("-inf"), v_v0)'
    assert bound in flash and mask in flash and "tl.num_programs(0) - 1 - tl.program_id(0)" in flash
    cases["square@small"] = (str(square), flash)
    cases["suite@small"] = (
        str(SUITES / "llm" / "attention_causal.py"),
        generate(graph, template=FLASH, config=SMALL).source,
    )
    cases["square-unmasked"] = (str(square), flash.replace(mask, "        v_v1 = v_v0"))
    small = generate(_graph(square), template=FLASH, config=SMALL).source  # blocks of 16 both ways
    cases["square-short"] = (str(square), small.replace(bound, "    hi = tl.minimum(N, pid_m * BLOCK_M)"))
    got = interpret(cases, tmp_path, tol=1e-5)
    bad = {"square-unmasked", "square-short"}
    assert all(v == "ok" for k, v in got.items() if k not in bad), {k: v for k, v in got.items() if v != "ok"}
    assert all(got[k] != "ok" for k in bad), got


def test_the_causal_op_is_what_sdpa_computes_and_only_a_batched_gemm_writes_it() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 24, 8), torch.randn(2, 3, 40, 8), torch.randn(2, 3, 40, 8)
    scores = causal_mask(q @ k.transpose(-2, -1) / math.sqrt(8))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(torch.softmax(scores, -1) @ v, want, rtol=1e-5, atol=1e-6)
    x = TensorArg("x", "input:0", "full")
    row = OpGraph(pattern="row", tensors=[x], ops=[Op("v0", "causal", ("x",))], outputs=["v0"])
    with pytest.raises(CodegenError, match="only a batched GEMM"):
        check_graph(row, "row")
    w = TensorArg("w", "param:w", "full")
    flat = OpGraph(pattern="gemm", tensors=[x, w], ops=[Op("v0", "causal", ("acc",))], outputs=["v0"],
                   gemm=GemmInfo(a="x", b="w", b_layout="nk"))  # fmt: skip
    with pytest.raises(CodegenError, match="unbatched GEMM"):
        triton_gemm.parse(flat, "strict_fp32")


PROJECTED = '''"""Attention behind one projection: {what}."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim{bias})
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(24, 24)).view(1, 1, 24, 24))

    def forward(self, x):
        B, T, C = x.shape
{body}
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


def get_inputs():
    return [torch.randn(2, 20, 32)]


def get_init_inputs():
    return []
'''
MINGPT = """        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = torch.softmax(att, dim=-1) @ v"""
PACKED = """        qkv = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)"""


def test_attention_behind_a_projection_reads_its_operands_as_views_the_wrapper_takes(tmp_path: Path) -> None:
    """MinGPT's split projection and a packed one ([B, T, 3, H, D] permuted, as the suites' sdpa_mlp_block):
    q, k and v are permuted views of the projection's output, taken by the wrapper (`strided:` sources,
    `torch.as_strided` with the traced strides), the heads' output viewed back to [B, T, C]
    (`reshape:`) for the last projection: five stages, flash offered, every variant correct. The
    offsets matter: k read at q's offset fails."""
    cases = {}
    for name, body, bias in (("mingpt", MINGPT, ""), ("packed", PACKED, ", bias=False")):
        path = tmp_path / f"{name}.py"
        path.write_text(PROJECTED.format(what=name, body=body, bias=bias))
        graph = _graph(path)
        assert [s.pattern for s in graph.stages] == ["gemm", "gemm", "row", "gemm", "gemm"], graph.description
        sources = [t.source for s in graph.stages for t in s.tensors]
        assert sum(s.startswith("strided:") for s in sources) == 3, sources
        assert any(s.startswith("reshape:") for s in sources), sources
        assert variants(graph)[0] == "triton-gemm+triton-flash+fused+fused+triton-gemm"
        for template in variants(graph):
            cases[f"{name}@{template}"] = (str(path), generate(graph, template=template).source)
    flash = cases["mingpt@triton-gemm+triton-flash+fused+fused+triton-gemm"][1]
    assert "storage_offset() + 32)" in flash  # k, 32 floats past q in each row of the projection
    cases["mingpt-k-at-q"] = (str(tmp_path / "mingpt.py"),
                              flash.replace("storage_offset() + 32)", "storage_offset() + 0)"))  # fmt: skip
    got = interpret(cases, tmp_path, tol=1e-5)
    assert got.pop("mingpt-k-at-q") != "ok"
    assert got == dict.fromkeys(got, "ok"), got


PACKED_BLOCK = '''"""Packed-projection attention whose head count is a constructor argument (as the suites'
sdpa_mlp_block): each shape gives other views of the projection's output."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(b, s, d))


def get_inputs(batch: int = 2, seq: int = 20, dim: int = 32, heads: int = 4):
    return [torch.randn(batch, seq, dim)]


def get_init_inputs(dim: int = 32, heads: int = 4):
    return [dim, heads]


KERNELEVOLVE = {{"shapes": {{"a": {{"params": {a}}}, "b": {{"params": {b}}}}}}}
'''
SHAPE_A = {"batch": 2, "seq": 20, "dim": 32, "heads": 4}
SHAPE_B = {"batch": 3, "seq": 12, "dim": 48, "heads": 6}  # head size 8 at both


def test_views_of_a_packed_projection_are_sized_from_it_at_each_call(tmp_path: Path, monkeypatch) -> None:
    """The head count a constructor argument, the width per shape: q, k and v's views (sizes,
    strides, offsets) are expressions of the projection's sizes (`shape_views`), one graph for both
    shapes, the flash variant first, every variant correct at both shapes under the interpreter.
    Control: without the fitting the shapes trace to different graphs (the refusal the suites'
    sdpa_mlp_block met)."""
    path = tmp_path / "packed2.py"
    path.write_text(PACKED_BLOCK.format(a=json.dumps(SHAPE_A), b=json.dumps(SHAPE_B)))
    graph = _graph(path)
    views = sorted({t.source for s in graph.stages for t in s.tensors if t.source.startswith("strided:")})
    assert views == [
        "strided:r0,r2//24,r1,8:r1*r2,8,r2,1:0:input:1",  # q: [b, heads, s, 8] of [b, s, 3 * dim]
        "strided:r0,r2//24,r1,8:r1*r2,8,r2,1:r2*2//3:input:1",  # v, two widths in
        "strided:r0,r2//24,r1,8:r1*r2,8,r2,1:r2//3:input:1",  # k
    ], views
    assert variants(graph)[0] == "triton-gemm+triton-flash+fused+fused+triton-gemm"
    cases, params = {}, {}
    for template in variants(graph):
        source = generate(graph, template=template).source
        for name, shape in (("a", SHAPE_A), ("b", SHAPE_B)):
            cases[f"{template}@{name}"] = (str(path), source)
            params[f"{template}@{name}"] = shape
    got = interpret(cases, tmp_path, tol=1e-5, params=params)
    assert got == dict.fromkeys(cases, "ok"), got

    import kernelevolve.synth.tuner.trace as trace

    monkeypatch.setattr(trace.shape_views, "unify", lambda graphs: graphs)
    graph, why = recognize(load_spec(path))
    assert graph is None and "traces to a different graph" in why, why


def test_a_view_whose_sizes_fit_no_product_of_its_roots_is_refused(tmp_path: Path) -> None:
    """Head counts 4 and 6 at widths 32 and 96 (head sizes 8 and 16): the head count is no fixed
    fraction of any product of the projection's sizes, so the shapes stay two graphs, refused with
    the reason."""
    path = tmp_path / "packed_odd.py"
    odd = {"batch": 2, "seq": 20, "dim": 96, "heads": 6}
    path.write_text(PACKED_BLOCK.format(a=json.dumps(SHAPE_A), b=json.dumps(odd)))
    graph, why = recognize(load_spec(path))
    assert graph is None
    assert "products of its root's sizes" in why, why


def test_view_numbers_fit_sizes_before_constants_and_products_before_fractions() -> None:
    roots = [(2, 512, 1536), (4, 1024, 2304)]
    assert shape_views._fit([512, 1024], roots) == "r1"
    assert shape_views._fit([64, 64], roots) == "64"
    assert shape_views._fit([2, 4], roots) == "r0"
    assert shape_views._fit([512 * 1536, 1024 * 2304], roots) == "r1*r2"
    assert shape_views._fit([8, 12], roots) == "r2//192"
    assert shape_views._fit([1024, 1536], roots) == "r2*2//3"
    assert shape_views._fit([3, 5], roots) is None
    assert shape_views.expr("r1*r2//3", "t") == "t.shape[1]*t.shape[2]//3"


def test_half_precision_attention_is_not_fused(tmp_path: Path) -> None:
    """The flash template takes fp32 q, k and v (its dot knob is for fp32 operands): a bf16 attention
    keeps its stage-by-stage variants."""
    path = _spec(tmp_path, "half", MANUAL, extra="\nKERNELEVOLVE = {'dtype': 'bfloat16'}\n")
    graph = _graph(path)
    assert [t.dtype for t in graph.stages[0].tensors[:2]] == ["bfloat16", "bfloat16"]
    assert variants(graph) and not any("triton-flash" in v for v in variants(graph)), variants(graph)


# `_tf32_round` against the nearest TF32 value (SCRIPT_PRELUDE's), and the flash kernel's TF32 products
# emulated with it.
_TF32_CHECK = (
    SCRIPT_PRELUDE
    + r"""
import triton
import triton.language as tl

mode, path = sys.argv[1], sys.argv[2]
if mode == "round":
    mod = load(path, "round_fn")
    bits = torch.tensor(json.loads(sys.argv[3]), dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    y = torch.empty_like(x)
    mod.apply[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    want = nearest_tf32(x).float()
    same = (y.view(torch.int32) == want.view(torch.int32)) | (torch.isnan(y) & torch.isnan(x))
    print(json.dumps({"same": bool(same.all()), "bad": [hex(int(b) & 0xFFFFFFFF) for b in bits[~same]]}))
else:
    out = {}
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 16) for _ in range(3))
    s = nearest_tf32(q) @ nearest_tf32(k).transpose(-1, -2) * 0.25
    p = torch.exp(s - s.amax(-1, keepdim=True))  # one block of keys: the kernel's p, unnormalized
    want = (nearest_tf32(p.float()) @ nearest_tf32(v)) / p.sum(-1, keepdim=True)
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) * 0.25, -1) @ v.double()
    out["exact"] = float((exact - want).norm() / want.norm())
    for cand in sys.argv[3:]:
        got = load(cand, cand.split("/")[-1][:-3]).ModelNew()(q, k, v).double()
        out[cand.split("/")[-1][:-3]] = float((got - want).norm() / want.norm())
    print(json.dumps(out))
"""
)


def test_tf32_rounding_is_to_the_nearest_value_ties_to_even(tmp_path: Path) -> None:
    """`_tf32_round` against the nearest TF32 value computed in float64: below, at and above a tie
    (an even and an odd last kept bit), negative values, the largest float (rounds to inf), a
    subnormal, zero, inf and NaN. A truncating rounding (what the tensor cores do) fails it."""
    from kernelevolve.synth.tuner.triton_common import HELPERS

    round_fn = HELPERS["tf32_round"]

    apply = (
        "\n@triton.jit\ndef apply(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n"
        "    r = tl.arange(0, BLOCK)\n"
        "    tl.store(y_ptr + r, _tf32_round(tl.load(x_ptr + r, mask=r < n)), mask=r < n)\n"
    )
    one, minus = 0x3F800000, 0xBF800000
    lows = [0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x3000, 0x2FFF, 0x0001]
    values = [one | low for low in lows] + [minus | low for low in lows]
    values += [0x7F7FFFFF, 0x00001234, 0x00003000, 0, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7FFFFFFF]
    signed = [b - (1 << 32) if b >= 1 << 31 else b for b in values]
    results = {}
    for name, fn in (("round", round_fn), ("truncate", round_fn.replace("((i >> 13) & 1) + 0xFFF", "0"))):
        path = tmp_path / f"{name}.py"
        path.write_text("import triton\nimport triton.language as tl\n\n\n" + fn + apply)
        results[name] = json.loads(interpret_script(_TF32_CHECK, "round", str(path), json.dumps(signed)))
    assert results["round"] == {"same": True, "bad": []}, results
    assert not results["truncate"]["same"] and "0x3f801fff" in results["truncate"]["bad"], results


def test_the_flash_kernel_at_tf32_rounds_every_operand_of_both_products(tmp_path: Path) -> None:
    """At TF32 the kernel's output is, to fp32 summation, the products of q, k, v and the
    probabilities each rounded to the nearest TF32 value (emulated in float64); with any one of the
    four left unrounded it is as far from that as TF32 is from exact (the interpreter's dot is exact
    for rounded operands, so each missing rounding shows)."""
    path = _spec(tmp_path, "tf32", MANUAL, s=16, d=16)
    config = {"s0_BLOCK_M": 16, "s0_BLOCK_N": 16, "s0_num_warps": 2}
    source = generate(_graph(path), template=FLASH, config=config, precision="tf32").source
    assert "'s0_DOT': 'tf32r'" in source  # the default at TF32: rounded
    files = {"rounded": source}
    for operand in ("a", "b", "vt", "pd"):
        line = f"{operand} = _tf32_round({operand})"
        assert line in source, (line, source)
        files[f"unrounded_{operand}"] = source.replace(line, f"{operand} = {operand}")
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
    paths = [str(tmp_path / f"{name}.py") for name in files]
    err = json.loads(interpret_script(_TF32_CHECK, "flash", str(path), *paths))
    assert err["exact"] > 1e-4, err  # the emulation is TF32's, not exact arithmetic
    assert err["rounded"] < 1e-6, err
    assert all(err[f"unrounded_{x}"] > 2e-5 for x in ("a", "b", "vt", "pd")), err


@pytest.mark.gpu
def test_the_flash_kernel_at_tf32_is_inside_the_tf32_tolerance_on_cuda(tmp_path: Path) -> None:
    """Compiled on a GPU at the suites' `batch` attention (4 prompts x 16 heads x 512 x 64): with its
    operands rounded the kernel passes the harness's TF32 tolerance against float64; the same kernel
    left to the tensor cores' truncation (Triton's plain "tf32") does not (every TF32 variant failed
    so on an H200)."""
    from kernelevolve.evaluate.correctness import compare, tolerance_for
    from tests.tuner_interp import load_module

    graph = _graph(SUITES / "llm" / "attention.py")
    source = generate(graph, template=FLASH, precision="tf32").source
    plain = generate(graph, template=FLASH, precision="tf32", config={"s0_DOT": "tf32", "s0_DOT_PV": "tf32"})
    ref = load_module(SUITES / "llm" / "attention.py", "attention_ref").Model()
    torch.manual_seed(1001)
    q, k, v = (torch.randn(4, 16, 512, 64, device="cuda") for _ in range(3))
    with torch.no_grad():
        want = ref(q.double(), k.double(), v.double())
    verdicts = {}
    for name, text in (
        ("rounded", source),
        ("truncated", plain.source),
    ):
        (tmp_path / f"{name}.py").write_text(text)
        got = load_module(tmp_path / f"{name}.py", f"flash_{name}").ModelNew()(q, k, v)
        verdicts[name] = compare(got.double(), want, tolerance_for(torch.float32, "tf32"))
    assert verdicts["rounded"].passed, verdicts["rounded"].message
    assert verdicts["rounded"].rel_norm_err < 6e-4, verdicts["rounded"]
    assert not verdicts["truncated"].passed, verdicts["truncated"]


def test_masked_scores_take_3xtf32_and_v_is_copied_keys_contiguous(tmp_path: Path) -> None:
    """At TF32 both products are rounded TF32 where nothing masks the scores and 3xTF32 where a causal mask or
    a mask buffer does (a row that sees few keys has outputs of v's size: the module doc); v, given [.., keys, head
    dim], is copied keys-contiguous by default (V_KMAJOR) and read in place without. Both are correct
    under the interpreter."""
    plain = _graph(_spec(tmp_path, "plain", MANUAL))
    causal_path = _spec(
        tmp_path, "causal", "return F.scaled_dot_product_attention(q, k, v, is_causal=True)", s=24
    )
    causal = _graph(causal_path)
    buffer = _graph(
        _spec(tmp_path, "buffer", MASKED + "return torch.softmax(att, dim=-1) @ v", init=DEAD_ROW)
    )
    dots = {}
    for name, graph in (("plain", plain), ("causal", causal), ("buffer", buffer)):
        config = generate(graph, template=FLASH, precision="tf32").config
        dots[name] = (config["s0_DOT"], config["s0_DOT_PV"], config["s0_V_KMAJOR"])
    masked = ("tf32x3", "tf32x3", 1)
    assert dots == {"plain": ("tf32r", "tf32r", 1), "causal": masked, "buffer": masked}, dots
    cases = {}
    for copy in (0, 1):
        source = generate(causal, template=FLASH, config={**SMALL, "s0_V_KMAJOR": copy}).source
        cases[f"copy{copy}"] = (str(causal_path), source)
        # the copy's strides left as the transposed tensor's: wrong wherever the copy is made
        broken = source.replace(
            "_v.transpose(-1, -2).contiguous().transpose(-1, -2)", "_v.transpose(-1, -2).contiguous()"
        )
        assert broken != source
        cases[f"copy{copy}-unviewed"] = (str(causal_path), broken)
    got = interpret(cases, tmp_path, tol=1e-5)
    assert got.pop("copy1-unviewed") != "ok", got
    assert got == dict.fromkeys(got, "ok"), got  # copy0-unviewed: without the knob nothing is copied


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "strict_fp32"])
def test_the_suites_sdpa_mlp_block_takes_the_flash_kernel_at_each_of_its_shapes_on_cuda(
    precision: str, tmp_path: Path
) -> None:
    """One candidate for the block's three shapes (8, 12 and 16 heads, the views sized from the
    projection at each call): its flash variant at the default config is inside the precision's
    tolerance against float64 at every shape."""
    from tests.tuner_interp import cuda_verdicts

    path = SUITES / "llm" / "sdpa_mlp_block.py"
    graph = _graph(path)
    template = variants(graph)[0]
    assert "triton-flash" in template, variants(graph)
    cand = tmp_path / f"sdpa_block_{precision}.py"
    cand.write_text(generate(graph, template=template, precision=precision).source)
    verdicts = cuda_verdicts(path, cand, precision)
    assert len(verdicts) == 3 and all(v.passed for v in verdicts.values()), {
        k: v.message for k, v in verdicts.items()
    }
