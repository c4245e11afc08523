"""RMSNorm as trained in recommendation models: forward and backward of the pre-norm of generative
recommenders' sequence blocks (HSTU, over jagged user histories flattened to tokens) and of the
per-feature embedding norm of interaction layers (Wukong, DHEN). A training spec: gradients of x and
of the scale are checked, forward plus backward is timed.

Shapes: `user_history` is 32k tokens at width 512; `interaction` is 1024 samples x 128 features of
dim-128 embeddings (short rows); `wide` is 4096 rows at 1024. strict_fp32. Eager runs about five
kernels forward and a dozen backward (the weight gradient a column sum over all rows); a good kernel
saves one rstd per row, computes dx in one pass over x and dy, and reduces dweight per program then
across programs in a second small kernel: about 16 bytes per element for the whole step.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cols: int = 1024, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cols))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def get_inputs(rows: int = 512, cols: int = 1024):
    return [torch.randn(rows, cols)]


def get_init_inputs(cols: int = 1024):
    return [cols]


KERNELEVOLVE = {
    "name": "rmsnorm_backward",
    "description": "training row reduction: RMSNorm forward and backward (dx and the scale's gradient)",
    "shapes": {
        "user_history": {"weight": 0.5, "params": {"rows": 32768, "cols": 512}},
        "interaction": {"weight": 0.3, "params": {"rows": 131072, "cols": 128}},
        "wide": {"weight": 0.2, "params": {"rows": 4096, "cols": 1024}},
    },
    "precision": "strict_fp32",
    "backward": True,
}
