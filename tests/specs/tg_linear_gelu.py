"""Tuner codegen test spec: gelu(Linear(x)) on a 3-D input: b is the Linear weight [N, K], a bias."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return F.gelu(self.fc(x))


def get_inputs(batch=2, seq=5, n_in=40, n_out=24):
    return [torch.randn(batch, seq, n_in)]


def get_init_inputs(n_in=40, n_out=24):
    return [n_in, n_out]


KERNELEVOLVE = {"shapes": {"tiny": {"weight": 1, "params": {"batch": 2, "seq": 5, "n_in": 40, "n_out": 24}}}}
