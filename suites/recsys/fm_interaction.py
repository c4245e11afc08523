"""Field interaction X (X^T Y) of a ranking model: every feature field mixes with every other one.

X [B, F, D] holds a sample's F field embeddings, Y [B, F, E] a second projection of them; the output
[B, F, E] is X (X^T Y), the factorization-machine / linear-attention form of all-pairs field mixing
used in the interaction layers of CTR and ranking models (queries and keys shared). Shapes: 16 to 64
fields of width 64 to 128 at batches of 2k-8k, as in serving and training. strict_fp32. Eager runs two
bmm kernels and writes the [B, D, E] intermediate X^T Y to memory, larger than X and Y together; a
good kernel fuses both products per sample, keeps the small D x E (or F x F) matrix on chip, and reads
X and Y once and writes the output once (near memory bound).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, torch.bmm(x.transpose(1, 2), y))


def get_inputs(batch: int = 1024, fields: int = 32, dim: int = 64, out_dim: int = 64):
    return [torch.randn(batch, fields, dim), torch.randn(batch, fields, out_dim)]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "fm_interaction",
    "description": "per-sample field interaction X (X^T Y): two fused batched products",
    "shapes": {
        "serving": {"weight": 0.4, "params": {"batch": 2048, "fields": 32, "dim": 64, "out_dim": 64}},
        "training": {"weight": 0.35, "params": {"batch": 4096, "fields": 64, "dim": 128, "out_dim": 128}},
        "few_fields": {"weight": 0.25, "params": {"batch": 8192, "fields": 16, "dim": 128, "out_dim": 64}},
    },
    "precision": "strict_fp32",
}  # fmt: skip
