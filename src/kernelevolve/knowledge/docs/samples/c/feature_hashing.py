"""Feature hashing in C for the CPU: a multiply-xorshift hash of int64 ids and a non-negative modulo,
one pass over the ids, OpenMP over contiguous chunks.

The hash runs in uint64_t, where C defines the multiply to wrap (signed overflow would be undefined),
and shifts the int64_t reinterpretation for torch's arithmetic `>>` (gcc shifts negative signed
values arithmetically). torch.remainder(h, b) is in [0, b). Eager runs seven passes over 8-byte
tensors; this reads each id once and writes once, and the bound is the modulo.

A 64-bit `div` costs tens of cycles. MOD "reciprocal" uses M = floor((2**64 - 1) / b), computed once:
for the unsigned bits u of h, q = (u * M) >> 64 (one 128-bit multiply) is floor(u / b) or one less,
so r = u - q * b needs at most one conditional subtraction. A negative h is u - 2**64, so its
remainder is r - (2**64 mod b), plus b if negative. MOD "divide" is the plain `%` with the sign fix.
"""

import torch
import torch.nn as nn

from kernelevolve.native import compile_c

TUNABLES = {"MOD": ["reciprocal", "divide"], "CHUNK": [4096, 16384, 65536]}
CONFIG = {"MOD": "reciprocal", "CHUNK": 16384}

SOURCE = r"""
#include <stdint.h>

/* out[i] = torch.remainder(hash(ids[i]), b); recip = floor((2**64 - 1) / b), wrap = 2**64 mod b */
void feature_hash(const int64_t *restrict ids, int64_t *restrict out, int64_t n, int64_t b,
                  uint64_t recip, int64_t wrap) {
    #pragma omp parallel for schedule(static) if (n > 2 * CHUNK)  /* small inputs: no thread wake-up */
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
        const int64_t c1 = n - c0 < CHUNK ? n : c0 + CHUNK;
        for (int64_t i = c0; i < c1; ++i) {
            uint64_t u = (uint64_t)ids[i] * 0x9E3779B97F4A7C15ull;  /* wraps: defined on uint64_t */
            u ^= (uint64_t)((int64_t)u >> 29);                       /* arithmetic shift, as torch */
            u *= 0xBF58476D1CE4E5B9ull;
            u ^= (uint64_t)((int64_t)u >> 32);
            const int64_t h = (int64_t)u;
#if USE_RECIPROCAL
            const uint64_t q = (uint64_t)(((unsigned __int128)u * recip) >> 64);  /* floor(u/b) - {0,1} */
            uint64_t ru = u - q * (uint64_t)b;
            ru -= ru >= (uint64_t)b ? (uint64_t)b : 0;
            int64_t r = (int64_t)ru - (h < 0 ? wrap : 0);  /* h = u - 2**64 when negative */
#else
            int64_t r = h % b;  /* truncating: the sign of h */
#endif
            out[i] = r < 0 ? r + b : r;
        }
    }
}
"""

_DEFINES = f"#define USE_RECIPROCAL {int(CONFIG['MOD'] == 'reciprocal')}\n#define CHUNK {CONFIG['CHUNK']}\n"
_lib = compile_c(_DEFINES + SOURCE)


class ModelNew(nn.Module):
    def __init__(self, buckets: int = 1000000):
        super().__init__()
        self.buckets = buckets
        self.recip = (2**64 - 1) // buckets  # host-side Python integers
        self.wrap = 2**64 % buckets

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.contiguous()
        out = torch.empty_like(ids)
        if out.numel():
            _lib.feature_hash(ids, out, ids.numel(), self.buckets, self.recip, self.wrap)
        return out
