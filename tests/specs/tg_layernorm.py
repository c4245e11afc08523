"""Tuner codegen test spec: nn.LayerNorm inside a submodule (state-dict names `norm.weight`,
`norm.bias`)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.norm = nn.LayerNorm(cols)

    def forward(self, x):
        return self.norm(x)


def get_inputs(rows=7, cols=80):
    return [torch.randn(rows, cols) * 2 + 1]


def get_init_inputs(cols=80):
    return [cols]


KERNELEVOLVE = {
    "shapes": {
        "narrow": {"weight": 1, "params": {"rows": 7, "cols": 80}},
        "wide": {"weight": 1, "params": {"rows": 3, "cols": 1300}},
    }
}
