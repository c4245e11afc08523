"""Sample spec: jagged sum pooling, a segment sum over per-sample lengths (values sized by their sum).

`values` holds every sample's rows one after the other; sample i owns `lengths[i]` of them (possibly
none: its output row is 0). `get_inputs` draws the lengths and sizes `values` by their sum.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.segment_reduce(values, "sum", lengths=lengths)


def get_inputs(batch: int = 256, mean_len: int = 8, dim: int = 32):
    lengths = torch.randint(0, 2 * mean_len + 1, (batch,))
    return [torch.randn(int(lengths.sum()), dim), lengths]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_jagged_sum",
    "description": "jagged segment sum over per-sample lengths",
    "shapes": {
        "small": {"weight": 0.5, "params": {"batch": 1024, "mean_len": 16, "dim": 64}},
        "large": {"weight": 0.5, "params": {"batch": 2048, "mean_len": 40, "dim": 128}},
    },
    "precision": "strict_fp32",
    "allow_torch_ops": ["aten.cumsum"],
}
