"""Candidate sources for the CPU tests: an honest C row-softmax, and the tricks built on it.

Every candidate shares one C source (so a trick differs from the honest candidate only in the lines
that make it a trick) and is returned as text, which is what the evaluator pool takes.
"""

C_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

static float round_to_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u &= 0xFFFF0000u;
    memcpy(&v, &u, 4);
    return v;
}

/* softmax of rows [row_begin, row_end); bf16 != 0 rounds every result to bf16 precision */
void softmax_rows(const float *x, float *y, int64_t cols, int64_t row_begin, int64_t row_end, int64_t bf16) {
    for (int64_t r = row_begin; r < row_end; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) { yr[c] /= s; if (bf16) yr[c] = round_to_bf16(yr[c]); }
    }
}

void null_write(void) { volatile int *p = 0; *p = 1; }
void spin_forever(void) { volatile int64_t i = 0; for (;;) i++; }
"""

HEADER = f'''
import torch
import torch.nn as nn
from kernelevolve.native import compile_c

_lib = compile_c(r"""{C_SOURCE}""")
'''

HONEST_FORWARD = """
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 0)
        return y
"""


def candidate(
    forward: str = HONEST_FORWARD, prelude: str = "", init: str = "", base: str = "nn.Module"
) -> str:
    """A C-softmax candidate whose ModelNew has the given forward (indented 4 spaces)."""
    init = init or "\n    def __init__(self):\n        super().__init__()\n"
    return f"{HEADER}\n{prelude}\n\nclass ModelNew({base}):\n{init}\n{forward}\n"


HONEST = candidate()

TRITON_SOFTMAX_KERNEL = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, axis=0), mask=mask)
"""

TRITON_SOFTMAX = (
    TRITON_SOFTMAX_KERNEL
    + """

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
"""
)
