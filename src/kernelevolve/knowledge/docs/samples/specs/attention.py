"""Sample spec: scaled dot-product attention softmax(q k^T / sqrt(d)) v over [B, H, S, D], not causal."""

import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1) @ v


def get_inputs(batch: int = 2, heads: int = 4, seq: int = 256, dim: int = 64):
    shape = (batch, heads, seq, dim)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_attention",
    "description": "attention: softmax(q k^T / sqrt(d)) v, no mask",
    "shapes": {
        "short": {"weight": 0.5, "params": {"batch": 2, "heads": 4, "seq": 100, "dim": 64}},
        "long": {"weight": 0.5, "params": {"batch": 1, "heads": 8, "seq": 512, "dim": 64}},
    },
    "precision": "tf32",
}
