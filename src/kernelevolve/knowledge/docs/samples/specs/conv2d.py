"""Sample spec: a 3x3 convolution, stride 1, padding 1, NCHW, no bias: convolution as implicit GEMM."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, c_in: int = 16, c_out: int = 32):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs(batch: int = 4, c_in: int = 16, hw: int = 32, **_):
    return [torch.randn(batch, c_in, hw, hw)]


def get_init_inputs(c_in: int = 16, c_out: int = 32):
    return [c_in, c_out]


KERNELEVOLVE = {
    "name": "sample_conv2d",
    "description": "convolution 3x3, stride 1, padding 1, as an implicit GEMM",
    "shapes": {
        "small": {"weight": 0.5, "params": {"batch": 2, "c_in": 8, "c_out": 16, "hw": 30}},
        "medium": {"weight": 0.5, "params": {"batch": 4, "c_in": 32, "c_out": 64, "hw": 32}},
    },
    "precision": "tf32",
}
