"""Synthesizers: what writes candidates. See `base.py` for the contract.

tuner              the offline tuner (`synth/tuner/`): templates generated from the traced
                   reference and mutations of declared tunables; the default, needs no model
PROVIDER:MODEL     the universal operator (`operator.py`) over a chat model from the provider
                   registry (`synth/providers/`): `openai:gpt-4.1`, `anthropic:claude-sonnet-4-5`,
                   or any OpenAI-compatible server with `base_url`
agent              nobody in this process: `kernelevolve agent next/submit` (or the MCP server)
                   hands tasks to an external agent or a person (`agent.py`)
NAME               a synthesizer another package registers (entry-point group
                   `kernelevolve.synthesizers`; see `registry.py`)
"""

from __future__ import annotations

from typing import Any

from kernelevolve.spec import Spec
from kernelevolve.synth.base import SynthConfig, Synthesizer


def create(
    cfg: SynthConfig,
    spec: Spec,
    platform: str,
    kinds: tuple[str, ...] | frozenset[str],
    *,
    meter: Any = None,
    extra_seeds: list[tuple[str, str]] | None = None,
    workspace: Any = None,
) -> Synthesizer:
    """The synthesizer `cfg.name` names (`registry.py`), made for this spec and platform."""
    from kernelevolve.synth.registry import factory_for

    make = factory_for(cfg.name)
    return make(cfg, spec, platform, tuple(kinds), meter=meter, extra_seeds=extra_seeds, workspace=workspace)


__all__ = ["SynthConfig", "create"]
