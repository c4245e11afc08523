"""Test spec for the tuner: a fused elementwise chain with per-column parameters.

Eager runs it as six ops, each a pass over memory and a fresh allocation; one fused pass wins at sizes
that do not fit in cache. `big` is 16 MB per tensor.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.w = nn.Parameter(torch.randn(cols))
        self.b = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return torch.relu(x * self.w + self.b) * 0.5 + torch.sigmoid(x)


def get_inputs(rows=64, cols=256):
    return [torch.randn(rows, cols)]


def get_init_inputs(cols=256):
    return [cols]


KERNELEVOLVE = {
    "shapes": {
        "small": {"weight": 1, "params": {"rows": 64, "cols": 256}},
        "big": {"weight": 1, "params": {"rows": 2048, "cols": 2048}},
    },
}
