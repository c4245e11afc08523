"""Prices of models, in US dollars per million tokens, for the run's meter.

The table below holds the providers' published list prices for a handful of current models. They are
defaults, not facts kept up to date by this project: providers change prices, and batch, cached and
regional rates differ. A user overrides or extends them in a TOML file, at the path in the environment
variable `KERNELEVOLVE_PRICES`, else `<workspace>/prices.toml`:

    # USD per million tokens
    ["gpt-5"]
    input = 1.25
    output = 10.0

    ["openai:qwen2.5-coder-32b"]      # a model on a local OpenAI-compatible server
    input = 0.0
    output = 0.0

A key is a bare model id (any provider) or "provider:model" (that provider only, checked first).
Dated snapshots ("claude-sonnet-4-5-20250929", "gpt-4o-2024-08-06") and "-latest" aliases are priced
as their family. A model the table does not know costs 0, and the meter names it.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kernelevolve.errors import WorkspaceError

PRICES_ENV = "KERNELEVOLVE_PRICES"
PRICES_FILE = "prices.toml"
DEFAULTS_AS_OF = "2025-10 list prices; override in prices.toml"


@dataclass(frozen=True)
class Price:
    input: float  # USD per million input tokens
    output: float  # USD per million output tokens


DEFAULT_PRICES: dict[str, Price] = {
    # OpenAI
    "gpt-5": Price(1.25, 10.0),
    "gpt-5-mini": Price(0.25, 2.0),
    "gpt-5-nano": Price(0.05, 0.40),
    "gpt-4.1": Price(2.0, 8.0),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-4o": Price(2.50, 10.0),
    "gpt-4o-mini": Price(0.15, 0.60),
    "o3": Price(2.0, 8.0),
    "o4-mini": Price(1.10, 4.40),
    # Anthropic
    "claude-opus-4-5": Price(5.0, 25.0),
    "claude-opus-4-1": Price(15.0, 75.0),
    "claude-sonnet-4-5": Price(3.0, 15.0),
    "claude-sonnet-4": Price(3.0, 15.0),
    "claude-haiku-4-5": Price(1.0, 5.0),
    "claude-3-5-haiku": Price(0.80, 4.0),
}

_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


def lookup(prices: Mapping[str, Price], model: str) -> Price | None:
    """The price of `model` ("provider:model" or a bare id), or None when the table has none."""
    # The first colon separates the provider: Ollama-style tags ("llama3.1:8b") belong to the model id.
    provider, sep, bare = model.partition(":")
    if not sep:
        provider, bare = "", model
    names = [model, bare]
    family = _SNAPSHOT.sub("", bare)
    if family != bare:
        names += [f"{provider}:{family}" if provider else family, family]
    for name in names:
        if name in prices:
            return prices[name]
    return None


def prices_path(workspace: str | Path | None = None) -> Path:
    """Where the user's price overrides are read from."""
    env = os.environ.get(PRICES_ENV)
    if env:
        return Path(env)
    if workspace is None:
        from kernelevolve.config import resolve_workspace

        workspace = resolve_workspace()
    return Path(workspace) / PRICES_FILE


def load_prices(workspace: str | Path | None = None) -> dict[str, Price]:
    """The default table, overridden by the user's TOML file where there is one."""
    table = dict(DEFAULT_PRICES)
    path = prices_path(workspace)
    if not path.is_file():
        if os.environ.get(PRICES_ENV):
            raise WorkspaceError(f"{path}: no such price file (from {PRICES_ENV})", hint="fix or unset it")
        return table
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise WorkspaceError(f"{path}: invalid TOML: {exc}", hint="fix or delete the file") from exc
    for name, entry in data.items():
        if not isinstance(entry, dict) or set(entry) != {"input", "output"}:
            raise WorkspaceError(
                f"{path}: price {name!r} must be a table with exactly `input` and `output`",
                hint=f'e.g.\n["{name}"]\ninput = 1.25   # USD per million input tokens\noutput = 10.0',
            )
        try:
            price = Price(float(entry["input"]), float(entry["output"]))
        except (TypeError, ValueError) as exc:
            raise WorkspaceError(f"{path}: price {name!r}: {exc}") from exc
        if price.input < 0 or price.output < 0:
            raise WorkspaceError(f"{path}: price {name!r} is negative")
        table[str(name)] = price
    return table


__all__ = ["DEFAULTS_AS_OF", "DEFAULT_PRICES", "Price", "load_prices", "lookup", "prices_path"]
