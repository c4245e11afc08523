"""Triton template for depthwise `conv` graphs (one input channel per group, `ConvInfo.in_per_group`
1, not transposed): a direct kernel, an elementwise epilogue, one store.

The implicit GEMM of `triton_conv` gives a depthwise convolution GEMMs one input channel deep and
COUT/groups wide: tensor-core tiles of mostly padding, far from the bandwidth the operation needs
(KernelBench level 1's depthwise problems ran at 0.19-0.21x of cuDNN through it). This kernel is a
stencil instead, as `triton_pool`'s: a program computes BLOCK consecutive outputs of the contiguous
output [N, C_out, OD, OH, OW]; from each flat index it finds the image n, the output channel co (its
input channel co // (C_out / groups): a channel multiplier is allowed), and the output position,
then visits the KD x KH x KW window, unrolled (constexpr sizes), each tap a masked load of x [N, C_in,
D, H, W] times the tap's weight w[co, 0, kd, kh, kw], summed in fp32 (products fused into FMAs).
Positions in the padding are masked to zero. 1-d and 2-d convolutions are 3-d ones with unit leading
dims, as in `triton_conv`. Bias and the epilogue run on the fp32 sum; `chan` tensors are read at the
output's channel, `full` ones at its own offsets.

Not here: transposed depthwise convolutions (`triton_conv` covers them), channels-last layouts, a
window staged through shared memory (each input is re-read from L1/L2 by the windows that cover it).
"""

from __future__ import annotations

from kernelevolve.synth.tuner.ir import ConvInfo, OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_common import (
    CodegenError,
    Names,
    Parts,
    allocate,
    forward_args,
    helpers_for,
    jit_function,
    load,
    op_expr,
    outputs_tuple,
    pick,
    pow2_at_least,
    prepare,
    source_expr,
    store,
)

_GEOMETRY = ("KD", "KH", "KW", "SD", "SH", "SW", "PD", "PH", "PW", "DD", "DH", "DW")


def applies(graph: OpGraph) -> bool:
    """A convolution with one input channel per group, more than one group, not transposed."""
    ci = graph.conv
    return ci is not None and not ci.transposed and ci.groups > 1 and ci.in_per_group == 1


def build(graph: OpGraph, precision: str) -> Parts:
    """`precision` does not matter here: the window's products are summed in fp32 (FMAs) whatever the
    policy, as an fp32 convolution computes them."""
    names, used, ops = prepare(graph, "conv")
    ci = graph.conv
    if ci is None or not applies(graph):
        raise CodegenError("the depthwise template takes a convolution with one input channel per group")
    by_name = {t.name: t for t in graph.tensors}
    for role, name in (("x", ci.x), ("w", ci.w), ("bias", ci.bias)):
        if name is not None and name not in by_name:
            raise CodegenError(f"conv {role} {name!r} is not one of the graph's tensors")
    x, w = by_name[ci.x], by_name[ci.w]
    bias = by_name[ci.bias] if ci.bias else None
    epilogue = [t for t in used if t.name not in (ci.x, ci.w, ci.bias)]
    for t in epilogue:
        if t.layout not in ("full", "chan", "scalar"):
            raise CodegenError(f"a {t.layout} tensor ({t.name}) in a convolution's epilogue")

    ptrs = [names.ptr(x.name), names.ptr(w.name)] + ([names.ptr(bias.name)] if bias else [])
    ptrs += [names.ptr(t.name) for t in epilogue] + [f"out{i}_ptr" for i in range(len(graph.outputs))]
    params = [*ptrs, "TOTAL", "CIN", "COUT", "COUT_G", "D", "H", "W", "OD", "OH", "OW"]
    params += [f"{k}: tl.constexpr" for k in (*_GEOMETRY, "BLOCK")]
    x_ptr, w_ptr = names.ptr(x.name), names.ptr(w.name)
    body = [
        "offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
        "mask = offs < TOTAL",
        "ow = offs % OW",
        "oh = (offs // OW) % OH",
        "od = (offs // (OW * OH)) % OD",
        "plane = offs // (OW * OH * OD)  # n * COUT + co",
        "co = plane % COUT",
        "base = ((plane // COUT) * CIN + co // COUT_G) * (D * H * W)",
        "w_base = co * (KD * KH * KW)",
        "acc = tl.zeros([BLOCK], tl.float32)",
        "for kd in tl.static_range(KD):",
        "    idd = od * SD - PD + kd * DD",
        "    ok_d = mask & (idd >= 0) & (idd < D)",
        "    for kh in tl.static_range(KH):",
        "        ihh = oh * SH - PH + kh * DH",
        "        ok_h = ok_d & (ihh >= 0) & (ihh < H)",
        "        for kw in tl.static_range(KW):",
        "            iww = ow * SW - PW + kw * DW",
        "            ok = ok_h & (iww >= 0) & (iww < W)",
        f"            xv = tl.load({x_ptr} + base + (idd * H + ihh) * W + iww, mask=ok, other=0.0)",
        f"            wv = tl.load({w_ptr} + w_base + (kd * KH + kh) * KW + kw, mask=mask, other=0.0)",
        "            acc += xv.to(tl.float32) * wv.to(tl.float32)",
    ]
    acc = names.var("acc")
    if bias:
        body.append(
            f"{acc} = acc + tl.load({names.ptr(bias.name)} + co, mask=mask, other=0.0).to(tl.float32)"
        )
    else:
        body.append(f"{acc} = acc")
    offsets, masks = {"full": "offs", "chan": "co"}, {"full": "mask", "chan": "mask"}
    body += [load(t, names, offsets, masks) for t in epilogue]
    body += [f"{names.var(op.out)} = {op_expr(op, names)}" for op in ops]
    for i, out in enumerate(graph.outputs):
        body.append(store(i, names.var(out), graph.layout_of(out), "offs", "mask", "[BLOCK]"))
    kernel = jit_function("_depthwise_kernel", params, body)
    fwd = _forward(graph, ci, names, x, w, bias, epilogue)
    tunables, defaults = _knobs(graph)
    return Parts([kernel], fwd, tunables, defaults, helpers_for(ops), tile=("BLOCK",))


def _forward(
    graph: OpGraph,
    ci: ConvInfo,
    names: Names,
    x: TensorArg,
    w: TensorArg,
    bias: TensorArg | None,
    epilogue: list[TensorArg],
) -> list[str]:
    args = forward_args(graph)
    lx, lw = names.local(x.name), names.local(w.name)
    lines = [f"{lx} = {source_expr(x, args)}.contiguous()", f"{lw} = {source_expr(w, args)}.contiguous()"]
    lines += [
        f"{names.local(t.name)} = {source_expr(t, args)}.contiguous()"
        for t in [*([bias] if bias else []), *epilogue]
    ]
    pad = 3 - ci.dims  # leading unit spatial dims: a 1-d or 2-d convolution as a 3-d one
    ones = "(1,) * " + str(pad) + " + " if pad else ""
    stride, dilation = (1,) * pad + ci.stride, (1,) * pad + ci.dilation
    padding = (0,) * pad + ci.padding
    lines += [
        f"_n, _cin = {lx}.shape[0], {lx}.shape[1]",
        f"_D, _H, _W = {ones}tuple({lx}.shape[2:])",
        f"_KD, _KH, _KW = {ones}tuple({lw}.shape[2:])",
        f"_cout = {lw}.shape[0]",
        f"_stride, _padding, _dilation = {stride!r}, {padding!r}, {dilation!r}",
        "_OD, _OH, _OW = ((s + 2 * p - d * (k - 1) - 1) // st + 1 for s, p, d, k, st in zip(",
        "    (_D, _H, _W), _padding, _dilation, (_KD, _KH, _KW), _stride))",
        f"_shape = (_n, _cout, *(_OD, _OH, _OW)[{pad}:])",
        f"_device = {lx}.device",
        *allocate(graph, "_shape"),
        "_total = _out0.numel()",
        "if _total == 0:",
        f"    return {outputs_tuple(graph)}",
    ]
    launch = [lx, lw] + [names.local(t.name) for t in [*([bias] if bias else []), *epilogue]]
    launch += [f"_out{i}" for i in range(len(graph.outputs))]
    lines += [
        '_block = CONFIG["BLOCK"]',
        "_depthwise_kernel[(triton.cdiv(_total, _block),)](",
        f"    {', '.join(launch)},",
        f"    _total, _cin, _cout, _cout // {ci.groups}, _D, _H, _W, _OD, _OH, _OW,",
        "    KD=_KD, KH=_KH, KW=_KW, SD=_stride[0], SH=_stride[1], SW=_stride[2],",
        "    PD=_padding[0], PH=_padding[1], PW=_padding[2], DD=_dilation[0], DH=_dilation[1], DW=_dilation[2],",
        '    BLOCK=_block, num_warps=CONFIG["num_warps"],',
        ")",
        f"return {outputs_tuple(graph)}",
    ]
    return lines


def _knobs(graph: OpGraph) -> tuple[dict[str, list[int | str]], dict[str, int | str]]:
    total = max((graph.rows[s] * graph.cols[s] * graph.batch.get(s, 1) for s in graph.rows), default=1 << 20)
    block = pick([128, 256, 512, 1024], pow2_at_least(max(128, total // 4096)))
    tunables: dict[str, list[int | str]] = {
        "BLOCK": [64, 128, 256, 512, 1024, 2048],
        "num_warps": [1, 2, 4, 8],
    }
    return tunables, {"BLOCK": block, "num_warps": 4 if block >= 256 else 2}


__all__ = ["applies", "build"]
