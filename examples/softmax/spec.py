"""Row softmax over the last dimension: attention probabilities and classifier heads.

A KernelBench-format spec with the kernelevolve extensions: three production shapes with their share
of traffic, strict fp32 precision.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs(rows: int = 4096, cols: int = 2048):
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "row_softmax",
    "description": "softmax over the last dimension of a 2-D fp32 tensor",
    "shapes": {
        "decode": {"weight": 0.5, "params": {"rows": 256, "cols": 1024}},
        "prefill": {"weight": 0.3, "params": {"rows": 4096, "cols": 2048}},
        "wide": {"weight": 0.2, "params": {"rows": 1024, "cols": 8192}},
    },
    "precision": "strict_fp32",
}
