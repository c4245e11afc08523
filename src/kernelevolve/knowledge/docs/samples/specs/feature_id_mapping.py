"""Sample spec: feature-id mapping, bucketize a dense feature, clamp, then gather a remap table.

out[i] = remap[clamp(#{borders < x[i]}, 0, n_borders - 1)]: torch.bucketize (right=False) against
sorted borders, the bucket clamped into the table, then looked up in int64 feature ids. An eighth of
the values sit exactly on a border (ties).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor, borders: torch.Tensor, remap: torch.Tensor) -> torch.Tensor:
        ids = torch.bucketize(x, borders).clamp(0, borders.numel() - 1)
        return remap[ids]


def get_inputs(n: int = 65536, n_borders: int = 64):
    borders = torch.sort(torch.randn(n_borders) * 2).values
    x = torch.randn(n) * 2
    # an eighth of the values sit exactly on a border: right=False ties, as integer-valued features have
    x[: n // 8] = borders[torch.randint(0, n_borders, (n // 8,))]
    remap = torch.randint(0, 1 << 40, (n_borders,))  # each bucket's id in a shared feature-id space
    return [x, borders, remap]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_feature_id_mapping",
    "description": "feature-id mapping: bucketize against sorted borders, clamp, gather a remap table",
    "shapes": {
        "small": {"weight": 0.5, "params": {"n": 4096, "n_borders": 48}},
        "large": {"weight": 0.5, "params": {"n": 262144, "n_borders": 64}},
    },
    "precision": "strict_fp32",
}
