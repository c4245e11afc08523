"""Bias, GELU, scale and residual add: the tail of a transformer MLP block, as eager writes it.

Purely elementwise and memory-bound: eager makes four passes over the activation (add, gelu, mul,
add) with a temporary each time; one fused pass reads x and the residual once and writes y once.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int = 2048):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(hidden) * 0.1)
        self.scale = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x + self.bias) * self.scale + residual


def get_inputs(tokens: int = 4096, hidden: int = 2048):
    return [torch.randn(tokens, hidden), torch.randn(tokens, hidden)]


def get_init_inputs(hidden: int = 2048):
    return [hidden]


KERNELEVOLVE = {
    "name": "bias_gelu_residual",
    "description": "gelu(x + bias) * scale + residual over fp32 activations",
    "shapes": {
        "decode": {"weight": 0.3, "params": {"tokens": 256, "hidden": 2048}},
        "prefill": {"weight": 0.7, "params": {"tokens": 4096, "hidden": 2048}},
    },
    "precision": "strict_fp32",
}
