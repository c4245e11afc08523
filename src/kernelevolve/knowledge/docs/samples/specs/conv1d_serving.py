"""Sample spec: Conv1d with same padding (kernel_size // 2) and bias over [batch, c_in, length]: a
convolution as an implicit GEMM with few channels and a long sequence.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, c_in: int = 16, c_out: int = 16, kernel_size: int = 3):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel_size=kernel_size, padding=kernel_size // 2, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs(batch: int = 8, c_in: int = 16, length: int = 4096, **_):
    return [torch.randn(batch, c_in, length)]


def get_init_inputs(c_in: int = 16, c_out: int = 16, kernel_size: int = 3):
    return [c_in, c_out, kernel_size]


KERNELEVOLVE = {
    "name": "sample_conv1d_serving",
    "description": "Conv1d with few channels and same padding over long sequences, with bias",
    "shapes": {
        "small": {"weight": 0.5, "params": {"batch": 2, "c_in": 8, "c_out": 16, "kernel_size": 3, "length": 300}},
        "large": {"weight": 0.5, "params": {"batch": 4, "c_in": 32, "c_out": 32, "kernel_size": 5,
                                            "length": 2048}},
    },
    "precision": "strict_fp32",
}  # fmt: skip
