"""argmax and argmin over a dim (or every dim) of a value, mapped onto an `arg` graph (see `ir.py`).

`aten_reduce.mapper_for` routes a traced graph with an `aten.argmax` or `aten.argmin` here.
`ArgMapper` is `aten_reduce.ReduceMapper` over the domain D (the shape of the value whose indices are
taken) with one more reduction, the index one: its result, one int64 index per kept position, is the
graph's one output (squeezed, kept with keepdim, or viewed with unit dims as torch has it). Before it,
an elementwise prologue on tensors that broadcast to D (argmax of x * 2 - b) is mapped as any row
graph's; the template (`triton_arg.py`) computes it in fp32, which can pick another index than torch's
half-precision arithmetic where two values round together, so a prologue is templated on float32
tensors only, and so is a half-precision value an earlier pipeline stage computed (the harness compares indices exactly; a float32 prologue's transcendental ops may
still differ from torch's by an ulp, which changes an index only between values that close).

Deliberately not here: the index used as data (a gather, arithmetic on it: int64 values are not
carried through elementwise ops), max/min's indices (`torch.max(x, dim)` returns them unread only),
more than one reduction in the graph. They raise `Unsupported` with the reason.
"""

from __future__ import annotations

from typing import Any

from kernelevolve.synth.tuner.aten_reduce import ReduceMapper, _name, _named
from kernelevolve.synth.tuner.aten_values import Unsupported
from kernelevolve.synth.tuner.ir import ARG_OPS, ELEMENTWISE_OPS, OpGraph


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
        name = _name(node)
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
        if any(t.dtype != "float32" for t in graph.tensors) and (
            len(graph.ops) > 1 or self.reads_a_stage(graph)
        ):
            raise Unsupported(
                "an argmax or argmin of computed half-precision values is not templated: torch rounds "
                "each op to the half dtype, the template computes in fp32, and indices are compared exactly"
            )
        graph.pattern = "arg"
        return graph

    def reads_a_stage(self, graph: OpGraph) -> bool:
        """Whether a tensor read is an earlier pipeline stage's result (`stages.py`: `_mid<j>`),
        which the stage stores in fp32 where torch rounded it to the reference's dtype."""
        args = self.forward_args
        return any(
            t.source.startswith("input:")
            and int(t.source[6:]) < len(args)
            and args[int(t.source[6:])].startswith("_mid")
            for t in graph.tensors
        )


def is_arg(node: Any) -> bool:
    return _name(node) in ARG_OPS


__all__ = ["ArgMapper", "is_arg"]
