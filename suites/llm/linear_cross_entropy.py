"""Fused output layer and loss of LLM training: logits = h @ W^T over the vocabulary, then the mean
cross-entropy against the next-token targets (`F.cross_entropy(lm_head(h), targets)`).

Shapes: `short` a 512-token fine-tuning micro-batch of a 512-wide model over a 32k vocabulary
(Llama-2 / Mistral tokenizers); `medium` 2048 tokens of GPT-2-medium (d = 1024) over nanoGPT's padded
50304 vocabulary, the common training case; `long` 4096 tokens of the 512-wide model over 32k.
Strict fp32: the reference GEMM runs without TF32, and a kernel gets fp32 accuracy on tensor cores
by splitting each operand into two TF32 parts (3xTF32).

Eager runs the GEMM, log_softmax and nll_loss: it writes the [N, V] logits (412 MiB at `medium`),
reads them twice and writes the log-probabilities. A good kernel is one GEMM whose epilogue keeps a
per-tile logsumexp and picks out the target logit, so the logits never reach memory; a small second
pass merges the tiles and takes the mean.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int = 768, vocab: int = 50304):
        super().__init__()
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.lm_head(h), targets)


def get_inputs(tokens: int = 2048, dim: int = 768, vocab: int = 50304):
    return [torch.randn(tokens, dim), torch.randint(0, vocab, (tokens,))]


def get_init_inputs(dim: int = 768, vocab: int = 50304):
    return [dim, vocab]


KERNELEVOLVE = {
    "name": "linear_cross_entropy",
    "description": "LLM output layer fused with the mean cross-entropy loss (logits never stored)",
    "shapes": {
        "short": {"weight": 0.2, "params": {"tokens": 512, "dim": 512, "vocab": 32000}},
        "medium": {"weight": 0.5, "params": {"tokens": 2048, "dim": 1024, "vocab": 50304}},
        "long": {"weight": 0.3, "params": {"tokens": 4096, "dim": 512, "vocab": 32000}},
    },
    "precision": "strict_fp32",
}
