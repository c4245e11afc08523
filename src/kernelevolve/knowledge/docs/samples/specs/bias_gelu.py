"""Sample spec: y = gelu(x + b), exact (erf) GELU, a bias broadcast along rows. Elementwise."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x + b)


def get_inputs(rows: int = 1024, cols: int = 1024):
    return [torch.randn(rows, cols), torch.randn(cols)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_bias_gelu",
    "description": "elementwise: exact GELU of x plus a per-column bias",
    "shapes": {
        "small": {"weight": 0.5, "params": {"rows": 256, "cols": 1000}},
        "large": {"weight": 0.5, "params": {"rows": 2048, "cols": 1024}},
    },
    "precision": "strict_fp32",
}
