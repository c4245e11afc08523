"""Triton template for strided transposed convolutions (dilation 1): phase decomposition, a.k.a.
sub-pixel convolution, one implicit GEMM per output phase.

Per spatial dim with stride s, padding p and kernel size Kz, output position o has phase
phi = (o + p) mod s, and only the taps k = phi + j * s (j = 0, 1, .. while k < Kz) reach it, from
input position i = (o + p - k) / s, an exact division. `triton_conv`'s transposed gather runs over
every (input channel, kernel position) and masks the pairs that do not divide: with stride s in
every one of `dims` dims, all but 1 in s^dims of its MACs are on zeros. Here the grid's third axis
holds the s_d * s_h * s_w phases; a phase's rows are only its own outputs, o = o_first + s * q for
q in [0, cdiv(O - o_first, s)) with o_first = (phi - p) mod s, and its inner dim is (input channel,
j_d, j_h, j_w) with cdiv(Kz, s) taps per dim (a tap past the kernel, phi + j * s >= Kz, is masked:
a kernel size that the stride does not divide pads the shorter phases' K). The input index is
i = (o_first + p - phi) / s + q - j; positions outside the input are masked.

The grid's first axis is sized by the largest phase's rows (N * prod(cdiv(O, s)) of them); a program
past its own phase's rows returns at once. Rows, groups (the grid's second axis), the program-id
swizzle, the dot, bias, epilogue and store are `triton_conv`'s, as are the tunables, their defaults
and the drafted presets; an output element's offset is its (n, channel, od, oh, ow) one, so the
store is scattered with stride s along each strided dim.

Not here: dilation > 1 (its taps are no longer phi + j * s; `triton_conv` covers it), stride 1 in
every dim (one phase: `triton_conv` is that GEMM), per-phase K trimmed to the phase's own taps
(the loop count is one constexpr for every phase).
"""

from __future__ import annotations

from kernelevolve.synth.tuner.ir import OpGraph
from kernelevolve.synth.tuner.triton_common import CodegenError, Parts, dot_lines, jit_function
from kernelevolve.synth.tuner.triton_conv import (
    conv_of,
    epilogue,
    forward_head,
    kernel_params,
    launch,
    load_a,
    parts,
    swizzle,
)

_GEOMETRY = ("KD", "KH", "KW", "SD", "SH", "SW", "PD", "PH", "PW", "TD", "TH", "TW")
_DIMS = (("d", "D", "SD", "PD"), ("h", "H", "SH", "PH"), ("w", "W", "SW", "PW"))


def applies(graph: OpGraph) -> bool:
    """A transposed convolution with a stride above 1 in some dim and dilation 1 in every dim."""
    ci = graph.conv
    return (
        ci is not None
        and ci.transposed
        and any(s > 1 for s in ci.stride)
        and all(d == 1 for d in ci.dilation)
    )


def build(graph: OpGraph, precision: str) -> Parts:
    c = conv_of(graph, precision)
    if not applies(graph):
        raise CodegenError(
            "triton-conv-phased takes a transposed convolution with a stride > 1 and dilation 1"
        )
    body = [
        *swizzle(),
        "phase = tl.program_id(2)",
        "phi_d = phase // (SH * SW)",
        "phi_h = (phase // SW) % SH",
        "phi_w = phase % SW",
    ]
    for d, size, st, pad in _DIMS:
        body += [
            f"f_{d} = (phi_{d} + {st} - {pad} % {st}) % {st}  # the phase's first output, (phi - pad) mod s",
            f"q{d}_n = (O{size} - f_{d} + {st} - 1) // {st}  # its outputs along this dim",
            f"base_{d} = (f_{d} + {pad} - phi_{d}) // {st}  # input of its first output, tap 0 (exact)",
        ]
    body += [
        "Q = qd_n * qh_n * qw_n",
        "M_PHASE = N * Q",
        "if pid_m * BLOCK_M >= M_PHASE:  # past this phase's rows (every row, where it has none)",
        "    return",
        "m_ok = rm < M_PHASE",
        "am = rm % M_PHASE  # past the edge: wrap (the loads stay in bounds, the store is masked)",
        "n_img = am // Q",
        "q = am % Q",
        "qd = q // (qh_n * qw_n)",
        "qh = (q // qw_n) % qh_n",
        "qw = q % qw_n",
        "P = OD * OH * OW",
        "p = ((f_d + SD * qd) * OH + f_h + SH * qh) * OW + f_w + SW * qw",
        "x_row = n_img.to(tl.int64) * sx_n + (g * CIN_G).to(tl.int64) * sx_c",
        "bn = rn % COUT_G",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "for kt in range(K_TILES):",
        "    k = kt * BLOCK_K + rk",
        "    cin = k // (TD * TH * TW)",
        "    t = k % (TD * TH * TW)",
        "    jd = t // (TH * TW)",
        "    jh = (t // TW) % TH",
        "    jw = t % TW",
        "    kd = phi_d + jd * SD",
        "    kh = phi_h + jh * SH",
        "    kw = phi_w + jw * SW",
        "    k_ok = (k < K) & (kd < KD) & (kh < KH) & (kw < KW)  # a tap past the kernel: masked",
        "    idd = (base_d + qd)[:, None] - jd[None, :]",
        "    ihh = (base_h + qh)[:, None] - jh[None, :]",
        "    iww = (base_w + qw)[:, None] - jw[None, :]",
        "    inside = (idd >= 0) & (idd < D) & (ihh >= 0) & (ihh < H) & (iww >= 0) & (iww < W)",
        *load_a(c),
        "    w_off = ((g * CIN_G + cin[:, None]).to(tl.int64) * COUT_G + bn[None, :]) * (KD * KH * KW)",
        "    w_off += ((kd * KH + kh) * KW + kw)[:, None]",
        f"    b = tl.load({c.ptrs[1]} + w_off, mask=k_ok[:, None], other=0.0){c.cast(c.w)}",
        *dot_lines(c.dots),
        *epilogue(c),
    ]
    kernel = jit_function("_conv_phased_kernel", kernel_params(c, ["N"], _GEOMETRY), body)
    fwd = [
        *forward_head(c),
        "_qd, _qh, _qw = (triton.cdiv(o, s) for o, s in zip((_OD, _OH, _OW), _stride))",
        "_M = _n * _qd * _qh * _qw  # the largest phase's rows",
        "_taps = tuple(triton.cdiv(k, s) for k, s in zip((_KD, _KH, _KW), _stride))",
        "_K = _cin_g * _taps[0] * _taps[1] * _taps[2]",
        *launch(
            c,
            "_conv_phased_kernel",
            ", _stride[0] * _stride[1] * _stride[2]",
            " _n,",
            "TD=_taps[0], TH=_taps[1], TW=_taps[2]",
        ),
    ]
    return parts(c, kernel, fwd)


__all__ = ["applies", "build"]
