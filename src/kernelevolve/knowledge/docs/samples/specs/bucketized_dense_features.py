"""Sample spec: merged bucketization, out[n, f] = #{borders[f] < x[n, f]} for F dense features.

x is [N, F]; borders is [F, B], each row sorted with a random number of +inf pads at its end (pads
never count); an eighth of the rows sit exactly on a border (ties). The reference compares through a
broadcast [N, F, B] bool tensor and sums it (int64).
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
    "name": "sample_bucketized_dense_features",
    "description": "merged bucketization: count each dense feature's borders below it, per-feature borders",
    "shapes": {
        "small": {"weight": 0.5, "params": {"rows": 64, "features": 24, "n_borders": 12}},
        "large": {"weight": 0.5, "params": {"rows": 4096, "features": 64, "n_borders": 12}},
    },
    "precision": "strict_fp32",
}
