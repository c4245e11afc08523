"""Rotary position embedding (rotate-half form) in C for the CPU: out = x * cos + rotate_half(x) * sin.

x is [B, S, H, D], cos and sin [S, D]. Tokens (b, s) are OpenMP iterations (static schedule: every
token costs the same). Per token the four table half-rows (D floats of cos, D of sin: 1 KiB at D = 128)
stay in L1 while all H heads use them; per head the two output halves are x1 * c1 - x2 * s1 and
x2 * c2 + x1 * s2, two `omp simd` loops over D/2 lanes with unit stride, so no rotated copy of x is
built. Traffic is one read of x and one write of out; eager's neg, cat, two muls and add make five
passes and three temporaries. FMA="contract" lets gcc fuse each multiply-add (-ffp-contract=fast);
"strict" (-ffp-contract=off) rounds like eager's separate kernels, bit for bit.
"""

import torch
import torch.nn as nn

from kernelevolve.native import compile_c

TUNABLES = {"TOKENS_PER_TASK": [1, 4, 16, 64], "FMA": ["contract", "strict"]}
CONFIG = {"TOKENS_PER_TASK": 4, "FMA": "contract"}

SOURCE = r"""
#include <stdint.h>

/* out[t, h] = rotate(x[t, h]) with the table row of position t % seq; x, out [tokens, heads, dim] */
void rotary_half(const float *restrict x, const float *restrict cosv, const float *restrict sinv,
                 float *restrict out, int64_t tokens, int64_t seq, int64_t heads, int64_t dim) {
    const int64_t half = dim / 2;
    #pragma omp parallel for schedule(static, TOKENS_PER_TASK)
    for (int64_t t = 0; t < tokens; ++t) {
        const float *c = cosv + (t % seq) * dim;
        const float *s = sinv + (t % seq) * dim;
        for (int64_t h = 0; h < heads; ++h) {
            const float *xr = x + (t * heads + h) * dim;
            float *o = out + (t * heads + h) * dim;
            #pragma omp simd
            for (int64_t j = 0; j < half; ++j) o[j] = xr[j] * c[j] - xr[j + half] * s[j];
            #pragma omp simd
            for (int64_t j = 0; j < half; ++j)
                o[j + half] = xr[j + half] * c[j + half] + xr[j] * s[j + half];
        }
    }
}
"""

_DEFINES = f"#define TOKENS_PER_TASK {CONFIG['TOKENS_PER_TASK']}\n"
_CONTRACT = {"contract": "-ffp-contract=fast", "strict": "-ffp-contract=off"}[CONFIG["FMA"]]
_lib = compile_c(_DEFINES + SOURCE, flags=[_CONTRACT, "-fno-trapping-math"])


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
        batch, seq, heads, dim = x.shape
        out = torch.empty_like(x)
        if out.numel():
            _lib.rotary_half(x, cos, sin, out, batch * seq, seq, heads, dim)
        return out
