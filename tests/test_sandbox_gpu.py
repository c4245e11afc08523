"""The sandbox on a GPU (marker `gpu`): the channels of `test_sandbox_channels.py` tried from CUDA C++
host code, in a worker and in the profiler's processes (torch.profiler and Nsight Compute), and the
toolchains a candidate may use (here `load_inline`; Triton, nvcc through `kernelevolve.native`,
torch.compile and ncu are in `test_gpu.py` and `test_profile_gpu.py`) working inside every layer."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from kernelevolve.evaluate import EvaluatorPool, Status
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from tests.conftest import SPECS, harness_settings
from tests.sandbox_probes import accepted, attacker, listeners, parse, run_engine
from tests.test_sandbox_channels import OFF, _assert_open, _assert_sealed

pytestmark = pytest.mark.gpu


def _attack_cuda(
    tmp: Path, mode: str = "evaluate", **overrides: object
) -> tuple[list[dict[str, int]], dict[str, bool]]:
    canary = "kv-canary-" + secrets.token_hex(8)
    tag = "kv-test-" + secrets.token_hex(6)
    with listeners(tag) as (tcp_server, unix_server):
        fields = {"@SHM_NAME@": tag, "@UNIX_NAME@": tag, "@PORT@": str(tcp_server.getsockname()[1])}
        results = run_engine(
            tmp, [attacker("cuda"), attacker("cuda", shm_only=True)], canary, "cuda", SPECS / "softmax.py",
            mode=mode, fields=fields, **overrides,
        )  # fmt: skip
        heard = {"tcp": accepted(tcp_server), "unix": accepted(unix_server)}
    probes = [parse(str(r["message"])) for r in results]
    shm_left = Path("/dev/shm") / tag
    heard["shm_left"] = shm_left.exists()
    shm_left.unlink(missing_ok=True)
    heard["canary_in_verdicts"] = canary in str(results)
    return probes, heard


def test_cuda_host_code_in_a_worker_reaches_no_secret_process_or_file(tmp_path: Path) -> None:
    _assert_sealed(*_attack_cuda(tmp_path))


def test_cuda_host_code_reaches_everything_with_the_layers_off(tmp_path: Path) -> None:
    _assert_open(*_attack_cuda(tmp_path, **OFF))


@pytest.mark.parametrize("mode", ["torch", "ncu"])
def test_cuda_host_code_in_the_profilers_processes_reaches_nothing(tmp_path: Path, mode: str) -> None:
    import shutil

    if mode == "ncu" and shutil.which("ncu") is None and not Path("/usr/local/cuda/bin/ncu").exists():
        pytest.skip("no Nsight Compute on this machine")
    _assert_sealed(*_attack_cuda(tmp_path, mode=mode))


LOAD_INLINE_SOFTMAX = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = "torch::Tensor row_softmax(torch::Tensor x);"
CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void softmax_rows(const float* x, float* y, int cols) {
    const float* xr = x + (long)blockIdx.x * cols;
    float* yr = y + (long)blockIdx.x * cols;
    __shared__ float red[256];
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();
    float sum = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(xr[c] - m);
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    sum = red[0];
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) / sum;
}

torch::Tensor row_softmax(torch::Tensor x) {
    auto y = torch::empty_like(x);
    auto stream = at::cuda::getCurrentCUDAStream();
    softmax_rows<<<x.size(0), 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), (int)x.size(1));
    return y;
}
"""

_ext = load_inline(name="row_softmax_ext", cpp_sources=CPP, cuda_sources=CUDA, functions=["row_softmax"])


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.row_softmax(x.contiguous())
'''


def test_a_load_inline_candidate_builds_and_runs_inside_every_layer(tmp_path: Path) -> None:
    settings = harness_settings(tmp_path, "cuda", compile_timeout_s=400, spares=0)
    assert settings.sandbox_network and settings.sandbox_processes and settings.sandbox_filesystem
    with EvaluatorPool(load_spec(SPECS / "softmax.py"), get_platform("cuda"), settings) as pool:
        v = pool.evaluate_one(LOAD_INLINE_SOFTMAX, "load_inline_softmax.py")
    assert v.status in (Status.OK, Status.SUSPICIOUS) and v.correct and v.timed, v.message
    assert v.method is not None
    assert not [n for n in v.method.notes if "SECURITY.md" in n or "could not" in n], v.method.notes
