"""Position-wise FFN block of a sequential recommender: GEMM, GELU, RMSNorm, GEMM, RMSNorm.

The feed-forward half of each transformer layer in user-history sequence models (BERT4Rec/SASRec
style, HSTU-like generative rankers): every token of every sample goes through x @ W1, exact-erf GELU,
RMSNorm with a learned gain, @ W2 and a second RMSNorm. Shapes: 4k-32k tokens (batch x history
length) at model widths 128-256 and hidden widths 256-512, the small widths these models use.
strict_fp32. Eager runs two GEMMs and about a dozen elementwise and reduction kernels, writing the
[tokens, H] hidden activation several times; a good kernel fuses all of it: GELU and the first
RMSNorm in the first GEMM's epilogue (a whole H row per tile, or a deferred per-row scale), the
second RMSNorm in the second GEMM's epilogue, so x is read once and y written once.
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
    "name": "ffn_block",
    "description": "fused position-wise FFN: GEMM, GELU, RMSNorm, GEMM, RMSNorm over tokens",
    "shapes": {
        "serving": {"weight": 0.3, "params": {"batch": 64, "seq": 64, "dim": 128, "hidden": 256}},
        "training": {"weight": 0.4, "params": {"batch": 256, "seq": 64, "dim": 256, "hidden": 512}},
        "long_history": {"weight": 0.3, "params": {"batch": 128, "seq": 256, "dim": 128, "hidden": 512}},
    },
    "precision": "strict_fp32",
}  # fmt: skip
