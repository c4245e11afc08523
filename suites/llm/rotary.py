"""Rotary position embedding (RoPE), rotate-half form, on the query and key heads of a fused QKV
projection: `x * cos + rotate_half(x) * sin`, what every Llama, Mistral and Qwen layer runs before
attention, in serving (prefill) and in training.

x is [batch, seq, heads, dim] with the query and key heads side by side (Llama-3-8B: 32 + 8 heads of
128; Llama-2-7B: 32 + 32), so one call rotates both. cos and sin are the [seq, dim] tables of the
GPT-NeoX / Hugging Face form (each half repeats the frequencies). Shapes: `short` a 1k-token prefill
chunk, `prefill` an 8k prompt, `train` a 4 x 2k training micro-batch. Strict fp32.

Eager runs five kernels (neg, cat, two muls, add) and writes three temporaries the size of x; a good
kernel reads x once, reads each token's table row once for all its heads, writes once: 8 bytes per
element at memory bandwidth.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]


def get_inputs(batch: int = 1, seq: int = 1024, heads: int = 40, dim: int = 128):
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return [torch.randn(batch, seq, heads, dim), angles.cos(), angles.sin()]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "rotary",
    "description": "rotary position embedding (rotate-half form) on fused query and key heads",
    "shapes": {
        "short": {"weight": 0.2, "params": {"batch": 1, "seq": 1024, "heads": 40, "dim": 128}},
        "prefill": {"weight": 0.5, "params": {"batch": 1, "seq": 8192, "heads": 40, "dim": 128}},
        "train": {"weight": 0.3, "params": {"batch": 4, "seq": 2048, "heads": 64, "dim": 128}},
    },
    "precision": "strict_fp32",
}
