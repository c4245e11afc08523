"""Sample spec: top-k Gumbel-max sampling with the noise given: keep the logits >= the k-th largest of
each row, scale by 1/temperature, add -log(-log(u)), return the argmax token id (int64 [B])."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, k: int = 50, temperature: float = 0.8):
        super().__init__()
        self.k = k
        self.temperature = temperature

    def forward(self, logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        kth = torch.topk(logits, self.k, dim=-1).values[:, -1:]
        scaled = (logits * (1.0 / self.temperature)).masked_fill(logits < kth, float("-inf"))
        return torch.argmax(scaled - torch.log(-torch.log(u)), dim=-1)


def get_inputs(batch: int = 64, vocab: int = 128256):
    logits = torch.randn(batch, vocab) * 2.0
    u = torch.rand(batch, vocab).clamp(1e-6, 1.0 - 1e-6)
    return [logits, u]


def get_init_inputs():
    return [50, 0.8]


KERNELEVOLVE = {
    "name": "sample_topk_sampling",
    "description": "top-k (k=50) Gumbel-max sampling of next-token ids",
    "shapes": {
        "small": {"weight": 0.5, "params": {"batch": 4, "vocab": 5000}},
        "large": {"weight": 0.5, "params": {"batch": 16, "vocab": 32000}},
    },
    "precision": "strict_fp32",
    "scaled_range": [0.25, 1.0],
}
