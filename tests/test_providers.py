"""The `openai` and `anthropic` providers against transport-level fakes: the real SDKs, talking to an
`httpx.MockTransport` that serves recorded responses (`tests/fixtures/llm/*.json`: status, headers,
body in the shape of the real chat-completions and messages APIs). No network.

Newer SDK releases moved from `httpx` to its fork `httpx2` and refuse the other's clients; the
helpers build the mock client from whichever of the two the installed SDK takes.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from kernelevolve.synth import providers
from kernelevolve.synth.operator import LLMOperator
from kernelevolve.synth.providers.anthropic import AnthropicChat
from kernelevolve.synth.providers.base import (
    Message,
    ProviderError,
    ToolCall,
    ToolSpec,
    Usage,
    backoff_delay,
    parse_retry_after,
    scrub,
)
from kernelevolve.synth.providers.meter import Meter
from kernelevolve.synth.providers.openai import OpenAIChat
from kernelevolve.synth.providers.pricing import DEFAULT_PRICES, Price, load_prices, lookup
from tests.fakes import FakeTools

FIXTURES = Path(__file__).parent / "fixtures" / "llm"
OPENAI_KEY = "sk-test-kernelevolve-0123456789abcdef"
ANTHROPIC_KEY = "sk-ant-test-kernelevolve-0123456789"
TOOLS = [
    ToolSpec(
        "replace",
        "search/replace in candidate.py",
        {
            "type": "object",
            "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
            "required": ["old", "new"],
        },
    )
]
CONVERSATION = [
    Message.system("You write kernels."),
    Message.user("Make it faster."),
    Message("assistant", "Reading.", tool_calls=[ToolCall("call_1", "read_file", {"path": "candidate.py"})]),
    Message("tool", "import torch\n", tool_call_id="call_1", name="read_file"),
    Message("tool", "error: no such file", tool_call_id="call_2", name="read_file", is_error=True),
]


@pytest.fixture(autouse=True)
def hermetic(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in (
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "KERNELEVOLVE_PRICES",
    ):
        monkeypatch.delenv(var, raising=False)
    yield


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


class Server:
    """Serves queued fixtures (or raises a timeout for the item "timeout") and records requests."""

    def __init__(self, http: ModuleType, items: list[str]):
        self.http = http
        self.items = list(items)
        self.requests: list[Any] = []

    def __call__(self, request: Any) -> Any:
        self.requests.append(request)
        item = self.items.pop(0)
        if item == "timeout":
            raise self.http.ReadTimeout("timed out", request=request)
        data = fixture(item)
        return self.http.Response(data["status"], headers=data["headers"], json=data["body"])

    def body(self, index: int = -1) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(self.requests[index].content)
        return body


def _http_modules() -> list[ModuleType]:
    mods: list[ModuleType] = [httpx]
    try:
        mods.append(importlib.import_module("httpx2"))
    except ImportError:
        pass
    return mods


def serve(cls: type, model: str, items: list[str], **options: Any) -> tuple[Any, Server, list[float]]:
    """A provider model whose HTTP goes to a fake server; its retry waits are recorded, not slept."""
    sleeps: list[float] = []
    for http in _http_modules():
        server = Server(http, items)
        client = http.Client(transport=http.MockTransport(server))
        try:
            return cls(model, http_client=client, sleep=sleeps.append, **options), server, sleeps
        except TypeError:  # the SDK wants the other HTTP library's client
            continue
    raise AssertionError(f"no HTTP client that {cls.__name__}'s SDK accepts")


# --- openai ----------------------------------------------------------------------------------------


def test_openai_maps_messages_and_tools_and_parses_tool_calls() -> None:
    model, server, _ = serve(OpenAIChat, "gpt-4o", ["openai_tool_call"], api_key=OPENAI_KEY)
    reply = model.complete(CONVERSATION, tools=TOOLS, max_tokens=2048)

    request = server.requests[0]
    assert str(request.url) == "https://api.openai.com/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    body = server.body()
    assert body["model"] == "gpt-4o"
    assert body["max_completion_tokens"] == 2048 and "max_tokens" not in body
    assert body["tools"] == [{"type": "function", "function": {"name": "replace", "description": TOOLS[0].description,
                                                               "parameters": TOOLS[0].parameters}}]  # fmt: skip
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "tool"]
    assistant = body["messages"][2]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": '{"path": "candidate.py"}',
    }
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "import torch\n"}

    assert reply.tool_calls == [
        ToolCall("call_Qm2vX8dK3pLr", "replace", {"old": "num_warps=4", "new": "num_warps=8"})
    ]
    assert reply.text == "" and reply.stop_reason == "tool_use" and reply.raw_stop_reason == "tool_calls"
    assert reply.usage == Usage(1843, 41) and reply.model == "gpt-4o-2024-08-06"

    meter = Meter(prices=DEFAULT_PRICES)
    cost = meter.charge(model.name, reply.usage)
    assert cost == pytest.approx((1843 * 2.50 + 41 * 10.0) / 1e6)
    assert meter.unpriced == []


def test_openai_text_answer_through_the_registry() -> None:
    for http in _http_modules():
        server = Server(http, ["openai_text"])
        try:
            model = providers.get_model("openai:gpt-4o", api_key=OPENAI_KEY,
                                        http_client=http.Client(transport=http.MockTransport(server)))  # fmt: skip
        except TypeError:
            continue
        reply = model.complete([Message.user("hi")])
        assert reply.stop_reason == "end" and "class ModelNew" in reply.text
        assert reply.usage == Usage(2210, 388) and model.name == "openai:gpt-4o"
        assert "tools" not in server.body()
        return
    raise AssertionError("no usable HTTP client")


def test_openai_base_url_for_a_local_server_needs_no_key() -> None:
    with pytest.raises(ProviderError) as info:
        OpenAIChat("gpt-4o")
    assert info.value.kind == "auth" and "OPENAI_API_KEY" in str(info.value)

    model, server, _ = serve(OpenAIChat, "Qwen/Qwen2.5-Coder-32B-Instruct", ["openai_text"],
                             base_url="http://localhost:8000/v1", context_tokens=32_768)  # fmt: skip
    model.complete([Message.user("hi")], max_tokens=1000)
    request = server.requests[0]
    assert str(request.url) == "http://localhost:8000/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer not-needed"
    assert server.body()["max_tokens"] == 1000 and "max_completion_tokens" not in server.body()
    assert model.context_tokens == 32_768 and model.supports_tools
    assert "localhost:8000" in repr(model)


def test_openai_retries_429_honoring_retry_after() -> None:
    model, server, sleeps = serve(
        OpenAIChat, "gpt-4o", ["openai_error_429", "openai_tool_call"], api_key=OPENAI_KEY
    )
    reply = model.complete([Message.user("hi")], tools=TOOLS)
    assert reply.tool_calls[0].name == "replace"
    assert len(server.requests) == 2
    assert len(sleeps) == 1 and 2.0 <= sleeps[0] <= 2.2  # retry-after: 2, plus at most 10% jitter


def test_openai_gives_up_after_max_retries_with_growing_waits() -> None:
    items = ["openai_error_500"] * 4
    model, server, sleeps = serve(OpenAIChat, "gpt-4o", items, api_key=OPENAI_KEY, max_retries=3)
    with pytest.raises(ProviderError) as info:
        model.complete([Message.user("hi")])
    assert info.value.kind == "server" and info.value.status == 500
    assert "The server had an error" in str(info.value)
    assert len(server.requests) == 4 and len(sleeps) == 3
    assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0 and 2.0 <= sleeps[2] <= 4.0


def test_openai_timeout_is_a_timeout() -> None:
    model, server, sleeps = serve(OpenAIChat, "gpt-4o", ["timeout", "timeout"], api_key=OPENAI_KEY,
                                  max_retries=1, timeout=5.0)  # fmt: skip
    with pytest.raises(ProviderError) as info:
        model.complete([Message.user("hi")])
    assert info.value.kind == "timeout" and "within 5 s" in str(info.value)
    assert len(server.requests) == 2 and len(sleeps) == 1


def test_openai_malformed_tool_arguments() -> None:
    model, _, sleeps = serve(OpenAIChat, "Qwen/Qwen2.5-Coder-32B-Instruct", ["openai_bad_arguments"],
                             base_url="http://localhost:8000/v1")  # fmt: skip
    with pytest.raises(ProviderError) as info:
        model.complete([Message.user("hi")], tools=TOOLS)
    assert (
        info.value.kind == "malformed" and "'write_file'" in str(info.value) and "not JSON" in str(info.value)
    )
    assert sleeps == []  # not retried


def test_the_operator_turns_a_malformed_tool_call_into_a_failed_proposal() -> None:
    from kernelevolve.spec import load_spec
    from kernelevolve.synth.base import Task

    spec = load_spec(Path(__file__).parent.parent / "examples" / "softmax" / "spec.py", probe=False)
    model, _, _ = serve(
        OpenAIChat, "qwen-coder", ["openai_bad_arguments"], base_url="http://localhost:8000/v1"
    )
    task = Task(run_id="r", node_id=1, spec=spec, platform="cuda", platform_target="cuda:sm90",
                kinds=("triton",), mode="draft")  # fmt: skip
    meter = Meter(prices={})
    proposal = LLMOperator(model, meter).propose(task, FakeTools())
    assert proposal.source is None and proposal.error is not None
    assert proposal.error.startswith("openai:qwen-coder: malformed:")
    assert meter.calls == 0  # a reply that does not parse is never charged: its usage is unknown


def test_openai_auth_error_never_shows_the_key(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    model, _, _ = serve(OpenAIChat, "gpt-4o", ["openai_error_429", "openai_error_401"], api_key=OPENAI_KEY)
    with pytest.raises(ProviderError) as info:
        model.complete([Message.user("hi")])
    err = info.value
    assert err.kind == "auth" and err.status == 401 and err.hint and "OPENAI_API_KEY" in err.hint
    assert "Incorrect API key provided" in str(err)
    for text in (str(err), repr(err), repr(model), caplog.text, err.message):
        assert OPENAI_KEY not in text and "0123456789abcdef" not in text
    assert err.__cause__ is None and err.__suppress_context__


# --- anthropic ---------------------------------------------------------------------------------------


def test_anthropic_maps_messages_and_tools_and_parses_tool_use() -> None:
    model, server, _ = serve(AnthropicChat, "claude-haiku-4-5", ["anthropic_tool_use"], api_key=ANTHROPIC_KEY)
    reply = model.complete(CONVERSATION, tools=TOOLS, max_tokens=4000)

    request = server.requests[0]
    assert str(request.url) == "https://api.anthropic.com/v1/messages"
    # older SDKs send the key as x-api-key, newer ones as a bearer token
    assert ANTHROPIC_KEY in (
        request.headers.get("x-api-key"),
        request.headers.get("authorization", "").removeprefix("Bearer "),
    )
    body = server.body()
    assert body["model"] == "claude-haiku-4-5" and body["max_tokens"] == 4000
    assert body["system"] == "You write kernels."
    assert body["tools"] == [
        {"name": "replace", "description": TOOLS[0].description, "input_schema": TOOLS[0].parameters}
    ]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "Reading."},
        {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "candidate.py"}},
    ]
    assert body["messages"][2]["content"] == [  # both results of the turn in one user turn
        {"type": "tool_result", "tool_use_id": "call_1", "content": "import torch\n"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "error: no such file", "is_error": True},
    ]

    assert reply.text.startswith("The parent launches 4 warps")
    assert reply.tool_calls == [
        ToolCall("toolu_01A09q90qw90lq917835lq9", "read_file", {"path": "candidate.py"})
    ]
    assert reply.stop_reason == "tool_use" and reply.model == "claude-haiku-4-5-20251001"
    assert reply.usage == Usage(2095 + 100, 75)  # cache reads count as input

    meter = Meter(prices=DEFAULT_PRICES)
    assert meter.charge("anthropic:" + reply.model, reply.usage) == pytest.approx(
        (2195 * 1.0 + 75 * 5.0) / 1e6
    )


def test_anthropic_retries_overloaded_then_answers() -> None:
    model, server, sleeps = serve(AnthropicChat, "claude-haiku-4-5", ["anthropic_error_529", "anthropic_text"],
                                  api_key=ANTHROPIC_KEY, base_url="http://proxy.internal:9000")  # fmt: skip
    reply = model.complete([Message.user("hi")])
    assert reply.text == "Done." and reply.stop_reason == "end" and reply.usage == Usage(512, 3)
    assert len(server.requests) == 2 and len(sleeps) == 1 and 1.0 <= sleeps[0] <= 1.1
    assert str(server.requests[0].url) == "http://proxy.internal:9000/v1/messages"


def test_anthropic_auth_error_and_timeout(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ProviderError) as info:
        AnthropicChat("claude-haiku-4-5")
    assert info.value.kind == "auth" and "ANTHROPIC_API_KEY" in str(info.value)

    model, _, _ = serve(AnthropicChat, "claude-haiku-4-5", ["anthropic_error_401"], api_key=ANTHROPIC_KEY)
    with pytest.raises(ProviderError) as auth:
        model.complete([Message.user("hi")])
    assert auth.value.kind == "auth" and "authentication_error" in str(auth.value)
    for text in (str(auth.value), repr(auth.value), repr(model), caplog.text):
        assert ANTHROPIC_KEY not in text and "0123456789" not in text

    model, _, sleeps = serve(
        AnthropicChat, "claude-haiku-4-5", ["timeout"], api_key=ANTHROPIC_KEY, max_retries=0
    )
    with pytest.raises(ProviderError) as timeout:
        model.complete([Message.user("hi")])
    assert timeout.value.kind == "timeout" and sleeps == []


# --- pieces -------------------------------------------------------------------------------------------


def test_retry_after_and_backoff() -> None:
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert parse_retry_after({"retry-after": "soon"}) is None and parse_retry_after(None) is None
    assert backoff_delay(0, None, rng=lambda: 0.0) == 0.5
    assert backoff_delay(3, None, rng=lambda: 1.0) == 8.0
    assert backoff_delay(10, None, rng=lambda: 1.0) == 60.0
    assert backoff_delay(0, 500.0, rng=lambda: 0.0) == 60.0


def test_scrub_removes_keys_and_key_shaped_tokens() -> None:
    assert scrub(f"bad key {OPENAI_KEY}!", OPENAI_KEY) == "bad key ***!"
    assert "abcd" not in scrub("Incorrect API key provided: sk-proj-****************abcd.")
    assert scrub("nothing secret here") == "nothing secret here"


def test_prices_defaults_snapshots_and_user_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert lookup(DEFAULT_PRICES, "openai:gpt-4o-2024-08-06") == DEFAULT_PRICES["gpt-4o"]
    assert (
        lookup(DEFAULT_PRICES, "anthropic:claude-sonnet-4-5-20250929") == DEFAULT_PRICES["claude-sonnet-4-5"]
    )
    assert lookup(DEFAULT_PRICES, "openai:gpt-4o-mini") == DEFAULT_PRICES["gpt-4o-mini"]
    assert lookup(DEFAULT_PRICES, "openai:o3-mini") is None  # not priced as o3
    assert lookup(DEFAULT_PRICES, "ollama:llama3.1:8b") is None

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "prices.toml").write_text(
        '["gpt-4o"]\ninput = 1.0\noutput = 4.0\n\n["openai:qwen-coder"]\ninput = 0.0\noutput = 0.0\n'
    )
    table = load_prices(ws)
    assert (
        table["gpt-4o"] == Price(1.0, 4.0) and table["claude-haiku-4-5"] == DEFAULT_PRICES["claude-haiku-4-5"]
    )
    meter = Meter(prices=table)
    meter.charge("openai:qwen-coder", Usage(1000, 1000))
    meter.charge("openai:mystery", Usage(10, 10))
    assert meter.usd == 0.0 and meter.unpriced == ["openai:mystery"]

    custom = tmp_path / "mine.toml"
    custom.write_text('["gpt-5"]\ninput = 9\noutput = 9\n')
    monkeypatch.setenv("KERNELEVOLVE_PRICES", str(custom))
    assert (
        load_prices(ws)["gpt-5"] == Price(9.0, 9.0) and load_prices(ws)["gpt-4o"] == DEFAULT_PRICES["gpt-4o"]
    )
    custom.write_text('["gpt-5"]\ninput = 9\n')
    with pytest.raises(Exception, match="exactly `input` and `output`"):
        load_prices(ws)


def test_meter_is_thread_safe_and_resumable() -> None:
    import threading

    meter = Meter(max_tokens=1_000_000, prices={"gpt-4o": Price(1.0, 1.0)})
    threads = [
        threading.Thread(target=lambda: [meter.charge("openai:gpt-4o", Usage(3, 2)) for _ in range(2000)])
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (meter.calls, meter.tokens_in, meter.tokens_out) == (16_000, 48_000, 32_000)
    assert meter.usd == pytest.approx(80_000 / 1e6)
    assert meter.exceeded() is None
    meter.preload(tokens=920_000, usd=1.5)
    assert meter.exceeded() == "used 1000000 tokens of the 1000000-token cap"
    assert meter.summary()["tokens_prior"] == 920_000 and meter.usd == pytest.approx(1.58)


def test_check_model_fails_early_without_sending_anything() -> None:
    with pytest.raises(ProviderError) as info:
        providers.check_model("anthropic:claude-haiku-4-5")
    assert info.value.kind == "auth"
    with pytest.raises(ProviderError, match="unknown provider"):
        providers.check_model("bogus:model")
    providers.check_model("openai:local-model", base_url="http://localhost:1/v1")  # no key needed, no request
