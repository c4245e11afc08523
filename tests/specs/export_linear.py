"""Test spec for export: a linear layer (parameters), two shapes that differ in batch only."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n_in: int = 16, n_out: int = 12):
        super().__init__()
        self.proj = nn.Linear(n_in, n_out)
        self.register_buffer("scale", torch.full((n_out,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.scale


def get_inputs(batch: int = 8, n_in: int = 16, n_out: int = 12):
    return [torch.randn(batch, n_in)]


def get_init_inputs(n_in: int = 16, n_out: int = 12):
    return [n_in, n_out]


KERNELEVOLVE = {
    "shapes": {
        "small": {"weight": 0.5, "params": {"batch": 8, "n_in": 16, "n_out": 12}},
        "large": {"weight": 0.5, "params": {"batch": 64, "n_in": 16, "n_out": 12}},
    },
}
