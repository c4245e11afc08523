"""Tuner codegen test spec: a row graph with two reduction stages (amin/amax, then a mean of a value
built from them), a per-row input, a per-column weight and a scalar parameter; two outputs."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.w = nn.Parameter(torch.randn(cols))
        self.s = nn.Parameter(torch.tensor(0.25))

    def forward(self, x, r):
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        t = (x - lo) / (hi - lo + r.abs() + 1.0) * self.w + self.s
        return t * torch.rsqrt((t * t).mean(-1, keepdim=True) + 1e-5), t


def get_inputs(rows=6, cols=90):
    return [torch.randn(rows, cols), torch.randn(rows, 1)]


def get_init_inputs(cols=90):
    return [cols]


KERNELEVOLVE = {
    "shapes": {
        "narrow": {"weight": 1, "params": {"rows": 6, "cols": 90}},
        "wide": {"weight": 1, "params": {"rows": 3, "cols": 1200}},
    }
}
