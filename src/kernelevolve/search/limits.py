"""When a run stops: whichever limit comes first.

Checked before each new node is created; expansions already in flight finish (their evaluation is
never cut off halfway), so the wall-clock limit can be overrun by one evaluation, never the candidate
budget. Token and USD caps are also enforced inside the model loop (`providers.meter.Meter`): a cap
reached mid-expansion ends that expansion cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Limits:
    budget: int = 50  # candidates: nodes whose synthesis produced a candidate or failed
    wall_s: float | None = None
    max_tokens: int | None = None
    max_usd: float | None = None
    patience: int | None = None  # evaluated nodes without a new best
    target: float | None = None  # stop once the best fitness reaches this speedup

    def validate(self) -> Limits:
        from kernelevolve.errors import WorkspaceError

        if self.budget < 1:
            raise WorkspaceError("--budget must be at least 1 candidate")
        for name in ("wall_s", "max_tokens", "max_usd", "patience", "target"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise WorkspaceError(f"{name} must be positive (or left unset)")
        return self


def stop_reason(
    limits: Limits,
    *,
    spent: int,
    wall_s: float,
    tokens: int,
    usd: float,
    stall: int,
    best_fitness: float,
) -> str | None:
    """Why the run must not start another node, or None."""
    if spent >= limits.budget:
        return f"candidate budget reached ({spent}/{limits.budget})"
    if limits.wall_s is not None and wall_s >= limits.wall_s:
        return f"wall-clock budget reached ({wall_s:.0f}/{limits.wall_s:.0f} s)"
    if limits.max_tokens is not None and tokens >= limits.max_tokens:
        return f"token budget reached ({tokens}/{limits.max_tokens})"
    if limits.max_usd is not None and usd >= limits.max_usd:
        return f"USD budget reached (${usd:.2f}/${limits.max_usd:.2f})"
    if limits.patience is not None and stall >= limits.patience:
        return f"no improvement in {stall} evaluated candidates (patience {limits.patience})"
    if limits.target is not None and best_fitness >= limits.target:
        return f"target speedup reached ({best_fitness:.2f}x >= {limits.target:.2f}x)"
    return None


__all__ = ["Limits", "stop_reason"]
