"""Test spec: row softmax, two small shapes. Outputs are ~1/cols in magnitude (small), which is what
the zeros-on-small-outputs test needs."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs(rows=64, cols=512):
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "shapes": {
        "narrow": {"weight": 3, "params": {"rows": 32, "cols": 256}},
        "wide": {"weight": 1, "params": {"rows": 16, "cols": 4096}},
    },
}
