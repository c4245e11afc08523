"""Test spec: a cumulative sum along a dimension given to the constructor, [64, 8000] float32.

On a CPU torch.compile's scan is about twice as slow as eager's (measured on the project's 2-core
machine: 560 vs 300 us), which is what the fitness tests need: a search must rank against the
faster baseline. The constructor takes `dim`, as the model's answers in
`fixtures/llm/cumsum_transcript` expect."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cumsum(x, dim=self.dim)


def get_inputs():
    return [torch.rand(64, 8000)]


def get_init_inputs():
    return [1]
