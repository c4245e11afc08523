"""Sparse inverted-index scoring in Triton: a zero fill, then one scatter launch with atomic adds.

scores[q, d] = sum over the query's terms t and the postings (d, s) of t of w_t * s. The output is
dense [queries, n_docs] but only a few thousand entries per query are non-zero, so the bytes are
the zero fill (torch.zeros: a memset at bandwidth) and the scatter is small. One program per query
term: it finds its query by counting the query ends q_offsets[1..Q] at or before its slot (one
vector load of BLOCK_Q offsets per step, L2-resident), reads its term id, weight and posting range,
then walks the posting list BLOCK_P postings at a time: a vector load of doc ids and impact scores
and a masked tl.atomic_add of w * s into out[q, doc]. Only the real postings are touched (eager
reads a padded window of max_postings slots per term), there is no host sync, and the whole
scatter is one launch. Different terms of a query can hit the same doc, and a list may repeat a
doc, so the adds are atomics (relaxed: nothing reads the output until the kernel ends). The
summation order across terms is unspecified: scores are sums of a few non-negative products, so
the result is within a few ulps of the reference. Output addresses are 64-bit (q * n_docs).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {"BLOCK_P": [32, 64, 128, 256], "BLOCK_Q": [64, 128, 256, 512], "num_warps": [1, 2, 4, 8]}
CONFIG = {"BLOCK_P": 128, "BLOCK_Q": 256, "num_warps": 4}


@triton.jit
def _inverted_index_kernel(
    q_terms_ptr, q_offsets_ptr, q_weights_ptr, post_offsets_ptr, post_docs_ptr, post_scores_ptr, out_ptr,
    queries, n_docs, BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    slot = tl.program_id(0)
    # the query of this slot: how many queries end at or before it
    query = 0
    k = 0
    while k < queries:
        i = k + tl.arange(0, BLOCK_Q)
        ends = tl.load(q_offsets_ptr + 1 + i, mask=i < queries, other=0)
        query += tl.sum(((ends <= slot) & (i < queries)).to(tl.int32), axis=0)
        k += BLOCK_Q
    term = tl.load(q_terms_ptr + slot)
    w = tl.load(q_weights_ptr + slot)
    start = tl.load(post_offsets_ptr + term)
    end = tl.load(post_offsets_ptr + term + 1)
    row = out_ptr + query.to(tl.int64) * n_docs
    j = start
    while j < end:  # a run-time trip count: a while loop (the interpreter cannot `range` to one)
        p = j + tl.arange(0, BLOCK_P)
        ok = p < end
        docs = tl.load(post_docs_ptr + p, mask=ok, other=0)
        s = tl.load(post_scores_ptr + p, mask=ok, other=0.0)
        tl.atomic_add(row + docs, w * s, mask=ok, sem="relaxed")
        j += BLOCK_P


class ModelNew(nn.Module):
    def __init__(self, n_docs: int = 100000, max_postings: int = 200):
        super().__init__()
        self.n_docs = n_docs
        self.max_postings = max_postings  # the kernel walks each list to its real end

    def forward(
        self,
        q_terms: torch.Tensor,
        q_offsets: torch.Tensor,
        q_weights: torch.Tensor,
        post_offsets: torch.Tensor,
        post_docs: torch.Tensor,
        post_scores: torch.Tensor,
    ) -> torch.Tensor:
        q_terms, q_offsets, q_weights = q_terms.contiguous(), q_offsets.contiguous(), q_weights.contiguous()
        post_offsets, post_docs = post_offsets.contiguous(), post_docs.contiguous()
        post_scores = post_scores.contiguous()
        queries = q_offsets.numel() - 1
        out = torch.zeros((queries, self.n_docs), device=post_scores.device, dtype=post_scores.dtype)
        if q_terms.numel() == 0 or out.numel() == 0:
            return out
        _inverted_index_kernel[(q_terms.numel(),)](
            q_terms, q_offsets, q_weights, post_offsets, post_docs, post_scores, out, queries, self.n_docs,
            BLOCK_Q=CONFIG["BLOCK_Q"], BLOCK_P=CONFIG["BLOCK_P"], num_warps=CONFIG["num_warps"],
        )  # fmt: skip
        return out
