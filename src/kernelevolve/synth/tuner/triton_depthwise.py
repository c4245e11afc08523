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

from kernelevolve.synth.tuner.ir import OpGraph
from kernelevolve.synth.tuner.triton_common import (
    CodegenError,
    Parts,
    helpers_for,
    jit_function,
    load,
    op_expr,
    outputs_tuple,
    store,
)
from kernelevolve.synth.tuner.triton_conv import Conv, conv_of, forward_head
from kernelevolve.synth.tuner.triton_pool import block_knobs, window_taps

_GEOMETRY = ("KD", "KH", "KW", "SD", "SH", "SW", "PD", "PH", "PW", "DD", "DH", "DW")


def applies(graph: OpGraph) -> bool:
    """A convolution with one input channel per group, more than one group, not transposed."""
    ci = graph.conv
    return ci is not None and not ci.transposed and ci.groups > 1 and ci.in_per_group == 1


def build(graph: OpGraph, precision: str) -> Parts:
    """`precision` does not matter here: the window's products are summed in fp32 (FMAs) whatever the
    policy, as an fp32 convolution computes them."""
    c = conv_of(graph, precision)  # the operands, the epilogue and its ops, checked as triton_conv's
    if not applies(graph):
        raise CodegenError("the depthwise template takes a convolution with one input channel per group")
    names = c.names
    params = [*c.ptrs, "TOTAL", "CIN", "COUT", "COUT_G", "D", "H", "W", "OD", "OH", "OW"]
    params += [f"{k}: tl.constexpr" for k in (*_GEOMETRY, "BLOCK")]
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
        *window_taps(c.ptrs[0]),
        "            xv = tl.load(ptr, mask=ok, other=0.0)",
        f"            wv = tl.load({c.ptrs[1]} + w_base + (kd * KH + kh) * KW + kw, mask=mask, other=0.0)",
        "            acc += xv.to(tl.float32) * wv.to(tl.float32)",
    ]
    acc = names.var("acc")
    if c.bias:
        body.append(
            f"{acc} = acc + tl.load({names.ptr(c.bias.name)} + co, mask=mask, other=0.0).to(tl.float32)"
        )
    else:
        body.append(f"{acc} = acc")
    offsets, masks = {"full": "offs", "chan": "co"}, {"full": "mask", "chan": "mask"}
    body += [load(t, names, offsets, masks) for t in c.epilogue]
    body += [f"{names.var(op.out)} = {op_expr(op, names)}" for op in c.ops]
    for i, out in enumerate(graph.outputs):
        body.append(store(i, names.var(out), graph.layout_of(out), "offs", "mask", "[BLOCK]"))
    kernel = jit_function("_depthwise_kernel", params, body)
    total = max((graph.rows[s] * graph.cols[s] * graph.batch.get(s, 1) for s in graph.rows), default=1 << 20)
    tunables, defaults = block_knobs(total)
    return Parts([kernel], _forward(c), tunables, defaults, helpers_for(c.ops), tile=("BLOCK",))


def _forward(c: Conv) -> list[str]:
    """`triton_conv`'s forward head (operands, the output's size and allocation), then one launch of
    a program per BLOCK outputs."""
    launched = ["_x", c.names.local(c.w.name)]
    launched += [c.names.local(t.name) for t in [*([c.bias] if c.bias else []), *c.epilogue]]
    launched += [f"_out{i}" for i in range(len(c.graph.outputs))]
    return [
        *forward_head(c),
        '_block = CONFIG["BLOCK"]',
        "_depthwise_kernel[(triton.cdiv(_out0.numel(), _block),)](",
        f"    {', '.join(launched)},",
        "    _out0.numel(), _cin, _cout, _cout_g, _D, _H, _W, _OD, _OH, _OW,",
        "    KD=_KD, KH=_KH, KW=_KW, SD=_stride[0], SH=_stride[1], SW=_stride[2],",
        "    PD=_padding[0], PH=_padding[1], PW=_padding[2], DD=_dilation[0], DH=_dilation[1], DW=_dilation[2],",
        '    BLOCK=_block, num_warps=CONFIG["num_warps"],',
        ")",
        f"return {outputs_tuple(c.graph)}",
    ]


__all__ = ["applies", "build"]
