"""Sample spec: softmax over the last dimension of a 2-D fp32 tensor. A row reduction."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs(rows: int = 512, cols: int = 1024):
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_softmax",
    "description": "row reduction: softmax over the last dimension",
    "shapes": {
        "narrow": {"weight": 0.5, "params": {"rows": 1024, "cols": 200}},
        "wide": {"weight": 0.5, "params": {"rows": 256, "cols": 4096}},
    },
    "precision": "strict_fp32",
}
