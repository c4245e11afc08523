"""Providers: where chat models come from.

A provider is a factory `factory(model: str, **options) -> ChatModel`, registered under a name in the
`kernelevolve.providers` entry-point group. The built-ins (`openai`, `anthropic`) register through the
package's own pyproject exactly as a third party would; `register(name, factory)` is the same path
for code that ships no entry points (and for the fakes in tests).

`get_model("openai:gpt-4o", base_url=..., ...)` splits at the first colon (Ollama-style tags such as
"llama3.1:8b" belong to the model), finds the provider and builds the model. Unknown names, and a
broken plugin, are errors that list the valid providers; a broken third-party plugin does not take
the built-ins down with it.

Options every built-in accepts: `base_url` (any OpenAI-compatible server for `openai`: vLLM, SGLang,
Ollama), `api_key` (else the provider's environment variable), `timeout` (seconds per request),
`max_retries`, `context_tokens`, `tools` (False for a server without tool calling), `http_client`
(an injected HTTP client, for tests and proxies), `sleep` (the retry wait, for tests).
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from kernelevolve.synth.providers.base import (
    ChatModel,
    Message,
    ProviderError,
    Reply,
    ToolCall,
    ToolSpec,
    Usage,
)
from kernelevolve.synth.providers.meter import Meter

__all__ = [
    "ChatModel",
    "Message",
    "Meter",
    "ProviderError",
    "Reply",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "all_providers",
    "check_model",
    "get_model",
    "register",
    "unregister",
]

ModelFactory = Callable[..., ChatModel]
GROUP = "kernelevolve.providers"
BUILTINS = {
    "openai": "kernelevolve.synth.providers.openai:OpenAIChat",
    "anthropic": "kernelevolve.synth.providers.anthropic:AnthropicChat",
}

_REGISTRY: dict[str, ModelFactory] = {}
_BROKEN: dict[str, str] = {}  # plugin name -> why it failed to load
_LOADED = False
_LOCK = threading.Lock()


def register(name: str, factory: ModelFactory) -> ModelFactory:
    """Register a provider under `name` (replacing any provider of that name)."""
    if not name or ":" in name or not callable(factory):
        raise ProviderError("config", f"cannot register provider {name!r}: a name without ':' and a callable")
    _load()
    _REGISTRY[name] = factory
    _BROKEN.pop(name, None)
    return factory


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load() -> None:
    global _LOADED
    with _LOCK:
        if _LOADED:
            return
        _LOADED = True
        _load_entry_points()


def _load_entry_points() -> None:
    for ep in entry_points(group=GROUP):
        try:
            factory = ep.load()
        except Exception as exc:  # a broken plugin is reported when it is asked for, not before
            _BROKEN[ep.name] = f"{ep.value} failed to load: {type(exc).__name__}: {exc}"
            continue
        _REGISTRY.setdefault(ep.name, factory)
    # A source tree that was never (re)installed has no entry points: the built-ins come anyway.
    for name, target in BUILTINS.items():
        if name not in _REGISTRY and name not in _BROKEN:
            module, _, attr = target.partition(":")
            _REGISTRY[name] = getattr(importlib.import_module(module), attr)


def all_providers() -> dict[str, ModelFactory]:
    _load()
    return dict(_REGISTRY)


def _valid() -> str:
    return ", ".join(sorted(_REGISTRY))


def parse_model_name(name: str) -> tuple[str, str]:
    """("openai", "gpt-4o") from "openai:gpt-4o"; an error naming the valid providers otherwise."""
    _load()
    provider, sep, model = name.partition(":")
    if not sep or not provider or not model:
        raise ProviderError(
            "config",
            f"model {name!r} does not name its provider",
            hint=f"write provider:model, e.g. openai:gpt-4o or anthropic:claude-sonnet-4-5; providers: {_valid()}",
        )
    return provider, model


def get_model(name: str, *, workspace: str | Path | None = None, **options: Any) -> ChatModel:
    """Build the chat model `name` ("provider:model") with the provider's `options`. `workspace` is
    passed on only to a provider whose factory takes it (the built-ins do not need one)."""
    provider, model = parse_model_name(name)
    factory = _REGISTRY.get(provider)
    if factory is None:
        if provider in _BROKEN:
            raise ProviderError(
                "config",
                f"provider plugin {provider!r} is installed but broken: {_BROKEN[provider]}",
                hint="reinstall or uninstall the plugin; working providers: " + _valid(),
            )
        raise ProviderError("config", f"unknown provider {provider!r}", hint="valid providers: " + _valid())
    options = {k: v for k, v in options.items() if v is not None}
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read: let the call itself decide
        return factory(model, **options)
    if workspace is not None and _accepts(signature, "workspace"):
        options["workspace"] = workspace
    try:
        signature.bind(model, **options)
    except TypeError as exc:
        raise ProviderError("config", f"provider {provider!r} cannot take these options: {exc}") from None
    return factory(model, **options)


def _accepts(signature: inspect.Signature, name: str) -> bool:
    return name in signature.parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
    )


def check_model(name: str, **options: Any) -> None:
    """Fail now, with the fix in the message, if `name` cannot be used: an unknown provider, an SDK
    that is not installed, a missing key. Builds the client but sends nothing."""
    get_model(name, **options)
