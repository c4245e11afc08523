"""Top-k sampling of the next token at an LLM's output, made deterministic by passing the uniform
noise in: keep the k largest logits of each row, divide by the temperature, add Gumbel noise
-log(-log(u)) and take the argmax, which draws a token from softmax(logits / T) restricted to the top k
(the Gumbel-max trick; `generate(do_sample=True, top_k=50)` in Hugging Face, the top-k path of vLLM).

Shapes: `single` one sequence over Llama-3's 128256-token vocabulary (latency-bound decode);
`decode` a 64-sequence serving batch over the same vocabulary; `batch` 256 sequences over a 32000
vocabulary (Llama-2 / Mistral). Strict fp32 for the arithmetic; the output is int64 token ids, which
must match exactly. The top-k set keeps every logit >= the k-th largest (ties at the threshold are all
kept, as Hugging Face's TopKLogitsWarper does), so it is well defined whatever the order of equal
values. The second input distribution scales inputs by 1/4..1 only (`scaled_range`), which keeps u in
(0, 1).

Eager runs topk (a radix select and a sort), a slice, mul, lt, masked_fill, two logs, neg, sub and
argmax: about ten kernels with [B, V] temporaries. A good kernel reads the logits once to find a
threshold, then touches only the few candidates: the k-th largest value by a select over a small
candidate set, and u only where a logit is kept.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, k: int = 50, temperature: float = 0.8):
        super().__init__()
        self.k = k
        self.temperature = temperature

    def forward(self, logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        kth = torch.topk(logits, self.k, dim=-1).values[:, -1:]
        scaled = (logits * (1.0 / self.temperature)).masked_fill(logits < kth, float("-inf"))
        return torch.argmax(scaled - torch.log(-torch.log(u)), dim=-1)


def get_inputs(batch: int = 64, vocab: int = 128256):
    logits = torch.randn(batch, vocab) * 2.0
    u = torch.rand(batch, vocab).clamp(1e-6, 1.0 - 1e-6)
    return [logits, u]


def get_init_inputs():
    return [50, 0.8]


KERNELEVOLVE = {
    "name": "topk_sampling",
    "description": "top-k (k=50) Gumbel-max sampling of next-token ids from fp32 logits",
    "shapes": {
        "single": {"weight": 0.2, "params": {"batch": 1, "vocab": 128256}},
        "decode": {"weight": 0.5, "params": {"batch": 64, "vocab": 128256}},
        "batch": {"weight": 0.3, "params": {"batch": 256, "vocab": 32000}},
    },
    "precision": "strict_fp32",
    "scaled_range": [0.25, 1.0],
}
