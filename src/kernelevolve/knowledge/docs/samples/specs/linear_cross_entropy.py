"""Sample spec: an LLM output layer fused with its loss, `F.cross_entropy(lm_head(h), targets)` with
lm_head = nn.Linear(dim, vocab, bias=False): mean over tokens of logsumexp(logits) - logits[target]."""

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
    "name": "sample_linear_cross_entropy",
    "description": "LLM output layer fused with the mean cross-entropy loss",
    "shapes": {
        "small": {"weight": 0.5, "params": {"tokens": 50, "dim": 64, "vocab": 1000}},
        "large": {"weight": 0.5, "params": {"tokens": 512, "dim": 256, "vocab": 8000}},
    },
    "precision": "strict_fp32",
}
