"""The chat interface every provider speaks, its errors, retries, and the run-wide token meter.

One small common format (`Message`, `ToolSpec`, `ToolCall`, `Reply`) that the universal operator
writes against; each provider maps it to and from its own API. A provider's `complete` either returns
a `Reply` or raises `ProviderError` with a `kind` the operator can act on (retryable kinds are retried
here, with exponential backoff and jitter, before anyone sees them).

The run's accounting (tokens and dollars, `Meter`) is `meter.py`'s.

Secrets: API keys live inside the SDK clients. Nothing here formats a key; `scrub` removes a key (and
anything shaped like one) from text that came back from a server before it goes into an error.

Deliberately not here: streaming, images, prompt caching controls, async clients.
"""

from __future__ import annotations

import email.utils
import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from kernelevolve.errors import KernelevolveError

log = logging.getLogger("kernelevolve.providers")

Role = Literal["system", "user", "assistant", "tool"]
StopReason = Literal["end", "tool_use", "max_tokens", "other"]
ErrorKind = Literal["timeout", "rate_limit", "auth", "bad_request", "server", "malformed", "config"]
RETRYABLE: frozenset[str] = frozenset({"timeout", "rate_limit", "server"})


@dataclass
class ToolCall:
    """A model's request to run one tool. `id` pairs it with its result."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class Message:
    """One turn. An assistant turn may carry tool calls; a `tool` turn answers one call by id."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None  # the tool's name, on a `tool` turn
    is_error: bool = False  # a `tool` turn that reports a failure

    @classmethod
    def system(cls, text: str) -> Message:
        return cls("system", text)

    @classmethod
    def user(cls, text: str) -> Message:
        return cls("user", text)

    @classmethod
    def tool_result(cls, call: ToolCall, text: str, is_error: bool = False) -> Message:
        return cls("tool", text, tool_call_id=call.id, name=call.name, is_error=is_error)


@dataclass
class ToolSpec:
    """A tool the model may call: `parameters` is a JSON schema of an object."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class Usage:
    tokens_in: int = 0
    tokens_out: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.tokens_in + other.tokens_in, self.tokens_out + other.tokens_out)


@dataclass
class Reply:
    """What a model answered. `stop_reason` is normalized; `raw_stop_reason` is the API's word."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    stop_reason: StopReason = "end"
    raw_stop_reason: str | None = None
    model: str = ""  # the model id the server says answered


@runtime_checkable
class ChatModel(Protocol):
    """A chat model behind some provider. `name` is "provider:model", as the user wrote it."""

    name: str
    supports_tools: bool
    context_tokens: int

    def complete(
        self, messages: list[Message], tools: list[ToolSpec] | None = None, max_tokens: int = 4096
    ) -> Reply: ...


class ProviderError(KernelevolveError):
    """A call to a provider failed. `kind` says how; `retry_after` (seconds) is the server's wish."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        hint: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ):
        super().__init__(message, hint)
        self.kind = kind
        self.status = status
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"ProviderError(kind={self.kind!r}, status={self.status!r}, message={self.message!r})"


# --- secrets -----------------------------------------------------------------------------------------

# Key-shaped tokens: OpenAI (sk-..., sk-proj-...), Anthropic (sk-ant-...), also partly masked echoes.
_KEYLIKE = re.compile(r"\b(sk-[A-Za-z0-9_\-*.]{6,}|key-[A-Za-z0-9_\-]{16,})")


def scrub(text: str, *secrets: str | None) -> str:
    """`text` with every secret, and every key-shaped token, replaced by '***'."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return _KEYLIKE.sub("***", text)


# --- retries -----------------------------------------------------------------------------------------


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `retry-after` (seconds or an HTTP date), if present."""
    if not headers:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def backoff_delay(
    attempt: int,
    retry_after: float | None,
    base_s: float = 1.0,
    max_s: float = 60.0,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds before retry number `attempt + 1`: the server's retry-after if it sent one (a little
    jitter added, so that many workers do not come back at the same instant), else base * 2^attempt
    with equal jitter; never more than `max_s`."""
    if retry_after is not None:
        return min(max_s, retry_after * (1.0 + 0.1 * rng()))
    ceiling = min(max_s, base_s * (2.0**attempt))
    return ceiling / 2.0 + rng() * ceiling / 2.0


T = TypeVar("T")


def with_retries(
    call: Callable[[], T],
    *,
    what: str,
    max_retries: int,
    sleep: Callable[[float], None] = time.sleep,
    base_s: float = 1.0,
    max_s: float = 60.0,
) -> T:
    """`call()`, retried on retryable `ProviderError`s up to `max_retries` times."""
    attempt = 0
    while True:
        try:
            return call()
        except ProviderError as exc:
            if exc.kind not in RETRYABLE or attempt >= max_retries:
                raise
            delay = backoff_delay(attempt, exc.retry_after, base_s, max_s)
            attempt += 1
            # exc.message names the model already; `what` is for callers whose errors do not
            log.warning(
                "%s [%s, %s]; retry %d of %d in %.1f s",
                exc.message,
                what,
                exc.kind,
                attempt,
                max_retries,
                delay,
            )
            sleep(delay)


def kind_for_status(status: int) -> ErrorKind:
    if status == 429:
        return "rate_limit"
    if status in (401, 403):
        return "auth"
    if status == 408:
        return "timeout"
    if status >= 500:  # includes Anthropic's 529 "overloaded"
        return "server"
    return "bad_request"


class SdkChat:
    """What the SDK-backed providers share: one request body, sent with retries and backoff, its
    errors mapped to `ProviderError`s, its response parsed. A subclass sets `sdk` (the module name),
    `host`, `unreachable`, `hints` and `detail`, builds `self._client`, and defines `request_body`,
    `_create` (one SDK call) and `_parse`."""

    sdk: str
    host: str
    unreachable: str
    hints: Mapping[str, str]
    detail: Callable[[Any], str | None]
    model: str
    name: str
    base_url: str | None
    timeout: float
    max_retries: int
    supports_tools: bool
    _secret: str | None
    _sleep: Callable[[float], None]

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"{type(self).__name__}(model={self.model!r}{where})"

    def request_body(
        self, messages: list[Message], tools: list[ToolSpec] | None, max_tokens: int
    ) -> dict[str, Any]:
        raise NotImplementedError

    def _create(self, body: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _parse(self, response: Any) -> Reply:
        raise NotImplementedError

    def complete(
        self, messages: list[Message], tools: list[ToolSpec] | None = None, max_tokens: int = 4096
    ) -> Reply:
        body = self.request_body(messages, tools if self.supports_tools else None, max_tokens)
        return with_retries(
            lambda: self._call(body), what=self.name, max_retries=self.max_retries, sleep=self._sleep
        )

    def _call(self, body: dict[str, Any]) -> Reply:
        try:
            response = self._create(body)
        except Exception as exc:
            import importlib

            raise sdk_error(
                importlib.import_module(self.sdk), exc, name=self.name, where=self.base_url or self.host,
                timeout=self.timeout, secret=self._secret, hints=self.hints, detail=type(self).detail,
                unreachable=self.unreachable,
            ) from None  # fmt: skip
        return self._parse(response)


def sdk_error(
    sdk: Any,
    exc: Exception,
    *,
    name: str,
    where: str,
    timeout: float,
    secret: str | None,
    hints: Mapping[str, str],
    detail: Callable[[Any], str | None],
    unreachable: str,
) -> ProviderError:
    """An official SDK's exception as a `ProviderError`. The openai and anthropic SDKs share their
    exception classes' names (APITimeoutError, APIConnectionError, APIStatusError, ...); `sdk` is the
    module, `detail` reads the error body's message, and every text is scrubbed of the key."""
    text = scrub(str(exc), secret)
    if isinstance(exc, sdk.APITimeoutError):
        return ProviderError("timeout", f"{name}: no answer within {timeout:g} s", hint="raise the timeout")
    if isinstance(exc, sdk.APIConnectionError):
        return ProviderError("server", f"{name}: cannot reach {where}: {text}", hint=unreachable)
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        kind = kind_for_status(status)
        return ProviderError(
            kind,
            f"{name}: HTTP {status} from {where}: {scrub(detail(exc) or text, secret)}",
            hint=hints.get(kind),
            status=status,
            retry_after=parse_retry_after(exc.response.headers),
        )
    if isinstance(exc, sdk.APIResponseValidationError):
        return ProviderError("malformed", f"{name}: the response did not parse: {text}")
    return ProviderError("server", f"{name}: {type(exc).__name__}: {text}")


__all__ = [
    "RETRYABLE",
    "ChatModel",
    "ErrorKind",
    "Message",
    "ProviderError",
    "Reply",
    "Role",
    "StopReason",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "backoff_delay",
    "kind_for_status",
    "parse_retry_after",
    "scrub",
    "with_retries",
]
