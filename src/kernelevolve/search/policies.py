"""Selection policies: which node(s) the next expansion grows from.

A policy answers a list of parent ids: `[]` for a new root (a draft, an independent sample), one id
for a mutation, two for a crossover. Only evaluated nodes are candidates, and a node whose children
the synthesizer declined twice (`exhausted`) is left alone. Before any policy runs, the engine spends
the draft phase (`SearchConfig.draft` independent roots).

greedy
    The best node by fitness. While nothing is correct yet, the newest failed node (so its error
    is debugged), at most `debug_children` times per node.

uct
    The node maximizing   q(n) + c * sqrt(ln N / (1 + v(n)))   where q(n) = fitness(n) / best fitness
    of the run (0 for a failed node), N = evaluated nodes in the run, v(n) = children of n, and
    c = `uct_c` (default 0.7; fitness is normalized to [0, 1], so c trades a full unit of
    normalized fitness against exploration). Ties go to the newer node.

evolutionary
    A population of the `population` fittest correct nodes. With probability `crossover` (and two
    members), two parents chosen by tournaments of 2: a crossover; otherwise one parent by
    tournament: a mutation. An empty population asks for a new root.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from kernelevolve.search.tree import Node, Tree

POLICIES = ("greedy", "uct", "evolutionary")


@dataclass
class SearchConfig:
    """How a run searches. Stored with the run, so `resume` continues the same search."""

    policy: str = "uct"
    draft: int = 4  # independent roots before feedback-driven expansion
    uct_c: float = 0.7
    population: int = 6
    crossover: float = 0.25
    debug_children: int = 2  # expansions of one failed node before it is given up
    schedule: tuple[str, ...] = ("inherit", "compare", "combine")
    fresh_after: int = 8  # evaluated nodes without a new best before a `fresh` expansion
    min_gain: float = 0.01  # the smallest relative gain that counts, on top of the measured spread
    parallel: int = 0  # expansions in flight; 0: auto (evaluator workers, +1 with a model)
    seed: int = 0

    def validate(self) -> SearchConfig:
        from kernelevolve.errors import WorkspaceError
        from kernelevolve.synth.base import MEMORY_MODES

        if self.policy not in POLICIES:
            raise WorkspaceError(f"unknown policy {self.policy!r}", hint="valid: " + ", ".join(POLICIES))
        bad = [m for m in self.schedule if m not in MEMORY_MODES or m == "draft"]
        if bad or not self.schedule:
            raise WorkspaceError(
                f"unknown memory modes in the schedule: {bad or 'empty'}",
                hint="use inherit, compare, combine and fresh, comma-separated",
            )
        if self.draft < 1:
            raise WorkspaceError("the draft phase needs at least one independent sample")
        return self


def _eligible(tree: Tree, n: Node, cfg: SearchConfig) -> bool:
    if n.state != "evaluated" or tree.exhausted_children(n.id) >= 2:
        return False
    return n.ok or len(n.children) < cfg.debug_children


def greedy(tree: Tree, rng: random.Random, cfg: SearchConfig) -> list[int]:
    ok = [n for n in tree.ok() if _eligible(tree, n, cfg)]
    if ok:
        return [max(ok, key=lambda n: (n.fitness, n.id)).id]
    failed = [n for n in tree.evaluated() if _eligible(tree, n, cfg)]
    return [max(failed, key=lambda n: n.id).id] if failed else []


def uct_score(n: Node, best_fitness: float, total: int, c: float) -> float:
    q = n.fitness / best_fitness if best_fitness > 0 and n.ok else 0.0
    return q + c * math.sqrt(math.log(max(total, 2)) / (1 + len(n.children)))


def uct(tree: Tree, rng: random.Random, cfg: SearchConfig) -> list[int]:
    pool = [n for n in tree.evaluated() if _eligible(tree, n, cfg)]
    if not pool:
        return []
    best = max((n.fitness for n in tree.ok()), default=0.0)
    total = len(tree.evaluated())
    return [max(pool, key=lambda n: (uct_score(n, best, total, cfg.uct_c), n.id)).id]


def evolutionary(tree: Tree, rng: random.Random, cfg: SearchConfig) -> list[int]:
    population = sorted((n for n in tree.ok() if _eligible(tree, n, cfg)), key=lambda n: (-n.fitness, -n.id))[
        : cfg.population
    ]
    if not population:
        return greedy(tree, rng, cfg)  # nothing correct yet: debug like greedy does

    def tournament(exclude: int | None = None) -> Node:
        entrants = [n for n in population if n.id != exclude] or population
        picks = [rng.choice(entrants) for _ in range(2)]
        return max(picks, key=lambda n: n.fitness)

    first = tournament()
    if len(population) >= 2 and rng.random() < cfg.crossover:
        return [first.id, tournament(exclude=first.id).id]
    return [first.id]


SELECT: dict[str, Callable[[Tree, random.Random, SearchConfig], list[int]]] = {
    "greedy": greedy,
    "uct": uct,
    "evolutionary": evolutionary,
}

__all__ = ["POLICIES", "SELECT", "SearchConfig", "evolutionary", "greedy", "uct", "uct_score"]
