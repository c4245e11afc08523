"""The `openai` provider: OpenAI's chat completions API through the official `openai` SDK, and any
server that speaks it (vLLM, SGLang, Ollama, LM Studio) through `base_url`.

    get_model("openai:gpt-5")                                          # OPENAI_API_KEY from the env
    get_model("openai:Qwen/Qwen2.5-Coder-32B-Instruct", base_url="http://localhost:8000/v1")

The key comes from `api_key` or `OPENAI_API_KEY`; a local server with no key gets a placeholder (such
servers accept any). The SDK's own retries are off: retries live in `base.with_retries`, so that
every provider backs off the same way and the wait can be replaced in tests.

Differences between servers that this module absorbs: OpenAI's current models take
`max_completion_tokens` and refuse `max_tokens`, while most compatible servers know only
`max_tokens` (chosen by whether `base_url` is set; `token_param` overrides); tool-call arguments
arrive as a JSON string, which is parsed here and is a `malformed` error when it is not a JSON object;
servers that report no usage are counted as 0 tokens. A server without tool calling (vLLM without
`--enable-auto-tool-choice`) is used with `tools=False`, which puts the operator in single-shot mode.

Deliberately not here: the Responses API, streaming, structured outputs, organization/project headers.
"""

from __future__ import annotations

import json
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

INSTALL_HINT = "pip install 'kernelevolve[openai]'  (or: pip install openai)"
_STOP: dict[str, StopReason] = {
    "stop": "end",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}
# Context windows of OpenAI models, by prefix (longest first); anything else (a local model) gets the
# conservative default unless `context_tokens` says otherwise.
_CONTEXT = (("gpt-4.1", 1_047_576), ("gpt-5", 400_000), ("gpt-4o", 128_000), ("o3", 200_000), ("o4", 200_000))
DEFAULT_CONTEXT = 32_768


def context_for(model: str) -> int:
    for prefix, tokens in _CONTEXT:
        if model.startswith(prefix):
            return tokens
    return DEFAULT_CONTEXT


_HINTS = {
    "auth": "check OPENAI_API_KEY (or api_key); a local server needs base_url",
    "rate_limit": "still rate limited after retries: lower the concurrency or raise max_retries",
    "bad_request": "the server refused the request (model name, context length, or an unsupported parameter)",
    "server": "the server failed; try again later",
}


def _detail(exc: Any) -> str | None:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return None


class OpenAIChat(SdkChat):
    """A chat model behind the OpenAI API or an OpenAI-compatible server."""

    provider = "openai"
    sdk = "openai"
    host = "api.openai.com"
    unreachable = "is the server up?"
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
        token_param: str | None = None,
        http_client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        try:
            import openai
        except ImportError:
            raise ProviderError(
                "config", "the openai provider needs the `openai` package", hint=INSTALL_HINT
            ) from None
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            if base_url is None:
                raise ProviderError(
                    "auth",
                    "no OpenAI API key: OPENAI_API_KEY is not set",
                    hint="export OPENAI_API_KEY=..., or pass base_url for a local OpenAI-compatible server",
                )
            key = "not-needed"  # local servers accept any key
        self._secret = key
        self._client = openai.OpenAI(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=0, http_client=http_client
        )
        self.model = model
        self.name = f"{self.provider}:{model}"
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self.supports_tools = True if tools is None else bool(tools)
        self.context_tokens = context_tokens or context_for(model)
        self.token_param = token_param or ("max_completion_tokens" if base_url is None else "max_tokens")
        self._sleep = sleep

    # -- request ---------------------------------------------------------------------------------------

    def request_body(
        self, messages: list[Message], tools: list[ToolSpec] | None, max_tokens: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_to_openai(m) for m in messages],
            self.token_param: max_tokens,
        }
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
        return body

    def _create(self, body: dict[str, Any]) -> Any:
        return self._client.chat.completions.create(**body)

    # -- response --------------------------------------------------------------------------------------

    def _parse(self, response: Any) -> Reply:
        choices = getattr(response, "choices", None)
        if not choices:
            raise ProviderError("malformed", f"{self.name} answered with no choices")
        message = choices[0].message
        calls: list[ToolCall] = []
        for raw in getattr(message, "tool_calls", None) or []:
            function: Any = getattr(raw, "function", None)
            name = getattr(function, "name", None)
            if function is None or not name:
                raise ProviderError("malformed", f"{self.name} returned a tool call with no function name")
            calls.append(
                ToolCall(
                    id=raw.id or f"call_{len(calls)}",
                    name=name,
                    arguments=self._arguments(name, function.arguments),
                )
            )
        usage = getattr(response, "usage", None)
        finish = choices[0].finish_reason
        return Reply(
            text=message.content or "",
            tool_calls=calls,
            usage=Usage(
                int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0)
            ),
            stop_reason="tool_use" if calls else _STOP.get(finish or "", "other"),
            raw_stop_reason=finish,
            model=getattr(response, "model", "") or self.model,
        )

    def _arguments(self, tool: str, raw: Any) -> dict[str, Any]:
        if isinstance(raw, dict):
            return raw
        try:
            args = json.loads(raw or "{}")
        except (TypeError, ValueError) as exc:
            snippet = str(raw)[:200]
            raise ProviderError(
                "malformed",
                f"{self.name} called {tool!r} with arguments that are not JSON ({exc}): {snippet!r}",
            ) from None
        if not isinstance(args, dict):
            raise ProviderError(
                "malformed", f"{self.name} called {tool!r} with arguments that are not a JSON object"
            )
        return args


def _to_openai(m: Message) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": m.content or None}
        if m.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in m.tool_calls
            ]
        return out
    return {"role": m.role, "content": m.content}
