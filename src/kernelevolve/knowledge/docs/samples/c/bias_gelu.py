"""Bias + exact GELU in C for the CPU: one fused pass, rows split across OpenMP threads.

y = gelu(x + b) reads x once and writes y once (eager torch writes x + b to a temporary first). The
loop over a row's columns is vectorized by gcc (-O3 -march=native): libm's erff/expf are scalar calls
that block vectorization without -ffast-math, so ERF="poly" uses Abramowitz-Stegun 7.1.26 (|error| <
1.5e-7, what torch's own vectorized CPU erf uses) with a branch-free Cephes expf, both plain
arithmetic that gcc turns into AVX2/AVX-512 code. For x < 0 it evaluates erfc directly, so 1 + erf
does not cancel. ERF="libm" is the scalar reference path, useful to see what vectorization buys.
"""

import torch
import torch.nn as nn

from kernelevolve.native import compile_c

TUNABLES = {"ROWS_PER_TASK": [1, 4, 16, 64], "ERF": ["poly", "libm"]}
CONFIG = {"ROWS_PER_TASK": 4, "ERF": "poly"}

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

static inline float gelu(float v) {
#if USE_POLY
    /* erfc(|z|) = q(t) exp(-z^2), t = 1 / (1 + p|z|), z = v / sqrt(2) (Abramowitz-Stegun 7.1.26) */
    float z = fabsf(v) * 0.70710678118654752f;
    float t = 1.0f / (1.0f + 0.3275911f * z);
    float q = 1.061405429f;
    q = q * t - 1.453152027f;
    q = q * t + 1.421413741f;
    q = q * t - 0.284496736f;
    q = q * t + 0.254829592f;
    q = q * t * exp_poly(-z * z);
    float one_plus_erf = v >= 0.0f ? 2.0f - q : q;
    return 0.5f * v * one_plus_erf;
#else
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
#endif
}

void bias_gelu(const float *restrict x, const float *restrict b, float *restrict y, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(static, ROWS_PER_TASK)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) yr[c] = gelu(xr[c] + b[c]);
    }
}
"""

_DEFINES = (
    f"#define ROWS_PER_TASK {CONFIG['ROWS_PER_TASK']}\n#define USE_POLY {int(CONFIG['ERF'] == 'poly')}\n"
)
_lib = compile_c(_DEFINES + SOURCE, flags=["-ffp-contract=fast", "-fno-trapping-math"])


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x, b = x.contiguous(), b.contiguous()
        cols = x.shape[-1]
        y = torch.empty_like(x)
        if y.numel():
            _lib.bias_gelu(x, b, y, x.numel() // cols, cols)
        return y
