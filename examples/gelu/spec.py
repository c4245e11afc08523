"""GELU (exact, erf form) over a 2-D fp32 activation: a purely memory-bound elementwise op."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)


def get_inputs(rows: int = 8192, cols: int = 8192):
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "gelu",
    "shapes": {
        "activation": {"weight": 0.7, "params": {"rows": 8192, "cols": 8192}},
        "small": {"weight": 0.3, "params": {"rows": 1024, "cols": 4096}},
    },
}
