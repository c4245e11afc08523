"""RMSNorm in C for the CPU: one row per iteration, rows split across OpenMP threads, two passes.

Pass 1 sums x^2 over the row (a float reduction: `#pragma omp simd reduction(+:ss)` lets gcc keep 8 or
16 partial sums in vector lanes, which it will not do on its own without -ffast-math); pass 2 writes
x * rsqrt(mean + eps) * w. A row of 2048 floats is 8 KiB, so pass 2 reads it from L1, and the
weight vector stays in cache for every row: DRAM traffic is one read of x and one write of y.
ACC="double" accumulates the sum of squares in double (half the lanes, more exact); float is within
strict fp32 tolerance at these widths.
"""

import torch
import torch.nn as nn

from kernelevolve.native import compile_c

TUNABLES = {"ROWS_PER_TASK": [1, 4, 16, 64], "ACC": ["float", "double"]}
CONFIG = {"ROWS_PER_TASK": 4, "ACC": "float"}

SOURCE = r"""
#include <math.h>
#include <stdint.h>

void rmsnorm_rows(const float *restrict x, const float *restrict w, float *restrict y,
                  int64_t rows, int64_t cols, float eps) {
    #pragma omp parallel for schedule(static, ROWS_PER_TASK)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        ACC_T ss = 0;
        #pragma omp simd reduction(+:ss)
        for (int64_t c = 0; c < cols; ++c) ss += (ACC_T)xr[c] * (ACC_T)xr[c];
        float inv = 1.0f / sqrtf((float)(ss / (ACC_T)cols) + eps);
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * inv * w[c];
    }
}
"""

_DEFINES = f"#define ROWS_PER_TASK {CONFIG['ROWS_PER_TASK']}\n#define ACC_T {CONFIG['ACC']}\n"
_lib = compile_c(_DEFINES + SOURCE, flags=["-ffp-contract=fast", "-fno-trapping-math"])


class ModelNew(nn.Module):
    def __init__(self, cols: int = 1024, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cols))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w = self.weight.detach().contiguous()
        cols = x.shape[-1]
        y = torch.empty_like(x)
        if y.numel():
            _lib.rmsnorm_rows(x, w, y, x.numel() // cols, cols, self.eps)
        return y
