"""A run's nodes as a tree, rebuilt from the store's rows whenever the engine needs to decide.

The store is the truth (every node is written when created); this is a read-only view with the
queries selection and memory need: children, ancestors, siblings, and the best node under the
noise rule. Rebuilding from rows keeps concurrent expansions and resumed runs honest: there is no
second copy of the tree to drift.

The noise rule: a node becomes the new best only if its fitness beats the current best's by more
than the larger of the two measured spreads (and `min_gain`). Nodes are considered in id order, so
the best of a resumed run is the best it had before it was killed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kernelevolve import tunables
from kernelevolve.evaluate.verdict import best_baseline_label
from kernelevolve.synth.base import NodeView


@dataclass
class Node:
    id: int
    parent: int | None
    parent2: int | None
    mode: str
    state: str  # created | proposed | evaluated | failed
    status: str | None = None  # the verdict's status, or "exhausted"/"synth_error" for a failed node
    fitness: float = 0.0
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    source: str | None = None
    note: str = ""
    message: str = ""
    analysis: str = ""
    verdict: dict[str, Any] | None = None
    diagnosis: dict[str, Any] | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    synth_s: float = 0.0
    eval_s: float = 0.0
    candidate_hash: str | None = None
    children: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state == "evaluated" and self.status == "ok"

    @property
    def spread(self) -> float:
        return float((self.verdict or {}).get("spread") or 0.0)

    @property
    def config(self) -> dict[str, Any] | None:
        if not self.source:
            return None
        try:
            found = tunables.read(self.source)
        except tunables.TunablesError:
            return None
        return found[1] if found else None

    def view(self) -> NodeView:
        v = self.verdict or {}
        shapes = [
            {
                "name": s.get("name"),
                "correct": s.get("correct"),
                "time_us": (s.get("candidate") or {}).get("median_s", 0) * 1e6
                if s.get("candidate")
                else None,
                "speedup_vs_eager": s.get("speedup_vs_eager"),
                "speedup_vs_compile": s.get("speedup_vs_compile"),
                "best_baseline": s.get("best_baseline"),
                "speedup_vs_best": s.get("speedup_vs_best"),
                "roofline_fraction": s.get("roofline_fraction"),
                "bound": s.get("bound"),
                "failed_check": s.get("failed_check"),
                "max_abs_err": s.get("max_abs_err"),
                "max_rel_err": s.get("max_rel_err"),
            }
            for s in v.get("shapes", [])
        ]
        return NodeView(
            id=self.id, parent=self.parent, mode=self.mode, source=self.source, status=self.status,
            message=self.message, fitness=self.fitness, speedup_vs_eager=self.speedup_vs_eager,
            speedup_vs_compile=self.speedup_vs_compile, speedup_vs_best=v.get("speedup_vs_best"),
            best_baseline=best_baseline_label(s.get("best_baseline") for s in v.get("shapes", [])), spread=v.get("spread"),
            roofline_fraction=v.get("roofline_fraction"), shapes=shapes, diagnosis=self.diagnosis,
            config=self.config, note=self.note, analysis=self.analysis,
        )  # fmt: skip


class Tree:
    def __init__(self, nodes: Iterable[Node]):
        self.nodes: dict[int, Node] = {}
        for n in sorted(nodes, key=lambda n: n.id):
            n.children = []
            self.nodes[n.id] = n
        for n in self.nodes.values():
            if n.parent is not None and n.parent in self.nodes:
                self.nodes[n.parent].children.append(n.id)

    @classmethod
    def from_rows(cls, rows: Iterable[dict[str, Any]]) -> Tree:
        keys = Node.__dataclass_fields__.keys() - {"children"}
        return cls(Node(**{k: r[k] for k in keys if k in r}) for r in rows)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def evaluated(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.state == "evaluated"]

    def ok(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.ok]

    def ancestors(self, node_id: int, limit: int = 100) -> list[Node]:
        """Closest first, the node itself excluded."""
        out: list[Node] = []
        cur = self.nodes[node_id].parent
        while cur is not None and cur in self.nodes and len(out) < limit:
            out.append(self.nodes[cur])
            cur = self.nodes[cur].parent
        return out

    def depth(self, node_id: int) -> int:
        return len(self.ancestors(node_id))

    def siblings(self, node_id: int) -> list[Node]:
        """Other children of the node's parent (roots: other roots)."""
        parent = self.nodes[node_id].parent
        pool = self.nodes[parent].children if parent is not None else [
            n.id for n in self.nodes.values() if n.parent is None
        ]  # fmt: skip
        return [self.nodes[i] for i in pool if i != node_id]

    def exhausted_children(self, node_id: int) -> int:
        return sum(1 for c in self.nodes[node_id].children if self.nodes[c].status == "exhausted")

    def tried(self) -> set[str]:
        return {n.candidate_hash for n in self.nodes.values() if n.candidate_hash}

    def best(self, min_gain: float = 0.0) -> Node | None:
        """The best ok node under the noise rule (see the module docstring)."""
        best: Node | None = None
        for n in sorted(self.ok(), key=lambda n: n.id):
            if n.fitness <= 0:
                continue
            if best is None or n.fitness > best.fitness * (1 + max(n.spread, best.spread, min_gain)):
                best = n
        return best

    def stall(self, min_gain: float = 0.0) -> int:
        """Evaluated nodes since the current best was found (all of them if there is none)."""
        best = self.best(min_gain)
        return sum(1 for n in self.evaluated() if best is None or n.id > best.id)


__all__ = ["Node", "Tree"]
