"""What a job will cost, said before it starts.

`estimate(ws, synth, candidates, settings)` gives the tokens and US dollars that asking `synth` for `candidates`
candidates is likely to spend. Tokens per candidate come from this workspace's own history with the
same synthesizer (every node it proposed, warm starts left out); without history, from a stated
default (`DEFAULT_TOKENS_PER_CANDIDATE`, a tool-loop expansion with retrieved documents). Dollars come
from the price table the run's meter uses (`synth/providers/pricing.py`, with the user's prices.toml).
The offline tuner and the agent cost nothing here: the tuner calls no model, and an agent's model is
metered by whoever runs the agent.

It is an estimate: the caps are what bound the spend. `Estimate.line()` says which basis it used and,
where a workspace-wide cap is set, what the cap leaves.

A USD cap only bounds a model the price table knows: the meter counts an unpriced model as $0 (a
local server must not crash for want of a price). `require_price` therefore refuses to start a job
that has a USD cap (`--max-usd`, or `workspace_max_usd`) and a model without a price, and says where
to give one; without a USD cap an unpriced model runs, and the estimate says its cost is unknown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kernelevolve.config import Settings
from kernelevolve.errors import WorkspaceError
from kernelevolve.store import Workspace
from kernelevolve.synth import SynthConfig

# Tokens (in, out) per candidate when the workspace has no history with the model: a tool-loop
# expansion of a few steps, each resending the prompt with retrieved documents and the tree's notes.
DEFAULT_TOKENS_PER_CANDIDATE = (24_000, 3_000)


@dataclass
class Estimate:
    synthesizer: str
    candidates: int
    tokens_in: int
    tokens_out: int
    usd: float | None  # None: the price table has no price for the model
    basis: str  # where the per-candidate figure comes from
    workspace_left_usd: float | None = None  # what the workspace-wide USD cap leaves, if one is set

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        tokens = self.tokens_in + self.tokens_out
        if tokens == 0:
            return f"estimate: {self.candidates} candidates, no model cost ({self.basis})"
        usd = (
            f"about ${self.usd:.2f}"
            if self.usd is not None
            else "an unknown USD cost (no price for the model)"
        )
        text = f"estimate: {self.candidates} candidates, about {tokens:,} tokens, {usd} ({self.basis})"
        if self.workspace_left_usd is not None:
            text += f"; the workspace cap leaves ${self.workspace_left_usd:.2f}"
            if self.usd is not None and self.usd > self.workspace_left_usd:
                text += ": the job will stop at the cap"
        return text


def estimate(ws: Workspace, synth: SynthConfig, candidates: int, settings: Settings) -> Estimate:
    if not synth.is_model:
        basis = (
            "the offline tuner calls no model" if synth.name == "tuner" else "the agent meters its own model"
        )
        return Estimate(synth.name, candidates, 0, 0, 0.0, basis)
    from kernelevolve.synth.providers.pricing import load_prices, lookup

    tin, tout, proposed = ws.synth_usage(synth.name)
    if proposed > 0 and tin + tout > 0:
        per_in, per_out = tin / proposed, tout / proposed
        basis = f"{per_in + per_out:,.0f} tokens per candidate over {proposed} earlier candidates here"
    else:
        per_in, per_out = DEFAULT_TOKENS_PER_CANDIDATE
        basis = f"no history with {synth.name} here: assumed {per_in + per_out:,} tokens per candidate"
    tokens_in, tokens_out = round(per_in * candidates), round(per_out * candidates)
    price = lookup(load_prices(ws.root), synth.name)
    usd = None if price is None else (tokens_in * price.input + tokens_out * price.output) / 1e6
    left = None
    if settings.workspace_max_usd is not None:
        left = max(0.0, settings.workspace_max_usd - ws.spend()[1])
    return Estimate(synth.name, candidates, tokens_in, tokens_out, usd, basis, left)


def require_price(synth: SynthConfig, max_usd: float | None, settings: Settings) -> None:
    """Refuse a USD cap on a model the price table does not know (it would count as $0, so the cap
    would never stop it): a WorkspaceError saying how to give the price."""
    capped = [name for name, value in (("--max-usd", max_usd), ("workspace_max_usd", settings.workspace_max_usd))
              if value is not None]  # fmt: skip
    if not synth.is_model or not capped:
        return
    from kernelevolve.synth.providers.pricing import PRICES_ENV, load_prices, lookup, prices_path

    if lookup(load_prices(settings.workspace), synth.name) is not None:
        return
    path = prices_path(settings.workspace)
    raise WorkspaceError(
        f"{' and '.join(capped)} cannot limit {synth.name}: the price table has no price for it, so "
        "its calls would count as $0",
        hint=f"give its price in USD per million tokens in {path} (or in the file {PRICES_ENV} names), "
        f'e.g. ["{synth.name}"] input = 1.25, output = 10.0 (one key per line; docs/providers.md); '
        "or cap tokens instead with --max-tokens",
    )


__all__ = ["DEFAULT_TOKENS_PER_CANDIDATE", "Estimate", "estimate", "require_price"]
