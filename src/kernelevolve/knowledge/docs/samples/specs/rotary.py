"""Sample spec: rotary position embedding, rotate-half (GPT-NeoX) form, over [B, S, H, D] with
[S, D] cos and sin tables: `x * cos + rotate_half(x) * sin`."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]


def get_inputs(batch: int = 1, seq: int = 1024, heads: int = 40, dim: int = 128):
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return [torch.randn(batch, seq, heads, dim), angles.cos(), angles.sin()]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_rotary",
    "description": "rotary position embedding (rotate-half form) on [B, S, H, D]",
    "shapes": {
        "small": {"weight": 0.5, "params": {"batch": 1, "seq": 16, "heads": 6, "dim": 64}},
        "large": {"weight": 0.5, "params": {"batch": 2, "seq": 512, "heads": 12, "dim": 128}},
    },
    "precision": "strict_fp32",
}
