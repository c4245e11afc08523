"""Sample spec: RMSNorm over the last dimension with a learned scale, trained: a row reduction whose
backward needs dx (a row reduction again) and the scale's gradient (a column sum over every row).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cols: int = 1024, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cols))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def get_inputs(rows: int = 512, cols: int = 1024):
    return [torch.randn(rows, cols)]


def get_init_inputs(cols: int = 1024):
    return [cols]


KERNELEVOLVE = {
    "name": "sample_rmsnorm_backward",
    "description": "training row reduction: RMSNorm forward and backward with a per-column scale",
    "shapes": {
        "small": {"weight": 0.5, "params": {"rows": 300, "cols": 768}},
        "large": {"weight": 0.5, "params": {"rows": 2048, "cols": 1024}},
    },
    "precision": "strict_fp32",
    "backward": True,
}
