"""Sample spec: a transformer block's core without norms: `h = x + proj(causal MHA(qkv(x)))`, then
`y = h + fc2(gelu(fc1(h)))` (fused qkv projection without bias, exact GELU, 4x MLP)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim: int = 512, heads: int = 8):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        h = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return h + self.fc2(F.gelu(self.fc1(h)))


def get_inputs(batch: int = 2, seq: int = 512, dim: int = 512, heads: int = 8):
    return [torch.randn(batch, seq, dim)]  # heads shapes the model, not the input


def get_init_inputs(dim: int = 512, heads: int = 8):
    return [dim, heads]


KERNELEVOLVE = {
    "name": "sample_sdpa_mlp_block",
    "description": "transformer block core: causal MHA with residual, then a GELU MLP with residual",
    "shapes": {
        "small": {"weight": 0.5, "params": {"batch": 2, "seq": 50, "dim": 96, "heads": 2}},
        "large": {"weight": 0.5, "params": {"batch": 2, "seq": 256, "dim": 256, "heads": 4}},
    },
    "precision": "strict_fp32",
}
