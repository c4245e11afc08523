"""The `anthropic` provider: Anthropic's Messages API through the official `anthropic` SDK.

    get_model("anthropic:claude-sonnet-4-5")                           # ANTHROPIC_API_KEY from the env

The key comes from `api_key` or `ANTHROPIC_API_KEY`. As with `openai`, the SDK's retries are off and
`base.with_retries` backs off on 429, 5xx (529 "overloaded" included) and timeouts, honoring
`retry-after`.

Mapping from the common format: system turns become the `system` parameter; an assistant turn's tool
calls become `tool_use` blocks; consecutive `tool` turns become one user turn of `tool_result` blocks
(the API wants every result of a turn's calls in the next user turn), and consecutive turns of one
role are merged. Usage counts cache reads and writes as input tokens (priced at the input rate: an
over-estimate, never an under-estimate).

Deliberately not here: streaming, extended thinking, prompt caching controls, batches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from kernelevolve.synth.providers.base import (
    Message,
    ProviderError,
    Reply,
    SdkChat,
    StopReason,
    ToolCall,
    ToolSpec,
    Usage,
)

INSTALL_HINT = "pip install 'kernelevolve[anthropic]'  (or: pip install anthropic)"
_STOP: dict[str, StopReason] = {
    "end_turn": "end",
    "stop_sequence": "end",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
}
DEFAULT_CONTEXT = 200_000


_HINTS = {
    "auth": "check ANTHROPIC_API_KEY (or api_key)",
    "rate_limit": "still rate limited after retries: lower the concurrency or raise max_retries",
    "bad_request": "the API refused the request (model name, context length, or an unsupported parameter)",
    "server": "the API failed or is overloaded; try again later",
}


def _detail(exc: Any) -> str | None:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return f"{err.get('type', 'error')}: {err['message']}"
    return None


class AnthropicChat(SdkChat):
    """A Claude model behind the Anthropic API."""

    provider = "anthropic"
    sdk = "anthropic"
    host = "api.anthropic.com"
    unreachable = "check the network"
    hints = _HINTS
    detail = staticmethod(_detail)

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 300.0,
        max_retries: int = 4,
        context_tokens: int | None = None,
        tools: bool | None = None,
        http_client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        try:
            import anthropic
        except ImportError:
            raise ProviderError(
                "config", "the anthropic provider needs the `anthropic` package", hint=INSTALL_HINT
            ) from None
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ProviderError(
                "auth",
                "no Anthropic API key: ANTHROPIC_API_KEY is not set",
                hint="export ANTHROPIC_API_KEY=...",
            )
        self._secret = key
        self._client = anthropic.Anthropic(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=0, http_client=http_client
        )
        self.model = model
        self.name = f"{self.provider}:{model}"
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self.supports_tools = True if tools is None else bool(tools)
        self.context_tokens = context_tokens or DEFAULT_CONTEXT
        self._sleep = sleep

    # -- request ---------------------------------------------------------------------------------------

    def request_body(
        self, messages: list[Message], tools: list[ToolSpec] | None, max_tokens: int
    ) -> dict[str, Any]:
        system = "\n\n".join(m.content for m in messages if m.role == "system")
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "messages": _to_anthropic([m for m in messages if m.role != "system"]),
        }
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
            ]
        return body

    def _create(self, body: dict[str, Any]) -> Any:
        return self._client.messages.create(**body)

    # -- response --------------------------------------------------------------------------------------

    def _parse(self, response: Any) -> Reply:
        blocks = getattr(response, "content", None)
        if blocks is None:
            raise ProviderError("malformed", f"{self.name} answered with no content")
        texts, calls = [], []
        for block in blocks:
            kind = getattr(block, "type", None)
            if kind == "text":
                texts.append(block.text)
            elif kind == "tool_use":
                if not isinstance(block.input, dict):
                    raise ProviderError(
                        "malformed", f"{self.name} called {block.name!r} with input that is not a JSON object"
                    )
                calls.append(ToolCall(id=block.id, name=block.name, arguments=dict(block.input)))
        usage = getattr(response, "usage", None)
        tokens_in = sum(
            int(getattr(usage, key, 0) or 0)
            for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        stop = getattr(response, "stop_reason", None)
        return Reply(
            text="".join(texts),
            tool_calls=calls,
            usage=Usage(tokens_in, int(getattr(usage, "output_tokens", 0) or 0)),
            stop_reason="tool_use" if calls else _STOP.get(stop or "", "other"),
            raw_stop_reason=stop,
            model=getattr(response, "model", "") or self.model,
        )


def _to_anthropic(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        blocks: list[dict[str, Any]]
        if m.role == "tool":
            role = "user"
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id,
                "content": m.content,
            }
            if m.is_error:
                result["is_error"] = True
            blocks = [result]
        elif m.role == "assistant":
            role = "assistant"
            blocks = [{"type": "text", "text": m.content}] if m.content else []
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls
            ]
            if not blocks:  # the API refuses an empty turn
                blocks = [{"type": "text", "text": "(no text)"}]
        else:
            role = "user"
            blocks = [{"type": "text", "text": m.content}]
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out
