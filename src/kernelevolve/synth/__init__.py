"""Synthesizers: what writes candidates. See `base.py` for the contract.

tuner              the offline tuner (`synth/tuner/`): templates generated from the traced
                   reference and mutations of declared tunables; the default, needs no model
PROVIDER:MODEL     the universal operator (`operator.py`) over a chat model from the provider
                   registry (`synth/providers/`): `openai:gpt-4.1`, `anthropic:claude-sonnet-4-5`,
                   or any OpenAI-compatible server with `base_url`
agent              nobody in this process: `kernelevolve agent next/submit` (or the MCP server)
                   hands tasks to an external agent or a person (`agent.py`)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelevolve.errors import WorkspaceError
from kernelevolve.spec import Spec
from kernelevolve.synth.base import Synthesizer


@dataclass
class SynthConfig:
    """How a run's synthesizer is made; stored with the run so `resume` makes the same one."""

    name: str = "tuner"
    base_url: str | None = None
    single_shot: bool = False  # a model without tool calling: one completion, code in the answer
    max_steps: int = 12  # tool-loop steps per expansion
    context_tokens: int | None = None  # prompt budget; None: the provider's

    @property
    def is_model(self) -> bool:
        return self.name not in ("tuner", "agent")


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
    if cfg.name == "tuner":
        from kernelevolve.synth.tuner.driver import OfflineTuner

        # With seeds (`kernelevolve tune`), the user's kernels are what is tuned, not the templates.
        return OfflineTuner(
            spec, platform, tuple(kinds), extra_seeds=list(extra_seeds or []), templates=not extra_seeds
        )
    if cfg.name == "agent":
        from kernelevolve.synth.agent import ExternalAgent

        return ExternalAgent()
    if ":" not in cfg.name:
        raise WorkspaceError(
            f"unknown synthesizer {cfg.name!r}",
            hint="use `tuner` (the default), `agent`, or PROVIDER:MODEL such as openai:gpt-4.1",
        )
    from kernelevolve.synth.operator import LLMOperator
    from kernelevolve.synth.providers import get_model

    model = get_model(cfg.name, base_url=cfg.base_url, workspace=workspace)
    return LLMOperator(
        model, meter, max_steps=cfg.max_steps, tool_mode=False if cfg.single_shot else None,
        context_tokens=cfg.context_tokens,
    )  # fmt: skip


__all__ = ["SynthConfig", "create"]
