"""LayerNorm over the hidden dimension with a learned scale and bias, as in GPT-2/BERT-style blocks.

Shapes: `decode` is a 64-token decode batch at hidden 4096 (launch-bound: 1 MB of activations);
`prefill` is 8192 tokens at hidden 4096 (128 MB: memory-bound); `wide` is 2048 tokens at hidden
8192. Strict fp32: statistics in fp32, like the reference.

Eager runs `native_layer_norm`, one fused kernel with a two-pass (Welford) reduction per row; a good
kernel keeps the row on chip, computes mean and variance in one pass over registers and writes y
once, at memory bandwidth (8 bytes per element plus the small weight and bias).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int = 4096, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs(tokens: int = 4096, hidden: int = 4096):
    return [torch.randn(tokens, hidden)]


def get_init_inputs(hidden: int = 4096):
    return [hidden]


KERNELEVOLVE = {
    "name": "layernorm",
    "description": "LayerNorm over the hidden dim with affine weight and bias",
    "shapes": {
        "decode": {"weight": 0.3, "params": {"tokens": 64, "hidden": 4096}},
        "prefill": {"weight": 0.5, "params": {"tokens": 8192, "hidden": 4096}},
        "wide": {"weight": 0.2, "params": {"tokens": 2048, "hidden": 8192}},
    },
    "precision": "strict_fp32",
}
