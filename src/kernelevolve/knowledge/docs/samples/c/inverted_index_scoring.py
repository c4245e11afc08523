"""Sparse inverted-index scoring in C for the CPU: each query zeroes and fills its own score row.

scores[q, d] = sum over the query's terms t and the postings (d, s) of t of w_t * s. Queries are
OpenMP iterations: a thread owns row q, so it needs no atomics. It zeroes the row (memset: the dense
output is most of the bytes) and, while the row is still warm in its caches, walks the query's terms
in order and each term's posting list in order, adding w_t * s into row[doc]. That is the order in
which the reference's index_add_ adds, so results match to rounding. Posting lists are doc-sorted, so
the scattered adds move forward through the row; PREFETCH issues a write prefetch of the row entry
PREFETCH postings ahead to overlap the misses of a row larger than L2 (4 MB at 1M docs). Only the
real postings are read (the reference pads each term to a window of max_postings slots). All index
arrays are int64, as the spec passes them.
"""

import torch
import torch.nn as nn

from kernelevolve.native import compile_c

TUNABLES = {"QUERIES_PER_TASK": [1, 2, 4, 8], "PREFETCH": [0, 4, 8, 16]}
CONFIG = {"QUERIES_PER_TASK": 1, "PREFETCH": 8}

SOURCE = r"""
#include <stdint.h>
#include <string.h>

/* out[q, d] = sum of q_weights[t] * post_scores[p] over terms t of query q and postings p of
   term q_terms[t] with post_docs[p] == d; out [queries, n_docs] */
void inverted_index_scoring(const int64_t *restrict q_terms, const int64_t *restrict q_offsets,
                            const float *restrict q_weights, const int64_t *restrict post_offsets,
                            const int64_t *restrict post_docs, const float *restrict post_scores,
                            float *restrict out, int64_t queries, int64_t n_docs) {
    #pragma omp parallel for schedule(dynamic, QUERIES_PER_TASK)
    for (int64_t q = 0; q < queries; ++q) {
        float *row = out + q * n_docs;
        memset(row, 0, (size_t)n_docs * sizeof(float));
        for (int64_t t = q_offsets[q]; t < q_offsets[q + 1]; ++t) {
            const float w = q_weights[t];
            const int64_t term = q_terms[t];
            const int64_t start = post_offsets[term], end = post_offsets[term + 1];
            for (int64_t p = start; p < end; ++p) {
#if PREFETCH > 0
                if (p + PREFETCH < end) __builtin_prefetch(row + post_docs[p + PREFETCH], 1, 1);
#endif
                row[post_docs[p]] += w * post_scores[p];
            }
        }
    }
}
"""

_DEFINES = f"#define QUERIES_PER_TASK {CONFIG['QUERIES_PER_TASK']}\n#define PREFETCH {CONFIG['PREFETCH']}\n"
_lib = compile_c(_DEFINES + SOURCE, flags=["-fno-trapping-math"])


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
        queries = q_offsets.shape[0] - 1
        out = torch.empty((queries, self.n_docs), dtype=post_scores.dtype, device=post_scores.device)
        if out.numel():
            _lib.inverted_index_scoring(
                q_terms, q_offsets, q_weights, post_offsets, post_docs, post_scores, out, queries, self.n_docs
            )
        return out
