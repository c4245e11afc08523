"""Feature hashing: raw int64 ids (user ids, item ids, hashed strings) mapped into a table of `buckets` rows.

The hashing trick of recommendation models: an unbounded id space is folded into a fixed embedding
table by a mixing hash and a modulo, before the lookup (TorchRec/Monolith-style preprocessing, run on
every training and serving batch). The hash is a splitmix-style multiply-xorshift in wrapping int64
arithmetic (multiply by an odd constant, xor in the arithmetic right shift, twice), then
torch.remainder, which is non-negative for a positive divisor. Shapes: a serving batch (64k ids, 1M
buckets), a training batch (2M ids, 10M buckets) and a large multi-feature batch (8M ids, 40M
buckets); the bucket counts are not powers of two, so the modulo is a real division. Integer output,
compared exactly. Eager runs seven elementwise kernels over 8-byte tensors (about 14 passes of
memory); a good kernel is one pass (16 bytes per id) that replaces the 64-bit division with a
multiply by a precomputed reciprocal.
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
    "name": "feature_hashing",
    "description": "hashing trick: multiply-xorshift hash of int64 ids, then remainder by the bucket count",
    "shapes": {
        "serving": {"weight": 0.3, "params": {"n": 65536, "buckets": 1000000}},
        "training": {"weight": 0.4, "params": {"n": 2097152, "buckets": 10000000}},
        "multi_feature": {"weight": 0.3, "params": {"n": 8388608, "buckets": 40000000}},
    },
    "precision": "strict_fp32",
}
