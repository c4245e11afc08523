"""Tuner codegen test spec: attention scores q @ k^T over [batch, heads, seq, dim] (batched, b in
the "nk" layout, four dims folded into one batch)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, q, k):
        return torch.matmul(q, k.transpose(-1, -2)) * 0.125


def get_inputs(batch=2, heads=2, seq=17, dim=32):
    return [torch.randn(batch, heads, seq, dim), torch.randn(batch, heads, seq, dim)]


def get_init_inputs():
    return []


KERNELEVOLVE = {"shapes": {"tiny": {"weight": 1, "params": {"batch": 2, "heads": 2, "seq": 17, "dim": 32}}}}
