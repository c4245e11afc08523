"""Synthesizers by name: the built-ins, and those other packages register.

A synthesizer is made by a factory, `factory(cfg, spec, platform, kinds, *, meter, extra_seeds,
workspace) -> Synthesizer`, registered under a name:
- the built-ins, `tuner` and `agent` (below);
- any installed package's, under the entry-point group `kernelevolve.synthesizers` (one file and one
  line of its pyproject.toml, as platforms, model providers and executors register);
- a test's, through `register_synthesizer`.
A name with a colon, PROVIDER:MODEL, is the universal operator over that chat model (`model` below);
model providers register in their own registry (`synth/providers/`).

Nothing here is imported before a search asks for a synthesizer; a package's factory is loaded only
when its name is asked for, so a broken plugin fails that search alone, with its error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernelevolve.errors import WorkspaceError

if TYPE_CHECKING:
    from kernelevolve.spec import Spec
    from kernelevolve.synth.base import SynthConfig, Synthesizer

GROUP = "kernelevolve.synthesizers"
Factory = Callable[..., "Synthesizer"]


def tuner(cfg: SynthConfig, spec: Spec, platform: str, kinds: tuple[str, ...], *, extra_seeds: Any = None,
          **_: Any) -> Synthesizer:  # fmt: skip
    """The offline tuner. The run's seed kernels (`optimize --start-from`, `kernelevolve tune`) are
    bases beside its templates; with `cfg.templates` off (`tune`), the user's kernels alone."""
    from kernelevolve.synth.tuner.driver import OfflineTuner

    return OfflineTuner(
        spec, platform, tuple(kinds), extra_seeds=list(extra_seeds or []), templates=cfg.templates
    )


def agent(cfg: SynthConfig, spec: Spec, platform: str, kinds: tuple[str, ...], **_: Any) -> Synthesizer:
    """Nobody in this process: an external agent takes the tasks (`kernelevolve agent`, MCP)."""
    from kernelevolve.synth.agent import ExternalAgent

    return ExternalAgent()


def model(cfg: SynthConfig, spec: Spec, platform: str, kinds: tuple[str, ...], *, meter: Any = None,
          workspace: Any = None, **_: Any) -> Synthesizer:  # fmt: skip
    """The universal operator over the chat model `cfg.name` (PROVIDER:MODEL)."""
    from kernelevolve.synth.operator import LLMOperator
    from kernelevolve.synth.providers import get_model

    chat = get_model(cfg.name, base_url=cfg.base_url, workspace=workspace)
    return LLMOperator(
        chat, meter, max_steps=cfg.max_steps, tool_mode=False if cfg.single_shot else None,
        context_tokens=cfg.context_tokens,
    )  # fmt: skip


BUILTIN = {"tuner": f"{__name__}:tuner", "agent": f"{__name__}:agent"}
_REGISTERED: dict[str, Factory] = {}


def register_synthesizer(name: str, factory: Factory) -> None:
    if ":" in name:
        raise ValueError(f"{name!r}: a synthesizer's name has no colon (PROVIDER:MODEL names a model)")
    _REGISTERED[name] = factory


def _advertised() -> dict[str, str]:
    """Names to entry points ("module:attribute"): the installed packages' over the built-ins."""
    from importlib.metadata import entry_points

    return {**BUILTIN, **{ep.name: ep.value for ep in entry_points(group=GROUP)}}


def names() -> list[str]:
    return sorted({*_REGISTERED, *_advertised()})


def factory_for(name: str) -> Factory:
    """The factory of synthesizer `name`; PROVIDER:MODEL is the operator over that model."""
    if ":" in name:
        return model
    if name not in _REGISTERED:
        target = _advertised().get(name)
        if target is None:
            raise WorkspaceError(
                f"unknown synthesizer {name!r}",
                hint=f"use one of {', '.join(names())}, or PROVIDER:MODEL such as openai:gpt-4.1",
            )
        module, _, attribute = target.partition(":")
        try:
            _REGISTERED[name] = getattr(importlib.import_module(module), attribute)
        except Exception as exc:  # a broken plugin: this search fails, with what went wrong
            raise WorkspaceError(
                f"synthesizer {name!r} ({target}) failed to load: {type(exc).__name__}: {exc}",
                hint="reinstall the package that provides it, or choose another synthesizer",
            ) from exc
    return _REGISTERED[name]
