"""The offline tuner as a synthesizer: templates and declared tunables in, one configuration per call out.

`OfflineTuner` answers the search engine's `Task`s like any synthesizer (`synth/base.py`), without a
model. It gathers its bases once (`templates.bases_for`: the platform's templates for the reference,
the knowledge base's code samples that compute it, the user's extra seeds), and from then on works
on configurations. A candidate is tunable when its source declares `TUNABLES`/`CONFIG`
(`kernelevolve/tunables.py`); a new candidate is the parent's source with only its `CONFIG`
rewritten, so a configuration has one spelling and one hash.

What each kind of task gets (the moves themselves are `moves.py`'s):
- draft (or no parent): each template at its default config (the default template first), then the
  templates' preset configurations (a GEMM's known-good tiles and fast dot, `Generated.drafts`), then
  each knowledge-base code sample that computes the same reference, then the extra seeds as written,
  then random configurations;
- one tunable parent: `inherit` steps 1-2 tunables to neighbouring choices, preferring directions that
  improved fitness along the ancestors (a retrieved skill's change first); `compare` moves towards
  the values of the fastest siblings; `combine` does both; `fresh` draws a random configuration;
- two parents: uniform crossover of their configs where the tunables match, else a mutation;
- a failed parent steps back towards its own parent's config, after (where it ran but was outside the
  tolerance) its products made one step more precise (`moves.more_precise_configs`: Triton's
  truncating TF32 dot, then one that rounds a, both, 3xTF32, IEEE), or (where a kernel needed more
  shared memory than a block has) that kernel made a step smaller (`moves.smaller_configs`); a
  parent without tunables gets a seed.
Every answer avoids `task.tried` (hashes of sources already in the tree) and whatever this tuner has
proposed before; when no untried configuration is left, the answer is `exhausted`. A configuration
the tuner makes never holds a tile over `tunables.THREAD_TILE_LIMIT` elements per thread (where the
candidate declares `TILE`): such a configuration spills and takes minutes to compile, so it is
skipped like a tried one (templates' defaults fit; a seed or sample as written is drafted as it is);
nor one whose declared shared memory (`SMEM`) is above the device's limit per block, which fails
to compile.

Randomness comes from `random.Random(task.seed)`, so a task's answer is reproducible. Deliberately not
here: evaluation (the engine sends every proposal to the harness), and any model: this is a tuner,
its `response` describes the step it took.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Sequence

from kernelevolve import tunables as tn
from kernelevolve.spec import Spec
from kernelevolve.store.blobs import candidate_hash
from kernelevolve.synth.base import NodeView, Proposal, Task, Tools
from kernelevolve.synth.tuner import moves as mv
from kernelevolve.synth.tuner.moves import Config, Space
from kernelevolve.synth.tuner.templates import Base, bases_for

Declared = tuple[Space, Config]


class OfflineTuner:
    """A `Synthesizer` that tunes declared configurations; safe to call from several threads."""

    name = "tuner"

    def __init__(
        self,
        spec: Spec,
        platform: str,
        kinds: Iterable[str] = (),
        extra_seeds: Sequence[tuple[str, str]] = (),
        templates: bool = True,
    ):
        """`templates=False` works on the extra seeds alone (`kernelevolve tune`: the user's kernel,
        not the tuner's own)."""
        self.spec = spec
        self.platform = platform
        self.kinds = tuple(kinds)
        self.extra_seeds = list(extra_seeds)
        self.templates = templates
        self._lock = threading.Lock()
        self._bases: list[Base] | None = None
        self._why = ""  # why there is no template, if there is none
        self._issued: set[str] = set()

    def _prepare(self) -> list[Base]:
        """Recognize the reference and gather the bases, once (under the lock)."""
        if self._bases is None:
            self._bases, self._why = bases_for(
                self.spec, self.platform, self.kinds, self.extra_seeds, self.templates
            )
        return self._bases

    def propose(self, task: Task, tools: Tools) -> Proposal:
        with self._lock:
            bases = self._prepare()
            tried = self._issued | set(task.tried)
            # a base whose author's spelling is in the tree (a seed node) has been tried as written
            tried |= {
                candidate_hash(b.source) for b in bases if b.written and candidate_hash(b.written) in tried
            }
            step = _Step(task, bases, tried, random.Random(task.seed))
            proposal = self._answer(step, task)
            if proposal.source is not None:
                self._issued.add(candidate_hash(proposal.source))
            proposal.prompt = _describe_task(task, bases)
            return proposal

    def _answer(self, step: _Step, task: Task) -> Proposal:
        """Which step the task gets: by its parents (how many, their verdict, their tunables) and mode."""
        parents = [p for p in task.parents if p.source]
        declared = [mv.declared(p) for p in parents]
        for p, d in zip(parents, declared, strict=True):
            if p.source and d is not None:  # a parent's own config, however its CONFIG line is spelled
                step.tried.add(candidate_hash(tn.write(p.source, d[1])))
        if task.mode != "draft" and parents and declared[0] is not None:
            parent, own = parents[0], declared[0]
            if len(parents) >= 2:
                return step.crossover(parent, own, parents[1], declared[1])
            if parent.status not in (None, "ok"):
                return step.step_back(parent, own)
            if task.mode == "fresh":
                return step.random_config(parent, own, "fresh")
            return step.mutate(parent, own, task.mode)
        if not step.bases:
            why = self._why.lstrip("; ") or "no template and no seed"
            return Proposal(
                source=None,
                error=f"{why}; declare TUNABLES/CONFIG in a candidate to tune it",
                exhausted=True,
                note="no template",
                response="the tuner has nothing to configure",
            )
        return step.random_base() if task.mode == "fresh" else step.draft()


def _describe_task(task: Task, bases: list[Base]) -> str:
    parents = ", ".join(f"#{p.id} ({p.status}, fitness {p.fitness:.3g})" for p in task.parents) or "none"
    spaces = "; ".join(f"{b.label}: {b.space}" for b in bases if b.space) or "no tunable seed"
    return (
        f"offline tuner step for {task.spec.name} on {task.platform_target}: mode {task.mode}, "
        f"parents {parents}, {len(task.history)} nodes of history, {len(task.tried)} sources tried. "
        f"Spaces: {spaces}"
    )


def _change(old: Config, new: Config) -> str:
    return ", ".join(f"{k} {old.get(k)!r}->{new[k]!r}" for k in new if old.get(k) != new[k]) or "no change"


class _Step:
    """One call's work: the task's view of what has been tried, and a seeded generator. Each kind of
    step takes the first configuration of its move (`moves.py`) that is worth trying, and says what
    it did; where a move runs out, the step falls back to a random configuration."""

    def __init__(self, task: Task, bases: list[Base], tried: set[str], rng: random.Random):
        self.task = task
        self.bases = bases
        self.tried = tried
        self.rng = rng

    # -- bookkeeping -------------------------------------------------------------------------------

    def untried(self, source: str) -> bool:
        return candidate_hash(source) not in self.tried

    def worth_trying(self, source: str, config: Config) -> str | None:
        """`source` rewritten to `config`, a configuration of the tuner's own, if its tile fits the
        registers (`tunables.config_fits`, asked before writing: a larger tile spills, and Triton takes
        minutes to compile it), its shared memory fits the device's (`tunables.smem_fits`: a larger one
        fails to compile) and the result is untried; else None."""
        if not tn.config_fits(config, tn.declared_tile(source)):
            return None
        if not tn.smem_fits(config, tn.declared_smem(source), self.task.platform_target):
            return None
        text = tn.write(source, config)
        return text if self.untried(text) else None

    def first_to_try(self, source: str, configs: Iterable[Config]) -> tuple[str, Config] | None:
        for cfg in configs:
            text = self.worth_trying(source, cfg)
            if text is not None:
                return text, cfg
        return None

    def ok(self, source: str, note: str, response: str) -> Proposal:
        return Proposal(source=source, note=note, response=response)

    def exhausted(self, why: str) -> Proposal:
        return Proposal(
            source=None,
            error=f"the tuner has nothing left to try: {why}",
            exhausted=True,
            note="exhausted",
            response=why,
        )

    # -- drafts ------------------------------------------------------------------------------------

    def draft(self) -> Proposal:
        for base in self.bases:  # as written: a seed's or sample's own CONFIG is its author's choice
            if self.untried(base.source):
                at = f"at a preset config: {base.why}" if base.why else "at its default config"
                return self.ok(
                    base.source,
                    f"{base.kind} {base.label} {at}",
                    f"draft: the {base.kind} {base.label} as written, CONFIG {tn.format_config(base.config)}",
                )
        return self.random_base()

    def random_base(self) -> Proposal:
        tunable = [b for b in self.bases if b.space]
        order = self.rng.sample(tunable, len(tunable))
        for base in order:
            assert base.space is not None
            found = self.first_to_try(base.source, mv.random_configs(self.rng, base.space, base.config))
            if found is not None:
                source, cfg = found
                return self.ok(
                    source,
                    f"random config of {base.label}: {_change(base.config, cfg)}",
                    f"a random configuration of {base.label}: {tn.format_config(cfg)}",
                )
        return self.exhausted("every seed and every configuration of the templates has been tried")

    # -- one parent --------------------------------------------------------------------------------

    def random_config(self, parent: NodeView, own: Declared, mode: str) -> Proposal:
        space, config = own
        assert parent.source is not None
        found = self.first_to_try(parent.source, mv.random_configs(self.rng, space, config))
        if found is None:
            return self.random_base()
        source, cfg = found
        return self.ok(
            source,
            f"{mode}: random config {_change(config, cfg)}",
            f"{mode}: a random configuration of #{parent.id}: {tn.format_config(cfg)}",
        )

    def mutate(self, parent: NodeView, own: Declared, mode: str) -> Proposal:
        """A verified skill's change first, then one or two neighbouring steps (`moves.mutation_plans`)."""
        space, config = own
        assert parent.source is not None
        moves = mv.single_moves(space, config)
        if not moves:
            return self.random_config(parent, own, mode)
        for cfg, doc in mv.skill_configs(self.task.knowledge, space, config):  # they won before
            source = self.worth_trying(parent.source, cfg)
            if source is not None:
                return self.ok(
                    source,
                    f"applied {doc}: {_change(config, cfg)}",
                    f"{mode}: from #{parent.id}, a verified skill ({doc}): {_change(config, cfg)}",
                )
        lineage, siblings = mv.split_history(parent, self.task.history)
        weight = mv.MoveWeights(space, mv.direction_scores(space, [parent, *lineage]), parent)
        toward = mv.toward_best(space, config, parent, siblings) if mode in ("compare", "combine") else []
        for chosen, why in mv.mutation_plans(self.rng, space, mode, moves, toward, weight):
            cfg = mv.apply(space, config, chosen)
            source = self.worth_trying(parent.source, cfg)
            if source is not None:
                return self.ok(
                    source,
                    f"mutate {_change(config, cfg)}",
                    f"{mode}: from #{parent.id}, {why}: {_change(config, cfg)}",
                )
        return self.random_config(parent, own, mode)

    def step_back(self, parent: NodeView, own: Declared) -> Proposal:
        """The parent failed: where it was only incorrect, its products made more precise; where a
        kernel ran out of shared memory, that kernel a step smaller; else (or where none is left to
        try) undo one of the changes that led to it, plus a neighbouring step."""
        space, config = own
        assert parent.source is not None
        if parent.status == "incorrect":  # it ran, outside the tolerance: a more precise dot first
            found = self.first_to_try(parent.source, mv.more_precise_configs(space, config))
            if found is not None:
                source, cfg = found
                return self.ok(
                    source,
                    f"more precise {_change(config, cfg)}",
                    f"#{parent.id} was outside the tolerance; a more precise product: {_change(config, cfg)}",
                )
        prefix = mv.failing_prefix(parent.message or "", parent.source)
        if prefix is not None:  # out of shared memory: the failing kernel a step smaller
            found = self.first_to_try(parent.source, mv.smaller_configs(space, config, prefix))
            if found is not None:
                source, cfg = found
                return self.ok(
                    source,
                    f"smaller {_change(config, cfg)}",
                    f"#{parent.id} needed more shared memory than a block has; smaller: {_change(config, cfg)}",
                )
        before = next((n for n in self.task.history if n.id == parent.parent), None)
        earlier = mv.declared(before) if before is not None else None
        if before is not None and earlier is not None and earlier[0] == space:
            configs = mv.step_back_configs(self.rng, space, config, earlier[1])
            found = self.first_to_try(parent.source, configs)
            if found is not None:
                source, cfg = found
                return self.ok(
                    source,
                    f"step back {_change(config, cfg)}",
                    f"#{parent.id} failed ({parent.status}); back towards #{before.id}: "
                    f"{_change(config, cfg)}",
                )
        return self.random_config(parent, own, f"after a failure ({parent.status})")

    # -- two parents -------------------------------------------------------------------------------

    def crossover(self, first: NodeView, own: Declared, second: NodeView, other: Declared | None) -> Proposal:
        space, config = own
        assert first.source is not None
        shared = mv.shared_tunables(space, other[1]) if other is not None else []
        if other is None or not shared or all(config[k] == other[1][k] for k in shared):
            return self.mutate(first, own, "inherit")
        found = self.first_to_try(first.source, mv.crossover_configs(self.rng, config, other[1], shared))
        if found is not None:
            source, cfg = found
            taken = [k for k in shared if cfg[k] != config[k]]
            return self.ok(
                source,
                f"crossover #{first.id} x #{second.id}: {', '.join(taken)} from #{second.id}",
                f"uniform crossover of #{first.id} and #{second.id}: {tn.format_config(cfg)}",
            )
        return self.mutate(first, own, "inherit")


__all__ = ["OfflineTuner"]
