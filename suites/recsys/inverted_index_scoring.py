"""Sparse inverted-index scoring: the first stage of learned-sparse (SPLADE-style) or BM25 retrieval.

A batch of queries, each a jagged list of weighted term ids, is scored against an index of posting
lists (CSR per term: doc ids sorted within each list, an impact score per posting, lists pruned to
at most max_postings entries) into a dense [queries, n_docs] score matrix that a top-k then reads:
scores[q, d] = sum of w_t * s over the query's terms t and the postings (d, s) of t. Shapes: online
serving (32 queries over a 1M-doc shard), an offline batch (256 queries, 500k docs) and a small
shard; 50k terms with 50-200 postings per term on average, 6-10 terms per query. strict_fp32; scores
are non-negative sums of few terms. Eager runs about 18 kernels: gathers over a padded window of
max_postings slots per query term, masks, products, the zero fill and index_add_. The dense write
dominates the bytes, so a good kernel is one zero fill at bandwidth plus one scatter launch with
atomics over the real postings only, one program per query term.

Roofline bytes (`bytes` per shape): the dense write plus the postings the query terms own (a doc id
and a score, 12 bytes, `postings` on average per term) and each term's id, weight and list bounds
(28 bytes). The inputs hold the whole index, which a kernel does not read: counting them made the
roofline's least time longer than the op needs, and kernels that zero-fill at bandwidth measured
111% of the roofline.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n_docs: int = 100000, max_postings: int = 200):
        super().__init__()
        self.n_docs = n_docs
        self.max_postings = max_postings

    def forward(
        self,
        q_terms: torch.Tensor,
        q_offsets: torch.Tensor,
        q_weights: torch.Tensor,
        post_offsets: torch.Tensor,
        post_docs: torch.Tensor,
        post_scores: torch.Tensor,
    ) -> torch.Tensor:
        dev = q_terms.device
        queries = q_offsets.numel() - 1
        term_slots = torch.arange(q_terms.numel(), device=dev)
        query_of_term = torch.searchsorted(q_offsets, term_slots, right=True) - 1
        # every query term reads a window of max_postings postings; slots past its list's end add 0
        pos = post_offsets[q_terms][:, None] + torch.arange(self.max_postings, device=dev)
        valid = pos < post_offsets[q_terms + 1][:, None]
        pos = pos.clamp(max=post_docs.numel() - 1)
        contrib = torch.where(valid, q_weights[:, None] * post_scores[pos], 0.0)
        target = query_of_term[:, None] * self.n_docs + post_docs[pos]
        scores = torch.zeros(queries * self.n_docs, dtype=post_scores.dtype, device=dev)
        scores.index_add_(0, target.flatten(), contrib.flatten())
        return scores.view(queries, self.n_docs)


def get_inputs(queries: int = 32, terms: int = 10, n_terms: int = 50000, n_docs: int = 100000,
               postings: int = 100):  # fmt: skip
    # every query gets terms // 2 terms plus a random share of the rest: `terms` on average
    base, extra = max(1, terms // 2), queries * (terms - max(1, terms // 2))
    cuts = torch.sort(torch.randint(0, extra + 1, (queries - 1,))).values
    shares = torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.full((1,), extra)])
    q_offsets = shares + base * torch.arange(queries + 1)
    q_terms = torch.randint(0, n_terms, (queries * terms,))
    # posting lists of 0 to 2 * postings entries (the index is pruned to that), n_terms * postings in all
    r = torch.randint(0, postings + 1, (n_terms,))
    lengths = postings + r - r.roll(1)
    post_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    n_post = n_terms * postings
    # doc ids sorted within each posting list, as an index stores them
    term_of_posting = torch.searchsorted(post_offsets, torch.arange(n_post), right=True) - 1
    keys = term_of_posting * n_docs + torch.randint(0, n_docs, (n_post,))
    post_docs = torch.sort(keys).values % n_docs
    q_weights = torch.randn(queries * terms).abs()
    post_scores = torch.randn(n_post).abs()
    return [q_terms, q_offsets, q_weights, post_offsets, post_docs, post_scores]


def get_init_inputs(n_docs: int = 100000, postings: int = 100):
    return [n_docs, 2 * postings]


KERNELEVOLVE = {
    "name": "inverted_index_scoring",
    "description": "jagged scatter: sparse inverted-index scoring of a query batch into dense doc scores",
    "shapes": {
        "serving": {"weight": 0.5, "params": {"queries": 32, "terms": 10, "n_terms": 50000,
                                              "n_docs": 1000000, "postings": 100},
                    "bytes": 32 * 1000000 * 4 + 32 * 10 * (100 * 12 + 28)},
        "batch": {"weight": 0.3, "params": {"queries": 256, "terms": 10, "n_terms": 50000,
                                            "n_docs": 500000, "postings": 200},
                  "bytes": 256 * 500000 * 4 + 256 * 10 * (200 * 12 + 28)},
        "shard": {"weight": 0.2, "params": {"queries": 64, "terms": 6, "n_terms": 50000,
                                            "n_docs": 100000, "postings": 50},
                  "bytes": 64 * 100000 * 4 + 64 * 6 * (50 * 12 + 28)},
    },
    "precision": "strict_fp32",
}  # fmt: skip
