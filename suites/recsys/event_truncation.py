"""User-history truncation: keep each user's most recent `max_events` events, padded to a dense block.

Sequential recommenders (SASRec, BST, HSTU-style rankers) read a user's history as sessions of events:
two jagged levels, users -> sessions (`user_offsets`) and sessions -> events (`session_offsets`), over
event features `values` [E, D]. Before the sequence encoder, preprocessing keeps the last `max_events`
events of each user across its sessions, oldest first, and pads the rest with zeros: [B, max_events, D]
(the jagged_to_padded_dense convention). Shapes: a serving batch (512 users, ~70 events each), a
ranking batch (2048 users, ~250 events each, half truncated) and a retrieval batch (1024 users, most
truncated); 1-19 sessions per user and 1-49 events per session. strict_fp32 (a pure copy: exact).
Eager runs about nine kernels (offset gathers, clamp, index arithmetic, a [B, M, D] gather of
clamped rows, then a masked multiply) and writes the output twice; a good kernel reads only the kept
rows and writes each output element once, in one launch.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, max_events: int = 64):
        super().__init__()
        self.max_events = max_events

    def forward(
        self, values: torch.Tensor, user_offsets: torch.Tensor, session_offsets: torch.Tensor
    ) -> torch.Tensor:
        # two offset levels collapse to one: user u's events are values[bounds[u]:bounds[u + 1]]
        bounds = session_offsets[user_offsets]
        ends = bounds[1:]
        keep = (ends - bounds[:-1]).clamp(max=self.max_events)
        slot = torch.arange(self.max_events, device=values.device)
        src = ends[:, None] - keep[:, None] + slot  # the last `keep` events, oldest first
        rows = values.index_select(0, src.clamp(max=values.shape[0] - 1).flatten()).view(*src.shape, -1)
        return rows * (slot < keep[:, None])[:, :, None]  # slots past `keep` are padding: zeros


def get_inputs(users: int = 256, sessions: int = 5, events: int = 10, dim: int = 16, **_):
    # sessions per user in [1, 2 * sessions - 1] and events per session in [1, 2 * events - 1]; the
    # totals are fixed (users * sessions sessions, users * sessions * events events) for every seed
    r = torch.randint(0, sessions, (users,))
    user_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sessions + r - r.roll(1), 0)])
    r = torch.randint(0, events, (users * sessions,))
    session_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(events + r - r.roll(1), 0)])
    return [torch.randn(users * sessions * events, dim), user_offsets, session_offsets]


def get_init_inputs(max_events: int = 64):
    return [max_events]


KERNELEVOLVE = {
    "name": "event_truncation",
    "description": "nested jagged user histories truncated to the last max_events events, padded dense",
    "shapes": {
        "serving": {"weight": 0.4, "params": {"users": 512, "sessions": 6, "events": 12, "dim": 32,
                                              "max_events": 128}},
        "ranking": {"weight": 0.35, "params": {"users": 2048, "sessions": 10, "events": 25, "dim": 64,
                                               "max_events": 256}},
        "retrieval": {"weight": 0.25, "params": {"users": 1024, "sessions": 8, "events": 16, "dim": 32,
                                                 "max_events": 64}},
    },
    "precision": "strict_fp32",
}  # fmt: skip
