"""Triton template for `pool` graphs: max or average pooling (1-, 2- or 3-d), an elementwise epilogue,
one store.

A program computes BLOCK consecutive outputs of the contiguous output [N, C, OD, OH, OW]: from each
flat index it finds the plane (n, c) and the output position, then visits the window's KD x KH x KW
input positions, unrolled (the sizes are constexprs), each a masked load of x [N, C, D, H, W]
(contiguous; consecutive outputs read inputs `stride` apart). Positions in the padding are masked: -inf
for max (which keeps a NaN the window holds, as torch does), 0 for average, whose divisor is the window's
size (`count_include_pad`), the count of positions inside the input (without it), or
`divisor_override`. 1-d and 2-d poolings are 3-d ones with unit leading dims (the wrapper views x so),
as in `triton_conv`. The epilogue runs on the fp32 result; `chan` tensors are read at the output's
channel, `full` ones at its own offsets.

Not here: ceil_mode (the recognizer refuses it), returned indices, channels-last layouts, a window
staged through shared memory for large overlapping windows (each input is re-read from L1/L2 by the
KD x KH x KW windows that cover it).
"""

from __future__ import annotations

from kernelevolve.synth.tuner.ir import OpGraph, PoolInfo, TensorArg
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


def build(graph: OpGraph, precision: str) -> Parts:
    """`precision` does not matter here: pooling compares and adds in fp32 whatever the policy."""
    names, used, ops = prepare(graph, "pool")  # the epilogue's tensors and ops (x is read by the window)
    pi = graph.pool
    if pi is None:
        raise CodegenError("a pool graph without its PoolInfo")
    x = next((t for t in graph.tensors if t.name == pi.x), None)
    if x is None:
        raise CodegenError(f"pool input {pi.x!r} is not one of the graph's tensors")
    epilogue = [t for t in used if t.name != pi.x]
    for t in epilogue:
        if t.layout not in ("full", "chan", "scalar"):
            raise CodegenError(f"a {t.layout} tensor ({t.name}) in a pooling's epilogue")

    ptrs = [names.ptr(x.name), *(names.ptr(t.name) for t in epilogue)]
    ptrs += [f"out{i}_ptr" for i in range(len(graph.outputs))]
    params = [*ptrs, "TOTAL", "C", "D", "H", "W", "OD", "OH", "OW"]
    params += [f"{k}: tl.constexpr" for k in (*_GEOMETRY, "DIVISOR", "BLOCK")]
    body = [
        "offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
        "mask = offs < TOTAL",
        "ow = offs % OW",
        "oh = (offs // OW) % OH",
        "od = (offs // (OW * OH)) % OD",
        "plane = offs // (OW * OH * OD)  # n * C + c",
        "chan = plane % C",
        "base = plane * (D * H * W)",
        *_window(pi, names.ptr(x.name)),
    ]
    acc = names.var("acc")
    body.append(f"{acc} = acc")
    offsets, masks = {"full": "offs", "chan": "chan"}, {"full": "mask", "chan": "mask"}
    body += [load(t, names, offsets, masks) for t in epilogue]
    body += [f"{names.var(op.out)} = {op_expr(op, names)}" for op in ops]
    for i, out in enumerate(graph.outputs):
        body.append(store(i, names.var(out), graph.layout_of(out), "offs", "mask", "[BLOCK]"))
    kernel = jit_function("_pool_kernel", params, body)
    fwd = _forward(graph, pi, names, x, epilogue)
    tunables, defaults = _knobs(graph)
    return Parts([kernel], fwd, tunables, defaults, helpers_for(ops), tile=("BLOCK",))


def _window(pi: PoolInfo, x_ptr: str) -> list[str]:
    """The unrolled visit of one window per output: max keeps the largest (a NaN wins and stays),
    average sums and divides."""
    maxing = pi.kind == "max"
    counted = not maxing and pi.divisor_override is None and not pi.count_include_pad
    lines = [
        "acc = tl.full([BLOCK], float('-inf'), tl.float32)"
        if maxing
        else "acc = tl.zeros([BLOCK], tl.float32)"
    ]
    if counted:
        lines.append("cnt = tl.zeros([BLOCK], tl.float32)")
    lines += window_taps(x_ptr)
    if maxing:
        lines += [
            "            v = tl.load(ptr, mask=ok, other=float('-inf')).to(tl.float32)",
            "            acc = tl.where(ok & ((v > acc) | (v != v)), v, acc)",
        ]
    else:
        lines += ["            acc += tl.load(ptr, mask=ok, other=0.0).to(tl.float32)"]
        if counted:
            lines.append("            cnt += ok.to(tl.float32)")
    if not maxing:
        lines.append("acc = acc / tl.maximum(cnt, 1.0)" if counted else "acc = acc / DIVISOR")
    return lines


def window_taps(x_ptr: str) -> list[str]:
    """The unrolled visit of a KD x KH x KW window per output (od, oh, ow) under `mask`: at each tap
    (kd, kh, kw), `ok` (inside the input) and `ptr` (x at base + its position, x [.., D, H, W]
    contiguous); the caller's lines for a tap follow, indented 12 spaces (`triton_depthwise` too)."""
    return [
        "for kd in tl.static_range(KD):",
        "    idd = od * SD - PD + kd * DD",
        "    ok_d = mask & (idd >= 0) & (idd < D)",
        "    for kh in tl.static_range(KH):",
        "        ihh = oh * SH - PH + kh * DH",
        "        ok_h = ok_d & (ihh >= 0) & (ihh < H)",
        "        for kw in tl.static_range(KW):",
        "            iww = ow * SW - PW + kw * DW",
        "            ok = ok_h & (iww >= 0) & (iww < W)",
        f"            ptr = {x_ptr} + base + (idd * H + ihh) * W + iww",
    ]


def _pad3(values: tuple[int, ...], fill: int) -> tuple[int, ...]:
    return (fill,) * (3 - len(values)) + values


def _forward(
    graph: OpGraph, pi: PoolInfo, names: Names, x: TensorArg, epilogue: list[TensorArg]
) -> list[str]:
    args = forward_args(graph)
    lx = names.local(x.name)
    lines = [f"{lx} = {source_expr(x, args)}.contiguous()"]
    lines += [f"{names.local(t.name)} = {source_expr(t, args)}.contiguous()" for t in epilogue]
    kernel, stride = _pad3(pi.kernel, 1), _pad3(pi.stride, 1)
    padding, dilation = _pad3(pi.padding, 0), _pad3(pi.dilation, 1)
    lead = 3 - pi.x_dims  # the input's own spatial dims, after unit ones: a 1-d or 2-d pooling as a 3-d one
    ones = f"(1,) * {lead} + " if lead else ""
    divisor = pi.divisor_override if pi.divisor_override is not None else kernel[0] * kernel[1] * kernel[2]
    lines += [
        f"_n, _c = {lx}.shape[0], {lx}.shape[1]",
        f"_D, _H, _W = {ones}tuple({lx}.shape[2:])",
        f"_k, _stride, _padding, _dilation = {kernel!r}, {stride!r}, {padding!r}, {dilation!r}",
        "_OD, _OH, _OW = ((s + 2 * p - d * (k - 1) - 1) // st + 1 for s, p, d, k, st in zip(",
        "    (_D, _H, _W), _padding, _dilation, _k, _stride))",
        f"_shape = (_n, _c, *(_OD, _OH, _OW)[{lead}:])",
        f"_device = {lx}.device",
        *allocate(graph, "_shape"),
        "_total = _out0.numel()",
        "if _total == 0:",
        f"    return {outputs_tuple(graph)}",
    ]
    launch = [lx, *(names.local(t.name) for t in epilogue), *(f"_out{i}" for i in range(len(graph.outputs)))]
    lines += [
        '_block = CONFIG["BLOCK"]',
        "_pool_kernel[(triton.cdiv(_total, _block),)](",
        f"    {', '.join(launch)},",
        "    _total, _c, _D, _H, _W, _OD, _OH, _OW,",
        "    KD=_k[0], KH=_k[1], KW=_k[2], SD=_stride[0], SH=_stride[1], SW=_stride[2],",
        "    PD=_padding[0], PH=_padding[1], PW=_padding[2], DD=_dilation[0], DH=_dilation[1], DW=_dilation[2],",
        f'    DIVISOR={divisor}, BLOCK=_block, num_warps=CONFIG["num_warps"],',
        ")",
        f"return {outputs_tuple(graph)}",
    ]
    return lines


def _knobs(graph: OpGraph) -> tuple[dict[str, list[int | str]], dict[str, int | str]]:
    return block_knobs(max((graph.rows[s] * graph.cols[s] for s in graph.rows), default=1 << 20))


def block_knobs(total: int) -> tuple[dict[str, list[int | str]], dict[str, int | str]]:
    """A one-output-per-lane stencil's tunables (BLOCK outputs per program, warps) and defaults for
    `total` outputs (`triton_depthwise` too)."""
    block = pick([128, 256, 512, 1024], pow2_at_least(max(128, total // 4096)))
    tunables: dict[str, list[int | str]] = {
        "BLOCK": [64, 128, 256, 512, 1024, 2048],
        "num_warps": [1, 2, 4, 8],
    }
    return tunables, {"BLOCK": block, "num_warps": 4 if block >= 256 else 2}


__all__ = ["block_knobs", "build", "window_taps"]
