"""Tuner codegen test spec: every elementwise op of the IR, one output each (tiny shapes)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, y):
        p = x.abs() + 0.1
        return (
            x + y, x - y, x * y, x / p, torch.maximum(x, y), torch.minimum(x, y),
            p**2, p**0.5, x**3, p**-0.5, p**1.7, x**5, x**6, p**-1, x**0, p**-2.5,
            -x, x.abs(), x.exp(), p.log(), p.sqrt(), p.rsqrt(), p.reciprocal(), x.square(),
            x.tanh(), x.sigmoid(), x.relu(), torch.erf(x), F.silu(x), F.gelu(x),
            F.gelu(x, approximate="tanh"), x.clamp(min=-0.5), x.clamp(-0.5, 0.7),
            torch.where(x > 0, x, 0.01 * x),
            torch.log1p(p), torch.log1p(x * 1e-6), torch.expm1(x), torch.expm1(x * 1e-6),
        )  # fmt: skip


def get_inputs(rows=6, cols=70):
    return [torch.randn(rows, cols) * 2, torch.randn(rows, cols)]


def get_init_inputs():
    return []


KERNELEVOLVE = {"shapes": {"tiny": {"weight": 1, "params": {"rows": 6, "cols": 70}}}}
