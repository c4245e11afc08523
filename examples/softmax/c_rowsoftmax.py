"""Row softmax in C for the CPU: rows split across threads, three passes over each row in cache."""

import torch
import torch.nn as nn

from kernelevolve.native import compile_c

SOURCE = r"""
#include <math.h>
#include <stdint.h>

void softmax_rows(const float *x, float *y, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        float s = 0.0f;
        for (int64_t c = 0; c < cols; ++c) { float e = expf(xr[c] - m); yr[c] = e; s += e; }
        float inv = 1.0f / s;
        for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
}
"""

_lib = compile_c(SOURCE)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[0], x.shape[1])
        return y
