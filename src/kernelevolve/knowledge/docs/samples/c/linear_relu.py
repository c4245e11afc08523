"""Linear + bias + ReLU in C for the CPU: a cache-blocked GEMM with a register-tiled micro-kernel and
the epilogue fused into its last store.

y[M, N] = relu(x[M, K] @ W[N, K]^T + b). W^T is first packed, once per call and in parallel, into
panels of NR columns laid out [p][k][NR], zero past N (contiguous, so the micro-kernel reads B with
unit stride and needs no edge code). OpenMP tasks are (N block of NC, M block of MC) tiles. A task
walks K in slabs of KC and, for each panel (a KC x NR slice kept in L1), runs the micro-kernel down
its MC rows (an MC x KC block of x, kept in L2). The micro-kernel holds an MR x NR tile of C in
MR * NR / 8 vector registers (GCC vector extensions, 8 floats: AVX2 ymm) and does one broadcast FMA
per (row, vector) per k. Full tiles are stored from the registers; partial tiles are computed full
size on clamped rows and zero-padded columns and stored masked. Bias and ReLU are applied when the
last K slab is stored. The spec allows TF32; this computes in fp32, well within it.
"""

import torch
import torch.nn as nn

from kernelevolve.native import compile_c

TUNABLES = {
    "MR": [1, 2, 4, 6, 8],
    "NR": [8, 16, 32],
    "MC": [16, 32, 48, 64, 96, 128],
    "NC": [32, 64, 128, 256],
    "KC": [64, 128, 256, 512],
}
CONFIG = {"MR": 6, "NR": 16, "MC": 48, "NC": 128, "KC": 256}

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
#define NV (NR / 8)
#if NR % 8 != 0 || NC % NR != 0
#error "NR must be a multiple of 8 and NC a multiple of NR"
#endif

static inline v8 load8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

/* C[mr_valid x nr_valid] (+)= A[MR rows, kk] * Bp[kk][NR]; on the last slab add bias and apply ReLU */
static inline void micro(int64_t kk, const float *restrict a, int64_t lda, int64_t mr_valid,
                         const float *restrict bp, float *restrict c, int64_t ldc, int64_t nr_valid,
                         int first, int last, const float *restrict bias) {
    const float *ar[MR];
    #pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) ar[i] = a + (i < mr_valid ? i : mr_valid - 1) * lda;
    v8 acc[MR][NV];
    #pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[i][v] = (v8){0};
    for (int64_t k = 0; k < kk; ++k) {
        v8 b[NV];
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = load8(bp + k * NR + 8 * v);
        #pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            float ai = ar[i][k];
            #pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[i][v] += ai * b[v];
        }
    }
    if (mr_valid == MR && nr_valid == NR) {  /* a full tile: straight from the registers */
        #pragma GCC unroll 8
        for (int i = 0; i < MR; ++i)
            #pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
                v8 t = acc[i][v];
                if (!first) t += load8(c + i * ldc + 8 * v);
                if (last) {
                    t += load8(bias + 8 * v);
                    t = (v8)((v8i)t & (t > (v8){0}));  /* ReLU: the comparison is an all-ones lane mask */
                }
                store8(c + i * ldc + 8 * v, t);
            }
        return;
    }
    float tile[MR][NR];  /* an edge tile: through memory, stored masked */
    #pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) store8(&tile[i][8 * v], acc[i][v]);
    for (int64_t i = 0; i < mr_valid; ++i) {
        float *ci = c + i * ldc;
        for (int64_t j = 0; j < nr_valid; ++j) {
            float t = tile[i][j] + (first ? 0.0f : ci[j]);
            if (last) {
                t += bias[j];
                t = t > 0.0f ? t : 0.0f;
            }
            ci[j] = t;
        }
    }
}

/* y[M, N] = relu(x[M, K] @ w[N, K]^T + bias[N]) */
int linear_relu(const float *restrict x, const float *restrict w, const float *restrict bias, float *restrict y,
                 int64_t M, int64_t K, int64_t N) {
    const int64_t np = (N + NR - 1) / NR;  /* panels of NR columns */
    const int64_t mt = (M + MC - 1) / MC, nt = (N + NC - 1) / NC;
    const int64_t kt = K > 0 ? (K + KC - 1) / KC : 1;
    /* W^T packed once per call as panels [p][K][NR], zero past N: the micro-kernel's B, unit stride */
    float *wp = aligned_alloc(64, ((size_t)(np * NR * (K > 0 ? K : 1)) * sizeof(float) + 63) / 64 * 64);
    if (wp == NULL) return -1;
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
        for (int64_t p = 0; p < np; ++p)
            for (int64_t j = 0; j < NR; ++j) {
                const int64_t n = p * NR + j;
                float *dst = wp + p * K * NR + j;
                for (int64_t k = 0; k < K; ++k) dst[k * NR] = n < N ? w[n * K + k] : 0.0f;
            }
        /* (the implicit barrier: every panel is packed before any tile reads it) */
        #pragma omp for collapse(2) schedule(static)
        for (int64_t nb = 0; nb < nt; ++nb)
            for (int64_t mb = 0; mb < mt; ++mb) {
                const int64_t n0 = nb * NC, nn = N - n0 < NC ? N - n0 : NC;
                const int64_t m0 = mb * MC, mm = M - m0 < MC ? M - m0 : MC;
                for (int64_t kb = 0; kb < kt; ++kb) {  /* K slab: an MC x KC block of x stays in L2 */
                    const int64_t k0 = kb * KC, kk = K - k0 < KC ? K - k0 : KC;
                    for (int64_t p = 0; p * NR < nn; ++p) {  /* a KC x NR panel of W stays in L1 */
                        const int64_t nr = nn - p * NR < NR ? nn - p * NR : NR;
                        const float *panel = wp + (n0 / NR + p) * K * NR + k0 * NR;
                        for (int64_t i = 0; i < mm; i += MR) {
                            const int64_t mr = mm - i < MR ? mm - i : MR;
                            micro(kk, x + (m0 + i) * K + k0, K, mr, panel, y + (m0 + i) * N + n0 + p * NR, N,
                                  nr, kb == 0, kb == kt - 1, bias + n0 + p * NR);
                        }
                    }
                }
            }
    }
    free(wp);
    return 0;
}
"""

_DEFINES = "".join(f"#define {k} {v}\n" for k, v in CONFIG.items())
_lib = compile_c(_DEFINES + SOURCE, flags=["-ffp-contract=fast", "-fno-trapping-math"])


class ModelNew(nn.Module):
    def __init__(self, n_in: int = 512, n_out: int = 512):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.linear.weight.detach().contiguous()
        b = self.linear.bias.detach().contiguous()
        n_out, n_in = w.shape
        x2 = x.reshape(-1, n_in).contiguous()
        y = torch.empty((x2.shape[0], n_out), dtype=x.dtype, device=x.device)
        if y.numel() and _lib.linear_relu(x2, w, b, y, x2.shape[0], n_in, n_out) != 0:
            raise MemoryError("linear_relu: could not allocate the packed weight")
        return y.reshape(*x.shape[:-1], n_out)
