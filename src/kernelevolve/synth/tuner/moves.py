"""The tuner's moves over declared tunables: from a parent's configuration (and what the tree says
about it) to the next configurations worth trying, best guess first.

A configuration is a `Config` over a `Space` (a candidate's `CONFIG` and `TUNABLES`,
`kernelevolve/tunables.py`); a `Move` is one step of one tunable, `(key, -1 | +1)`, to the
neighbouring choice in its declared list. The moves, each a generator the driver reads until it finds
a configuration it has not tried:
- `random_configs`: a few random draws, then every configuration in a shuffled order (sampled where
  the space is too large to count);
- `skill_configs`: what retrieved skills changed (`knowledge/skills.py`), applied to this config:
  verified improvements come before any guess;
- `mutation_plans`: 12 drawn plans of one or two moves, then every single move by weight, then every
  pair. A move's weight (`MoveWeights`) is its direction's fitness change along the lineage
  (`direction_scores`), times `PRIOR_WEIGHT` where the parent's diagnosis favours it (`PRIORS`);
  `compare` draws from the moves towards the fastest siblings (`toward_best`), `combine` one of those
  and one along the lineage;
- `more_precise_configs`: a parent that ran but failed the tolerance gets its precision knobs (a `DOT`
  of `tl.dot` precisions, PRECISION_ORDER) one step more precise first, all together, then singly;
- `smaller_configs`: a parent that needed more shared memory than a block has (Triton's
  `OutOfResources`) gets the failing kernel's pipeline one stage shorter, then each of its blocks
  one step smaller, largest first;
- `step_back_configs`: what a failed parent suggests: undo one tunable it changed from its own parent,
  alone, then with a neighbouring step;
- `crossover_configs`: uniform crossover of two parents over the tunables they share.

Every random choice draws from the generator the caller passes, in a fixed order, so a seed gives the
same configurations. Deliberately not here: sources, hashes and what the tree has tried (the driver's
bookkeeping, `driver.py`), and where the bases come from (`templates.py`). These functions only
compute with configurations and the nodes' declared values.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Iterator, Sequence
from typing import Any

from kernelevolve import tunables as tn
from kernelevolve.synth.base import NodeView, Snippet

Config = dict[str, Any]
Space = dict[str, list[Any]]
Move = tuple[str, int]  # (tunable, direction along its list of choices: -1 or +1)
Plan = tuple[list[Move], str]  # the moves to make together, and why, in words
ENUMERATE_LIMIT = 200_000  # larger spaces are sampled, not enumerated
DRAWN_PLANS = 12  # a mutation's random plans before its systematic ones
CROSSOVER_DRAWS = 24

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
# A product's precisions from least to most precise (the GEMM-shaped templates' DOT choices,
# `triton_common.DOT_CHOICES`, which list their default first): a tunable whose choices are all
# among them is a precision knob (`more_precise_configs`).
PRECISION_ORDER = ("bf16", "tf32", "tf32ra", "tf32r", "tf32x3", "ieee")


def declared(node: NodeView) -> tuple[Space, Config] | None:
    """A node's (TUNABLES, CONFIG), or None where its source declares none (or declares them badly).
    The config is the node's recorded one where that is a configuration of the declared space."""
    if not node.source:
        return None
    try:
        found = tn.read(node.source)
    except tn.TunablesError:
        return None
    if found is None:
        return None
    space, config = found
    if node.config and set(node.config) == set(space) and all(node.config[k] in space[k] for k in space):
        config = dict(node.config)
    return space, config


# -- random configurations -----------------------------------------------------------------------------


def random_configs(rng: random.Random, space: Space, config: Config) -> Iterator[Config]:
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


# -- single steps ----------------------------------------------------------------------------------------


def single_moves(space: Space, config: Config) -> list[Move]:
    """Every one-step move: (key, direction) where the neighbouring choice exists."""
    moves = []
    for key, choices in space.items():
        i = choices.index(config[key])
        moves += [(key, d) for d in (-1, 1) if 0 <= i + d < len(choices)]
    return moves


def apply(space: Space, config: Config, moves: Sequence[Move]) -> Config:
    out = dict(config)
    for key, d in moves:
        choices = space[key]
        i = max(0, min(len(choices) - 1, choices.index(out[key]) + d))
        out[key] = choices[i]
    return out


def skill_configs(knowledge: Sequence[Snippet], space: Space, config: Config) -> Iterator[tuple[Config, str]]:
    """Configurations that retrieved skills' changes give from `config`: the exact move where the
    skill's old value is this config's, else one step in the skill's direction."""
    for snip in knowledge:
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


# -- what the tree says about a parent -------------------------------------------------------------------


def split_history(parent: NodeView, history: Sequence[NodeView]) -> tuple[list[NodeView], list[NodeView]]:
    """(ancestors, siblings) of `parent` among the history: siblings share its parent (drafts, the
    roots, are each other's siblings)."""
    siblings = [n for n in history if n.parent == parent.parent and n.id != parent.id]
    sibling_ids = {n.id for n in siblings}
    return [n for n in history if n.id not in sibling_ids and n.id != parent.id], siblings


def direction_scores(space: Space, nodes: Sequence[NodeView]) -> dict[Move, float]:
    """For each (tunable, direction), the summed fitness change of the steps along the lineage that
    moved it that way."""
    by_id = {n.id: n for n in nodes}
    scores: dict[Move, float] = {}
    for child in nodes:
        before = by_id.get(child.parent) if child.parent is not None else None
        if before is None:
            continue
        a, b = declared(before), declared(child)
        if a is None or b is None:
            continue
        delta = (child.fitness if child.status == "ok" else 0.0) - before.fitness
        for key, choices in space.items():
            va, vb = a[1].get(key), b[1].get(key)
            if va != vb and va in choices and vb in choices:
                d = 1 if choices.index(vb) > choices.index(va) else -1
                scores[(key, d)] = scores.get((key, d), 0.0) + delta
    return scores


def toward_best(space: Space, config: Config, parent: NodeView, siblings: Sequence[NodeView]) -> list[Move]:
    """Steps from `config` towards the configurations of siblings that beat the parent."""
    better = sorted(
        (s for s in siblings if s.status == "ok" and s.fitness > parent.fitness), key=lambda s: -s.fitness
    )[:3]
    moves: list[Move] = []
    for sib in better:
        found = declared(sib)
        if found is None:
            continue
        for key, choices in space.items():
            value = found[1].get(key)
            if value in choices and value != config[key]:
                move = (key, 1 if choices.index(value) > choices.index(config[key]) else -1)
                if move not in moves:
                    moves.append(move)
    return moves


def prior(move: Move, space: Space, klass: str) -> float:
    """PRIOR_WEIGHT where the diagnosis class `klass` favours `move` on an ascending numeric list,
    else 1."""
    key, d = move
    choices = space[key]
    ordered = _numeric(choices) and choices == sorted(choices)
    if not ordered:
        return 1.0
    for fragment, direction in PRIORS.get(klass, ()):
        if fragment.lower() in key.lower() and d == direction:
            return PRIOR_WEIGHT
    return 1.0


class MoveWeights:
    """How much a mutation favours each move, relative to the largest fitness change seen: up to 9x
    for the best direction so far, 1/4 for directions that made things worse; times PRIOR_WEIGHT where
    the parent's diagnosis favours the move. Called on a move, it gives the move's weight."""

    def __init__(self, space: Space, scores: dict[Move, float], parent: NodeView):
        self.space = space
        self.scores = scores
        self.scale = max((abs(v) for v in scores.values()), default=0.0) or 1.0
        self.klass = str((parent.diagnosis or {}).get("class") or "")

    def __call__(self, move: Move) -> float:
        score = self.scores.get(move, 0.0) / self.scale
        base = 1.0 + 8.0 * score if score >= 0 else 0.25
        return base * prior(move, self.space, self.klass)


# -- mutations -------------------------------------------------------------------------------------------


def pick(rng: random.Random, pool: Sequence[Move], n: int, chosen: Sequence[Move],
         weight: MoveWeights | None) -> list[Move]:  # fmt: skip
    """`chosen` and up to `n` more moves from `pool`, one draw each, on tunables not yet chosen,
    by `weight` (uniform where None)."""
    out = list(chosen)
    for _ in range(n):
        taken = {c[0] for c in out}
        left = [m for m in pool if m[0] not in taken]
        if left:
            out.append(_weighted(rng, left, [weight(m) if weight is not None else 1.0 for m in left]))
    return out


def drawn_plan(
    rng: random.Random, space: Space, mode: str, moves: list[Move], toward: list[Move], weight: MoveWeights
) -> Plan:
    """One random plan of one or two moves: towards the fastest siblings (`compare`), one of those
    and one along the lineage (`combine`), else along the lineage by weight."""
    # drawn in every mode, combine's too (which takes one of each): a seed's draws stay in one order
    n = 1 if len(space) == 1 else rng.choice((1, 2))
    if toward and mode == "compare":
        return pick(rng, toward, n, [], None), "towards the fastest siblings"
    if toward and mode == "combine":
        chosen = pick(rng, toward, 1, [], None)
        return pick(rng, moves, 1, chosen, weight), "towards the fastest sibling, and along the lineage"
    why = "along the lineage" if weight.scores else "a neighbouring step"
    return pick(rng, moves, n, [], weight), why


def mutation_plans(
    rng: random.Random, space: Space, mode: str, moves: list[Move], toward: list[Move], weight: MoveWeights
) -> Iterator[Plan]:
    """The plans a mutation tries in order: DRAWN_PLANS random ones (`drawn_plan`), then every single
    step, best weight first, then every pair of steps on two tunables. Drawn lazily: the caller stops
    at the first plan that gives an untried configuration."""
    for _ in range(DRAWN_PLANS):
        yield drawn_plan(rng, space, mode, moves, toward, weight)
    for move in sorted(moves, key=weight, reverse=True):
        yield [move], "a neighbouring step"
    for a, b in itertools.combinations(moves, 2):
        if a[0] != b[0]:
            yield [a, b], "two neighbouring steps"


# -- what a failure suggests, and crossover --------------------------------------------------------------


def more_precise_configs(space: Space, config: Config) -> Iterator[Config]:
    """For a parent whose output was outside the tolerance: every precision knob (PRECISION_ORDER)
    moved to the next more precise choice it offers, all at once (a pipeline's products each add
    their error: the suites' fm_interaction, two truncating TF32 GEMMs, was 1.5e-3 off with neither
    rounded and 1.15e-3 with one), then one knob at a time (cheaper, where one suffices)."""
    steps = {}
    for key, choices in space.items():
        if not all(isinstance(c, str) and c in PRECISION_ORDER for c in choices):
            continue
        rank = PRECISION_ORDER.index(config[key])
        finer = [c for c in choices if PRECISION_ORDER.index(c) > rank]
        if finer:
            steps[key] = min(finer, key=PRECISION_ORDER.index)
    if len(steps) > 1:
        yield {**config, **steps}
    for key, value in steps.items():
        yield {**config, key: value}


# Triton's compile error for a kernel whose shared memory is above the block's limit, as the harness
# reports it with the line of the candidate that launched it ("(candidate line 139)").
SMEM_FAILURE = re.compile(r"out of resource: shared memory, Required: (\d+), Hardware limit: (\d+)")
_LAUNCH_LINE = re.compile(r"\(candidate line (\d+)\)")
_STAGE_FUNCTION = re.compile(r"^\s*def _stage(\d+)\(")


def failing_prefix(message: str, source: str) -> str | None:
    """For a pipeline's candidate whose kernel ran out of shared memory, the knob prefix (`s<k>_`) of
    the stage whose function launched it (the `_stage<k>` the message's candidate line is in); ""
    for a kernel of no stage; None where the message is not a shared-memory failure."""
    if not SMEM_FAILURE.search(message):
        return None
    line = _LAUNCH_LINE.search(message)
    if line is None:
        return ""
    lines = source.splitlines()[: int(line.group(1))]
    stage = next((m.group(1) for text in reversed(lines) if (m := _STAGE_FUNCTION.match(text))), None)
    return "" if stage is None else f"s{stage}_"


def smaller_configs(space: Space, config: Config, prefix: str = "") -> Iterator[Config]:
    """For a parent that needed more shared memory than a block has: the kernel's (the knobs that
    start with `prefix`) num_stages one choice lower, then each BLOCK knob one choice lower, the
    largest block first, then both together. The flash kernel's SMEM fits no formula the tuner could
    check before compiling (issue K: 34 of the suites' attention candidates failed so at head dim
    128 in one run); a shared-memory failure then costs a node but points at its neighbour that fits."""

    def lower(key: str) -> Any:
        choices = space[key]
        if not _numeric(choices):
            return None
        below = [c for c in choices if c < config[key]]
        return max(below) if below else None

    mine = [k for k in space if k.startswith(prefix) and k in config]
    stages = [k for k in mine if k.endswith("num_stages") and lower(k) is not None]
    blocks = sorted(
        (k for k in mine if k.removeprefix(prefix).startswith("BLOCK") and lower(k) is not None),
        key=lambda k: -config[k],
    )
    for key in stages + blocks:
        yield {**config, key: lower(key)}
    for st in stages:
        for key in blocks:
            yield {**config, st: lower(st), key: lower(key)}


def step_back_configs(rng: random.Random, space: Space, config: Config, before: Config) -> Iterator[Config]:
    """From a failed node's `config` back towards its parent's (`before`): one tunable that changed
    reverted (in a random order of tunables), first alone, then with each neighbouring step in a
    random order."""
    undo = [k for k in space if config.get(k) != before.get(k)]
    rng.shuffle(undo)
    for key in undo:
        reverted = {**config, key: before[key]}
        steps = single_moves(space, reverted)
        for move in [None, *rng.sample(steps, len(steps))]:
            yield reverted if move is None else apply(space, reverted, [move])


def shared_tunables(space: Space, other: Config) -> list[str]:
    """The tunables of `space` whose value in another parent's config is one of its choices."""
    return [k for k in space if k in other and other[k] in space[k]]


def crossover_configs(
    rng: random.Random, config: Config, other: Config, shared: Sequence[str]
) -> Iterator[Config]:
    """Uniform crossover: each shared tunable from `other` with probability 1/2, CROSSOVER_DRAWS
    draws, leaving out the draws that are all one parent's."""
    for _ in range(CROSSOVER_DRAWS):
        cfg = {k: (other[k] if k in shared and rng.random() < 0.5 else v) for k, v in config.items()}
        if cfg in (config, {**config, **{k: other[k] for k in shared}}):
            continue
        yield cfg


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(c, int | float) and not isinstance(c, bool) for c in values)


def _weighted(rng: random.Random, items: list[Any], weights: list[float]) -> Any:
    return rng.choices(items, weights=weights, k=1)[0]


__all__ = [
    "ENUMERATE_LIMIT",
    "PRIORS",
    "PRIOR_WEIGHT",
    "Config",
    "Move",
    "MoveWeights",
    "Space",
    "apply",
    "crossover_configs",
    "declared",
    "direction_scores",
    "failing_prefix",
    "mutation_plans",
    "prior",
    "random_configs",
    "shared_tunables",
    "single_moves",
    "skill_configs",
    "smaller_configs",
    "split_history",
    "step_back_configs",
    "toward_best",
]
