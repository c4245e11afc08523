"""Tuner codegen test spec: RMS norm with a weight parameter."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cols, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(cols))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def get_inputs(rows=9, cols=96):
    return [torch.randn(rows, cols)]


def get_init_inputs(cols=96):
    return [cols]


KERNELEVOLVE = {
    "shapes": {
        "narrow": {"weight": 1, "params": {"rows": 9, "cols": 96}},
        "wide": {"weight": 1, "params": {"rows": 3, "cols": 1100}},
    }
}
