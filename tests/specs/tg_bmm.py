"""Tuner codegen test spec: a batched product with an epilogue that reads another full input."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b, c):
        return torch.relu(torch.bmm(a, b)) * 0.5 + c


def get_inputs(batch=3, m=20, k=24, n=18):
    return [torch.randn(batch, m, k), torch.randn(batch, k, n), torch.randn(batch, m, n)]


def get_init_inputs():
    return []


KERNELEVOLVE = {"shapes": {"tiny": {"weight": 1, "params": {"batch": 3, "m": 20, "k": 24, "n": 18}}}}
