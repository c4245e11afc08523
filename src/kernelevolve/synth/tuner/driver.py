"""The offline tuner as a synthesizer: templates and declared tunables in, one configuration per call out.

`OfflineTuner` answers the search engine's `Task`s like any synthesizer (`synth/base.py`), without a
model: it recognizes the reference once (`trace.recognize`), generates the platform's templates
(`c_codegen` on the CPU; `triton_codegen` and each of its `variants` on CUDA and ROCm; imported
lazily, cached per spec fingerprint), and from then on works on configurations. A candidate is
tunable when its source declares `TUNABLES`/`CONFIG` (`kernelevolve/tunables.py`); a new candidate is the parent's
source with only its `CONFIG` rewritten, so a configuration has one spelling and one hash.

What each kind of task gets:
- draft (or no parent): each template at its default config (the default template first), then each
  knowledge-base code sample that computes the same reference (`knowledge/samples.py`), then the
  extra seeds (user candidates given to `kernelevolve tune`) as written, then random configurations;
- one tunable parent: `inherit` steps 1-2 tunables to neighbouring choices, preferring directions that
  improved fitness along the ancestors; `compare` moves towards the values of the fastest siblings;
  `combine` does both; `fresh` draws a random configuration;
- two parents: uniform crossover of their configs where the tunables match, else a mutation;
- a failed parent steps back towards its own parent's config; a parent without tunables gets a seed.
Every answer avoids `task.tried` (hashes of sources already in the tree) and whatever this tuner has
proposed before; when no untried configuration is left, the answer is `exhausted`. A configuration
the tuner makes never holds a tile over `tunables.THREAD_TILE_LIMIT` elements per thread (where the
candidate declares `TILE`): such a configuration spills and takes minutes to compile, so it is
skipped like a tried one (templates' defaults fit; a seed or sample as written is drafted as it is).

Randomness comes from `random.Random(task.seed)`, so a task's answer is reproducible. Deliberately not
here: evaluation (the engine sends every proposal to the harness), and any model: this is a tuner,
its `response` describes the step it took.
"""

from __future__ import annotations

import importlib
import itertools
import math
import random
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kernelevolve import tunables as tn
from kernelevolve.errors import KernelevolveError
from kernelevolve.spec import Spec
from kernelevolve.store.blobs import candidate_hash
from kernelevolve.synth.base import NodeView, Proposal, Task, Tools
from kernelevolve.synth.tuner.ir import Generated

Config = dict[str, Any]
Space = dict[str, list[Any]]
ENUMERATE_LIMIT = 200_000  # larger spaces are sampled, not enumerated


@dataclass
class _Base:
    """A tunable source the tuner can configure: a generated template or a user's seed."""

    label: str
    source: str
    space: Space | None  # None: the seed declares no tunables and is offered once, as written
    config: Config
    kind: str = "seed"  # "template" | "sample" | "seed"


# Platform -> (kernel kind, code generator module). A generator module has `generate(graph,
# config=None, precision=...)` and optionally `variants(graph)` (template names, the default first,
# passed back as `template=`). Imported on first use: the Triton one needs triton.
GENERATORS: dict[str, tuple[str, str]] = {
    "cpu": ("c", "kernelevolve.synth.tuner.c_codegen"),
    "cuda": ("triton", "kernelevolve.synth.tuner.triton_codegen"),
    "rocm": ("triton", "kernelevolve.synth.tuner.triton_codegen"),
}


_TEMPLATES: dict[tuple[str, ...], tuple[list[Generated], str]] = {}
_TEMPLATES_LOCK = threading.Lock()


def templates_for(spec: Spec, platform: str, kinds: Sequence[str] = ()) -> tuple[list[Generated], str]:
    """The platform's templates for the spec's reference, default first, and why there are none
    (the reference is not recognized, no generator covers it). Cached per spec fingerprint: tracing
    takes a second, and several tuners may serve one run."""
    key = (str(spec.path), spec.fingerprint, spec.precision, platform, *kinds)
    with _TEMPLATES_LOCK:
        if key not in _TEMPLATES:
            _TEMPLATES[key] = _generate_templates(spec, platform, kinds)
        return _TEMPLATES[key]


def _generate_templates(spec: Spec, platform: str, kinds: Sequence[str]) -> tuple[list[Generated], str]:
    from kernelevolve.synth.tuner.trace import recognize

    entry = GENERATORS.get(platform)
    if entry is None:
        return [], f"no template generator for platform {platform!r}"
    kind, module_name = entry
    if kinds and kind not in kinds:
        return [], f"the {platform} templates are {kind} kernels, which this platform does not run"
    graph, why = recognize(spec)
    if graph is None:
        return [], f"the reference is not templated: {why}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return [], f"the {kind} template generator is not available ({exc})"
    names: list[str | None] = list(module.variants(graph)) if hasattr(module, "variants") else [None]
    out: list[Generated] = []
    failures = []
    for name in names or [None]:
        extra = {"template": name} if name is not None else {}
        try:
            out.append(module.generate(graph, config=None, precision=spec.precision, **extra))
        except (NotImplementedError, ValueError, KernelevolveError) as exc:
            failures.append(f"no {kind} template for this {graph.pattern} graph: {exc}")
        except Exception as exc:  # a generator's bug costs its template, not the run
            failures.append(
                f"the {kind} generator failed on this {graph.pattern} graph: {type(exc).__name__}: {exc}"
            )
    return out, "" if out else "; ".join(failures)


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
        self._bases: list[_Base] | None = None
        self._why = ""  # why there is no template, if there is none
        self._issued: set[str] = set()

    # -- set-up ------------------------------------------------------------------------------------

    def _prepare(self) -> list[_Base]:
        """Recognize the reference and generate the templates, once (under the lock)."""
        if self._bases is not None:
            return self._bases
        templates, self._why = (
            templates_for(self.spec, self.platform, self.kinds) if self.templates else ([], "")
        )
        bases = [_Base(t.template, t.source, dict(t.tunables), dict(t.config), "template") for t in templates]
        if self.templates:
            bases += self._samples()
        for label, source in self.extra_seeds:
            try:
                declared = tn.read(source)
            except tn.TunablesError as exc:
                self._why += f"; seed {label}: {exc}"
                declared = None
            if declared is None:
                bases.append(_Base(label, source, None, {}))
            else:  # CONFIG as the tuner writes it, so that a configuration has one spelling
                bases.append(_Base(label, tn.write(source, declared[1]), declared[0], declared[1]))
        self._bases = bases
        return bases

    def _samples(self) -> list[_Base]:
        """The knowledge base's code samples that compute this spec's reference, in this platform's
        kernel kind (`knowledge/samples.py`): hand-written kernels with declared tunables, offered
        after the generated templates. Where the templates do not cover a reference (gathers, jagged
        ops, several GEMMs), they are what the tuner has to work with."""
        from kernelevolve.knowledge.samples import applicable_samples

        entry = GENERATORS.get(self.platform)
        if entry is None or (self.kinds and entry[0] not in self.kinds):
            return []
        out = []
        for sample in applicable_samples(self.spec, entry[0]):
            source = sample.source
            try:
                declared = tn.read(source)
            except tn.TunablesError:
                declared = None
            if declared is None:
                out.append(_Base(sample.doc_id, source, None, {}, "sample"))
            else:
                out.append(
                    _Base(sample.doc_id, tn.write(source, declared[1]), declared[0], declared[1], "sample")
                )
        if out:
            self._why = ""
        return out

    # -- the protocol ------------------------------------------------------------------------------

    def propose(self, task: Task, tools: Tools) -> Proposal:
        with self._lock:
            bases = self._prepare()
            step = _Step(task, bases, self._issued | set(task.tried), random.Random(task.seed))
            proposal = self._answer(step, task)
            if proposal.source is not None:
                self._issued.add(candidate_hash(proposal.source))
            proposal.prompt = _describe_task(task, bases)
            return proposal

    def _answer(self, step: _Step, task: Task) -> Proposal:
        parents = [p for p in task.parents if p.source]
        declared = [_declared(p) for p in parents]
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


def _declared(node: NodeView) -> tuple[Space, Config] | None:
    if not node.source:
        return None
    try:
        declared = tn.read(node.source)
    except tn.TunablesError:
        return None
    if declared is None:
        return None
    space, config = declared
    if node.config and set(node.config) == set(space) and all(node.config[k] in space[k] for k in space):
        config = dict(node.config)
    return space, config


def _describe_task(task: Task, bases: list[_Base]) -> str:
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
    """One call's work: the task's view of what has been tried, and a seeded generator."""

    def __init__(self, task: Task, bases: list[_Base], tried: set[str], rng: random.Random):
        self.task = task
        self.bases = bases
        self.tried = tried
        self.rng = rng

    def untried(self, source: str) -> bool:
        return candidate_hash(source) not in self.tried

    def worth_trying(self, source: str, config: Config) -> str | None:
        """`source` rewritten to `config`, a configuration of the tuner's own, if its tile fits the
        registers (`tunables.config_fits`, asked before writing: a larger tile spills, and Triton takes
        minutes to compile it) and the result is untried; else None."""
        if not tn.config_fits(config, tn.declared_tile(source)):
            return None
        text = tn.write(source, config)
        return text if self.untried(text) else None

    def ok(self, source: str, note: str, response: str) -> Proposal:
        return Proposal(source=source, note=note, response=response)

    def exhausted(self, why: str) -> Proposal:
        return Proposal(source=None, error=f"the tuner has nothing left to try: {why}", exhausted=True,
                        note="exhausted", response=why)  # fmt: skip

    # -- drafts ------------------------------------------------------------------------------------

    def draft(self) -> Proposal:
        for base in self.bases:  # as written: a seed's or sample's own CONFIG is its author's choice
            if self.untried(base.source):
                return self.ok(base.source, f"{base.kind} {base.label} at its default config",
                               f"draft: the {base.kind} {base.label} as written, CONFIG {tn.format_config(base.config)}")  # fmt: skip
        return self.random_base()

    def random_base(self) -> Proposal:
        tunable = [b for b in self.bases if b.space]
        order = self.rng.sample(tunable, len(tunable))
        for base in order:
            assert base.space is not None
            found = self.first_to_try(base.source, _random_configs(self.rng, base.space, base.config))
            if found is not None:
                source, cfg = found
                return self.ok(source, f"random config of {base.label}: {_change(base.config, cfg)}",
                               f"a random configuration of {base.label}: {tn.format_config(cfg)}")  # fmt: skip
        return self.exhausted("every seed and every configuration of the templates has been tried")

    # -- one parent --------------------------------------------------------------------------------

    def random_config(self, parent: NodeView, own: tuple[Space, Config], mode: str) -> Proposal:
        space, config = own
        assert parent.source is not None
        found = self.first_to_try(parent.source, _random_configs(self.rng, space, config))
        if found is None:
            return self.random_base()
        source, cfg = found
        return self.ok(source, f"{mode}: random config {_change(config, cfg)}",
                       f"{mode}: a random configuration of #{parent.id}: {tn.format_config(cfg)}")  # fmt: skip

    def mutate(self, parent: NodeView, own: tuple[Space, Config], mode: str) -> Proposal:
        space, config = own
        assert parent.source is not None
        lineage, siblings = _split_history(parent, self.task.history)
        scores = _direction_scores(space, [parent, *lineage])
        toward = _toward_best(space, config, parent, siblings) if mode in ("compare", "combine") else []
        moves = _single_moves(space, config)
        if not moves:
            return self.random_config(parent, own, mode)

        for cfg, doc in _skill_configs(self.task, space, config):  # verified skills first: they won before
            source = self.worth_trying(parent.source, cfg)
            if source is not None:
                return self.ok(source, f"applied {doc}: {_change(config, cfg)}",
                               f"{mode}: from #{parent.id}, a verified skill ({doc}): {_change(config, cfg)}")  # fmt: skip
        scale = max((abs(v) for v in scores.values()), default=0.0) or 1.0
        klass = str((parent.diagnosis or {}).get("class") or "")

        def weight(move: tuple[str, int]) -> float:
            """Relative to the largest fitness change seen: up to 9x for the best direction so far,
            1/4 for directions that made things worse; times PRIOR_WEIGHT where the parent's
            diagnosis favours the move."""
            score = scores.get(move, 0.0) / scale
            base = 1.0 + 8.0 * score if score >= 0 else 0.25
            return base * _prior(move, space, klass)

        def pick(pool: list[tuple[str, int]], n: int, chosen: list[tuple[str, int]], weighted: bool) -> None:
            for _ in range(n):
                left = [m for m in pool if m[0] not in {c[0] for c in chosen}]
                if left:
                    chosen.append(_weighted(self.rng, left, [weight(m) if weighted else 1.0 for m in left]))

        def plans() -> Iterator[tuple[list[tuple[str, int]], str]]:
            for _ in range(12):
                chosen: list[tuple[str, int]] = []
                n = 1 if len(space) == 1 else self.rng.choice((1, 2))
                if toward and mode == "compare":
                    pick(toward, n, chosen, weighted=False)
                    why = "towards the fastest siblings"
                elif toward and mode == "combine":
                    pick(toward, 1, chosen, weighted=False)
                    pick(moves, 1, chosen, weighted=True)
                    why = "towards the fastest sibling, and along the lineage"
                else:
                    pick(moves, n, chosen, weighted=True)
                    why = "along the lineage" if scores else "a neighbouring step"
                yield chosen, why
            for move in sorted(moves, key=weight, reverse=True):  # then every single step, best first
                yield [move], "a neighbouring step"
            for a, b in itertools.combinations(moves, 2):
                if a[0] != b[0]:
                    yield [a, b], "two neighbouring steps"

        for chosen, why in plans():
            cfg = _apply(space, config, chosen)
            source = self.worth_trying(parent.source, cfg)
            if source is not None:
                return self.ok(source, f"mutate {_change(config, cfg)}",
                               f"{mode}: from #{parent.id}, {why}: {_change(config, cfg)}")  # fmt: skip
        return self.random_config(parent, own, mode)

    def step_back(self, parent: NodeView, own: tuple[Space, Config]) -> Proposal:
        """The parent failed: undo one of the changes that led to it, plus a neighbouring step."""
        space, config = own
        assert parent.source is not None
        before = next((n for n in self.task.history if n.id == parent.parent), None)
        earlier = _declared(before) if before is not None else None
        if before is not None and earlier is not None and earlier[0] == space:
            prior = earlier[1]
            undo = [k for k in space if config.get(k) != prior.get(k)]
            self.rng.shuffle(undo)
            for key in undo:
                reverted = {**config, key: prior[key]}
                steps = _single_moves(space, reverted)
                for move in [None, *self.rng.sample(steps, len(steps))]:
                    cfg = reverted if move is None else _apply(space, reverted, [move])
                    source = self.worth_trying(parent.source, cfg)
                    if source is not None:
                        return self.ok(source, f"step back {_change(config, cfg)}",
                                       f"#{parent.id} failed ({parent.status}); back towards #{before.id}: "
                                       f"{_change(config, cfg)}")  # fmt: skip
        return self.random_config(parent, own, f"after a failure ({parent.status})")

    # -- two parents -------------------------------------------------------------------------------

    def crossover(
        self, first: NodeView, own: tuple[Space, Config], second: NodeView, other: tuple[Space, Config] | None
    ) -> Proposal:
        space, config = own
        assert first.source is not None
        shared = [k for k in space if other is not None and k in other[1] and other[1][k] in space[k]]
        if other is None or not shared or all(config[k] == other[1][k] for k in shared):
            return self.mutate(first, own, "inherit")
        for _ in range(24):
            cfg = {
                k: (other[1][k] if k in shared and self.rng.random() < 0.5 else v) for k, v in config.items()
            }
            if cfg in (config, {**config, **{k: other[1][k] for k in shared}}):
                continue
            source = self.worth_trying(first.source, cfg)
            if source is not None:
                taken = [k for k in shared if cfg[k] != config[k]]
                return self.ok(source, f"crossover #{first.id} x #{second.id}: {', '.join(taken)} from #{second.id}",
                               f"uniform crossover of #{first.id} and #{second.id}: {tn.format_config(cfg)}")  # fmt: skip
        return self.mutate(first, own, "inherit")

    # -- search helpers ----------------------------------------------------------------------------

    def first_to_try(self, source: str, configs: Iterable[Config]) -> tuple[str, Config] | None:
        for cfg in configs:
            text = self.worth_trying(source, cfg)
            if text is not None:
                return text, cfg
        return None


def _random_configs(rng: random.Random, space: Space, config: Config) -> Iterator[Config]:
    """Random configurations: a few draws, then (in a shuffled order) every one, if countable."""
    for _ in range(64):
        yield {k: rng.choice(space[k]) for k in config}
    size = math.prod(len(v) for v in space.values())
    if size <= ENUMERATE_LIMIT:
        keys = list(config)
        combos = list(itertools.product(*(space[k] for k in keys)))
        rng.shuffle(combos)
        for combo in combos:
            yield dict(zip(keys, combo, strict=True))
    else:
        for _ in range(4096):
            yield {k: rng.choice(space[k]) for k in config}


# Which moves a diagnosis class favours: (tunable name fragment, direction along an ascending list).
# Triton templates name BLOCK/ROWS/num_warps/num_stages; the C templates threads/grain.
PRIORS: dict[str, tuple[tuple[str, int], ...]] = {
    "launch-bound": (("ROWS", 1), ("num_warps", -1), ("BLOCK", 1), ("grain", 1), ("threads", -1)),
    "memory-bound": (("BLOCK", 1), ("ROWS", 1), ("num_warps", 1), ("VEC", 1), ("threads", 1)),
    "latency-bound": (("num_stages", 1), ("BLOCK", 1), ("num_warps", 1)),
    "compute-bound": (("BLOCK_M", 1), ("BLOCK_N", 1), ("num_stages", 1), ("num_warps", 1)),
    "occupancy-limited": (("BLOCK", -1), ("num_warps", -1), ("num_stages", -1)),
}
PRIOR_WEIGHT = 3.0


def _prior(move: tuple[str, int], space: Space, klass: str) -> float:
    key, d = move
    choices = space[key]
    ordered = _numeric(choices) and choices == sorted(choices)
    if not ordered:
        return 1.0
    for fragment, direction in PRIORS.get(klass, ()):
        if fragment.lower() in key.lower() and d == direction:
            return PRIOR_WEIGHT
    return 1.0


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(c, int | float) and not isinstance(c, bool) for c in values)


def _skill_configs(task: Task, space: Space, config: Config) -> Iterator[tuple[Config, str]]:
    """Configurations that retrieved skills' changes give from `config`: the exact move where the
    skill's old value is this config's, else one step in the skill's direction."""
    for snip in task.knowledge:
        moved = (snip.data.get("change") or {}).get("tunables") or {}
        if not moved or not set(moved) <= set(space):
            continue
        cfg = dict(config)
        for key, (old, new) in moved.items():
            choices = space[key]
            if config[key] == old and new in choices:
                cfg[key] = new
            elif _numeric(choices) and _numeric([old, new]) and choices == sorted(choices):
                i = choices.index(config[key]) + (1 if new > old else -1)
                if 0 <= i < len(choices):
                    cfg[key] = choices[i]
        if cfg != config:
            yield cfg, snip.doc


def _single_moves(space: Space, config: Config) -> list[tuple[str, int]]:
    """Every one-step move: (key, direction) where the neighbouring choice exists."""
    moves = []
    for key, choices in space.items():
        i = choices.index(config[key])
        moves += [(key, d) for d in (-1, 1) if 0 <= i + d < len(choices)]
    return moves


def _apply(space: Space, config: Config, moves: list[tuple[str, int]]) -> Config:
    out = dict(config)
    for key, d in moves:
        choices = space[key]
        i = max(0, min(len(choices) - 1, choices.index(out[key]) + d))
        out[key] = choices[i]
    return out


def _weighted(rng: random.Random, items: list[Any], weights: list[float]) -> Any:
    return rng.choices(items, weights=weights, k=1)[0]


def _split_history(parent: NodeView, history: list[NodeView]) -> tuple[list[NodeView], list[NodeView]]:
    """(ancestors, siblings) of `parent` among the history: siblings share its parent (drafts, the
    roots, are each other's siblings)."""
    siblings = [n for n in history if n.parent == parent.parent and n.id != parent.id]
    sibling_ids = {n.id for n in siblings}
    return [n for n in history if n.id not in sibling_ids and n.id != parent.id], siblings


def _direction_scores(space: Space, nodes: list[NodeView]) -> dict[tuple[str, int], float]:
    """For each (tunable, direction), the summed fitness change of the steps along the lineage that
    moved it that way."""
    by_id = {n.id: n for n in nodes}
    scores: dict[tuple[str, int], float] = {}
    for child in nodes:
        before = by_id.get(child.parent) if child.parent is not None else None
        if before is None:
            continue
        a, b = _declared(before), _declared(child)
        if a is None or b is None:
            continue
        delta = (child.fitness if child.status == "ok" else 0.0) - before.fitness
        for key, choices in space.items():
            va, vb = a[1].get(key), b[1].get(key)
            if va != vb and va in choices and vb in choices:
                d = 1 if choices.index(vb) > choices.index(va) else -1
                scores[(key, d)] = scores.get((key, d), 0.0) + delta
    return scores


def _toward_best(
    space: Space, config: Config, parent: NodeView, siblings: list[NodeView]
) -> list[tuple[str, int]]:
    """Steps from `config` towards the configurations of siblings that beat the parent."""
    better = sorted(
        (s for s in siblings if s.status == "ok" and s.fitness > parent.fitness), key=lambda s: -s.fitness
    )[:3]
    moves: list[tuple[str, int]] = []
    for sib in better:
        declared = _declared(sib)
        if declared is None:
            continue
        for key, choices in space.items():
            value = declared[1].get(key)
            if value in choices and value != config[key]:
                move = (key, 1 if choices.index(value) > choices.index(config[key]) else -1)
                if move not in moves:
                    moves.append(move)
    return moves


__all__ = ["GENERATORS", "OfflineTuner", "templates_for"]
