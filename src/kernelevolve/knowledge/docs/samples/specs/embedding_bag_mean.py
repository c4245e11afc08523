"""Sample spec: embedding-bag mean pooling over jagged offsets (a gather and a segment mean).

`ids` index rows of `table`; bag i averages rows ids[offsets[i]:offsets[i+1]]. Bags may be empty
(their output row is 0). Offsets are sorted, start at 0 and end at len(ids).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, table: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding_bag(ids, table, offsets[:-1], mode="mean")


def get_inputs(vocab: int = 10000, dim: int = 64, bags: int = 512, n_ids: int = 5000):
    cuts = torch.sort(torch.randint(0, n_ids + 1, (bags - 1,))).values
    ends = torch.tensor([0, n_ids], dtype=torch.int64)
    offsets = torch.cat([ends[:1], cuts, ends[1:]])
    ids = torch.randint(0, vocab, (n_ids,))
    return [torch.randn(vocab, dim), ids, offsets]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "sample_embedding_bag_mean",
    "description": "jagged gather: embedding-bag mean pooling over offsets (empty bags give 0)",
    "shapes": {
        "small": {"weight": 0.5, "params": {"vocab": 5000, "dim": 48, "bags": 300, "n_ids": 1800}},
        "large": {"weight": 0.5, "params": {"vocab": 50000, "dim": 128, "bags": 2048, "n_ids": 40000}},
    },
    "precision": "strict_fp32",
}
