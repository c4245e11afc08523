"""The SwiGLU activation of a gated MLP (Llama, Mistral): `silu(gate) * up`, on the outputs of the
gate and up projections, before the down projection.

Shapes: the intermediate sizes of Llama-2-7B (11008) and Mistral-7B (14336); `decode` is 64 tokens,
`prefill` 4096 tokens. Strict fp32.

Eager runs two kernels (silu, then mul), writing the silu result in between: 20 bytes per element;
a good kernel reads gate and up once and writes the product once (12 bytes per element), at memory
bandwidth.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


def get_inputs(tokens: int = 4096, inter: int = 11008):
    return [torch.randn(tokens, inter), torch.randn(tokens, inter)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "swiglu",
    "description": "SwiGLU activation silu(gate) * up of a gated MLP",
    "shapes": {
        "decode": {"weight": 0.3, "params": {"tokens": 64, "inter": 14336}},
        "prefill": {"weight": 0.5, "params": {"tokens": 4096, "inter": 11008}},
        "prefill_wide": {"weight": 0.2, "params": {"tokens": 2048, "inter": 14336}},
    },
    "precision": "strict_fp32",
}
