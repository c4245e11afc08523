"""Merged bucketization of dense features: F continuous features per sample, each against its own borders.

Recommendation preprocessing (TorchRec-style merged bucketization of counts, prices, dwell times)
turns every continuous feature into a bucket index before its embedding lookup: out[n, f] =
#{borders[f] < x[n, f]}, each feature with its own sorted quantile borders, padded with +inf to a
common width B (pads never count). Shapes: a serving batch (4k samples, 256 features, 32 borders), a
training batch (64k samples, 128 features, 64 borders) and a wide, coarse one (16k, 256, 16); an
eighth of the rows sit exactly on a border (ties). Integer output, compared exactly (strict_fp32
inputs). Eager compares through a broadcast [N, F, B] bool tensor (512 MiB at the training shape)
and sums it: two kernels, B bytes per output. A good kernel reads x once, writes the int64 counts
once, and finds each count by a branchless binary search over its feature's row of borders (sorted,
so the count is a lower bound), which stays in L1/L2.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor, borders: torch.Tensor) -> torch.Tensor:
        return (x.unsqueeze(-1) > borders).sum(-1)


def get_inputs(rows: int = 4096, features: int = 256, n_borders: int = 32):
    # each feature keeps 1..n_borders real quantile borders, sorted, then +inf pads to n_borders
    real = torch.randint(1, n_borders + 1, (features, 1))
    quantiles = torch.sort(torch.randn(features, n_borders), dim=1).values
    borders = torch.where(torch.arange(n_borders) < real, quantiles, float("inf"))
    x = torch.randn(rows, features)
    # an eighth of the rows sit exactly on one of their feature's real borders: ties count as not below
    k = rows // 8
    on = (torch.rand(k, features) * real.T).long()
    x[:k] = torch.gather(quantiles.T, 0, on)
    return [x, borders]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "bucketized_dense_features",
    "description": "merged bucketization: count each dense feature's borders below it, per-feature borders",
    "shapes": {
        "serving": {"weight": 0.4, "params": {"rows": 4096, "features": 256, "n_borders": 32}},
        "training": {"weight": 0.4, "params": {"rows": 65536, "features": 128, "n_borders": 64}},
        "wide_coarse": {"weight": 0.2, "params": {"rows": 16384, "features": 256, "n_borders": 16}},
    },
    "precision": "strict_fp32",
}
