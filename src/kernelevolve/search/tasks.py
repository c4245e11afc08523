"""What an expansion works from: a new node's parents and memory mode, then the task a synthesizer is given.

Two reads of the tree the engine passes in; the engine then creates the node, or hands the task on:

- `plan`: for the node about to be created, the node(s) it expands (the policy, `policies.py`; none
  while the draft phase lasts) and its memory mode (`memory.py`). Both are stored with the node, so a
  resumed run gives a `created` node the parents and mode it was created with.
- `task`: for a created node, the `Task` (`synth/base.py`): the spec and platform, its parents and the
  history its memory mode shows, the candidates already tried, the search phase and the lessons of the
  tree's failures (`learning.py`), the reference's analysis, and the knowledge documents retrieved for
  the node's runtime signals. With `settings.diagnosis` off (the ablation), the task shows times only;
  with `settings.knowledge` off, no documents.

Their random draws are seeded by the run's seed, the run id and the node count (the policy) or the
node id (the task's seed), so the same tree gives the same plan and the same seed.

Deliberately not here: creating the node, calling the synthesizer, or what a synthesizer makes of its
task (`kernelevolve.synth`).
"""

from __future__ import annotations

import random

from kernelevolve.knowledge.index import KnowledgeBase
from kernelevolve.profile.diagnosis import reference_analysis
from kernelevolve.search import learning
from kernelevolve.search.context import EngineContext
from kernelevolve.search.memory import choose_mode, history
from kernelevolve.search.policies import SELECT, SearchConfig
from kernelevolve.search.tools import snippet
from kernelevolve.search.tree import Tree
from kernelevolve.synth.base import Task

KNOWLEDGE_DOCS = 4  # documents retrieved into each task


class TaskBuilder:
    """The plans and tasks of one run's nodes: the run's fixed inputs, applied to a tree."""

    def __init__(
        self, ctx: EngineContext, run_id: str, search: SearchConfig, budget: int, target: str,
        pattern: str, kb: KnowledgeBase,
    ):  # fmt: skip
        self.ctx, self.run_id, self.search, self.budget = ctx, run_id, search, budget
        self.target, self.pattern, self.kb = target, pattern, kb

    def plan(self, tree: Tree) -> tuple[list[int], str]:
        """The parents (none while drafting) and memory mode of the node the store creates next."""
        rng = random.Random(f"{self.search.seed}:{self.run_id}:{len(tree)}")
        if len(tree) < self.search.draft:
            parents: list[int] = []
        else:
            parents = SELECT[self.search.policy](tree, rng, self.search)
        node_id = len(tree) + 1  # the id the store will allocate: the mode's schedule uses it
        return parents, choose_mode(tree, parents, node_id, self.search)

    def task(self, tree: Tree, node_id: int) -> Task:
        node = tree[node_id]
        parents = [p for p in (node.parent, node.parent2) if p is not None]
        best = tree.best(self.search.min_gain)
        ctx, settings = self.ctx, self.ctx.settings
        views = [tree[p].view() for p in parents]
        hist = [n.view() for n in history(tree, parents, node.mode)]
        if not settings.diagnosis:  # the ablation's "diagnosis off": the search sees times only
            for v in views + hist:
                v.diagnosis = None
        task = Task(
            run_id=self.run_id,
            node_id=node_id,
            spec=ctx.spec,
            platform=ctx.platform.name,
            platform_target=self.target,
            kinds=tuple(sorted(ctx.platform.kinds)),
            mode=node.mode,
            parents=views,
            history=hist,
            tried=tree.tried(),
            best_fitness=best.fitness if best else 0.0,
            seed=random.Random(f"{self.search.seed}:{self.run_id}:{node_id}").randrange(2**31),
            hardware={k: v for k, v in ctx.profile.items() if isinstance(v, int | float | str)},
            phase=learning.phase(tree, parents, self.budget),
            pattern=self.pattern,
            lessons=learning.lessons(tree),
            reference=reference_analysis(tree) if settings.diagnosis else None,
        )
        if settings.knowledge:
            hits = self.kb.retrieve(
                learning.signals(task, self.target, settings.diagnosis), limit=KNOWLEDGE_DOCS
            )
            task.knowledge = [snippet(h) for h in hits]
        return task


__all__ = ["KNOWLEDGE_DOCS", "TaskBuilder"]
