"""Scaled dot-product attention (no mask) in C for the CPU: an online-softmax loop per query row.

Each query row of each (batch, head) is an OpenMP iteration (ROWS_PER_TASK consecutive rows of one
head per chunk, so they share that head's K^T and V in L2: 2 x seq x 64 floats = 256 KiB at seq 512).
The row walks the keys in blocks of BLOCK_N: scores s_j = q.k_j / sqrt(d) for the block, then the
flash-attention update with running max m and running sum l:
    m' = max(m, max_j s_j);  c = exp(m - m');  p_j = exp(s_j - m');  l = l c + sum p_j;  o = o c + sum p_j v_j
and o / l at the end. The [seq, seq] score matrix is never stored: per row, only BLOCK_N scores live
(in L1), and o is the output row itself. K is transposed once per call (1/seq of the work) into
kt[head][d][seq padded to BLOCK_N], so a block's scores are vectorized axpys over keys,
s[0:BLOCK_N] += q[d] * kt[d][j0:j0+BLOCK_N], instead of one horizontal reduction per key. The p.V
update folds 4 keys per pass over o. dim == 64 takes a specialized path (constant trip counts).
exp is a branch-free polynomial that gcc vectorizes (libm's expf is a scalar call). The spec allows TF32; this computes in fp32.
"""

import math

import torch
import torch.nn as nn

from kernelevolve.native import compile_c

TUNABLES = {"BLOCK_N": [16, 32, 64, 128, 256], "ROWS_PER_TASK": [1, 4, 16, 64], "EXP": ["poly", "libm"]}
CONFIG = {"BLOCK_N": 64, "ROWS_PER_TASK": 16, "EXP": "poly"}

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

/* One query row: o = softmax(q . K^T * scale) V, K given transposed and padded: kt[d][spad] */
static inline __attribute__((always_inline)) void attend_row(
    const float *restrict qi, const float *restrict kt, const float *restrict vh, float *restrict oi,
    int64_t seq, int64_t spad, int64_t dim, float scale) {
    float m = -INFINITY, l = 0.0f, s[BLOCK_N];
    for (int64_t d = 0; d < dim; ++d) oi[d] = 0.0f;
    for (int64_t j0 = 0; j0 < seq; j0 += BLOCK_N) {
        const int64_t nb = seq - j0 < BLOCK_N ? seq - j0 : BLOCK_N;
        /* scores of the block as axpys over keys: s[0:BLOCK_N] += q[d] * kt[d][j0:j0+BLOCK_N] */
        for (int j = 0; j < BLOCK_N; ++j) s[j] = 0.0f;
        int64_t d = 0;
        for (; d + 4 <= dim; d += 4) {  /* 4 rows of K^T per pass over s */
            const float q0 = qi[d] * scale, q1 = qi[d + 1] * scale, q2 = qi[d + 2] * scale, q3 = qi[d + 3] * scale;
            const float *k0 = kt + d * spad + j0, *k1 = k0 + spad, *k2 = k1 + spad, *k3 = k2 + spad;
            #pragma omp simd
            for (int j = 0; j < BLOCK_N; ++j) s[j] += q0 * k0[j] + q1 * k1[j] + q2 * k2[j] + q3 * k3[j];
        }
        for (; d < dim; ++d) {
            const float qd = qi[d] * scale;
            const float *kr = kt + d * spad + j0;
            #pragma omp simd
            for (int j = 0; j < BLOCK_N; ++j) s[j] += qd * kr[j];
        }
        float bm = -INFINITY;
        #pragma omp simd reduction(max:bm)
        for (int64_t j = 0; j < nb; ++j) bm = s[j] > bm ? s[j] : bm;
        const float mn = m > bm ? m : bm;
        const float corr = EXPF(m - mn);  /* first block: exp(-inf) -> ~0, and o, l are 0 anyway */
        float ps = 0.0f;
        #pragma omp simd reduction(+:ps)
        for (int64_t j = 0; j < nb; ++j) {
            s[j] = EXPF(s[j] - mn);
            ps += s[j];
        }
        l = l * corr + ps;
        m = mn;
        /* o = o * corr + sum_j p_j v_j, 4 keys per pass over o */
        int64_t j = 0;
        for (; j + 4 <= nb; j += 4) {
            const float *v0 = vh + (j0 + j) * dim, *v1 = v0 + dim, *v2 = v1 + dim, *v3 = v2 + dim;
            const float p0 = s[j], p1 = s[j + 1], p2 = s[j + 2], p3 = s[j + 3], c = j == 0 ? corr : 1.0f;
            #pragma omp simd
            for (int64_t d = 0; d < dim; ++d) oi[d] = oi[d] * c + p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d];
        }
        if (nb < 4)
            for (int64_t d = 0; d < dim; ++d) oi[d] *= corr;
        for (; j < nb; ++j) {
            const float *vj = vh + (j0 + j) * dim;
            const float pj = s[j];
            #pragma omp simd
            for (int64_t d = 0; d < dim; ++d) oi[d] += pj * vj[d];
        }
    }
    const float inv = 1.0f / l;
    for (int64_t d = 0; d < dim; ++d) oi[d] *= inv;
}

/* o[bh, i] = softmax(q[bh, i] . k[bh]^T * scale) v[bh]; q, k, v, o [BH, S, D] contiguous */
int attention(const float *restrict q, const float *restrict k, const float *restrict v, float *restrict o,
              int64_t bh, int64_t seq, int64_t dim, float scale) {
    const int64_t spad = (seq + BLOCK_N - 1) / BLOCK_N * BLOCK_N;
    float *kt = aligned_alloc(64, ((size_t)(bh * dim * spad) * sizeof(float) + 63) / 64 * 64);
    if (kt == NULL) return -1;
    #pragma omp parallel
    {
        /* K^T per head, zero-padded to a whole number of key blocks: 1/seq of the work */
        #pragma omp for collapse(2) schedule(static)
        for (int64_t h = 0; h < bh; ++h)
            for (int64_t d = 0; d < dim; ++d) {
                float *dst = kt + (h * dim + d) * spad;
                const float *src = k + h * seq * dim + d;
                for (int64_t j = 0; j < seq; ++j) dst[j] = src[j * dim];
                for (int64_t j = seq; j < spad; ++j) dst[j] = 0.0f;
            }
        #pragma omp for schedule(static, ROWS_PER_TASK)
        for (int64_t row = 0; row < bh * seq; ++row) {
            const int64_t h = row / seq;
            const float *kth = kt + h * dim * spad, *vh = v + h * seq * dim;
            if (dim == 64)  /* the common head size, specialized: every d loop has a constant trip count */
                attend_row(q + row * 64, kth, vh, o + row * 64, seq, spad, 64, scale);
            else
                attend_row(q + row * dim, kth, vh, o + row * dim, seq, spad, dim, scale);
        }
    }
    free(kt);
    return 0;
}
"""

_DEFINES = (
    f"#define BLOCK_N {CONFIG['BLOCK_N']}\n#define ROWS_PER_TASK {CONFIG['ROWS_PER_TASK']}\n"
    f"#define USE_POLY {int(CONFIG['EXP'] == 'poly')}\n"
)
_lib = compile_c(_DEFINES + SOURCE, flags=["-ffp-contract=fast", "-fno-trapping-math"])


class ModelNew(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        seq, dim = q.shape[-2], q.shape[-1]
        o = torch.empty_like(q)
        if (
            o.numel()
            and _lib.attention(q, k, v, o, q.numel() // (seq * dim), seq, dim, 1.0 / math.sqrt(dim)) != 0
        ):
            raise MemoryError("attention: could not allocate K^T")
        return o
