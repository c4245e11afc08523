"""Sample spec: a fused FFN block over tokens: x @ W1, GELU, RMSNorm * g1, @ W2, RMSNorm * g2.

x [B, T, D]; W1 [D, H], W2 [H, D] and the gains g1 [H], g2 [D] are parameters of the model.
Exact (erf) GELU, eps 1e-6, strict fp32.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int = 128, hidden: int = 256, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.w1 = nn.Parameter(torch.randn(dim, hidden) / dim**0.5)
        self.w2 = nn.Parameter(torch.randn(hidden, dim) / hidden**0.5)
        self.g1 = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.g2 = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(x @ self.w1)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.g1
        y = h @ self.w2
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps) * self.g2


def get_inputs(batch: int = 64, seq: int = 64, dim: int = 128, **_):
    return [torch.randn(batch, seq, dim)]


def get_init_inputs(dim: int = 128, hidden: int = 256):
    return [dim, hidden]


KERNELEVOLVE = {
    "name": "sample_ffn_block",
    "description": "fused position-wise FFN: GEMM, GELU, RMSNorm, GEMM, RMSNorm over tokens",
    "shapes": {
        "small": {"weight": 0.5, "params": {"batch": 3, "seq": 25, "dim": 48, "hidden": 80}},
        "large": {"weight": 0.5, "params": {"batch": 8, "seq": 64, "dim": 128, "hidden": 256}},
    },
    "precision": "strict_fp32",
}
