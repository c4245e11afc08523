"""Feature hashing in Triton: a multiply-xorshift hash of int64 ids and a non-negative modulo, one pass.

A flat grid of BLOCK ids per program: load the id, run the spec's hash in wrapping int64 arithmetic
(`*` wraps like torch, `>>` on a signed int is arithmetic like torch's), then torch.remainder(h, b).
Eager runs seven elementwise kernels over 8-byte tensors; this reads 8 bytes and writes 8 per id.

The modulo is where the time goes: a 64-bit division is a long software routine on GPUs. MOD
"reciprocal" replaces it by a multiply with M = floor((2**64 - 1) / b), computed once on the host.
For the unsigned bits u of h, q = umulhi(u, M) is floor(u / b) or one less (the error of M is below
one quotient unit over all of u's range), so r = u - q * b needs at most one conditional subtraction.
A negative h is u - 2**64, so its remainder is r - (2**64 mod b), plus b if that went negative: the
result is torch.remainder's, in [0, b). MOD "divide" uses `%` (truncating, like C) and the same sign
fix, for comparison.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {"BLOCK": [512, 1024, 2048, 4096], "num_warps": [2, 4, 8], "MOD": ["reciprocal", "divide"]}
CONFIG = {"BLOCK": 2048, "num_warps": 4, "MOD": "reciprocal"}


@triton.jit
def _feature_hash_kernel(
    ids_ptr, out_ptr, n, buckets, recip, wrap, BLOCK: tl.constexpr, RECIPROCAL: tl.constexpr,
    IDX64: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if IDX64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    h = tl.load(ids_ptr + offs, mask=mask, other=0)
    h = h * -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64: wraps
    h = h ^ (h >> 29)  # arithmetic shift: h is signed
    h = h * -4658895280553007687  # 0xBF58476D1CE4E5B9
    h = h ^ (h >> 32)
    if RECIPROCAL:
        u = h.to(tl.uint64, bitcast=True)
        b = buckets.to(tl.uint64)
        q = tl.umulhi(u, recip.to(tl.uint64))  # floor(u / b) or one less
        r = u - q * b
        r = tl.where(r >= b, r - b, r).to(tl.int64, bitcast=True)  # u mod b, below 2**63
        r = tl.where(h < 0, r - wrap, r)  # h = u - 2**64: subtract 2**64 mod b
    else:
        r = h % buckets  # truncating: the sign of h
    r = tl.where(r < 0, r + buckets, r)
    tl.store(out_ptr + offs, r, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, buckets: int = 1000000):
        super().__init__()
        self.buckets = buckets
        self.recip = (2**64 - 1) // buckets  # host-side Python integers
        self.wrap = 2**64 % buckets

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.contiguous()
        out = torch.empty_like(ids)
        n = ids.numel()
        if n == 0:
            return out
        block = CONFIG["BLOCK"]
        _feature_hash_kernel[(triton.cdiv(n, block),)](
            ids, out, n, self.buckets, self.recip, self.wrap,
            BLOCK=block, RECIPROCAL=CONFIG["MOD"] == "reciprocal", IDX64=n + block >= 2**31,
            num_warps=CONFIG["num_warps"],
        )  # fmt: skip
        return out
