"""A reduction over merged dims is a reduction over the dims merged: rewrite it before mapping.

References flatten dims to reduce over them: `x.view(b, c, -1)` then `softmax(dim=2)` and a view
back to [b, c, d, h, w] (KernelBench 2/38), or `x.view(n, -1).sum(1)`. The templates address every
value row-major (contiguous), so a view that only merges consecutive dims changes no element's
place, and the reduction over a merged dim is the reduction over the dims it merges.
`split_merged_reductions(gm)` rewrites such a reduction of `view(y)` into the reduction of y itself
over y's dims, keepdim, viewed to the original result's shape; `_softmax` / `_log_softmax` (which
take one dim) become amax, sub, exp, sum and div (or log and sub), as the mappers expand them
anyway. The row templates then see one domain D (y's shape) with several reduced dims, which they
merge back for addressing (`triton_reduce`); the value viewed back to D is D's own
(`aten_reduce.ReduceMapper.view` keeps a full value's memory under any view of its size).

Deliberately not here: views that split a dim that is reduced only in part, reductions of a
transposed or permuted value (not a view), `var` and max/min with indices. Those are left as they
are, and the mappers refuse them with their reasons.
"""

from __future__ import annotations

from typing import Any

from kernelevolve.synth.tuner.aten_graph import op_name

_PLAIN = {"sum", "mean", "amax", "amin", "logsumexp"}
_SOFTMAX = {"_softmax", "_log_softmax"}
_VIEWS = {"view", "_unsafe_view", "reshape"}


def _groups(merged: tuple[int, ...], base: tuple[int, ...]) -> list[list[int]] | None:
    """Per dim of `merged`, the consecutive dims of `base` it merges (row-major); None where
    `merged` is not such a merge of `base`."""
    groups, j = [], 0
    for m in merged:
        group, size = [], 1
        while size < m and j < len(base):
            size *= base[j]
            group.append(j)
            j += 1
        if size != m:
            return None
        groups.append(group)
    return groups if all(d == 1 for d in base[j:]) else None


def _reduced(node: Any, rank: int) -> list[int]:
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dim is None or (isinstance(dim, list | tuple) and not dim):
        return list(range(rank))
    return sorted({int(d) % rank for d in ([dim] if isinstance(dim, int) else dim)})


def split_merged_reductions(gm: Any) -> Any:
    """`gm` with every reduction over merged dims of a view rewritten over the dims merged (in place)."""
    import torch

    aten = torch.ops.aten
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        name = op_name(node)
        if node.op != "call_function" or name not in _PLAIN | _SOFTMAX or not node.args:
            continue
        x = node.args[0]
        if (
            getattr(x, "op", None) != "call_function"
            or op_name(x) not in _VIEWS
            or not hasattr(x.args[0], "meta")
        ):
            continue
        y = x.args[0]
        yv, xv, out = y.meta.get("val"), x.meta.get("val"), node.meta.get("val")
        if not all(hasattr(v, "shape") for v in (yv, xv, out)) or node.kwargs.get("dtype") is not None:
            continue
        merged, base = tuple(xv.shape), tuple(yv.shape)
        groups = _groups(merged, base)
        if groups is None or merged == base:
            continue
        dims = sorted(d for r in _reduced(node, len(merged)) for d in groups[r])
        if not dims or (name in _SOFTMAX and bool(node.args[2] if len(node.args) > 2 else False)):
            continue

        def call(op: Any, *args: Any) -> Any:
            vals = [a.meta["val"] if hasattr(a, "meta") else a for a in args]
            new = graph.call_function(op, tuple(args))
            new.meta = {"val": op(*vals)}
            return new

        with graph.inserting_before(node):
            if name in _PLAIN:
                op = {"sum": aten.sum.dim_IntList, "mean": aten.mean.dim, "amax": aten.amax.default,
                      "amin": aten.amin.default, "logsumexp": aten.logsumexp.default}[name]  # fmt: skip
                result = call(op, y, dims, True)
            else:
                m = call(aten.amax.default, y, dims, True)
                d = call(aten.sub.Tensor, y, m)
                e = call(aten.exp.default, d)
                s = call(aten.sum.dim_IntList, e, dims, True)
                result = (
                    call(aten.div.Tensor, e, s)
                    if name == "_softmax"
                    else call(aten.sub.Tensor, d, call(aten.log.default, s))
                )
            view = call(aten.view.default, result, list(out.shape))
        node.replace_all_uses_with(view)
        graph.erase_node(node)
        if not x.users:
            graph.erase_node(x)
        changed = True
    if changed:
        graph.lint()
        gm.recompile()
    return gm


__all__ = ["split_merged_reductions"]
