"""Which mapper maps a traced graph: the routing between the aten mappers.

`mapper_for(gm, sources, forward_args)` looks at a traced reference's reductions and returns the
mapper that understands them: the plain `GraphMapper` (elementwise graphs, reductions over the
output's last dim, losses), `aten_squeeze.UnitDimsMapper` (an elementwise output with unit dims:
an outer broadcast over the others), `aten_arg.ArgMapper` (argmax, argmin) or
`aten_reduce.ReduceMapper` (reductions over any dims and the norms). A graph with a reduction after
a matmul, convolution or pooling is refused here with the reason (a staged pipeline splits it first:
`stages.py`).

Its own module so that the mappers need not know each other: each imports what it builds on
(`aten_map`, `aten_reduce`), and only this one imports them all.
"""

from __future__ import annotations

from typing import Any

from kernelevolve.synth.tuner import aten_squeeze
from kernelevolve.synth.tuner.aten_arg import ArgMapper, is_arg
from kernelevolve.synth.tuner.aten_graph import op_name
from kernelevolve.synth.tuner.aten_map import GraphMapper, Unsupported
from kernelevolve.synth.tuner.aten_reduce import _MAIN_OPS, _PLAIN, ReduceMapper, _reduction, _shape


def mapper_for(gm: Any, sources: list[str], forward_args: list[str]) -> GraphMapper:
    """`GraphMapper` for graphs whose reductions are all over the output's last dim, and for those
    reduced to one value (a loss: `GraphMapper`'s `scalar` pattern, partial sums in a fixed order),
    `ReduceMapper` for the others."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.users]
    found = [(n, r) for n in nodes if (r := _reduction(n)) is not None]
    if not found:
        if aten_squeeze.applies(gm):  # an output with unit dims: an outer broadcast over the others
            return aten_squeeze.UnitDimsMapper(gm, sources, forward_args)
        return GraphMapper(gm, sources, forward_args)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], list | tuple) else [out_node.args[0]]
    if not outs or getattr(outs[0], "meta", {}).get("val") is None:
        return GraphMapper(gm, sources, forward_args)  # it says why
    arg = next((r for n, r in found if is_arg(n)), None)
    o = _shape(outs[0])
    if not o and arg is None:  # argmax over every dim gives one index, [] too
        return GraphMapper(gm, sources, forward_args)

    def plain(node: Any, r: tuple[tuple[int, ...], tuple[int, ...], int]) -> bool:
        d, dims, groups = r
        return (
            (op_name(node) in _PLAIN or op_name(node) == "native_layer_norm")
            and groups == 1
            and d == o
            and len(d) > 0
            and dims == (len(d) - 1,)
        )

    if all(plain(n, r) for n, r in found):
        return GraphMapper(gm, sources, forward_args)
    main = next((n for n in nodes if op_name(n) in _MAIN_OPS), None)
    if main is not None:
        m = op_name(main)
        what = "matmul" if m in ("mm", "addmm", "bmm") else "convolution" if m == "convolution" else "pooling"
        raise Unsupported(
            f"aten.{op_name(found[0][0])} with a {what} in the graph: only an elementwise epilogue is templated "
            f"after a {what}, and reductions are templated of the graph's inputs"
        )
    d, dims, groups = arg or found[0][1]
    return (ArgMapper if arg else ReduceMapper)(gm, sources, forward_args, d, dims, groups)


__all__ = ["mapper_for"]
