"""Tuner codegen test spec: softmax and log-softmax over the last dim of a 3-D input (two outputs of
one row graph; cols not a power of two)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1), torch.log_softmax(x, dim=-1)


def get_inputs(batch=2, rows=5, cols=100):
    return [torch.randn(batch, rows, cols) * 3]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "shapes": {
        "narrow": {"weight": 1, "params": {"batch": 2, "rows": 5, "cols": 100}},
        "wide": {"weight": 1, "params": {"batch": 1, "rows": 3, "cols": 1500}},
    }
}
