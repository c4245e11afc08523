"""A pre-norm transformer block without its norms: `h = x + proj(attn(qkv(x)))`, then
`y = h + fc2(gelu(fc1(h)))`, with causal multi-head attention (GPT-2 style: one fused qkv projection
without bias, biased output projection and MLP, exact GELU, 4x MLP width).

Shapes: `gpt2` is GPT-2 small (768 wide, 12 heads) on 4 sequences of 1024 tokens, the heaviest;
`serving` a 512-wide 8-head block on 2 prompts of 512 (a small LLM serving short prompts); `wide`
1024 wide, 16 heads, 2 x 1024 tokens (GPT-2 medium). Head size 64 throughout. Strict fp32.

Eager runs nine kernels: the qkv GEMM, SDPA (memory-efficient attention), a copy back to [B, S, D],
proj GEMM, residual add, fc1 GEMM, GELU, fc2 GEMM, residual add; the [B, S, 4D] MLP activation makes
two extra trips to memory. A good implementation is five kernels: GEMMs with bias, GELU and residual
fused into their epilogues, and a causal flash attention reading q, k, v straight out of the qkv
output and writing [B, S, D] directly.
"""

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
    "name": "sdpa_mlp_block",
    "description": "transformer block core: x + proj(causal MHA(qkv(x))), then h + fc2(gelu(fc1(h)))",
    "shapes": {
        "serving": {"weight": 0.3, "params": {"batch": 2, "seq": 512, "dim": 512, "heads": 8}},
        "gpt2": {"weight": 0.4, "params": {"batch": 4, "seq": 1024, "dim": 768, "heads": 12}},
        "wide": {"weight": 0.3, "params": {"batch": 2, "seq": 1024, "dim": 1024, "heads": 16}},
    },
    "precision": "strict_fp32",
}
