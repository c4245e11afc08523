"""Sample spec: per-sample field interaction X (X^T Y), two chained batched products (strict fp32).

X [B, F, D] and Y [B, F, E]; the output is [B, F, E]. The reference runs X^T Y first, a D x E
matrix per sample.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, torch.bmm(x.transpose(1, 2), y))


def get_inputs(batch: int = 1024, fields: int = 32, dim: int = 64, out_dim: int = 64):
    return [torch.randn(batch, fields, dim), torch.randn(batch, fields, out_dim)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_fm_interaction",
    "description": "per-sample field interaction X (X^T Y): two fused batched products",
    "shapes": {
        "small": {"weight": 0.5, "params": {"batch": 6, "fields": 12, "dim": 20, "out_dim": 24}},
        "large": {"weight": 0.5, "params": {"batch": 64, "fields": 32, "dim": 64, "out_dim": 64}},
    },
    "precision": "strict_fp32",
}
