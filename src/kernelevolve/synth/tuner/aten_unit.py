"""Reductions over size-1 dims are copies: rewrite them as views before a traced graph is mapped.

A reference often reduces a value that an earlier reduction already kept with keepdim (KernelBench's
`x.sum(dim=1, keepdim=True)` followed by `max`, `mean` and two `logsumexp` over the same dim, each of
one value). Mapped as reductions, each is a reduction of a reduced value, a pipeline stage of its own;
yet over size-1 dims `sum`, `mean`, `amax`, `amin`, `max`/`min` (the values, their indices unread) and
`logsumexp` return their input exactly (logsumexp of one value x is log(exp(x - x)) + x = x, and
torch gives +-inf and NaN back unchanged too). `drop_unit_reductions(gm)` replaces each such node by
an `aten.view` of its input to the result's shape, so the mappers see a view, which every template
reads as the same memory.

Deliberately not here: `var` (its correction makes 0 / 0 of one value), `softmax` (1, not x), any
reduction with a `dtype` argument or a result of another dtype than its input (int sums), and
`max`/`min` whose indices are read. Those are left as they are.
"""

from __future__ import annotations

from typing import Any

from kernelevolve.synth.tuner.aten_graph import op_name

_COPIES = {"sum", "mean", "amax", "amin", "logsumexp", "max", "min"}


def _unit_dims(node: Any) -> bool:
    """Whether `node` reduces its float input over dims that all have size 1."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not node.args or not hasattr(node.args[0], "meta"):
        return False
    named = {**dict(zip([a.name for a in schema.arguments], node.args, strict=False)), **node.kwargs}
    x = node.args[0].meta.get("val")
    if (
        x is None
        or not hasattr(x, "shape")
        or not x.dtype.is_floating_point
        or named.get("dtype") is not None
    ):
        return False
    dim = named.get("dim")
    if op_name(node) in ("max", "min") and not isinstance(dim, int):
        return False  # max(x) over every dim returns one value; max(x, y) is elementwise
    rank = len(x.shape)
    dims = range(rank) if dim is None or (isinstance(dim, list | tuple) and not dim) else (
        [dim] if isinstance(dim, int) else list(dim)
    )  # fmt: skip
    return rank > 0 and all(int(x.shape[int(d) % rank]) == 1 for d in dims)


def drop_unit_reductions(gm: Any) -> Any:
    """`gm` with every reduction over size-1 dims replaced by a view of its input (in place)."""
    import operator

    import torch

    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or op_name(node) not in _COPIES or not _unit_dims(node):
            continue
        val = node.meta.get("val")
        pair = isinstance(val, tuple | list)  # max/min: (values, indices)
        out = val[0] if pair else val
        if out is None or out.dtype != node.args[0].meta["val"].dtype:
            continue
        users = list(node.users)
        if pair and not all(u.target is operator.getitem and (u.args[1] == 0 or not u.users) for u in users):
            continue  # the indices are read
        with graph.inserting_after(node):
            view = graph.call_function(torch.ops.aten.view.default, (node.args[0], list(out.shape)))
        view.meta = {"val": out}
        if pair:
            for u in users:
                if u.args[1] == 0:
                    u.replace_all_uses_with(view)
                graph.erase_node(u)
        else:
            node.replace_all_uses_with(view)
        graph.erase_node(node)
        changed = True
    if changed:
        graph.lint()
        gm.recompile()
    return gm


__all__ = ["drop_unit_reductions"]
