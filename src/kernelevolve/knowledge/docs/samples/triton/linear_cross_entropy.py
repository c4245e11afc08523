"""Linear layer fused with the mean cross-entropy in Triton: loss = mean_i(lse(h_i W^T) - h_i . W_t_i),
without ever storing the [N, V] logits.

Kernel 1 is a GEMM over (BLOCK_M tokens) x (BLOCK_N vocabulary columns) tiles, K = D streamed in
BLOCK_K steps through tl.dot; tiles are ordered in groups of GROUP_M row blocks so that a W tile is
reused from L2 by neighbouring programs. Its epilogue, instead of storing the tile, reduces it to one
base-2 logsumexp per row (max, then sum of exp2) written to a [N, cdiv(V, BLOCK_N)] partial array,
and the one tile that holds a row's target column writes that logit. Kernel 2 merges a row's partials
(lse = m + log2(sum 2^(p - m)), times ln 2) and subtracts the target logit; kernel 3 sums the rows in a
fixed order and divides by the number of targets that are not ignore_index (-100), as torch's mean
does. Every output is written once: deterministic, no atomics.

Precision: DOT="tf32x3" splits each fp32 operand into a TF32 high part and a TF32 remainder and sums
three tensor-core products (the small x small one dropped), about fp32 accuracy at tensor-core speed;
"ieee" is plain fp32 FMA. Plain "tf32" is not offered: this is a strict-fp32 spec. Out-of-range rows
and columns are clamped to the last valid one for the loads (no masks in the inner loop) and masked
in the epilogue; D is a constexpr, so the K loop has a fixed trip count.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {
    "BLOCK_M": [32, 64, 128],
    "BLOCK_N": [32, 64, 128, 256],
    "BLOCK_K": [16, 32, 64],
    "GROUP_M": [1, 4, 8, 16],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4],
    "DOT": ["tf32x3", "ieee"],
}
CONFIG = {
    "BLOCK_M": 128,
    "BLOCK_N": 128,
    "BLOCK_K": 32,
    "GROUP_M": 8,
    "num_warps": 8,
    "num_stages": 3,
    "DOT": "tf32x3",
}
IGNORE_INDEX = -100


@triton.jit
def _tile_lse_kernel(
    h_ptr, w_ptr, tgt_ptr, part_ptr, tlogit_ptr, N, V, NT,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    grid_m = tl.cdiv(N, BLOCK_M)
    width = GROUP_M * NT
    first_m = (pid // width) * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N

    # local offsets clamped to the last valid row / column: every load is in bounds, unmasked
    rm = tl.minimum(tl.arange(0, BLOCK_M), N - 1 - m0)
    rn = tl.minimum(tl.arange(0, BLOCK_N), V - 1 - n0)
    kk = tl.arange(0, BLOCK_K)
    a_ptrs = h_ptr + m0.to(tl.int64) * D + rm[:, None] * D + kk[None, :]
    b_ptrs = w_ptr + n0.to(tl.int64) * D + rn[None, :] * D + kk[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, D, BLOCK_K):  # a constexpr trip count
        if D % BLOCK_K == 0:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(k0 + kk)[None, :] < D, other=0.0)
            b = tl.load(b_ptrs, mask=(k0 + kk)[:, None] < D, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    rows = m0 + tl.arange(0, BLOCK_M)
    cols = n0 + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    s = tl.where((cols < V)[None, :], acc * 1.4426950408889634, -float("inf"))  # base 2
    m = tl.max(s, axis=1)
    lse2 = m + tl.log2(tl.sum(tl.exp2(s - m[:, None]), axis=1))
    tl.store(part_ptr + rows.to(tl.int64) * NT + pid_n, lse2, mask=row_ok)
    tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=-1)
    picked = tl.sum(tl.where(cols[None, :] == tgt[:, None], acc, 0.0), axis=1)
    mine = row_ok & (tgt >= n0) & (tgt < n0 + BLOCK_N)
    tl.store(tlogit_ptr + rows, picked, mask=mine)


@triton.jit
def _row_loss_kernel(
    part_ptr, tlogit_ptr, tgt_ptr, loss_ptr, N, NT, ignore_index,
    BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    t = tl.arange(0, BLOCK_T)
    row_ok = rows < N
    p = tl.load(
        part_ptr + rows.to(tl.int64)[:, None] * NT + t[None, :],
        mask=row_ok[:, None] & (t < NT)[None, :], other=-float("inf"),
    )  # fmt: skip
    m = tl.where(row_ok, tl.max(p, axis=1), 0.0)
    total = tl.where(row_ok, tl.sum(tl.exp2(p - m[:, None]), axis=1), 1.0)  # no log2(0) past N
    lse = (m + tl.log2(total)) * 0.6931471805599453
    tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=ignore_index)
    valid = row_ok & (tgt != ignore_index)
    picked = tl.load(tlogit_ptr + rows, mask=valid, other=0.0)
    tl.store(loss_ptr + rows, tl.where(valid, lse - picked, 0.0), mask=row_ok)


@triton.jit
def _mean_kernel(loss_ptr, tgt_ptr, out_ptr, N, ignore_index, BLOCK: tl.constexpr):
    total = tl.zeros([BLOCK], tl.float32)
    count = tl.zeros([BLOCK], tl.int32)
    start = 0
    while start < N:  # a run-time trip count: a while loop (the interpreter cannot `range` to one)
        offs = start + tl.arange(0, BLOCK)
        ok = offs < N
        total += tl.load(loss_ptr + offs, mask=ok, other=0.0)
        tgt = tl.load(tgt_ptr + offs, mask=ok, other=ignore_index)
        count += (ok & (tgt != ignore_index)).to(tl.int32)
        start += BLOCK
    tl.store(out_ptr, tl.math.div_rn(tl.sum(total), tl.sum(count).to(tl.float32)))


class ModelNew(nn.Module):
    def __init__(self, dim: int = 768, vocab: int = 50304):
        super().__init__()
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h, targets = h.contiguous(), targets.contiguous()
        w = self.lm_head.weight.contiguous()
        n, d = h.shape
        v = w.shape[0]
        out = torch.empty((), device=h.device, dtype=torch.float32)
        bm, bn = CONFIG["BLOCK_M"], CONFIG["BLOCK_N"]
        nt = triton.cdiv(v, bn)
        part = torch.empty((n, nt), device=h.device, dtype=torch.float32)
        tlogit = torch.empty((n,), device=h.device, dtype=torch.float32)
        row_loss = torch.empty((n,), device=h.device, dtype=torch.float32)
        _tile_lse_kernel[(triton.cdiv(n, bm) * nt,)](
            h, w, targets, part, tlogit, n, v, nt,
            D=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=CONFIG["BLOCK_K"], GROUP_M=CONFIG["GROUP_M"],
            DOT=CONFIG["DOT"], num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"],
        )  # fmt: skip
        block_t = triton.next_power_of_2(nt)
        block_r = max(1, 4096 // block_t)
        _row_loss_kernel[(triton.cdiv(n, block_r),)](
            part, tlogit, targets, row_loss, n, nt, IGNORE_INDEX, BLOCK_R=block_r, BLOCK_T=block_t,
            num_warps=4,
        )  # fmt: skip
        _mean_kernel[(1,)](row_loss, targets, out, n, IGNORE_INDEX, BLOCK=1024, num_warps=4)
        return out
