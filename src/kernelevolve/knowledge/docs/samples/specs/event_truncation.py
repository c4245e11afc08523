"""Sample spec: nested jagged user histories truncated to the last max_events events, padded dense.

user_offsets [B+1] index sessions, session_offsets [S+1] index event rows of values [E, D]; user u's
events are values[session_offsets[user_offsets[u]]:session_offsets[user_offsets[u + 1]]]. out[u] holds
its last min(len, max_events) events, oldest first, then zero rows: [B, max_events, D].
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
    "name": "sample_event_truncation",
    "description": "nested jagged truncation: last max_events events per user, padded to a dense block",
    "shapes": {
        "small": {"weight": 0.5, "params": {"users": 128, "sessions": 4, "events": 8, "dim": 32, "max_events": 32}},
        "large": {"weight": 0.5, "params": {"users": 512, "sessions": 8, "events": 12, "dim": 32,
                                            "max_events": 64}},
    },
    "precision": "strict_fp32",
}  # fmt: skip
