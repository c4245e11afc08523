"""A feed-forward up-projection: Linear (with bias) then tanh-approximated GELU, TF32 allowed.

Eager runs a cuBLAS GEMM and then a separate GELU pass over the [tokens, 4096] output; a kernel that
applies bias and GELU in the GEMM's epilogue saves that round trip through memory.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d_model: int = 1024, d_ff: int = 4096):
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.up(x), approximate="tanh")


def get_inputs(tokens: int = 4096, d_model: int = 1024):
    return [torch.randn(tokens, d_model)]


def get_init_inputs(d_model: int = 1024, d_ff: int = 4096):
    return [d_model, d_ff]


KERNELEVOLVE = {
    "name": "linear_gelu",
    "description": "y = gelu_tanh(x @ W^T + b): a transformer MLP's up-projection",
    "shapes": {
        "decode": {"weight": 0.3, "params": {"tokens": 128}},
        "prefill": {"weight": 0.7, "params": {"tokens": 4096}},
    },
    "precision": "tf32",
}
