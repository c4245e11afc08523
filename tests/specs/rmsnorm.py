"""Test spec for the tuner: RMS norm over the last dim with a learned scale (a row reduction)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cols, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def get_inputs(rows=64, cols=256):
    return [torch.randn(rows, cols)]


def get_init_inputs(cols=256):
    return [cols]


KERNELEVOLVE = {
    "shapes": {
        "narrow": {"weight": 1, "params": {"rows": 64, "cols": 256}},
        "wide": {"weight": 1, "params": {"rows": 32, "cols": 2048}},
    },
}
