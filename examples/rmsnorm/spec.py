"""RMSNorm over the hidden dimension with a learned scale: every transformer layer runs two of these.

Memory-bound: one read of x, one write of y, and a tiny weight. Eager runs it as five kernels (pow,
mean, add, rsqrt, two muls) with fp32 intermediates the size of x.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int = 4096, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def get_inputs(tokens: int = 4096, hidden: int = 4096):
    return [torch.randn(tokens, hidden)]


def get_init_inputs(hidden: int = 4096):
    return [hidden]


KERNELEVOLVE = {
    "name": "rmsnorm",
    "description": "RMSNorm over the last dim of fp32 activations, with a learned scale",
    "shapes": {
        "decode": {"weight": 0.3, "params": {"tokens": 64, "hidden": 4096}},
        "prefill": {"weight": 0.5, "params": {"tokens": 8192, "hidden": 4096}},
        "wide": {"weight": 0.2, "params": {"tokens": 2048, "hidden": 8192}},
    },
    "precision": "strict_fp32",
}
