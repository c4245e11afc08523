"""Causal attention softmax(q k^T / sqrt(d) + mask) v over [B, H, S, D] in Triton, FlashAttention-style.

One program per (query block of BLOCK_M rows, batch * head), as in the unmasked sample: the Q tile,
a running row max m, a running denominator l and an fp32 [BLOCK_M, D] accumulator stay in registers
while K and V stream through in BLOCK_N-key blocks (online softmax in base 2, 1/sqrt(d) * log2(e)
folded into Q). The causal structure splits the key range of query block [m0, m0 + BLOCK_M) in two:
- keys [0, lo), lo = m0 rounded down to a multiple of BLOCK_N, lie below the diagonal for every row
  of the block: no mask at all (not even the sequence-end mask: lo <= m0 < S);
- keys [lo, min(m0 + BLOCK_M, S)) are the diagonal blocks: scores with key > query (or key >= S) are
  set to -inf before the running max.
Key blocks above the diagonal are never loaded, which halves the work at long S. Every row meets key
lo <= row in its first diagonal block, so no row's max stays -inf (no NaN from a fully masked row).
Query blocks run heaviest first (axis 0 is reversed), so the cheap blocks near the start of the
sequence fill the tail of the launch. The trip counts depend on the program, so both loops are
`while` loops (the Triton 3.6 interpreter under numpy 2 cannot `range` to a run-time bound).
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {
    "BLOCK_M": [16, 32, 64, 128],
    "BLOCK_N": [16, 32, 64, 128],
    "num_warps": [2, 4, 8],
    "DOT": ["tf32x3", "ieee", "tf32"],
}
CONFIG = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "DOT": "tf32x3"}


@triton.jit
def _attn_block(
    acc, l_i, m_i, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, S, sks, svs,
    D: tl.constexpr, DIAG: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One BLOCK_N-key step of the online softmax; DIAG masks keys past the query and past S."""
    cols = start_n + offs_n
    kv_mask = offs_d[None, :] < D
    if DIAG:
        kv_mask = kv_mask & (cols[:, None] < S)
    k = tl.load(k_base + cols[:, None] * sks + offs_d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT)
    if DIAG:
        s = tl.where((cols[None, :] <= offs_m[:, None]) & (cols[None, :] < S), s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)  # 0 on the first block (m_i = -inf)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_base + cols[:, None] * svs + offs_d[None, :], mask=kv_mask, other=0.0)
    acc = tl.dot(p, v, acc * alpha[:, None], input_precision=DOT)
    return acc, l_i, m_new


@triton.jit
def _causal_attn_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,
    H, S, qk_scale,
    sqz, sqh, sqs, skz, skh, sks, svz, svh, svs, soz, soh, sos,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # the heaviest query blocks first
    bh = tl.program_id(1)
    z = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    k_base = k_ptr + z * skz + h * skh
    v_base = v_ptr + z * svz + h * svh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_m[:, None] < S) & (offs_d[None, :] < D)
    q = tl.load(q_ptr + z * sqz + h * sqh + offs_m[:, None] * sqs + offs_d[None, :], mask=q_mask, other=0.0)
    q = q * qk_scale  # 1/sqrt(d) * log2(e): scores come out in base 2

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N
    hi = tl.minimum((start_m + 1) * BLOCK_M, S)
    start_n = lo * 0  # a run-time int32, carried by the while loops
    while start_n < lo:  # below the diagonal: no mask
        acc, l_i, m_i = _attn_block(
            acc, l_i, m_i, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, S, sks, svs,
            D=D, DIAG=False, DOT=DOT,
        )  # fmt: skip
        start_n += BLOCK_N
    while start_n < hi:  # the diagonal blocks: causal and sequence-end mask
        acc, l_i, m_i = _attn_block(
            acc, l_i, m_i, q, k_base, v_base, start_n, offs_m, offs_n, offs_d, S, sks, svs,
            D=D, DIAG=True, DOT=DOT,
        )  # fmt: skip
        start_n += BLOCK_N

    out = acc / l_i[:, None]
    tl.store(o_ptr + z * soz + h * soh + offs_m[:, None] * sos + offs_d[None, :], out, mask=q_mask)


class ModelNew(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        batch, heads, seq, dim = q.shape
        o = torch.empty_like(q)
        if o.numel() == 0:
            return o
        bm = CONFIG["BLOCK_M"]
        grid = (triton.cdiv(seq, bm), batch * heads)
        _causal_attn_kernel[grid](
            q, k, v, o,
            heads, seq, 1.4426950408889634 / math.sqrt(dim),
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
            D=dim, BLOCK_D=max(16, triton.next_power_of_2(dim)), BLOCK_M=bm, BLOCK_N=CONFIG["BLOCK_N"],
            DOT=CONFIG["DOT"], num_warps=CONFIG["num_warps"],
        )  # fmt: skip
        return o
