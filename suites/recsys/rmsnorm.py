"""RMSNorm in recommendation models: the pre-norm of generative recommenders' sequence blocks (HSTU,
over jagged user histories flattened to tokens) and the per-feature embedding norm of interaction
layers (Wukong, DHEN), which normalize every sparse feature's embedding before mixing them.

Shapes: `user_history` is 32k history tokens at a 512-wide model; `interaction` is 2048 samples x 128
features of dim-128 embeddings (short rows, many of them); `serving` is a 4096-token ranking request
at width 256 (launch-bound). strict_fp32: the sum of squares in fp32, like the reference. Eager runs
five kernels (pow, mean, add, rsqrt, two muls) with fp32 intermediates the size of x; a good kernel
reads each row once, packs several short rows per program and writes y once, at bandwidth.
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
    "name": "rmsnorm",
    "description": "row reduction: RMSNorm of recommendation-model activations with a per-column scale",
    "shapes": {
        "user_history": {"weight": 0.5, "params": {"rows": 32768, "cols": 512}},
        "interaction": {"weight": 0.3, "params": {"rows": 262144, "cols": 128}},
        "serving": {"weight": 0.2, "params": {"rows": 4096, "cols": 256}},
    },
    "precision": "strict_fp32",
}
