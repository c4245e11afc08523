"""Triton template for `conv` graphs: a convolution as an implicit GEMM, an elementwise epilogue, one
store.

The GEMM per group g: rows m = (batch n, output position p), columns c = the group's output channels,
inner k = (input channel ci, kernel position r). A program holds a BLOCK_M x BLOCK_N tile (GROUP_M
rows of tiles swizzled, as `triton_gemm`); each K slice gathers its [BLOCK_M, BLOCK_K] slab of the
input straight from x (no im2col buffer): the indices come from m and k by integer division by
constexpr sizes, positions in the padding are masked to zero. The weight [C_out, C_in/groups, *K] is
read as the matrix [C_out, K] it is in memory. 1-d and 2-d convolutions are 3-d ones with unit depth
(and height): the wrapper views x as [N, C, D, H, W], so one kernel serves all three. Bias and the
epilogue run on the fp32 accumulator; `chan` tensors (one value per output channel) are read at the
tile's channels, `full` ones at the output's own offsets (N, C, D, H, W contiguous).

Precision (`DOT`), as `triton_gemm`: strict_fp32 -> "ieee" by default, "tf32x3" offered; tf32 ->
"tf32"; low -> bf16 operands, fp32 accumulation; bf16/fp16 inputs take the native dot.

A transposed convolution is the same GEMM over (input channel, kernel position) with a gather that
keeps only the input positions i where i * stride - pad + k * dilation lands on the output position
(a stride of s masks all but 1 in s^dims of them: correct, not fast). Where the stride is above 1
and the dilation 1, `triton_conv_phased` (template `triton-conv-phased`, drafted after this one) runs
one GEMM per output phase over only the taps that reach it; it shares this module's pieces (`Conv`,
`swizzle`, `load_a`, `epilogue`, `forward_head`, `launch`, `parts`).

Not here: a direct (non-GEMM) depthwise kernel (`triton_depthwise`: here a depthwise convolution runs
as GEMMs one channel wide, correct but far from the bandwidth a direct kernel reaches), channels-last
layouts, split-K.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelevolve.synth.tuner.ir import SAME, ConvInfo, Op, OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_common import (
    DOT_CHOICES,
    HALF_DTYPES,
    CodegenError,
    Names,
    Parts,
    allocate,
    check_graph,
    dot_lines,
    forward_args,
    helpers_for,
    jit_function,
    load,
    needed,
    op_expr,
    outputs_tuple,
    pick,
    pow2_at_least,
    source_expr,
    store,
)
from kernelevolve.synth.tuner.triton_gemm import gemm_drafts

_GEOMETRY = ("KD", "KH", "KW", "SD", "SH", "SW", "PD", "PH", "PW", "DD", "DH", "DW")


@dataclass(frozen=True)
class Conv:
    """What both convolution templates (this one and `triton_conv_phased`) read of a conv graph:
    its tensors by role, the live epilogue, and the dot precisions offered."""

    graph: OpGraph
    ci: ConvInfo
    names: Names
    x: TensorArg
    w: TensorArg
    bias: TensorArg | None
    epilogue: list[TensorArg]
    ops: list[Op]
    precision: str
    native: bool
    dots: list[str]

    @property
    def ptrs(self) -> list[str]:
        """The kernel's pointer parameters: x, w, the bias, the epilogue's tensors, the outputs."""
        ptrs = [self.names.ptr(t.name) for t in (self.x, self.w, *([self.bias] if self.bias else []))]
        ptrs += [self.names.ptr(t.name) for t in self.epilogue]
        return ptrs + [f"out{i}_ptr" for i in range(len(self.graph.outputs))]

    def cast(self, t: TensorArg) -> str:
        """The suffix that brings a loaded operand to the dot's type (none for fp32 or native)."""
        return "" if self.native or t.dtype == "float32" else ".to(tl.float32)"


def conv_of(graph: OpGraph, precision: str) -> Conv:
    check_graph(graph, "conv")
    ci = graph.conv
    if ci is None:
        raise CodegenError("a conv graph without its ConvInfo")
    by_name = {t.name: t for t in graph.tensors}
    for role, name in (("x", ci.x), ("w", ci.w), ("bias", ci.bias)):
        if name is not None and name not in by_name:
            raise CodegenError(f"conv {role} {name!r} is not one of the graph's tensors")
    x, w = by_name[ci.x], by_name[ci.w]
    live = needed(graph, graph.outputs)
    epilogue = [t for t in graph.tensors if t.name in live and t.name not in (ci.x, ci.w, ci.bias)]
    for t in epilogue:
        if t.layout not in ("full", "chan", "scalar"):
            raise CodegenError(f"a {t.layout} tensor ({t.name}) in a convolution's epilogue")
    native = x.dtype == w.dtype and x.dtype in HALF_DTYPES
    dots = ["native"] if native else DOT_CHOICES[precision]
    bias = by_name[ci.bias] if ci.bias else None
    ops = [op for op in graph.ops if op.out in live]
    return Conv(graph, ci, Names(graph), x, w, bias, epilogue, ops, precision, native, dots)


def build(graph: OpGraph, precision: str) -> Parts:
    c = conv_of(graph, precision)
    body = [
        *swizzle(),
        "m_ok = rm < M",
        "P = OD * OH * OW",
        "am = rm % M  # past the edge: wrap (the loads stay in bounds, the store is masked)",
        "n_img = am // P",
        "p = am % P",
        "od = p // (OH * OW)",
        "oh = (p // OW) % OH",
        "ow = p % OW",
        "x_row = n_img.to(tl.int64) * sx_n + (g * CIN_G).to(tl.int64) * sx_c",
        "bn = rn % COUT_G",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "for kt in range(K_TILES):",
        "    k = kt * BLOCK_K + rk",
        "    k_ok = k < K",
        "    cin = k // (KD * KH * KW)",
        "    r = k % (KD * KH * KW)",
        "    kd = r // (KH * KW)",
        "    kh = (r // KW) % KH",
        "    kw = r % KW",
        *(_transposed_gather() if c.ci.transposed else _gather()),
        *load_a(c),
        f"    b = tl.load({c.ptrs[1]} + {_weight_offset(c.ci)}, mask=k_ok[:, None], other=0.0){c.cast(c.w)}",
        *dot_lines(c.dots),
        *epilogue(c),
    ]
    kernel = jit_function("_conv_kernel", kernel_params(c, [], _GEOMETRY), body)
    fwd = [
        *forward_head(c),
        "_M = _n * _OD * _OH * _OW",
        "_K = _cin_g * _KD * _KH * _KW",
        *launch(c, "_conv_kernel", "", "", "DD=_dilation[0], DH=_dilation[1], DW=_dilation[2]"),
    ]
    return parts(c, kernel, fwd)


def kernel_params(c: Conv, extra: list[str], geometry: tuple[str, ...]) -> list[str]:
    """The pointers, the run-time sizes (then `extra`), and the constexprs: `geometry`, the tile."""
    params = [*c.ptrs, "M", "COUT", "COUT_G", "CIN_G", "K", "D", "H", "W", "OD", "OH", "OW",
              "sx_n", "sx_c", "sx_d", "sx_h", "sx_w", *extra]  # fmt: skip
    params += [f"{k}: tl.constexpr" for k in geometry]
    return params + [
        f"{k}: tl.constexpr" for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "K_TILES", "DOT")
    ]


def swizzle() -> list[str]:
    """The program's tile: GROUP_M rows of tiles swizzled over the grid's first axis (cdiv(M, BLOCK_M)
    x cdiv(COUT_G, BLOCK_N) programs), the group g on its second; rows rm, columns rn, inner rk."""
    return [
        "pid = tl.program_id(0)",
        "g = tl.program_id(1)",
        "num_pid_m = tl.cdiv(M, BLOCK_M)",
        "num_pid_n = tl.cdiv(COUT_G, BLOCK_N)",
        "num_pid_in_group = GROUP_M * num_pid_n",
        "first_pid_m = (pid // num_pid_in_group) * GROUP_M",
        "group_size_m = min(num_pid_m - first_pid_m, GROUP_M)",
        "pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)",
        "pid_n = (pid % num_pid_in_group) // group_size_m",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "rk = tl.arange(0, BLOCK_K)",
    ]


def load_a(c: Conv) -> list[str]:
    """The K loop's input slab `a` [BLOCK_M, BLOCK_K]: x at (n_img, g * CIN_G + cin, idd, ihh, iww),
    zero where not `inside` the input or past K (`k_ok`)."""
    offset = "x_row[:, None] + cin[None, :].to(tl.int64) * sx_c + idd * sx_d + ihh * sx_h + iww * sx_w"
    return [
        f"    a_ptrs = {c.ptrs[0]} + {offset}",
        f"    a = tl.load(a_ptrs, mask=inside & k_ok[None, :], other=0.0){c.cast(c.x)}",
    ]


def epilogue(c: Conv) -> list[str]:
    """Bias, epilogue and stores on the accumulator, given the rows' image `n_img`, their output
    position `p` in [0, P = OD * OH * OW) and `m_ok`; the output is N, C, D, H, W contiguous."""
    names = c.names
    lines = [
        "c2 = (g * COUT_G + rn)[None, :]",
        "n_ok = (rn < COUT_G)[None, :]",
        "mask = m_ok[:, None] & n_ok",
        "off = n_img[:, None].to(tl.int64) * COUT * P + c2.to(tl.int64) * P + p[:, None]",
    ]
    acc = names.var("acc")
    if c.bias:
        lines.append(
            f"{acc} = acc + tl.load({names.ptr(c.bias.name)} + c2, mask=n_ok, other=0.0).to(tl.float32)"
        )
    else:
        lines.append(f"{acc} = acc")
    offsets, masks = {"full": "off", "chan": "c2"}, {"full": "mask", "chan": "n_ok"}
    lines += [load(t, names, offsets, masks) for t in c.epilogue]
    lines += [f"{names.var(op.out)} = {op_expr(op, names)}" for op in c.ops]
    for i, out in enumerate(c.graph.outputs):
        lines.append(store(i, names.var(out), c.graph.layout_of(out), "off", "mask", "[BLOCK_M, BLOCK_N]"))
    return lines


def parts(c: Conv, kernel: str, forward: list[str]) -> Parts:
    tunables, defaults = _knobs(c.graph, c.dots, c.native)
    drafts = gemm_drafts(tunables, defaults, c.precision, c.native)
    helpers = helpers_for(c.ops, c.dots)
    return Parts([kernel], forward, tunables, defaults, helpers, ("BLOCK_M", "BLOCK_N"), drafts)


def _gather() -> list[str]:
    """The input positions a convolution's [BLOCK_M, BLOCK_K] slab reads: o * stride - pad + k * dil."""
    lines = []
    for o, i, k, st, pad, dil in (("od", "idd", "kd", "SD", "PD", "DD"), ("oh", "ihh", "kh", "SH", "PH", "DH"),
                                  ("ow", "iww", "kw", "SW", "PW", "DW")):  # fmt: skip
        lines.append(f"    {i} = ({o} * {st} - {pad})[:, None] + {k}[None, :] * {dil}")
    lines.append("    inside = (idd >= 0) & (idd < D) & (ihh >= 0) & (ihh < H) & (iww >= 0) & (iww < W)")
    return lines


def _transposed_gather() -> list[str]:
    """A transposed convolution's: output o takes input i where i * stride - pad + k * dil = o, so
    i = (o + pad - k * dil) / stride where that divides and lands inside the input."""
    lines = ["    inside = k_ok[None, :]"]
    for o, i, k, size, st, pad, dil in (("od", "idd", "kd", "D", "SD", "PD", "DD"),
                                        ("oh", "ihh", "kh", "H", "SH", "PH", "DH"),
                                        ("ow", "iww", "kw", "W", "SW", "PW", "DW")):  # fmt: skip
        lines += [
            f"    t_{i} = ({o} + {pad})[:, None] - {k}[None, :] * {dil}",
            f"    {i} = tl.where(t_{i} >= 0, t_{i}, 0) // {st}",
            f"    inside = inside & (t_{i} >= 0) & (t_{i} % {st} == 0) & ({i} < {size})",
        ]
    return lines


def _weight_offset(ci: ConvInfo) -> str:
    """Where weight element (k, c) is: w [C_out, C_in/groups * K] as a matrix; a transposed one's w
    [C_in, C_out/groups, *K] holds (input channel, output channel, kernel position)."""
    if ci.transposed:
        return (
            "((g * CIN_G + cin[:, None]).to(tl.int64) * COUT_G + bn[None, :]) * (KD * KH * KW) + r[:, None]"
        )
    return "(g * COUT_G + bn[None, :]).to(tl.int64) * K + k[:, None]"


def forward_head(c: Conv) -> list[str]:
    """The forward up to the launch: the operands contiguous, x viewed [N, C, D, H, W], the output's
    size (`_OD`, `_OH`, `_OW`) and allocation, `_cout_g` and `_cin_g`; the template adds `_M`, `_K`."""
    ci, names = c.ci, c.names
    args = forward_args(c.graph)
    lx, lw = names.local(c.x.name), names.local(c.w.name)
    lines = [f"{lx} = {source_expr(c.x, args)}.contiguous()", f"{lw} = {source_expr(c.w, args)}.contiguous()"]
    lines += [
        f"{names.local(t.name)} = {source_expr(t, args)}.contiguous()"
        for t in [*([c.bias] if c.bias else []), *c.epilogue]
    ]
    pad = 3 - ci.dims  # leading unit spatial dims: a 1-d or 2-d convolution as a 3-d one
    ones = "(1,) * " + str(pad) + " + " if pad else ""
    stride, dilation = (1,) * pad + ci.stride, (1,) * pad + ci.dilation
    padding = (0,) * pad + ci.padding
    output_padding = (0,) * pad + (ci.output_padding or (0,) * ci.dims)
    lines += [
        f"_n, _cin = {lx}.shape[0], {lx}.shape[1]",
        f"_D, _H, _W = {ones}tuple({lx}.shape[2:])",
        f"_KD, _KH, _KW = {ones}tuple({lw}.shape[2:])",
        f"_x = {lx}.reshape(_n, _cin, _D, _H, _W)",
        f"_groups = {ci.groups}",
        f"_cout = {lw}.shape[1] * _groups" if ci.transposed else f"_cout = {lw}.shape[0]",
        f"_stride, _padding, _dilation = {stride!r}, {padding!r}, {dilation!r}",
        *(  # SAME padding: from the weight's kernel size at each call
            [
                "_padding = tuple(d * (k - 1) // 2 if p < 0 else p",
                "                 for p, d, k in zip(_padding, _dilation, (_KD, _KH, _KW)))",
            ]
            if any(p == SAME for p in padding)
            else []
        ),
        *(
            [
                "_OD, _OH, _OW = ((s - 1) * st - 2 * p + d * (k - 1) + op + 1 for s, p, d, k, st, op in zip(",
                f"    (_D, _H, _W), _padding, _dilation, (_KD, _KH, _KW), _stride, {output_padding!r}))",
            ]
            if ci.transposed
            else [
                "_OD, _OH, _OW = ((s + 2 * p - d * (k - 1) - 1) // st + 1 for s, p, d, k, st in zip(",
                "    (_D, _H, _W), _padding, _dilation, (_KD, _KH, _KW), _stride))",
            ]
        ),
        f"_shape = (_n, _cout, *(_OD, _OH, _OW)[{pad}:])",
        f"_device = {lx}.device",
        *allocate(c.graph, "_shape"),
        "if _out0.numel() == 0:",
        f"    return {outputs_tuple(c.graph)}",
        "_cout_g, _cin_g = _cout // _groups, _cin // _groups",
    ]
    return lines


def launch(c: Conv, kernel: str, grid_extra: str, args_extra: str, geometry_extra: str) -> list[str]:
    """The launch of `kernel` on (cdiv(_M, BLOCK_M) * cdiv(_cout_g, BLOCK_N), _groups`grid_extra`), its
    arguments as `kernel_params` lists them (`args_extra` after x's strides, the geometry's
    constexprs KD..PW then `geometry_extra`), and the return."""
    launched = ["_x", c.names.local(c.w.name)]
    launched += [c.names.local(t.name) for t in [*([c.bias] if c.bias else []), *c.epilogue]]
    launched += [f"_out{i}" for i in range(len(c.graph.outputs))]
    return [
        '_bm, _bn, _bk = CONFIG["BLOCK_M"], CONFIG["BLOCK_N"], CONFIG["BLOCK_K"]',
        f"{kernel}[(triton.cdiv(_M, _bm) * triton.cdiv(_cout_g, _bn), _groups{grid_extra})](",
        f"    {', '.join(launched)},",
        f"    _M, _cout, _cout_g, _cin_g, _K, _D, _H, _W, _OD, _OH, _OW, *_x.stride(),{args_extra}",
        "    KD=_KD, KH=_KH, KW=_KW, SD=_stride[0], SH=_stride[1], SW=_stride[2],",
        f"    PD=_padding[0], PH=_padding[1], PW=_padding[2], {geometry_extra},",
        '    BLOCK_M=_bm, BLOCK_N=_bn, BLOCK_K=_bk, GROUP_M=CONFIG["GROUP_M"], K_TILES=triton.cdiv(_K, _bk),',
        '    DOT=CONFIG["DOT"], num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"],',
        ")",
        f"return {outputs_tuple(c.graph)}",
    ]


def _knobs(
    graph: OpGraph, dots: list[str], native: bool
) -> tuple[dict[str, list[int | str]], dict[str, int | str]]:
    m = max(graph.rows.values(), default=4096)
    n = max(graph.cols.values(), default=64)
    bm = pick([32, 64, 128], pow2_at_least(m))
    bn = pick([16, 32, 64, 128], pow2_at_least(n))
    tunables: dict[str, list[int | str]] = {
        "BLOCK_M": [16, 32, 64, 128, 256],
        "BLOCK_N": [16, 32, 64, 128, 256],
        "BLOCK_K": [16, 32, 64, 128],
        "GROUP_M": [1, 4, 8, 16],
        "num_warps": [2, 4, 8],
        "num_stages": [1, 2, 3, 4, 5],
        "DOT": list(dots),
    }
    defaults: dict[str, int | str] = {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": 32,
        "GROUP_M": 8,
        "num_warps": 8 if bm * bn >= 128 * 128 else 4,
        "num_stages": 3,
        "DOT": dots[0],
    }
    return tunables, defaults


__all__ = [
    "Conv",
    "build",
    "conv_of",
    "epilogue",
    "forward_head",
    "kernel_params",
    "launch",
    "load_a",
    "parts",
    "swizzle",
]
