"""The fused residual add + RMSNorm of pre-norm transformers (Llama, Mistral): `h = x + residual`
becomes the next residual stream and `y = rmsnorm(h) * weight` the next sublayer's input.

Shapes: `decode` is 64 tokens at hidden 4096, `prefill` 4096 tokens at hidden 4096 and `wide` 2048
tokens at hidden 8192. Strict fp32: the sum of squares in fp32, like the reference.

Eager runs an add and then five kernels for the norm (pow, mean, add, rsqrt, two muls), writing `h`
and several fp32 intermediates the size of x; a good kernel reads x and residual once and writes h
and y once: 16 bytes per element, one launch.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int = 4096, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + residual
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return y, h


def get_inputs(tokens: int = 4096, hidden: int = 4096):
    return [torch.randn(tokens, hidden), torch.randn(tokens, hidden)]


def get_init_inputs(hidden: int = 4096):
    return [hidden]


KERNELEVOLVE = {
    "name": "rmsnorm_residual",
    "description": "residual add fused with RMSNorm; returns the normed output and the new residual",
    "shapes": {
        "decode": {"weight": 0.3, "params": {"tokens": 64, "hidden": 4096}},
        "prefill": {"weight": 0.5, "params": {"tokens": 4096, "hidden": 4096}},
        "wide": {"weight": 0.2, "params": {"tokens": 2048, "hidden": 8192}},
    },
    "precision": "strict_fp32",
}
