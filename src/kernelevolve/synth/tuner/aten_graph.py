"""Rewritten copies of a traced graph, for mapping something other than the graph as traced.

`GraphMapper` reads a graph module's `.graph` and, for a constant the forward made (a get_attr
node), the traced module's attribute of that name. `StandIn` is such a module for a rewritten graph:
its own `.graph`, every other attribute looked up on the module it was made from. `copy_graph`
copies a graph's nodes (all of them, or a part with one value turned into an input) into a new fx
graph. `op_name` is a node's op as the rewrites and mappers match it. `stages.py` cuts a graph into a pipeline this way; `aten_squeeze.py` maps a copy whose
values have their shapes projected.

Deliberately not here: which nodes to copy or what to rewrite in them (the callers decide), and
anything that runs a graph.
"""

from __future__ import annotations

from typing import Any


class StandIn:
    """A graph module's stand-in for `GraphMapper`: `.graph`, and the traced module's attributes
    (the constants its get_attr nodes name) from `owner`."""

    def __init__(self, graph: Any, owner: Any = None):
        self.graph = graph
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or self._owner is None:
            raise AttributeError(name)
        return getattr(self._owner, name)


def op_name(node: Any) -> str:
    """An fx node's op without its namespace or overload ("bmm" for aten.bmm.default; a
    placeholder's or output's target as text)."""
    return str(getattr(node.target, "__name__", str(node.target))).split(".")[0]


def copy_graph(placeholders: list[Any], body: list[Any], output: Any, mid: Any = None) -> Any:
    """A new fx graph: every placeholder (so sources keep their positions), `mid` (a node of the
    original) as one more placeholder if given, the `body` nodes copied in order, and `output`.
    Each copied node has a copy of its original's meta (rewriting it leaves the original as it is)."""
    import torch.fx as fx

    g = fx.Graph()
    env: dict[Any, Any] = {}
    for p in placeholders:
        env[p] = g.node_copy(p)
    if mid is not None and output is not mid:
        env[mid] = g.placeholder("mid")
        env[mid].meta = dict(mid.meta)
    for n in body:
        if n is not mid or output is mid:
            env[n] = g.node_copy(n, lambda a: env[a])

    def remap(o: Any) -> Any:
        if isinstance(o, list | tuple):
            return type(o)(remap(x) for x in o)
        return env[o] if isinstance(o, fx.Node) else o

    g.output(remap(output))
    return g


__all__ = ["StandIn", "copy_graph", "op_name"]
