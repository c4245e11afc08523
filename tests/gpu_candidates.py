"""Candidate sources for the GPU tests: an honest Triton row-softmax, a CUDA C++ one, and the tricks
and faults built on them."""

from tests.cpu_candidates import TRITON_SOFTMAX_KERNEL

TRITON_HEADER = (
    TRITON_SOFTMAX_KERNEL
    + """

@triton.jit
def wild_store(y_ptr, n):
    offs = tl.arange(0, 128)
    tl.store(y_ptr + offs + (1 << 40), tl.zeros([128], dtype=tl.float32))


@triton.jit
def wait_forever(flag_ptr, out_ptr):
    i = 0
    while tl.load(flag_ptr, volatile=True) == 0:
        i += 1
        tl.store(out_ptr, i)


def launch(x, y):
    softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]),
                                  num_warps=8 if x.shape[1] >= 2048 else 4)
"""
)


def triton_candidate(forward: str, prelude: str = "") -> str:
    return f"{TRITON_HEADER}\n{prelude}\n\nclass ModelNew(nn.Module):\n{forward}\n"


HONEST = triton_candidate("""
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        launch(x, y)
        return y
""")

SIDE_STREAM = triton_candidate(
    """
    def forward(self, x):
        y = torch.empty_like(x)
        with torch.cuda.stream(_SIDE):
            for _ in range(8):  # long enough to outlast the harness's synchronization latency
                launch(x, y)
        return y
""",
    prelude="_SIDE = torch.cuda.Stream()",
)

ILLEGAL_ACCESS = triton_candidate("""
    def forward(self, x):
        y = torch.empty_like(x)
        wild_store[(1,)](y, y.numel())
        return y
""")

HANG = triton_candidate("""
    def forward(self, x):
        y = torch.empty_like(x)
        flag = torch.zeros(1, dtype=torch.int32, device=x.device)
        wait_forever[(1,)](flag, torch.empty(1, dtype=torch.int32, device=x.device))
        return y
""")

EVENT_PATCH = triton_candidate(
    HONEST.split("class ModelNew(nn.Module):\n", 1)[1],
    prelude="torch.cuda.Event.elapsed_time = lambda self, end: 1e-3",
)

CUDA_CPP = '''
import torch
import torch.nn as nn
from kernelevolve.native import compile_cuda

_lib = compile_cuda(r"""
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void softmax_rows(const float *x, float *y, int64_t cols) {
    extern __shared__ float red[];
    const float *xr = x + blockIdx.x * cols;
    float *yr = y + blockIdx.x * cols;
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();
    float sum = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(xr[c] - m);
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    float inv = 1.f / red[0];
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) * inv;
}

extern "C" void launch_softmax(const float *x, float *y, int64_t rows, int64_t cols, cudaStream_t stream) {
    softmax_rows<<<rows, 256, 256 * sizeof(float), stream>>>(x, y, cols);
}
""")


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.launch_softmax(x, y, x.shape[0], x.shape[1])
        return y
'''
