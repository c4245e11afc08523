"""Memory modes: what an expansion remembers, and the schedule that picks the mode.

    draft    a new root: no parent, no history (the draft phase's independent samples)
    inherit  the parent's trajectory: its ancestors, closest first, with what each step changed and
             what it measured; a failed parent always gets `inherit` (debugging is this operator)
    compare  the parent's other children and the parent's siblings with their fates: what separated
             the fast from the slow
    combine  inherit and compare together
    fresh    the parent's kernel only, no history: to escape a stall

The schedule (`SearchConfig.schedule`, default inherit, compare, combine) is cycled by node id; after
`fresh_after` evaluated nodes without a new best, every `fresh_after`-th expansion is `fresh`.
"""

from __future__ import annotations

from kernelevolve.search.policies import SearchConfig
from kernelevolve.search.tree import Node, Tree

HISTORY_LIMIT = 8


def choose_mode(tree: Tree, parents: list[int], node_id: int, cfg: SearchConfig) -> str:
    if not parents:
        return "draft" if len(tree.nodes) <= cfg.draft else "fresh"
    if len(parents) == 1 and not tree[parents[0]].ok:
        return "inherit"
    stall = tree.stall(cfg.min_gain)
    if cfg.fresh_after and stall >= cfg.fresh_after and stall % cfg.fresh_after == 0:
        return "fresh"
    return cfg.schedule[node_id % len(cfg.schedule)]


def history(tree: Tree, parents: list[int], mode: str) -> list[Node]:
    """The nodes the mode shows besides the parents themselves."""
    if not parents or mode in ("draft", "fresh"):
        return []
    parent = parents[0]
    out: list[Node] = []
    if mode in ("inherit", "combine"):
        out.extend(tree.ancestors(parent, limit=HISTORY_LIMIT))
    if mode in ("compare", "combine"):
        peers = [tree[c] for c in tree[parent].children] + tree.siblings(parent)
        peers = [n for n in peers if n.state in ("evaluated", "failed") and n.id not in parents]
        peers.sort(key=lambda n: -n.fitness)
        out.extend(n for n in peers[:HISTORY_LIMIT] if n not in out)
    return out


__all__ = ["HISTORY_LIMIT", "choose_mode", "history"]
