"""The universal operator: one chat model, one synthesized prompt, a small tool loop.

`LLMOperator(model, meter)` is a `Synthesizer`. Every expansion (a draft, a mutation, a fix of a
failed kernel, a crossover) is the same operator; only the prompt differs (`synth/prompt.py`).

Tool mode (a model that calls tools): the model works on one file, `candidate.py`, which starts as
the (fitter) parent's source, with these tools:
    read_file(path)          candidate.py, reference.py, node_<id>.py (the kernels the task carries)
    write_file(content)      replace candidate.py as a whole
    replace(old, new)        one exact, unique search/replace in candidate.py
    lint()                   the static guards (`Tools.lint`)
    quick_run()              the harness at the smallest shape (`Tools.quick_run`)
    search_knowledge(query)  retrieved snippets (`Tools.search_knowledge`)
    submit(note)             the current file is the proposal; the loop ends
A failed tool (a `replace` whose text is missing or ambiguous, a refused submit) is an error message
fed back to the model, which tries again. A step is one model call; at `max_steps` the current file is
proposed if it differs from the parent, else the expansion fails. A reply with no tool call but a
```python block is taken as the file, then submitted.

Single-shot mode (a model without tool calls): one completion; the candidate is the answer's last
```python block.

Failures are values: a provider fault (timeout, rate limit after retries, malformed tool arguments),
an answer with no code, an unknown tool, all become `Proposal(source=None, error=...)`; nothing
raises out of `propose`. The run-wide `Meter` is checked before every call: once a cap is reached,
the operator stops with `exhausted=True`. Every tool call is recorded in `Proposal.actions`.

Threat model: the model's text is untrusted. Nothing here executes it: files live in memory, and
lint and quick_run go through the harness's isolation (`Tools`). Tool arguments are checked for
type; `read_file` serves only the in-memory files named above.

Thread safety: all per-expansion state lives in a local `_Run`; one operator serves many threads.

Why one module (over 450 lines): the tool loop and its seven tools' handlers share one `_Run`
state; the handlers are short functions below the loop, in the order of the tool list above.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelevolve.store.blobs import candidate_hash
from kernelevolve.synth.base import Proposal, Task, Tools
from kernelevolve.synth.prompt import (
    CANDIDATE_FILE,
    clip,
    estimate_tokens,
    starting_source,
    synthesize,
    visible_files,
)
from kernelevolve.synth.providers.base import (
    RETRYABLE,
    ChatModel,
    Message,
    ProviderError,
    Reply,
    ToolCall,
    ToolSpec,
)
from kernelevolve.synth.providers.meter import Meter

FILE_CHARS = 60_000  # a read_file result larger than this is elided in the middle
RESULT_CHARS = 6_000  # lint / quick_run / search results
ELIDED = "[elided to save context]"

_OBJECT = {"type": "object", "properties": {}, "additionalProperties": False}

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "read_file",
        "Read a file: candidate.py (the file you are writing), reference.py (the PyTorch reference), "
        "or node_<id>.py (the kernel of a tree node shown in the prompt).",
        {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    ),
    ToolSpec(
        "write_file",
        "Replace candidate.py with `content`: the complete Python file defining ModelNew.",
        {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]},
    ),
    ToolSpec(
        "replace",
        "Replace the one exact occurrence of `old` in candidate.py with `new`. Fails when `old` is not "
        "found or occurs more than once: include enough surrounding lines to make it unique.",
        {
            "type": "object",
            "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
            "required": ["old", "new"],
        },
    ),
    ToolSpec("lint", "Check candidate.py with the harness's static guards and a syntax check.", _OBJECT),
    ToolSpec(
        "quick_run",
        "Run candidate.py in the harness at the smallest shape: correctness against the reference and a "
        "short timing. Takes seconds to a minute.",
        _OBJECT,
    ),
    ToolSpec(
        "search_knowledge",
        "Search the knowledge base (kernel techniques, hardware facts, error fixes).",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 8},
            },
            "required": ["query"],
        },
    ),
    ToolSpec(
        "submit",
        "Submit candidate.py as your answer and stop. `note`: one line on what you changed and why.",
        {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]},
    ),
)
TOOL_NAMES = tuple(t.name for t in TOOLS)

_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str | None:
    """The answer's last ```python block (an untagged block counts if it defines ModelNew)."""
    tagged: list[str] = []
    untagged: list[str] = []
    for match in _FENCE.finditer(text or ""):
        (tagged if match.group(1) else untagged).append(match.group(2))
    if tagged:
        return tagged[-1].strip("\n") + "\n"
    found = [b for b in untagged if "class ModelNew" in b]
    return found[-1].strip("\n") + "\n" if found else None


class _ArgError(Exception):
    pass


@dataclass
class _Run:
    """One expansion's state and accounting."""

    model: ChatModel
    meter: Meter
    task: Task
    prompt: str = ""
    parent_source: str = ""
    current: str = ""
    files: dict[str, str] = field(default_factory=dict)
    actions: list[dict[str, Any]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    outage: bool = False  # a call failed for a retryable reason (server, timeout, rate limit)

    def call(self, messages: list[Message], tools: list[ToolSpec] | None, max_tokens: int) -> Reply | str:
        """The model's reply, or an error string (budget cap or provider fault)."""
        reason = self.meter.exceeded()
        if reason is not None:
            return f"budget cap reached: {reason}"
        try:
            reply = self.model.complete(messages, tools=tools, max_tokens=max_tokens)
        except ProviderError as exc:
            self.outage = exc.kind in RETRYABLE  # retried already: the endpoint is down, not the request bad
            return f"{self.model.name}: {exc.kind}: {exc.message}"
        self.tokens_in += reply.usage.tokens_in
        self.tokens_out += reply.usage.tokens_out
        self.cost_usd += self.meter.charge(self.model.name, reply.usage)
        if reply.text.strip():
            self.texts.append(reply.text.strip())
        return reply

    def record(self, step: int, tool: str, args: dict[str, Any], result: str, ok: bool) -> None:
        self.actions.append(
            {
                "step": step,
                "tool": tool,
                "args": _summarize_args(args),
                "result": _first_line(result),
                "ok": ok,
            }
        )

    def proposal(self, source: str | None, error: str | None = None, note: str = "") -> Proposal:
        return Proposal(
            source=source,
            error=error,
            note=note,
            prompt=self.prompt,
            response="\n\n".join(self.texts) or None,
            actions=self.actions,
            tokens_in=self.tokens_in,
            tokens_out=self.tokens_out,
            cost_usd=self.cost_usd,
            exhausted=bool(error and error.startswith("budget cap reached")),
            unavailable=source is None and self.outage,
        )

    def refusal(self, source: str) -> str | None:
        """Why `source` cannot be submitted, or None."""
        if not source.strip():
            return f"{CANDIDATE_FILE} is empty: write the complete file first"
        if "ModelNew" not in source:
            return f"{CANDIDATE_FILE} defines no ModelNew"
        if self.parent_source and source.strip() == self.parent_source.strip():
            return f"{CANDIDATE_FILE} is unchanged from the parent: change it before submitting"
        if candidate_hash(source) in self.task.tried:
            return "this exact file was already evaluated in this run: try something different"
        return None


class LLMOperator:
    """The universal operator over one chat model. `name` is the model's "provider:model".

    `meter`: the run's accounting (a fresh uncapped one if None). `max_steps`: model calls per
    expansion in tool mode. `tool_mode`: None follows `model.supports_tools`; False forces single-shot.
    `reply_tokens`: the cap on each answer (at most a quarter of the context window).
    `prompt_tokens`: the synthesized prompt's budget (default: derived from the context window).
    `context_tokens`: the window to assume, overriding the model's (a local server's real limit).
    """

    def __init__(
        self,
        model: ChatModel,
        meter: Meter | None = None,
        max_steps: int = 12,
        tool_mode: bool | None = None,
        reply_tokens: int = 16_384,
        prompt_tokens: int | None = None,
        context_tokens: int | None = None,
    ):
        self.model = model
        self.meter = meter if meter is not None else Meter()
        self.context_tokens = context_tokens or model.context_tokens
        self.max_steps = max(1, max_steps)
        self.tool_mode = model.supports_tools if tool_mode is None else (tool_mode and model.supports_tools)
        self.reply_tokens = min(reply_tokens, max(1024, self.context_tokens // 4))
        self.prompt_tokens = prompt_tokens
        self.name = model.name

    def __repr__(self) -> str:
        mode = "tools" if self.tool_mode else "single-shot"
        return f"LLMOperator({self.name}, {mode}, max_steps={self.max_steps})"

    def prompt_budget(self) -> int:
        """Tokens for the synthesized prompt: in tool mode, room is left for the conversation."""
        if self.prompt_tokens:
            return self.prompt_tokens
        room = self.context_tokens - self.reply_tokens
        return max(2048, min(room // 2, 32_000) if self.tool_mode else min(room - 1024, 48_000))

    def propose(self, task: Task, tools: Tools) -> Proposal:
        run = _Run(self.model, self.meter, task)
        try:
            system, user = synthesize(task, self.prompt_budget(), self.tool_mode)
            run.prompt = f"{system}\n\n{user}"
            messages = [Message.system(system), Message.user(user)]
            if self.tool_mode:
                return self._loop(run, messages, tools)
            return self._single(run, messages)
        except Exception as exc:  # a bug here must cost one node, not the run
            return run.proposal(None, f"{self.name}: operator failed: {type(exc).__name__}: {exc}")

    # -- single shot ----------------------------------------------------------------------------------

    def _single(self, run: _Run, messages: list[Message]) -> Proposal:
        reply = run.call(messages, None, self.reply_tokens)
        if isinstance(reply, str):
            return run.proposal(None, reply)
        code = extract_code(reply.text)
        run.record(
            1,
            "answer",
            {},
            f"{len(reply.text)} characters, code {'found' if code else 'missing'}",
            bool(code),
        )
        if code is None:
            cut = " (the answer was cut off at max_tokens)" if reply.stop_reason == "max_tokens" else ""
            return run.proposal(None, f"{self.name} answered without a ```python block{cut}")
        return run.proposal(code, note=_note_of(reply.text))

    # -- tool loop ------------------------------------------------------------------------------------

    def _loop(self, run: _Run, messages: list[Message], tools: Tools) -> Proposal:
        run.parent_source = run.current = starting_source(run.task)
        run.files = visible_files(run.task)
        handlers: dict[str, Callable[[_Run, ToolCall, Tools], tuple[str, bool]]] = {
            "read_file": _read_file,
            "write_file": _write_file,
            "replace": _replace,
            "lint": _lint,
            "quick_run": _quick_run,
            "search_knowledge": _search,
        }
        for step in range(1, self.max_steps + 1):
            self._fit(messages)
            reply = run.call(messages, list(TOOLS), self.reply_tokens)
            if isinstance(reply, str):
                return run.proposal(None, reply)
            messages.append(Message("assistant", reply.text, tool_calls=list(reply.tool_calls)))
            if not reply.tool_calls:
                code = extract_code(reply.text)
                if code is None:
                    run.record(step, "answer", {}, "no tool call and no code", False)
                    messages.append(
                        Message.user(f"Use the tools: edit {CANDIDATE_FILE}, check it, then call submit.")
                    )
                    continue
                refused = run.refusal(code)
                run.record(
                    step, "answer", {}, refused or "code taken as the candidate and submitted", not refused
                )
                if refused is None:
                    return run.proposal(code, note=_note_of(reply.text))
                run.current = code
                messages.append(Message.user(f"Not submitted: {refused}."))
                continue
            for call in reply.tool_calls:
                if call.name == "submit":
                    refused = run.refusal(run.current)
                    note = str(call.arguments.get("note") or "")
                    run.record(step, "submit", call.arguments, refused or "submitted", refused is None)
                    if refused is None:
                        return run.proposal(run.current, note=note.strip())
                    messages.append(
                        Message.tool_result(call, f"error: not submitted: {refused}", is_error=True)
                    )
                    continue
                handler = handlers.get(call.name)
                if handler is None:
                    run.record(step, call.name, call.arguments, "unknown tool", False)
                    return run.proposal(
                        None,
                        f"{self.name} called an unknown tool {call.name!r} (tools: {', '.join(TOOL_NAMES)})",
                    )
                try:
                    result, ok = handler(run, call, tools)
                except _ArgError as exc:
                    result, ok = f"error: {exc}", False
                run.record(step, call.name, call.arguments, result, ok)
                messages.append(Message.tool_result(call, result, is_error=not ok))
        refused = run.refusal(run.current)
        if refused is None:
            return run.proposal(
                run.current, note=f"step limit ({self.max_steps}) reached; the current file proposed"
            )
        return run.proposal(None, f"{self.name}: step limit ({self.max_steps}) reached and {refused}")

    def _fit(self, messages: list[Message]) -> None:
        """Keep the conversation inside the context window: elide the oldest tool results and file
        contents in old tool calls (never the prompt, never the last two turns)."""
        limit = self.context_tokens - self.reply_tokens - 1024
        total = sum(_tokens(m) for m in messages)
        for m in messages[2:-2]:
            if total <= limit:
                return
            before = _tokens(m)
            if m.role == "tool" and m.content != ELIDED:
                m.content = ELIDED
            for call in m.tool_calls:
                for key in ("content", "old", "new"):
                    if isinstance(call.arguments.get(key), str) and len(call.arguments[key]) > 200:
                        call.arguments[key] = ELIDED
            total -= before - _tokens(m)


def _tokens(m: Message) -> int:
    args = sum(len(json.dumps(c.arguments)) for c in m.tool_calls)
    return estimate_tokens(m.content) + args // 4 + 4


# --- tools -------------------------------------------------------------------------------------------


def _str_arg(call: ToolCall, key: str, required: bool = True) -> str:
    value = call.arguments.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise _ArgError(f"{call.name} needs `{key}` as a string")
    return value


def _read_file(run: _Run, call: ToolCall, tools: Tools) -> tuple[str, bool]:
    path = _str_arg(call, "path").strip().removeprefix("./")
    if path == CANDIDATE_FILE:
        text = run.current
        return (clip(text, FILE_CHARS) if text else f"({CANDIDATE_FILE} is empty)"), True
    if path in run.files:
        return clip(run.files[path], FILE_CHARS), True
    return f"error: no file {path!r}; files: {', '.join([CANDIDATE_FILE, *run.files])}", False


def _write_file(run: _Run, call: ToolCall, tools: Tools) -> tuple[str, bool]:
    content = _str_arg(call, "content")
    path = _str_arg(call, "path", required=False)
    if path and path.strip().removeprefix("./") != CANDIDATE_FILE:
        return f"error: only {CANDIDATE_FILE} can be written", False
    if not content.strip():
        return "error: refusing to write an empty file", False
    run.current = content if content.endswith("\n") else content + "\n"
    return f"wrote {CANDIDATE_FILE}: {len(run.current.splitlines())} lines", True


def _replace(run: _Run, call: ToolCall, tools: Tools) -> tuple[str, bool]:
    old, new = _str_arg(call, "old"), _str_arg(call, "new")
    if not old:
        return "error: `old` is empty", False
    count = run.current.count(old)
    if count == 0:
        return f"error: `old` was not found in {CANDIDATE_FILE} (read_file shows its exact text)", False
    if count > 1:
        return (
            f"error: `old` occurs {count} times in {CANDIDATE_FILE}; include more lines to make it unique",
            False,
        )
    run.current = run.current.replace(old, new, 1)
    return f"replaced 1 occurrence; {CANDIDATE_FILE} has {len(run.current.splitlines())} lines", True


def _harness(fn: Callable[[str], str], source: str, what: str) -> tuple[str, bool]:
    if not source.strip():
        return f"error: {CANDIDATE_FILE} is empty", False
    try:
        out = fn(source)
    except Exception as exc:  # the harness failing is not the model's fault: report, carry on
        return f"error: {what} could not run: {type(exc).__name__}: {exc}", False
    return clip(str(out), RESULT_CHARS), True


def _lint(run: _Run, call: ToolCall, tools: Tools) -> tuple[str, bool]:
    return _harness(tools.lint, run.current, "lint")


def _quick_run(run: _Run, call: ToolCall, tools: Tools) -> tuple[str, bool]:
    return _harness(tools.quick_run, run.current, "quick_run")


def _search(run: _Run, call: ToolCall, tools: Tools) -> tuple[str, bool]:
    query = _str_arg(call, "query")
    limit = call.arguments.get("limit", 3)
    limit = max(1, min(8, limit if isinstance(limit, int) else 3))
    try:
        found = tools.search_knowledge(query, limit)
    except Exception as exc:
        return f"error: search failed: {type(exc).__name__}: {exc}", False
    if not found:
        return "no results", True
    return clip("\n\n".join(f"### {s.title} ({s.doc})\n{s.text}" for s in found), RESULT_CHARS), True


# --- summaries -----------------------------------------------------------------------------------------


def _first_line(text: str, limit: int = 200) -> str:
    text = text.strip()
    line = text.splitlines()[0] if text else ""
    return line[:limit] + ("..." if len(line) > limit or "\n" in text else "")


def _summarize_args(args: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in args.items():
        if isinstance(value, str) and (len(value) > 80 or "\n" in value):
            out[key] = f"<{len(value)} chars, {value.count(chr(10)) + 1} lines>"
        else:
            out[key] = value
    return out


def _note_of(text: str) -> str:
    """What the model said it changed: its words before the code, shortened."""
    before = (text or "").split("```", 1)[0].strip()
    return before[:300]


__all__ = ["TOOLS", "TOOL_NAMES", "LLMOperator", "extract_code"]
