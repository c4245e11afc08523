"""Fakes for synthesizer tests, registered through the real provider registry.

`ScriptedModel` is a chat model whose replies are written in advance: each `complete` call takes the
next item of its script (a `Reply`, an exception to raise, or a function of the messages). It records
what it was sent. `register_scripted()` makes it the provider `scripted`, so that tests build it with
`providers.get_model("scripted:fake-1", script=[...])`, the path a third-party provider takes.

`FakeTools` stands in for the harness's tools: canned lint and quick_run answers, real built-in
knowledge search, every call recorded.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kernelevolve.synth import providers
from kernelevolve.synth.base import Snippet
from kernelevolve.synth.providers.base import Message, Reply, ToolCall, ToolSpec, Usage

ScriptItem = Reply | Exception | Callable[[list[Message]], Reply]
_ids = itertools.count(1)


class ScriptedModel:
    provider = "scripted"

    def __init__(
        self,
        model: str,
        *,
        script: Iterable[ScriptItem] = (),
        tools: bool = True,
        context_tokens: int = 200_000,
    ):
        self.model = model
        self.name = f"{self.provider}:{model}"
        self.supports_tools = tools
        self.context_tokens = context_tokens
        self.script = list(script)
        self.sent: list[list[Message]] = []
        self.tools_sent: list[list[ToolSpec] | None] = []
        self.max_tokens_sent: list[int] = []

    def complete(
        self, messages: list[Message], tools: list[ToolSpec] | None = None, max_tokens: int = 4096
    ) -> Reply:
        self.sent.append(copy.deepcopy(messages))
        self.tools_sent.append(tools)
        self.max_tokens_sent.append(max_tokens)
        if not self.script:
            raise AssertionError(f"{self.name}: the script ran out after {len(self.sent) - 1} calls")
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        if callable(item):
            return item(messages)
        return item


def register_scripted() -> None:
    providers.register("scripted", ScriptedModel)


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"call_{next(_ids)}", name=name, arguments=arguments)


def tool_reply(*calls: ToolCall, text: str = "", tokens: tuple[int, int] = (1000, 100)) -> Reply:
    return Reply(text=text, tool_calls=list(calls), usage=Usage(*tokens), stop_reason="tool_use")


def text_reply(text: str, tokens: tuple[int, int] = (1000, 100), stop: str = "end") -> Reply:
    return Reply(text=text, usage=Usage(*tokens), stop_reason=stop)  # type: ignore[arg-type]


class FakeTools:
    def __init__(
        self,
        lint: str | Callable[[str], str] = "ok",
        quick_run: str | Callable[[str], str] = "ok: correct at shape decode; 11.2 us, 1.31x vs eager",
    ):
        self._lint = lint
        self._quick_run = quick_run
        self.calls: list[tuple[str, str]] = []

    def lint(self, source: str) -> str:
        self.calls.append(("lint", source))
        return self._lint(source) if callable(self._lint) else self._lint

    def quick_run(self, source: str) -> str:
        self.calls.append(("quick_run", source))
        return self._quick_run(source) if callable(self._quick_run) else self._quick_run

    def search_knowledge(self, query: str, limit: int = 5) -> list[Snippet]:
        self.calls.append(("search_knowledge", query))
        return kb_search(query, limit=limit)


_KB: list[Any] = []


def kb_search(query: str, limit: int = 5, platform: str = "cuda") -> list[Snippet]:
    """The shipped knowledge base, indexed once per test session into a temporary workspace."""
    if not _KB:
        import tempfile

        from kernelevolve.knowledge import KnowledgeBase
        from kernelevolve.store import Workspace

        _KB.append(KnowledgeBase(Workspace.open(Path(tempfile.mkdtemp(prefix="kernelevolve-kb-")) / "ws")))
    from kernelevolve.search.tools import snippet

    return [snippet(h) for h in _KB[0].search(query, platform=platform, limit=limit)]
