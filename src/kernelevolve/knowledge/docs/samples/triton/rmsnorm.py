"""RMSNorm in Triton: y = x * rsqrt(mean(x^2) + eps) * weight, a [ROWS, BLOCK_C] tile per program.

Single pass: each row is loaded once into registers (BLOCK_C = next_power_of_2(cols), padding
masked to 0 so it adds nothing to the sum of squares; the mean divides by the true cols), reduced,
scaled and stored. The weight row is loaded once per program and broadcast over its ROWS rows. Short
rows are packed so a tile holds about 4096 elements; "auto" sizes ROWS and num_warps per shape.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {"ROWS": ["auto", 1, 2, 4, 8, 16], "num_warps": ["auto", 1, 2, 4, 8, 16]}
CONFIG = {"ROWS": "auto", "num_warps": "auto"}


@triton.jit
def _rmsnorm_kernel(
    x_ptr, w_ptr, y_ptr, rows, cols, eps, ROWS: tl.constexpr, BLOCK_C: tl.constexpr, IDX64: tl.constexpr
):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    if IDX64:
        r = r.to(tl.int64)
    c = tl.arange(0, BLOCK_C)[None, :]
    cmask = c < cols
    mask = (r < rows) & cmask
    x = tl.load(x_ptr + r * cols + c, mask=mask, other=0.0)
    w = tl.load(w_ptr + c, mask=cmask, other=0.0)
    ms = tl.sum(x * x, axis=1, keep_dims=True) / cols
    rs = tl.rsqrt(ms + eps)
    tl.store(y_ptr + r * cols + c, x * rs * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, cols: int = 1024, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(cols))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w = self.weight.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        if x.numel() == 0:
            return y
        rows = x.numel() // cols
        block_c = triton.next_power_of_2(cols)
        r = CONFIG["ROWS"]
        if r == "auto":  # tiles of up to 4096 elements, yet about two programs per SM (132 on H100)
            r = 1 << (max(1, min(4096 // block_c, rows // 264)).bit_length() - 1)
        r = max(1, min(r, 16384 // block_c))
        warps = CONFIG["num_warps"]
        if warps == "auto":
            warps = 4 if r * block_c <= 2048 else 8 if r * block_c <= 8192 else 16
        progs = triton.cdiv(rows, r)
        _rmsnorm_kernel[(progs,)](
            x, w, y, rows, cols, self.eps,
            ROWS=r, BLOCK_C=block_c, IDX64=progs * r * cols >= 2**31, num_warps=warps,
        )  # fmt: skip
        return y
