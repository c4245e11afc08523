"""What a synthesizer is asked (`Task`) and what it answers (`Proposal`): the universal operator's contract.

The search engine (`kernelevolve.search`) selects a node, gathers its context per the memory mode,
and hands a `Task` to a synthesizer: the offline tuner, an LLM tool loop, or an external agent. The
synthesizer answers with a `Proposal`: a candidate's source, or the reason it has none, plus what it
cost. It never evaluates for keeps: the engine sends every proposal to the evaluator pool and records
the verdict. The `Tools` a synthesizer may use while it works (lint, a quick run on the smallest shape,
knowledge search) go through the same isolated harness; none of them runs a candidate in this process.

`SynthConfig` is how a run's synthesizer is named and made (`synth.create`, `synth/registry.py`).

Deliberately not here: selection, budgets and storage (the engine's), prompts (`synth/prompt.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kernelevolve.spec import Spec

MemoryMode = Literal["draft", "inherit", "compare", "combine", "fresh"]
MEMORY_MODES: tuple[str, ...] = ("draft", "inherit", "compare", "combine", "fresh")


@dataclass
class NodeView:
    """One node of the run's tree as a synthesizer sees it: its kernel and what the harness said.

    `message` is the verdict's message (the compile error, the guard rule, the correctness numbers);
    `shapes` holds per shape: name, correct, candidate time (us), speedup vs eager, vs compile and vs
    the best baseline (the faster of the two there, named), roofline fraction, bound. `best_baseline`
    names what `speedup_vs_best` (fitness, by default) is against: "eager", "compile", or a per-shape
    mix. `config` is the candidate's declared `CONFIG` (tunables), if any.
    """

    id: int
    parent: int | None
    mode: str
    source: str | None
    status: str | None  # the verdict's status; None while not yet evaluated
    message: str = ""
    fitness: float = 0.0
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    speedup_vs_best: float | None = None
    best_baseline: str | None = None
    spread: float | None = None
    roofline_fraction: float | None = None
    shapes: list[dict[str, Any]] = field(default_factory=list)
    diagnosis: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    note: str = ""  # what the synthesizer said it changed
    analysis: str = ""  # the harness's summary: what it tried, what that changed, why it failed or won


@dataclass
class Snippet:
    """A piece of retrieved knowledge: where it comes from, and its text."""

    doc: str
    title: str
    text: str
    score: float = 0.0
    category: str = ""  # constraint | guidance | hardware | sample | skill | user
    data: dict[str, Any] = field(default_factory=dict)  # structured payload (a skill's `change`)


@dataclass
class Task:
    """Everything one expansion needs. `parents` is empty for a draft or fresh node, one node for a
    mutation, two for a crossover. `history` is the memory the mode selects: the parent's ancestors
    (inherit), the parent's siblings and their fates (compare), both (combine), nothing (fresh).
    `tried` lists the sources' hashes already in the tree, so a synthesizer can avoid repeats."""

    run_id: str
    node_id: int
    spec: Spec
    platform: str  # the platform's name ("cuda", "cpu", ...)
    platform_target: str  # e.g. "cuda:sm90", "cpu:x86_64-avx2"
    kinds: tuple[str, ...]  # kernel kinds the platform runs ("triton", "cuda", "c", ...)
    mode: str
    parents: list[NodeView] = field(default_factory=list)
    history: list[NodeView] = field(default_factory=list)
    knowledge: list[Snippet] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)
    best_fitness: float = 0.0
    seed: int = 0  # for synthesizers that draw random numbers: reproducible per (run, node)
    hardware: dict[str, Any] = field(default_factory=dict)  # measured peaks (bandwidth, FLOP/s)
    phase: str = "draft"  # draft | early | late: how deep the retrieved knowledge goes
    pattern: str = ""  # the spec's operator pattern (elementwise, row, gemm, conv, ...), if known
    lessons: list[str] = field(default_factory=list)  # analyses of failed or slower nodes: not again
    reference: dict[str, Any] | None = None  # the reference's own analysis: bytes, FLOPs, bound per shape


@dataclass
class Proposal:
    """A synthesizer's answer. `source` None means no candidate: `error` says why (the model wrote no
    code, the endpoint failed, the tuner ran out of ideas); the node is recorded as a failure.
    `prompt` and `response` are what an LLM saw and said (or a tuner's description of its step);
    `actions` are the tool calls of an agentic loop, in order."""

    source: str | None
    error: str | None = None
    note: str = ""
    prompt: str | None = None
    response: str | None = None
    actions: list[dict[str, Any]] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    exhausted: bool = False  # the synthesizer has nothing more to offer for this run
    unavailable: bool = False  # the model endpoint kept failing (after retries): no candidate budget spent


class Tools(Protocol):
    """What a synthesizer may use while it works. All of it goes through the harness's isolation."""

    def lint(self, source: str) -> str:
        """Static guards and syntax: 'ok' or the violations, one per line."""
        ...

    def quick_run(self, source: str) -> str:
        """The harness on the smallest shape (correctness, a short timing): the verdict as text."""
        ...

    def search_knowledge(self, query: str, limit: int = 5) -> list[Snippet]: ...


class Synthesizer(Protocol):
    """Anything that turns a `Task` into a `Proposal`. Must be safe to call from several threads."""

    name: str  # recorded with the run: "tuner", "openai:gpt-5", "anthropic:claude-...", "agent"

    def propose(self, task: Task, tools: Tools) -> Proposal: ...


@dataclass
class SynthConfig:
    """How a run's synthesizer is made; stored with the run so `resume` makes the same one."""

    name: str = "tuner"
    base_url: str | None = None
    single_shot: bool = False  # a model without tool calling: one completion, code in the answer
    max_steps: int = 12  # tool-loop steps per expansion
    context_tokens: int | None = None  # prompt budget; None: the provider's
    # The offline tuner drafts from its own templates and samples besides the run's seed kernels;
    # off for `kernelevolve tune`, where the user's kernel alone is tuned.
    templates: bool = True

    @property
    def is_model(self) -> bool:
        """A chat model (PROVIDER:MODEL): it costs money and needs its SDK and key."""
        return ":" in self.name


__all__ = [
    "MEMORY_MODES",
    "MemoryMode",
    "NodeView",
    "Proposal",
    "Snippet",
    "SynthConfig",
    "Synthesizer",
    "Task",
    "Tools",
]
