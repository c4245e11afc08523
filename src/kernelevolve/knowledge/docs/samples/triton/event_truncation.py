"""Nested jagged truncation in Triton: out[u] = the last max_events events of user u, then zero rows.

Two offset levels collapse to one pair of bounds per user: its events are the rows
session_offsets[user_offsets[u]] .. session_offsets[user_offsets[u + 1]] of values, one contiguous
run of rows. The kept rows (the last keep = min(len, max_events)) are then one contiguous run of
keep * dim floats, and out[u] is one contiguous block of max_events * dim floats: the op is a flat
copy of a variable-length prefix followed by zeros. The grid is (user, chunk of BLOCK floats of out[u]):
each program does the four dependent offset loads (two levels), then one masked streaming load of
values (lanes past keep * dim read nothing and give 0) and one store. Every output element is written
once and only kept rows are read; a chunk that is all padding moves no input bytes. When dim is a
multiple of 4 (Triton specializes integers divisible by 16), source and destination addresses are
16-byte aligned and both sides move in vector loads and stores. Addresses are 64-bit (offsets are
int64; users * max_events * dim can pass 2**31).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLES = {"BLOCK": [256, 512, 1024, 2048, 4096], "num_warps": [1, 2, 4, 8]}
CONFIG = {"BLOCK": 1024, "num_warps": 4}


@triton.jit
def _truncate_pad_kernel(
    values_ptr, user_offsets_ptr, session_offsets_ptr, out_ptr, dim, max_events, BLOCK: tl.constexpr
):
    user = tl.program_id(0)
    chunk = tl.program_id(1)
    first = tl.load(user_offsets_ptr + user)  # the user's first session and one past its last
    last = tl.load(user_offsets_ptr + user + 1)
    start = tl.load(session_offsets_ptr + first)  # its events: rows start .. end of values
    end = tl.load(session_offsets_ptr + last)
    keep = tl.minimum(end - start, max_events)
    row_len = max_events * dim
    i = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(values_ptr + (end - keep) * dim + i, mask=i < keep * dim, other=0.0)
    tl.store(out_ptr + user.to(tl.int64) * row_len + i, x, mask=i < row_len)


class ModelNew(nn.Module):
    def __init__(self, max_events: int = 64):
        super().__init__()
        self.max_events = max_events

    def forward(
        self, values: torch.Tensor, user_offsets: torch.Tensor, session_offsets: torch.Tensor
    ) -> torch.Tensor:
        values = values.contiguous()
        user_offsets, session_offsets = user_offsets.contiguous(), session_offsets.contiguous()
        users, dim = user_offsets.numel() - 1, values.shape[1]
        out = torch.empty((users, self.max_events, dim), device=values.device, dtype=values.dtype)
        if out.numel() == 0:
            return out
        grid = (users, triton.cdiv(self.max_events * dim, CONFIG["BLOCK"]))
        _truncate_pad_kernel[grid](
            values, user_offsets, session_offsets, out, dim, self.max_events,
            BLOCK=CONFIG["BLOCK"], num_warps=CONFIG["num_warps"],
        )  # fmt: skip
        return out
