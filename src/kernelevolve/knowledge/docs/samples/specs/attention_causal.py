"""Sample spec: causal scaled dot-product attention over [B, H, S, D] (query i sees keys 0..i), as
`F.scaled_dot_product_attention(q, k, v, is_causal=True)`."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs(batch: int = 2, heads: int = 4, seq: int = 256, dim: int = 64):
    shape = (batch, heads, seq, dim)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_attention_causal",
    "description": "causal attention: softmax(q k^T / sqrt(d) + causal mask) v",
    "shapes": {
        "small": {"weight": 0.5, "params": {"batch": 2, "heads": 3, "seq": 100, "dim": 48}},
        "large": {"weight": 0.5, "params": {"batch": 1, "heads": 8, "seq": 512, "dim": 64}},
    },
    "precision": "tf32",
}
