"""Tuner codegen test spec: an elementwise graph over every layout (full, col parameter, row input,
scalar buffer) with two outputs."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(cols))
        self.register_buffer("shift", torch.tensor(0.5))

    def forward(self, x, r):
        h = x * self.scale + r
        y = torch.clamp(F.gelu(h, approximate="tanh"), -1.0, 2.0) * torch.sigmoid(x) + self.shift * 2.0
        return y, torch.tanh(h) ** 2


def get_inputs(batch=2, rows=3, cols=50):
    return [torch.randn(batch, rows, cols), torch.randn(batch, rows, 1)]


def get_init_inputs(cols=50):
    return [cols]


KERNELEVOLVE = {"shapes": {"tiny": {"weight": 1, "params": {"batch": 2, "rows": 3, "cols": 50}}}}
