"""Row softmax in C for the CPU: rows split across OpenMP threads, three vectorized passes per row.

Each row (<= 16 KiB at 4096 columns) stays in L1/L2 between its passes: max, then exp(x - max) stored
into y while summing, then a scale by 1/sum. Without -ffast-math gcc refuses to vectorize float
reductions (they reassociate the sum); `#pragma omp simd reduction(max:m)` / `reduction(+:s)`
authorizes exactly those loops, and EXP="poly" replaces libm's scalar expf with a branch-free Cephes
polynomial (~1 ulp) that vectorizes, so every pass runs 8 (AVX2) or 16 (AVX-512) lanes wide.
"""

import torch
import torch.nn as nn

from kernelevolve.native import compile_c

TUNABLES = {"ROWS_PER_TASK": [1, 4, 16], "EXP": ["poly", "libm"]}
CONFIG = {"ROWS_PER_TASK": 4, "EXP": "poly"}

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float exp_poly(float x) {  /* Cephes expf, branch-free: vectorizable, ~1 ulp */
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return y * scale;
}

#if USE_POLY
#define EXPF exp_poly
#else
#define EXPF expf
#endif

void softmax_rows(const float *restrict x, float *restrict y, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(static, ROWS_PER_TASK)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        float s = 0.0f;
        #pragma omp simd reduction(+:s)
        for (int64_t c = 0; c < cols; ++c) {
            float e = EXPF(xr[c] - m);
            yr[c] = e;
            s += e;
        }
        float inv = 1.0f / s;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
}
"""

_DEFINES = (
    f"#define ROWS_PER_TASK {CONFIG['ROWS_PER_TASK']}\n#define USE_POLY {int(CONFIG['EXP'] == 'poly')}\n"
)
_lib = compile_c(_DEFINES + SOURCE, flags=["-ffp-contract=fast", "-fno-trapping-math"])


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        cols = x.shape[-1]
        y = torch.empty_like(x)
        if y.numel():
            _lib.softmax_rows(x, y, x.numel() // cols, cols)
        return y
