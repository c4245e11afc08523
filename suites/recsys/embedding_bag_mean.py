"""Embedding-bag mean pooling: averaged sparse features in a recommendation model.

Mean pooling is what ranking and two-tower retrieval models use for variable-length histories and
bags of content tokens, where a sum would scale with the list length: bag i averages the table rows
ids[offsets[i]:offsets[i+1]], and an empty bag gives a zero row. Shapes: a 1M-row history table at
dim 64 with ~50 ids per bag, a 250k-row token table at dim 128 with ~30, and a small 100k-row table
with short bags, at batch sizes of 4k-16k. The tables do not fit in L2, so this is a latency-bound
random gather. strict_fp32. Eager runs one embedding_bag kernel (which also writes per-bag bookkeeping
buffers); a good kernel keeps many row fetches in flight per bag and scales the fp32 sum by 1/length
before its single store of the output row.
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


def least_bytes(vocab: int, dim: int, bags: int, n_ids: int) -> int:
    """Roofline bytes: each distinct table row once (the expected count of distinct ids among n_ids
    uniform draws), the ids, the offsets and the output. The table is an input, but a lookup reads
    only its rows: counting the whole table made the roofline's least time longer than the fastest
    kernels took, so they were flagged as faster than the hardware allows."""
    distinct = vocab * (1 - (1 - 1 / vocab) ** n_ids)
    return int(distinct * dim * 4 + n_ids * 8 + (bags + 1) * 8 + bags * dim * 4)


KERNELEVOLVE = {
    "name": "embedding_bag_mean",
    "description": "jagged gather: embedding-bag mean pooling over offsets (empty bags give 0)",
    "shapes": {
        "history": {
            "weight": 0.5,
            "params": {"vocab": 1000000, "dim": 64, "bags": 8192, "n_ids": 409600},
            "bytes": least_bytes(1000000, 64, 8192, 409600),
        },
        "tokens": {
            "weight": 0.3,
            "params": {"vocab": 250000, "dim": 128, "bags": 16384, "n_ids": 491520},
            "bytes": least_bytes(250000, 128, 16384, 491520),
        },
        "small_table": {
            "weight": 0.2,
            "params": {"vocab": 100000, "dim": 64, "bags": 4096, "n_ids": 81920},
            "bytes": least_bytes(100000, 64, 4096, 81920),
        },
    },
    "precision": "strict_fp32",
}
