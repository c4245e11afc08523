"""Scaled dot-product attention softmax(q k^T / sqrt(d)) v over [B, H, S, D], no mask: the core of
every transformer layer, here at LLM prefill sizes (encoders and prefix-LM prompts are unmasked).

Shapes: `batch` is 4 prompts of 512 tokens on 16 heads of 64 (a BERT-large or small-LLM layer);
`prefill` one 2k prompt on 32 heads of 128 (Llama-2-7B); `long` one 4k prompt on 8 heads of 128 (a
tensor-parallel shard of a 32-head model). TF32: the spec's policy lets both products use tensor
cores, as production fp32 attention does.

Eager runs four kernels (q k^T, the scale, softmax, the value product) and writes the S x S score
matrix three times (512 MiB per pass at `prefill`); a good kernel is FlashAttention: it streams K and
V through an online softmax, never stores the scores, and is bound by tensor-core throughput.
"""

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
    "name": "attention",
    "description": "attention softmax(q k^T / sqrt(d)) v without a mask, at LLM prefill sizes",
    "shapes": {
        "batch": {"weight": 0.3, "params": {"batch": 4, "heads": 16, "seq": 512, "dim": 64}},
        "prefill": {"weight": 0.5, "params": {"batch": 1, "heads": 32, "seq": 2048, "dim": 128}},
        "long": {"weight": 0.2, "params": {"batch": 1, "heads": 8, "seq": 4096, "dim": 128}},
    },
    "precision": "tf32",
}
