"""Sample spec: sparse inverted-index scoring, a jagged gather of posting lists and a scatter-add.

Query q is the term ids q_terms[q_offsets[q]:q_offsets[q+1]] with weights q_weights; term t's posting
list is post_docs / post_scores[post_offsets[t]:post_offsets[t+1]] (doc ids sorted within a list,
duplicates possible, at most max_postings = 2 * postings entries). scores[q, d] sums w_t * s over
the query's terms and their postings (d, s).
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
    "name": "sample_inverted_index_scoring",
    "description": "jagged scatter: sparse inverted-index scoring of a query batch into dense doc scores",
    "shapes": {
        "small": {"weight": 0.5, "params": {"queries": 8, "terms": 6, "n_terms": 500, "n_docs": 2000,
                                            "postings": 20}},
        "large": {"weight": 0.5, "params": {"queries": 32, "terms": 10, "n_terms": 5000, "n_docs": 20000,
                                            "postings": 50}},
    },
    "precision": "strict_fp32",
}  # fmt: skip
