"""Views whose sizes depend on the shape: attention's q, k and v read out of a packed projection.

A reference that splits a projection's output into heads (`qkv.view(b, s, 3, heads, d // heads)
.permute(2, 0, 3, 1, 4)`, the suites' sdpa_mlp_block) reads its operands as permuted views of an
intermediate (`aten_mask.materialize`: `strided:<sizes>:<strides>:<offset>:<root>`), and reshapes
the heads' output back (`reshape:<sizes>:<source>`). The traced sizes, strides and offsets are
numbers, so each of a spec's shapes gives another graph, where a candidate is one file for all of
them: the head count is a constructor argument, and the projection's width differs per shape.

`unify` rewrites each such source that differs between the shapes into one whose numbers are
expressions of the root's sizes, which the wrapper reads at each call (`expr`): the root is traced
contiguous from its start, and an intermediate reaches its stage in the traced shape
(`stages.py`), so its sizes at run time are the traced ones. `materialize` records the root's
traced sizes for this (`shaped:<sizes>:<root>`, read as the root itself by the wrapper); a unified
source drops them.

Each number is fitted on its values at every shape (`_fit`), inner dims first, first as one of the
root's sizes (`r<i>`), then as the same number at every shape, then as a product of root sizes (`r1*r2`), then
as such a product times a fraction that is the same at every shape (`r2//192` for the head count
at a head size of 64, `r2*2//3` for v's offset in the packed row), fewest sizes first. A view's
size is fitted only to the root dim its stride lies in and the dims outside it (`_within`). The harness checks a candidate at
every shape of the spec; a size the spec never traced may give a view that does not exist, which
`torch.as_strided` refuses at run time (it checks the root's storage).

Deliberately not here: slices (`slice:`) and broadcasts (`expand:`) whose bounds depend on the shape
(MinGPT's mask buffer sliced to the sequence), and numbers that fit none of these forms.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import replace
from fractions import Fraction

from kernelevolve.synth.tuner.ir import OpGraph, TensorArg, per_node

_SIZE = re.compile(r"r(\d+)")


def unify(graphs: list[OpGraph]) -> list[OpGraph]:
    """`graphs` (one per shape) with every view source that differs between them replaced by one
    whose numbers are expressions of its root's sizes, where each number fits; the others as they
    are (the caller compares the graphs and refuses those that still differ)."""
    if len(graphs) < 2:
        return graphs
    return per_node(graphs, _unify_node) or graphs


def _unify_node(nodes: list[OpGraph]) -> list[OpGraph]:
    first = nodes[0]
    if any(len(n.tensors) != len(first.tensors) for n in nodes):
        return nodes
    tensors: list[list[TensorArg]] = [list(n.tensors) for n in nodes]
    changed = False
    for j, t in enumerate(first.tensors):
        sources = [n.tensors[j].source for n in nodes]
        if all(s == t.source for s in sources) or any(n.tensors[j].name != t.name for n in nodes):
            continue
        unified = _unify_source(sources)
        if unified is None:
            continue
        changed = True
        for k in range(len(nodes)):
            tensors[k][j] = replace(tensors[k][j], source=unified)
    if not changed:
        return nodes
    return [replace(n, tensors=ts) for n, ts in zip(nodes, tensors, strict=True)]


def _unify_source(sources: list[str]) -> str | None:
    """One source for a view traced as `sources` (one per shape), or None where they are not views
    of one root or a number fits no expression."""
    kinds = {s.partition(":")[0] for s in sources}
    found = [_root_sizes(s) for s in sources]
    roots = [r for r in found if r is not None]
    if len(roots) != len(sources) or len({len(r) for r in roots}) != 1:
        return None
    if kinds == {"reshape"}:
        parts = [s.split(":", 2) for s in sources]  # reshape, sizes, inner
        inner = _unify_source([p[2] for p in parts])
        fitted = _fit_all([_ints(p[1]) for p in parts], roots)
        return None if inner is None or fitted is None else f"reshape:{fitted}:{inner}"
    if kinds != {"strided"}:
        return None
    parts = [s.split(":", 4) for s in sources]  # strided, sizes, strides, offset, root
    root = {_strip_shaped(p[4]) for p in parts}
    if len(root) != 1:
        return None
    sizes = [_ints(p[1]) for p in parts]
    fields = [_fit_all(sizes, roots, _within(sizes[0], _ints(parts[0][2]), roots[0]))]
    fields += [_fit_all([_ints(p[f]) for p in parts], roots) for f in (2, 3)]
    if any(f is None for f in fields):
        return None
    return f"strided:{fields[0]}:{fields[1]}:{fields[2]}:{root.pop()}"


def _within(sizes: tuple[int, ...], strides: tuple[int, ...], root: tuple[int, ...]) -> list[int | None]:
    """For each dim of a view, the root's innermost dim it lies in (its stride within that dim's
    span of the contiguous root), None for a dim of one or a broadcast: a view's size is a part of
    that dim and the dims outside it, never of the dims inside it."""
    spans, step = [], 1
    for size in reversed(root):
        spans.append((step, step * size))
        step *= size
    spans.reverse()
    out: list[int | None] = []
    for size, stride in zip(sizes, strides, strict=True):
        i = next((i for i, (lo, hi) in enumerate(spans) if size > 1 and lo <= stride < hi), None)
        out.append(i)
    return out


def _root_sizes(source: str) -> tuple[int, ...] | None:
    """The traced sizes of a view source's root (`shaped:`), None where they were not recorded."""
    kind, _, rest = source.partition(":")
    if kind == "reshape":
        return _root_sizes(rest.split(":", 1)[1])
    if kind == "strided":
        return _root_sizes(rest.split(":", 3)[3])
    if kind == "shaped":
        return _ints(rest.partition(":")[0])
    return None


def _strip_shaped(source: str) -> str:
    return source.split(":", 2)[2] if source.startswith("shaped:") else source


def _ints(csv: str) -> tuple[int, ...]:
    return tuple(int(v) for v in csv.split(","))


def _fit_all(
    values: list[tuple[int, ...]], roots: list[tuple[int, ...]], within: list[int | None] | None = None
) -> str | None:
    """Each position of `values` (a tuple per shape) fitted, as comma-separated expressions;
    `within[j]`, where given, the root's innermost dim position j may be made of (`_within`)."""
    if len({len(v) for v in values}) != 1:
        return None
    out = []
    for j, column in enumerate(zip(*values, strict=True)):
        inner = within[j] if within is not None else None
        fitted = _fit(list(column), roots, len(roots[0]) if inner is None else inner + 1)
        if fitted is None:
            return None
        out.append(fitted)
    return ",".join(out)


def _fit(values: list[int], roots: list[tuple[int, ...]], outer: int | None = None) -> str | None:
    """An expression of the root's sizes (its first `outer` dims, all by default) that is `values[s]`
    at every shape s, if one is. Inner dims are tried first: two shapes can make a head count twice
    the batch as well as a 24th of the packed width."""
    rank = len(roots[0]) if outer is None else outer
    for i in reversed(range(rank)):
        if all(v == r[i] for v, r in zip(values, roots, strict=True)):
            return f"r{i}"
    if len(set(values)) == 1:
        return str(values[0])
    subsets = _subsets(rank)
    ratios = [_ratio(values, roots, dims) for dims in subsets]
    for want_one in (True, False):  # a product of sizes before a product times a constant
        for subset, ratio in zip(subsets, ratios, strict=True):
            if ratio is None or (ratio == 1) != want_one:
                continue
            text = "*".join(f"r{i}" for i in subset)
            text += f"*{ratio.numerator}" if ratio.numerator != 1 else ""
            return text + (f"//{ratio.denominator}" if ratio.denominator != 1 else "")
    return None


def _subsets(rank: int) -> list[tuple[int, ...]]:
    """The root's first `rank` dims taken 1, 2, .. at a time, inner dims first."""
    return [
        tuple(sorted(dims))
        for n in range(1, rank + 1)
        for dims in itertools.combinations(reversed(range(rank)), n)
    ]


def _ratio(values: list[int], roots: list[tuple[int, ...]], dims: tuple[int, ...]) -> Fraction | None:
    """The positive fraction that `values[s]` is of the product of `dims`' sizes at every shape s, if
    it is the same at all of them."""
    products = [math.prod(r[i] for i in dims) for r in roots]
    if any(p <= 0 for p in products):
        return None
    ratios = {Fraction(v, p) for v, p in zip(values, products, strict=True)}
    ratio = ratios.pop() if len(ratios) == 1 else None
    return ratio if ratio is not None and ratio > 0 else None


def expr(field: str, root: str) -> str:
    """The Python expression for one fitted number: its `r<i>` read from `root`'s sizes at the call."""
    return _SIZE.sub(lambda m: f"{root}.shape[{int(m.group(1))}]", field)


__all__ = ["expr", "unify"]
