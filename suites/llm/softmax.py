"""Softmax over the last dimension: attention scores before the value product, and the vocabulary
distribution at an LLM's output.

Shapes: `scores` is one attention head-batch of scores at a 4k context (4096 rows of 4096 keys), the
most common shape in unfused attention; `vocab` is a decode batch over a 32k vocabulary (1024 rows of
32000), where each row is 125 KB and no longer fits one thread block's registers; `short` is a
decode-sized batch (256 rows of 4096) where launch overhead matters. Strict fp32.

Eager runs one softmax kernel that reads each row twice (max, then exp-sum and write); a good kernel
reads each row once from DRAM (keeping it on chip, or using an online max-and-sum) and runs at
memory bandwidth: 8 bytes per element.
"""

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
    "name": "softmax",
    "description": "softmax over the last dim: attention scores and vocabulary distributions",
    "shapes": {
        "short": {"weight": 0.2, "params": {"rows": 256, "cols": 4096}},
        "scores": {"weight": 0.5, "params": {"rows": 4096, "cols": 4096}},
        "vocab": {"weight": 0.3, "params": {"rows": 1024, "cols": 32000}},
    },
    "precision": "strict_fp32",
}
