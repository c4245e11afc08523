"""Test spec (GPU): a row softmax large enough (256 MiB read + written) that work hidden on another
stream lasts far longer than the harness's own synchronization latency."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs(rows=8192, cols=4096):
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
