"""A transformer block's core in five Triton launches: h = x + proj(causal MHA(qkv(x))), y = h + fc2(gelu(fc1(h))).

1. qkv = x @ Wqkv^T: one tiled GEMM writing [B*S, 3D], which *is* q, k and v in [B, S, 3, H, Dh]
   order: no split, permute or copy follows it.
2. Causal flash attention (the attention_causal sample's kernel) reads q, k and v out of that buffer
   through strides (token stride 3D, head stride Dh) and writes [B*S, D] with the heads already
   interleaved, so eager's transpose-and-copy before the output projection disappears.
3. h = x + a @ Wproj^T + b_proj: the bias and the residual are added to the fp32 accumulator.
4. g = gelu(h @ W1^T + b1): exact (erf) GELU in the epilogue; the [B*S, 4D] activation is written once
   and read once (eager writes it twice and reads it twice around a separate GELU kernel).
5. y = h + g @ W2^T + b2.
Every GEMM is the Triton tutorial's schedule (GROUP_M swizzled tiles, fp32 accumulator, nn.Linear
weights read as W^T through strides, edge rows wrapped so only the store is masked, a constexpr K trip
count so the loop pipelines), specialized per call by constexpr flags for bias, GELU and residual.
The spec is strict fp32: the dots run as "tf32x3" (three TF32 tensor-core products, about fp32
accuracy) or "ieee"; plain TF32 is outside the policy. The GEMMs with N = D (proj, fc2) have their
own tile sizes, since they have 3x to 4x fewer output tiles than qkv and fc1.
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {
    "BLOCK_M": [128, 64],
    "BLOCK_N": [128, 64, 256],
    "BLOCK_K": [32, 16, 64],
    "GROUP_M": [8, 1, 4],
    "num_warps": [8, 4],
    "num_stages": [3, 2, 4],
    "OUT_BLOCK_M": [64, 128, 32],
    "OUT_BLOCK_N": [64, 128, 32],
    "ATTN_BLOCK_M": [64, 32, 128],
    "ATTN_BLOCK_N": [32, 64, 16],
    "attn_warps": [4, 8],
    "DOT": ["tf32x3", "ieee"],
}
CONFIG = {
    "BLOCK_M": 128,
    "BLOCK_N": 128,
    "BLOCK_K": 32,
    "GROUP_M": 8,
    "num_warps": 8,
    "num_stages": 3,
    "OUT_BLOCK_M": 64,
    "OUT_BLOCK_N": 64,
    "ATTN_BLOCK_M": 64,
    "ATTN_BLOCK_N": 32,
    "attn_warps": 4,
    "DOT": "tf32x3",
}


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, b_ptr, r_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    K_TILES: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, GELU: tl.constexpr,
    HAS_RES: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """y = epilogue(x @ W^T): x [M, K] and W [N, K] K-contiguous, y and the residual r [M, N]."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    am = (rm % M).to(tl.int64)  # past the edge: wrap, so the loads need no mask (the store has one)
    bn = (rn % N).to(tl.int64)
    a_ptrs = x_ptr + am[:, None] * stride_xm + rk[None, :]
    b_ptrs = w_ptr + bn[None, :] * stride_wn + rk[:, None]  # B[k, n] = W[n, k]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(K_TILES):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=rk[None, :] < K - kt * BLOCK_K, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < K - kt * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if GELU:
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    offs = rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    if HAS_RES:
        acc += tl.load(r_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc, mask=mask)


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
    """Causal flash attention over strided [B, S, H, Dh] views; see the attention_causal sample."""
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


def _linear(x, weight, bias, out, residual=None, gelu=False, wide=True):
    """out = [residual +] [gelu](x @ weight^T [+ bias]) for 2-D contiguous x, out and residual."""
    M, K = x.shape
    N = weight.shape[0]
    bm = CONFIG["BLOCK_M"] if wide else CONFIG["OUT_BLOCK_M"]
    bn = CONFIG["BLOCK_N"] if wide else CONFIG["OUT_BLOCK_N"]
    bk = CONFIG["BLOCK_K"]
    _linear_kernel[(triton.cdiv(M, bm) * triton.cdiv(N, bn),)](
        x, weight, out if bias is None else bias, out if residual is None else residual, out,
        M, N, K,
        x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=CONFIG["GROUP_M"],
        K_TILES=triton.cdiv(K, bk), EVEN_K=K % bk == 0, HAS_BIAS=bias is not None, GELU=gelu,
        HAS_RES=residual is not None, DOT=CONFIG["DOT"],
        num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"],
    )  # fmt: skip
    return out


class ModelNew(nn.Module):
    def __init__(self, dim: int = 512, heads: int = 8):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        heads, dh = self.heads, d // self.heads
        x2 = x.contiguous().view(b * s, d)
        y = torch.empty_like(x2)
        if y.numel() == 0:
            return y.view(b, s, d)
        like = {"device": x.device, "dtype": x.dtype}

        qkv = _linear(x2, self.qkv.weight, None, torch.empty((b * s, 3 * d), **like))
        q, k, v = qkv.view(b, s, 3, heads, dh).unbind(2)  # strided [B, S, H, Dh] views
        a = torch.empty((b * s, d), **like)
        o = a.view(b, s, heads, dh)
        bm = CONFIG["ATTN_BLOCK_M"]
        _causal_attn_kernel[(triton.cdiv(s, bm), b * heads)](
            q, k, v, o,
            heads, s, 1.4426950408889634 / math.sqrt(dh),
            q.stride(0), q.stride(2), q.stride(1), k.stride(0), k.stride(2), k.stride(1),
            v.stride(0), v.stride(2), v.stride(1), o.stride(0), o.stride(2), o.stride(1),
            D=dh, BLOCK_D=max(16, triton.next_power_of_2(dh)), BLOCK_M=bm, BLOCK_N=CONFIG["ATTN_BLOCK_N"],
            DOT=CONFIG["DOT"], num_warps=CONFIG["attn_warps"],
        )  # fmt: skip

        h = _linear(a, self.proj.weight, self.proj.bias, torch.empty_like(x2), residual=x2, wide=False)
        g = _linear(h, self.fc1.weight, self.fc1.bias, torch.empty((b * s, 4 * d), **like), gelu=True)
        _linear(g, self.fc2.weight, self.fc2.bias, y, residual=h, wide=False)
        return y.view(b, s, d)
