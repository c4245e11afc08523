"""Sample spec: bucketize dense features against sorted borders, then clamp the bucket ids.

out[i] = number of borders strictly less than x[i] (torch.bucketize, right=False), clamped to
[0, n_borders - 1]: a feature-id mapping as recommendation models do it.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor, borders: torch.Tensor) -> torch.Tensor:
        ids = torch.bucketize(x, borders)
        return ids.clamp(0, borders.numel() - 1)


def get_inputs(n: int = 100000, n_borders: int = 64):
    borders = torch.sort(torch.randn(n_borders) * 2).values
    return [torch.randn(n) * 2, borders]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_bucketize",
    "description": "feature-id mapping: bucketize against sorted borders, then clamp",
    "shapes": {
        "small": {"weight": 0.5, "params": {"n": 10000, "n_borders": 16}},
        "large": {"weight": 0.5, "params": {"n": 1000000, "n_borders": 255}},
    },
    "precision": "strict_fp32",
}
