"""Dense-feature normalization: the preprocessing of a ranking model's continuous inputs (DLRM-style).

Counts, dwell times and prices are heavy-tailed, so each dense feature is log-compressed, then
standardized with per-feature statistics fitted offline, and clipped to bound outliers:
out = clamp((log(1 + relu(x)) - mean) / std, -clip, clip). Shapes: a serving batch of 16k requests
with 1024 dense features, a training batch of 64k samples with 256 features, and the 13 dense
features of Criteo at batch 128k (narrow rows). strict_fp32. Eager runs six elementwise kernels
(relu, add, log, sub, div, clamp), each reading and writing the whole batch; a good kernel reads x
once, keeps mean and 1/std per column in registers and writes the output once, at bandwidth.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int = 256, clip: float = 5.0):
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.rand(features) * 0.5)
        self.register_buffer("std", torch.rand(features) * 0.5 + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp((torch.log(torch.relu(x) + 1.0) - self.mean) / self.std, -self.clip, self.clip)


def get_inputs(batch: int = 4096, features: int = 256):
    return [torch.randn(batch, features) * 2.0]


def get_init_inputs(features: int = 256):
    return [features]


KERNELEVOLVE = {
    "name": "dense_normalization",
    "description": "elementwise chain with per-column constants: log(1+x), standardize and clip dense features",
    "shapes": {
        "serving": {"weight": 0.5, "params": {"batch": 16384, "features": 1024}},
        "training": {"weight": 0.3, "params": {"batch": 65536, "features": 256}},
        "criteo": {"weight": 0.2, "params": {"batch": 131072, "features": 13}},
    },
    "precision": "strict_fp32",
}
