"""Feature-id mapping: a dense feature bucketized into quantile buckets, each bucket a sparse feature id.

Recommendation preprocessing (DLRM, YouTube/Criteo-style pipelines) turns a continuous feature (price,
age, watch time, a count) into an embedding id: find its bucket among sorted quantile borders
(torch.bucketize, right=False), clamp it into the table, then look the bucket up in a remap table of
global feature ids (the bucket's row in a shared id space). An eighth of the values sit exactly on a
border, as integer-valued features do, so ties are exercised. Shapes: a serving batch (64k values, 64
borders), a training batch (1M values, 256 borders) and a fine-quantile feature (4M values, 1024
borders). Integer output, compared exactly (strict_fp32 inputs). Eager runs three kernels (bucketize,
clamp, index) with two int64 intermediates; a good kernel is one pass: a branchless binary search
with the borders in L1 and the clamp folded in, a gather from the remap table, 12 bytes per value.
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
    "name": "feature_id_mapping",
    "description": "bucketize a dense feature against sorted borders, clamp, and remap to feature ids",
    "shapes": {
        "serving": {"weight": 0.3, "params": {"n": 65536, "n_borders": 64}},
        "training": {"weight": 0.4, "params": {"n": 1048576, "n_borders": 256}},
        "fine_quantiles": {"weight": 0.3, "params": {"n": 4194304, "n_borders": 1024}},
    },
    "precision": "strict_fp32",
}
