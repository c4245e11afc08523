"""Sample spec: batched matrix product [B, M, K] x [B, K, N] (TF32 allowed)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs(batch: int = 8, m: int = 128, k: int = 128, n: int = 128):
    return [torch.randn(batch, m, k), torch.randn(batch, k, n)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_bmm",
    "description": "batched GEMM",
    "shapes": {
        "ragged": {"weight": 0.5, "params": {"batch": 6, "m": 100, "k": 72, "n": 130}},
        "square": {"weight": 0.5, "params": {"batch": 16, "m": 128, "k": 128, "n": 128}},
    },
    "precision": "tf32",
}
