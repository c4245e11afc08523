"""Temporal convolution at serving shapes: a 1-D conv with few channels over a long sequence.

Sequence feature extractors in serving run Conv1d stacks over long streams: TCN encoders of user
activity and time-series features in ranking and forecasting, and the conv front ends of audio and
speech models. Channels stay small (16-64) and the kernel short (3-7, same padding) while the sequence
is long (4k-32k steps), so the GEMM view (M = batch * length, N = c_out, K = c_in * kernel_size) is
tall and skinny. Shapes: a 64-channel k=7 encoder on 16k steps, a 32-channel k=5 layer on 32k steps,
and a light 16-channel k=3 layer. strict_fp32: no TF32 (cuDNN runs fp32 FMA). Eager runs one cuDNN
convolution plus a bias add; a good kernel is an implicit GEMM (no im2col buffer) with the bias fused
into the epilogue, reading x once per tile (the taps' shifted windows hit in cache) and using
3xTF32 tensor-core dots for fp32 accuracy.
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
    "name": "conv1d_serving",
    "description": "Conv1d with few channels and same padding over long sequences, with bias",
    "shapes": {
        "encoder": {"weight": 0.4, "params": {"batch": 32, "c_in": 64, "c_out": 64, "kernel_size": 7,
                                              "length": 16384}},
        "long": {"weight": 0.3, "params": {"batch": 16, "c_in": 32, "c_out": 32, "kernel_size": 5,
                                           "length": 32768}},
        "light": {"weight": 0.3, "params": {"batch": 8, "c_in": 16, "c_out": 16, "kernel_size": 3,
                                            "length": 4096}},
    },
    "precision": "strict_fp32",
}  # fmt: skip
