"""argmax and argmin over a dim (or every dim) of a value, mapped onto an `arg` graph (see `ir.py`).

`aten_route.mapper_for` routes a traced graph with an `aten.argmax` or `aten.argmin` here.
`ArgMapper` is `aten_reduce.ReduceMapper` over the domain D (the shape of the value whose indices are
taken) with one more reduction, the index one: its result, one int64 index per kept position, is the
graph's one output (squeezed, kept with keepdim, or viewed with unit dims as torch has it).

The harness compares indices exactly, so the values compared must be torch's to the bit: a value
one ulp off changes the index between two values that close. Before the index reduction, an
elementwise prologue on float32 tensors that broadcast to D (argmax of x * 2 - b) is templated
only of ops that IEEE arithmetic rounds exactly as torch's do (`EXACT_OPS`: add, sub, mul, min,
max, abs, clamp, ...; not Triton's approximate division, square root or transcendentals); a
half-precision prologue (torch rounds each op to the half dtype, the template computes in fp32) and
values an earlier pipeline stage computed (a matmul's summation order, an intermediate kept in fp32)
are refused with that reason.

Deliberately not here: the index used as data (a gather, arithmetic on it: int64 values are not
carried through elementwise ops), max/min's indices (`torch.max(x, dim)` returns them unread only),
more than one reduction in the graph. They raise `Unsupported` with the reason.
"""

from __future__ import annotations

from typing import Any

from kernelevolve.synth.tuner.aten_graph import op_name
from kernelevolve.synth.tuner.aten_reduce import ReduceMapper, _named
from kernelevolve.synth.tuner.aten_values import Unsupported
from kernelevolve.synth.tuner.ir import ARG_OPS, ELEMENTWISE_OPS, OpGraph

# Elementwise ops that fp32 IEEE arithmetic in a Triton kernel rounds exactly as torch's (or that do
# not round): a prologue of these gives torch's values to the bit.
EXACT_OPS = {"add", "sub", "mul", "neg", "abs", "maximum", "minimum", "relu", "clamp", "where_gt0", "square"}


class ArgMapper(ReduceMapper):
    """`ReduceMapper` whose graph ends in one argmax or argmin: int64 output, pattern `arg`."""

    output_dtypes = ("int64",)
    output_layouts = ("row", "rowsq")

    def __init__(self, gm: Any, *args: Any):
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        out = out[0] if isinstance(out, list | tuple) and len(out) == 1 else out
        dtype = str(getattr(getattr(out, "meta", {}).get("val"), "dtype", "")).removeprefix("torch.")
        if dtype and dtype != "int64" and not isinstance(out, list | tuple):
            raise Unsupported(
                f"the index of an argmax or argmin used as data (a {dtype} output) is not templated: "
                "the arg template returns the int64 index itself"
            )
        super().__init__(gm, *args)

    def visit(self, node: Any) -> Any:
        name = op_name(node)
        if name not in ARG_OPS:
            return super().visit(node)
        a = _named(node)
        x = self.env.get(a["self"], a["self"])
        v = self.read(x)
        if v.layout not in ("full", "col") or v.shape != self.o:
            raise Unsupported(f"aten.{name} of a value of shape {list(v.shape)}, not {list(self.o)}")
        return self.reduced_value(name, v, bool(a.get("keepdim", False)))

    def build(self, shape_name: str) -> OpGraph:
        graph = super().build(shape_name)
        args = [op for op in graph.ops if op.op in ARG_OPS]
        others = [op for op in graph.ops if op.op not in ARG_OPS and op.op not in ELEMENTWISE_OPS]
        if len(args) != 1 or others:
            what = ", ".join(op.op for op in [*args[1:], *others])
            raise Unsupported(
                f"an argmax or argmin together with {what} is not templated (one index reduction)"
            )
        if graph.outputs != [args[0].out]:
            raise Unsupported(
                "the index of an argmax or argmin used as data is not templated (only returned)"
            )
        if self.reads_a_stage(graph):
            raise Unsupported(
                "an argmax or argmin of values an earlier stage computed is not templated: the harness "
                "compares indices exactly, and a stage's values (a matmul's summation order, an fp32 "
                "intermediate) need not be torch's to the bit"
            )
        prologue = [op for op in graph.ops if op.op not in ARG_OPS]
        if prologue and any(t.dtype != "float32" for t in graph.tensors):
            raise Unsupported(
                "an argmax or argmin of computed half-precision values is not templated: torch rounds "
                "each op to the half dtype, the template computes in fp32, and indices are compared exactly"
            )
        inexact = sorted({op.op for op in prologue} - EXACT_OPS)
        if inexact:
            raise Unsupported(
                f"an argmax or argmin of values computed with {', '.join(inexact)} is not templated: "
                "indices are compared exactly, and those ops may round otherwise than torch's"
            )
        graph.pattern = "arg"
        return graph

    def reads_a_stage(self, graph: OpGraph) -> bool:
        """Whether a tensor read is an earlier pipeline stage's result (`stages.py`: `_mid<j>`)."""
        args = self.forward_args
        return any(
            t.source.startswith("input:")
            and int(t.source[6:]) < len(args)
            and args[int(t.source[6:])].startswith("_mid")
            for t in graph.tensors
        )


def is_arg(node: Any) -> bool:
    return op_name(node) in ARG_OPS


__all__ = ["ArgMapper", "is_arg"]
