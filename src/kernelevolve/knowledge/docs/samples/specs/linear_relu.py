"""Sample spec: relu(x @ W.T + b), a GEMM with a fused bias and activation epilogue (TF32 allowed)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n_in: int = 512, n_out: int = 512):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs(rows: int = 256, n_in: int = 512, **_):
    return [torch.randn(rows, n_in)]


def get_init_inputs(n_in: int = 512, n_out: int = 512):
    return [n_in, n_out]


KERNELEVOLVE = {
    "name": "sample_linear_relu",
    "description": "GEMM with a fused epilogue: linear layer, bias, ReLU",
    "shapes": {
        "small": {"weight": 0.5, "params": {"rows": 100, "n_in": 256, "n_out": 384}},
        "large": {"weight": 0.5, "params": {"rows": 512, "n_in": 512, "n_out": 512}},
    },
    "precision": "tf32",
}
