"""Tuner codegen test spec: exact GELU on bf16 activations (loads cast up, stores cast down)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x):
        return F.gelu(x)


def get_inputs(rows=8, cols=300):
    return [torch.randn(rows, cols).to(torch.bfloat16)]


def get_init_inputs():
    return []


KERNELEVOLVE = {"shapes": {"tiny": {"weight": 1, "params": {"rows": 8, "cols": 300}}}, "precision": "low"}
