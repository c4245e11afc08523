"""The run-wide token meter: tokens and US dollars over every call of every synthesizer in a run.

`Meter` counts under optional caps: the run's own, and the workspace's (`WorkspaceCap`: what every
other run of the workspace has spent, read live from the store, plus this run). It is shared between
threads, so every update takes its lock. A model missing from the price table costs 0 and is named in
`unpriced`: a run on a local server must not crash for want of a price, and a report must not pretend
that such a run was free.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelevolve.synth.providers.base import Usage
from kernelevolve.synth.providers.pricing import Price, lookup

log = logging.getLogger("kernelevolve.providers")


@dataclass
class WorkspaceCap:
    """A cap on what all the runs of one workspace spend together. `elsewhere()` returns (tokens, USD)
    spent by the workspace's other runs; it is read at most every `refresh_s` seconds (a store query)."""

    max_usd: float | None
    max_tokens: int | None
    elsewhere: Callable[[], tuple[int, float]]
    refresh_s: float = 2.0
    _cached: tuple[float, tuple[int, float]] | None = field(default=None, repr=False)

    def spent_elsewhere(self) -> tuple[int, float]:
        now = time.monotonic()
        if self._cached is None or now - self._cached[0] >= self.refresh_s:
            self._cached = (now, self.elsewhere())
        return self._cached[1]


class Meter:
    """Run-wide token and USD accounting with optional caps. Thread-safe.

    `charge` records a call's usage and returns its cost; `exceeded()` says which cap is reached (None
    while under both). Caps are checked before a call, so one call may overshoot a cap by its own size:
    the operator bounds that with its reply's `max_tokens`. `preload` adds what a resumed run had
    already spent. `prices` default to the table with the user's overrides (`pricing.load_prices`,
    read from `workspace` when given).
    """

    def __init__(
        self,
        max_usd: float | None = None,
        max_tokens: int | None = None,
        prices: Mapping[str, Price] | None = None,
        workspace: str | Path | None = None,
        workspace_cap: WorkspaceCap | None = None,
    ):
        if prices is None:
            from kernelevolve.synth.providers.pricing import load_prices

            prices = load_prices(workspace)
        self.max_usd = max_usd
        self.max_tokens = max_tokens
        self.workspace_cap = workspace_cap
        self.prices = dict(prices)
        self._lock = threading.Lock()
        self._usd = 0.0
        self._in = 0
        self._out = 0
        self._prior_tokens = 0
        self._calls = 0
        self._unpriced: set[str] = set()

    def preload(self, tokens: int = 0, usd: float = 0.0) -> None:
        """Count what earlier sessions of the same run spent (a resumed run keeps its caps)."""
        with self._lock:
            self._prior_tokens += int(tokens)
            self._usd += float(usd)

    def price_of(self, model: str) -> Price | None:
        return lookup(self.prices, model)

    def charge(self, model: str, usage: Usage) -> float:
        price = self.price_of(model)
        cost = 0.0
        if price is not None:
            cost = (usage.tokens_in * price.input + usage.tokens_out * price.output) / 1e6
        with self._lock:
            self._calls += 1
            self._in += usage.tokens_in
            self._out += usage.tokens_out
            self._usd += cost
            if price is None and model not in self._unpriced:
                self._unpriced.add(model)
                log.warning("no price for %s: its calls are counted as $0 (add it to prices.toml)", model)
        return cost

    def exceeded(self) -> str | None:
        """Which cap is reached ("spent $X of the $Y cap"), or None while under all of them."""
        with self._lock:
            usd, tokens = self._usd, self._prior_tokens + self._in + self._out
        if self.max_usd is not None and usd >= self.max_usd:
            return f"spent ${usd:.4f} of the ${self.max_usd:.2f} cap"
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return f"used {tokens} tokens of the {self.max_tokens}-token cap"
        cap = self.workspace_cap
        if cap is not None and (cap.max_usd is not None or cap.max_tokens is not None):
            other_tokens, other_usd = cap.spent_elsewhere()  # outside the lock: a store query
            if cap.max_usd is not None and usd + other_usd >= cap.max_usd:
                return (f"the workspace has spent ${usd + other_usd:.4f} of its ${cap.max_usd:.2f} cap "
                        "(workspace_max_usd)")  # fmt: skip
            if cap.max_tokens is not None and tokens + other_tokens >= cap.max_tokens:
                return (f"the workspace has used {tokens + other_tokens} tokens of its {cap.max_tokens}-token "
                        "cap (workspace_max_tokens)")  # fmt: skip
        return None

    @property
    def usd(self) -> float:
        with self._lock:
            return self._usd

    @property
    def tokens_in(self) -> int:
        with self._lock:
            return self._in

    @property
    def tokens_out(self) -> int:
        with self._lock:
            return self._out

    @property
    def calls(self) -> int:
        with self._lock:
            return self._calls

    @property
    def unpriced(self) -> list[str]:
        """Models charged at $0 because the price table does not know them (a warning, not an error)."""
        with self._lock:
            return sorted(self._unpriced)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {
                "calls": self._calls,
                "tokens_in": self._in,
                "tokens_out": self._out,
                "tokens_prior": self._prior_tokens,
                "usd": round(self._usd, 6),
                "max_usd": self.max_usd,
                "max_tokens": self.max_tokens,
                "unpriced": sorted(self._unpriced),
            }


__all__ = ["Meter", "WorkspaceCap"]
