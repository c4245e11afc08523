"""Causal scaled dot-product attention over [B, H, S, D]: LLM prefill, where each token of the prompt
attends to itself and the tokens before it (`F.scaled_dot_product_attention(..., is_causal=True)`).

Shapes: `batch` is 4 prompts of 512 tokens on 16 heads of 64 (a small LLM serving short prompts);
`prefill` one 2k prompt on 32 heads of 128 (Llama-2-7B); `long` one 4k prompt on 8 heads of 128 (a
tensor-parallel shard of a 32-head model). TF32: the spec's policy lets both products use tensor
cores, as production fp32 attention does.

Eager runs one fused SDPA kernel (memory-efficient attention: fp32 rules out flash). A good kernel is
FlashAttention with the causal structure exploited: key blocks entirely above the diagonal are never
loaded (half the work at long S), only the diagonal blocks pay for the mask, and the heaviest query
blocks start first so the last wave is short.
"""

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
    "name": "attention_causal",
    "description": "causal attention softmax(q k^T / sqrt(d) + causal mask) v at LLM prefill sizes",
    "shapes": {
        "batch": {"weight": 0.3, "params": {"batch": 4, "heads": 16, "seq": 512, "dim": 64}},
        "prefill": {"weight": 0.5, "params": {"batch": 1, "heads": 32, "seq": 2048, "dim": 128}},
        "long": {"weight": 0.2, "params": {"batch": 1, "heads": 8, "seq": 4096, "dim": 128}},
    },
    "precision": "tf32",
}
