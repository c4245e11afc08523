"""Tuner codegen test spec: an elementwise result shaped only by broadcasting a per-row input against
a per-column one (no input has the output's shape)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, r, c):
        return torch.sigmoid(r + c)


def get_inputs(rows=7, cols=45):
    return [torch.randn(rows, 1), torch.randn(cols)]


def get_init_inputs():
    return []


KERNELEVOLVE = {"shapes": {"tiny": {"weight": 1, "params": {"rows": 7, "cols": 45}}}}
