"""Constants that depend on the shape: a scale of 1/sqrt(head dim), traced at each of a spec's shapes.

A reference that computes a number from its inputs' sizes (`q @ k.T / math.sqrt(q.shape[-1])`,
scaled_dot_product_attention's default scale) traces to a different constant at every shape whose
size differs: one graph per shape, where a candidate is one file for all of them (the suites'
attention, head dims of 64 and 128, was refused for it). `unify` finds, for each constant that
differs, a size of one of the forward's arguments and a power that give it at every shape, and turns
the constant into a tensor of one value (`scalar` layout) that the candidate makes from that size at
each call, with the source `dim:<argument>:<dim>:<power>` (`dim_expr`). The templates read it as
they read any scalar tensor.

The powers tried are `POWERS`, each size's value computed in float64 and compared with the traced
constant to `REL_TOL` (SDPA's decomposition squares the square root of the scale: 1/8 traces as
0.12500000000000003). Where several sizes fit every shape, the first argument's last such dim is
taken: on every traced shape they give the same value.

Deliberately not here: constants that are other functions of the sizes (a product of two sizes, a
size times a constant), integer arguments (a view's sizes, a reduction's dims: those change the graph
itself), and a constant that is the same at every shape (kept as it is, inlined).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kernelevolve.synth.tuner.ir import Op, OpGraph, TensorArg, per_node

POWERS = (1.0, -1.0, 0.5, -0.5)
REL_TOL = 1e-9
PREFIX = "shape_c"  # the scalar tensors' names: shape_c0, shape_c1, ..


def dim_expr(source: str, args: Sequence[str]) -> str:
    """The wrapper's expression for a `dim:<i>:<d>:<power>` tensor: the size in float64 to the power,
    as a 0-d fp32 tensor on the first argument's device."""
    kind, _, rest = source.partition(":")
    if kind != "dim":
        raise ValueError(f"not a dim source: {source!r}")
    i, d, power = rest.split(":")
    if int(i) >= len(args) or not args:
        raise ValueError(f"a dim source reads forward argument {i}; forward has {len(args)}")
    size = f"float({args[int(i)]}.shape[{int(d)}])"
    return f"torch.full((), {size} ** {float(power)!r}, device={args[0]}.device, dtype=torch.float32)"


def unify(graphs: list[OpGraph], arg_shapes: list[list[tuple[int, ...] | None]]) -> list[OpGraph] | None:
    """`graphs` (one per shape, the forward's positional arguments' shapes beside each, None for an
    argument that is not a tensor) with every float constant that differs between them replaced by a
    scalar tensor computed from a size; None where they differ otherwise, or a differing constant
    fits no size at every shape."""
    if len(graphs) < 2:
        return graphs
    return per_node(graphs, lambda column: _unify_node(column, arg_shapes))


def _unify_node(nodes: list[OpGraph], arg_shapes: list[list[tuple[int, ...] | None]]) -> list[OpGraph] | None:
    """One graph (a pipeline's stage, or the graph itself) at every shape, its differing constants
    replaced; None where its ops differ otherwise or a constant fits no size."""
    first = nodes[0]
    if any(len(n.ops) != len(first.ops) for n in nodes):
        return None
    taken = {t.name for t in first.tensors} | {op.out for op in first.ops}
    made: dict[str, str] = {}  # a dim source -> its tensor's name
    new_ops: list[list[Op]] = [[] for _ in nodes]
    for j, op in enumerate(first.ops):
        mine = [n.ops[j] for n in nodes]
        if any(o.out != op.out or o.op != op.op or len(o.args) != len(op.args) for o in mine):
            return None
        args: list[Any] = list(op.args)
        for a, value in enumerate(op.args):
            values = [o.args[a] for o in mine]
            if all(v == value for v in values):
                continue
            numbers = [float(v) for v in values if _is_float(v)]  # type: ignore[arg-type]
            if len(numbers) != len(values):
                return None
            source = _fit(numbers, arg_shapes)
            if source is None:
                return None
            if source not in made:
                name = next(f"{PREFIX}{i}" for i in range(len(taken) + 1) if f"{PREFIX}{i}" not in taken)
                taken.add(name)
                made[source] = name
            args[a] = made[source]
        for k in range(len(nodes)):
            new_ops[k].append(replace(mine[k], args=tuple(args)))
    if not made:
        return nodes
    scalars = [TensorArg(name, source, "scalar") for source, name in made.items()]
    return [
        replace(n, ops=ops, tensors=[*n.tensors, *scalars]) for n, ops in zip(nodes, new_ops, strict=True)
    ]


def _is_float(v: Any) -> bool:
    return isinstance(v, float | int) and not isinstance(v, bool) and math.isfinite(v)


def _fit(values: list[float], arg_shapes: list[list[tuple[int, ...] | None]]) -> str | None:
    """The `dim:` source whose value is `values[s]` at every shape s, if one is."""
    for i, shape in enumerate(arg_shapes[0]):
        if shape is None:
            continue
        for d in reversed(range(len(shape))):
            for power in POWERS:
                if all(
                    _size_fits(v, shapes[i], d, power) for v, shapes in zip(values, arg_shapes, strict=True)
                ):
                    return f"dim:{i}:{d}:{power}"
    return None


def _size_fits(value: float, shape: tuple[int, ...] | None, d: int, power: float) -> bool:
    if shape is None or d >= len(shape) or shape[d] <= 0:
        return False
    return math.isclose(value, float(shape[d]) ** power, rel_tol=REL_TOL)


__all__ = ["POWERS", "PREFIX", "dim_expr", "unify"]
