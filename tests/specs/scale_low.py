"""Test spec: y = 3 * x + 1 with the `low` precision policy (bf16 arithmetic allowed)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 3.0 + 1.0


def get_inputs(n=4096):
    return [torch.randn(n)]


KERNELEVOLVE = {"precision": "low"}
