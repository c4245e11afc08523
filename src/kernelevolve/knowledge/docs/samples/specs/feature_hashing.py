"""Sample spec: feature hashing, a multiply-xorshift hash of int64 ids, then remainder by `buckets`.

h = ids * C1 (wrapping int64), h ^= h >> 29 (arithmetic shift), h *= C2, h ^= h >> 32, then
torch.remainder(h, buckets), which is in [0, buckets) for a positive divisor. `buckets` is a
constructor argument.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, buckets: int = 1000000):
        super().__init__()
        self.buckets = buckets

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = ids * -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64; the product wraps
        h = h ^ (h >> 29)  # >> on int64 is an arithmetic shift
        h = h * -4658895280553007687  # 0xBF58476D1CE4E5B9
        h = h ^ (h >> 32)
        return torch.remainder(h, self.buckets)


def get_inputs(n: int = 65536, buckets: int = 1000000):
    return [torch.randint(0, 1 << 62, (n,))]


def get_init_inputs(buckets: int = 1000000):
    return [buckets]


KERNELEVOLVE = {
    "name": "sample_feature_hashing",
    "description": "hashing trick: multiply-xorshift hash of int64 ids, remainder by the bucket count",
    "shapes": {
        "small": {"weight": 0.5, "params": {"n": 10000, "buckets": 100003}},
        "large": {"weight": 0.5, "params": {"n": 1000000, "buckets": 10000000}},
    },
    "precision": "strict_fp32",
}
