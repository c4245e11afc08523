"""Jagged sum pooling: a sequence feature of a recommendation model reduced to one vector per sample.

Each sample carries a variable-length list of embeddings (the items of a user's recent history, the
tokens of a query), stored the way TorchRec and FBGEMM store them: the rows of every sample one after
the other in `values`, and a `lengths` tensor saying how many rows each sample owns. Lengths are drawn
at random around a mean (from 0 to twice it), so `values` is sized by their sum: written the natural
way, `get_inputs` needs a tensor's value to size another, and the harness probes it on the CPU. Shapes:
a history feature (4k samples, ~50 rows of dim 128), a short feature at a large batch (16k samples,
~8 rows, dim 64) and a long-sequence one (1k samples, ~400 rows, dim 64). strict_fp32.
Eager runs `segment_reduce` (its own offsets, then one reduction pass); a good kernel reads `values`
once at full bandwidth, one program or thread team per sample, and computes the offsets on the fly
(the exclusive prefix sum of `lengths`, which candidates may take with `torch.cumsum`).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.segment_reduce(values, "sum", lengths=lengths)


def get_inputs(batch: int = 512, mean_len: int = 16, dim: int = 64):
    lengths = torch.randint(0, 2 * mean_len + 1, (batch,))
    return [torch.randn(int(lengths.sum()), dim), lengths]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "jagged_sum_pooling",
    "description": "jagged segment sum: per-sample sum of a variable number of embedding rows (values, lengths)",
    "shapes": {
        "history": {"weight": 0.4, "params": {"batch": 4096, "mean_len": 50, "dim": 128}},
        "short": {"weight": 0.4, "params": {"batch": 16384, "mean_len": 8, "dim": 64}},
        "long_sequence": {"weight": 0.2, "params": {"batch": 1024, "mean_len": 400, "dim": 64}},
    },
    "precision": "strict_fp32",
    "allow_torch_ops": ["aten.cumsum"],
}
