"""Test spec: a training op (backward): y = x @ W^T + b, gradients of x, W and b are checked."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * 0.1)
        self.bias = nn.Parameter(torch.randn(n_out) * 0.1)

    def forward(self, x):
        return x @ self.weight.t() + self.bias


def get_inputs(batch=16, n_in=32, n_out=24):
    return [torch.randn(batch, n_in)]


def get_init_inputs(n_in=32, n_out=24):
    return [n_in, n_out]


KERNELEVOLVE = {"backward": True}
