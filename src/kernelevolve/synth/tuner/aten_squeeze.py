"""Elementwise graphs whose output has unit dims, mapped over the output with those dims dropped.

An elementwise template reads each tensor as the output's shape (`full`), one value per row (`row`),
one per column (`col`) or one value (`scalar`), rows and columns being the output's leading dims and
its last. Where the output has unit dims, that picture can miss a plain outer broadcast: KernelBench
2/75 adds a reduced value of shape [N, 1] to a bias of shape [1, C, 1, 1], an output of shape
[1, C, N, 1] whose last dim is 1. Dropping the output's unit dims gives [C, N], over which the bias
is one value per row and the reduced value one per column.

`UnitDimsMapper` maps such a graph as `GraphMapper` does; only where that is refused, it maps a
copy of the graph whose every value has its shape *projected*: right-aligned against the output,
the dims where the output is 1 dropped (in an elementwise graph every value broadcasts to the
output, so those dims are 1 in every value). The projected graph's output is the squeezed shape;
the graph's `out_view` views it back, and the generated wrapper computes over the squeezed shape
(`triton_common.prologue`). Memory is unchanged: a contiguous tensor's elements keep their order
when unit dims are dropped.

Deliberately not here: graphs with reductions, matmuls, convolutions or poolings (their ops take
dims that the projection would renumber), outputs without unit dims.
"""

from __future__ import annotations

from typing import Any

from kernelevolve.synth.tuner.aten_graph import StandIn, copy_graph, op_name
from kernelevolve.synth.tuner.aten_map import GraphMapper, Unsupported
from kernelevolve.synth.tuner.aten_reduce import _MAIN_OPS, _reduction
from kernelevolve.synth.tuner.aten_values import _unit_view
from kernelevolve.synth.tuner.ir import OpGraph


def _project(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...] | None:
    """`shape` right-aligned against `out`, the dims where `out` is 1 dropped; None where it does
    not broadcast so (a dim that is not 1 where `out` is)."""
    if len(shape) > len(out):
        return None
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    if any(o == 1 and d != 1 for d, o in zip(padded, out, strict=True)):
        return None
    return tuple(d for d, o in zip(padded, out, strict=True) if o != 1)


def _projected(gm: Any, out: tuple[int, ...]) -> StandIn:
    """A stand-in for `gm` whose graph is a copy with every read value's shape projected (see the
    module's docstring)."""
    import torch

    nodes = list(gm.graph.nodes)
    out_node = next(n for n in nodes if n.op == "output")
    body = [n for n in nodes if n.op not in ("placeholder", "output")]
    graph = copy_graph([n for n in nodes if n.op == "placeholder"], body, out_node.args[0])
    for node in graph.nodes:
        val = node.meta.get("val")
        if not hasattr(val, "shape") or isinstance(val, tuple | list) or not node.users:
            continue  # an unread input or parameter keeps its shape
        shape = _project(tuple(int(d) for d in val.shape), out)
        if shape is None:
            raise Unsupported(
                f"a value of shape {list(val.shape)} does not broadcast to the output {list(out)}"
            )
        node.meta = {**node.meta, "val": torch.empty(shape, dtype=val.dtype, device="meta")}
    return StandIn(graph, gm)


class UnitDimsMapper(GraphMapper):
    """`GraphMapper`, and where it refuses an output with unit dims, the same over the squeezed
    output (see the module's docstring)."""

    def __init__(self, gm: Any, sources: list[str], forward_args: list[str]):
        super().__init__(gm, sources, forward_args)
        self.args = (gm, sources, forward_args)

    def build(self, shape_name: str) -> OpGraph:
        try:
            return super().build(shape_name)
        except Unsupported as exc:
            whole = exc
        gm, sources, forward_args = self.args
        out = tuple(int(d) for d in self.out_nodes[0].meta["val"].shape)
        try:
            squeezed = GraphMapper(_projected(gm, out), sources, forward_args)
            graph = squeezed.build(shape_name)
        except Unsupported:
            raise whole from None
        if graph.pattern != "elementwise":
            raise whole
        graph.out_view = _unit_view(squeezed.o, out)
        return graph


def applies(gm: Any) -> bool:
    """Whether `gm` is an elementwise graph (nothing that takes dims) whose output has unit dims."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], list | tuple) else [out_node.args[0]]
    val: Any = getattr(outs[0], "meta", {}).get("val") if outs else None
    shape = tuple(getattr(val, "shape", ()))
    if 1 not in shape or len(shape) < 2:
        return False
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.users]
    taking_dims = {
        "cumsum",
        "cumprod",
        "flip",
        "cat",
        "select",
        "slice",
        "gather",
        "permute",
        "transpose",
        "t",
    }
    return not any(
        _reduction(n) is not None or op_name(n) in _MAIN_OPS or op_name(n) in taking_dims for n in nodes
    )


__all__ = ["UnitDimsMapper", "applies"]
