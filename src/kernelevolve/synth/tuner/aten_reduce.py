"""Reductions over any dims, and the norms built from them, mapped onto a `row` graph with a
`ReduceInfo` (see `ir.py`).

`aten_route.mapper_for(gm, ...)` scans a traced graph first. Where every reduction is over the last
dim of a value of the output's shape (softmax, layer norm over one dim, ...), the plain `GraphMapper`
maps it as before. Otherwise `ReduceMapper` does, over a *domain* D, the shape of the value reduced (an
input's or an intermediate's; outputs are D-shaped or one value per row):

- plain reductions (`sum`, `mean`, `amax`, `amin`, `max`/`min` with their indices unread, `var`,
  `var_mean`, `_softmax`, `_log_softmax`, `logsumexp`, `linalg_vector_norm` with p = 2, 1, inf,
  -inf or another p > 0) over any dims of D, all dims included (the Frobenius norm, a mean loss);
- `native_layer_norm` over several trailing dims;
- `native_group_norm`: dim 1 of D viewed as (groups, C / groups), rows are (n, group), cols the
  group's channels and spatial positions, the affine per channel;
- batch norm (`native_batch_norm`, `_native_batch_norm_legit*`): in training mode statistics per
  channel over N and the spatial dims (biased variance); in eval mode the running statistics, per
  channel; instance norm arrives as a training batch norm of x viewed as [1, N * C, *S] and is mapped
  as statistics per (n, c) over the spatial dims.

Every reduction of a graph must run over the same dims of the same D. A value reduced with keepdim
(its shape D with the reduced dims 1) broadcasts back like any tensor; one reduced without keepdim
(`rowsq` here) is used as is or reshaped, never broadcast (torch would align it differently).
Tensors read are placed by torch's right-aligned broadcast against D, except the per-channel
parameters of the norms, which are per channel by definition.

Batch norm's buffer updates (the running mean and variance, `num_batches_tracked += 1`) are not
computed: the harness compares the forward's outputs only (`evaluate/prepared.forward_backward`),
and in training mode the output does not read the running statistics, so a candidate that leaves its
buffers unchanged returns the same outputs. Nodes whose only use is a `copy_` into a module buffer
are skipped for that reason.

Why one module (over 450 lines): `ReduceMapper` and the norms it maps
share one picture of D, its kept and reduced dims and where each tensor sits in it; split, each
part would restate it.

Deliberately not here: two reductions over different dims in one graph (a norm followed by a mean
over other dims), reductions after a matmul, convolution or pooling (a staged pipeline's business:
a later stage sees the intermediate as a plain input), group norm's dims with a reduction of its own,
cumulative ops. argmax and argmin are `aten_arg`'s. They raise `Unsupported` with the reason.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from kernelevolve.synth.tuner.aten_graph import op_name
from kernelevolve.synth.tuner.aten_map import GraphMapper
from kernelevolve.synth.tuner.aten_values import (
    Unsupported,
    _channel,
    _NoValue,
    _numel,
    _pad,
    _shape,
    _unit_view,
    _Val,
)
from kernelevolve.synth.tuner.ir import OpGraph, ReduceInfo

_PLAIN = {"sum", "mean", "amax", "amin", "var", "var_mean", "_softmax", "_log_softmax", "logsumexp"}
_MAIN_OPS = {"mm", "addmm", "bmm", "convolution", "max_pool2d_with_indices", "max_pool3d_with_indices",
             "max_pool2d", "max_pool3d", "avg_pool2d", "avg_pool3d"}  # fmt: skip
_BATCH_NORMS = {
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training",
}


def _named(node: Any) -> dict[str, Any]:
    """A call's arguments by their schema names (fx nodes, not yet mapped)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return dict(node.kwargs)
    names = [a.name for a in schema.arguments]
    return {**dict(zip(names, node.args, strict=False)), **node.kwargs}


def _dims(dims: Any, rank: int) -> tuple[int, ...]:
    """Normalized reduced dims; None or [] is every dim, as aten has it."""
    if dims is None or (isinstance(dims, list | tuple) and not dims):
        return tuple(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return tuple(sorted({int(d) % rank for d in dims}))


def _reduction(node: Any) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """(domain D, reduced dims of D, groups) of a reducing node, None for other nodes."""
    name = op_name(node)
    if node.op != "call_function" or not node.args or not hasattr(node.args[0], "meta"):
        return None
    x = node.args[0]
    if not hasattr(x.meta.get("val"), "shape"):
        return None
    d = _shape(x)
    a = _named(node)
    if name in ("sum", "mean", "amax", "amin", "var", "var_mean", "logsumexp"):
        return d, _dims(a.get("dim"), len(d)), 1
    if name in ("max", "min") and isinstance(a.get("dim"), int):
        return d, _dims(a["dim"], len(d)), 1
    if name in ("argmax", "argmin"):  # `aten_arg`
        return d, _dims(a.get("dim"), len(d)), 1
    if name in ("_softmax", "_log_softmax"):
        return d, _dims(a.get("dim"), len(d)), 1
    if name == "linalg_vector_norm":
        return d, _dims(a.get("dim"), len(d)), 1
    if name == "native_layer_norm":
        k = len(a.get("normalized_shape", ()))
        return d, tuple(range(len(d) - k, len(d))), 1
    if name == "native_group_norm":
        return d, tuple(range(1, len(d))), int(a.get("group", 1))
    if name in _BATCH_NORMS:
        base = _instance_base(x)
        if base is not None:
            return base, tuple(range(2, len(base))), 1
        return d, tuple(i for i in range(len(d)) if i != 1), 1
    return None


def _instance_base(x: Any) -> tuple[int, ...] | None:
    """The shape [N, C, *S] of the value a batch norm's input [1, N * C, *S] views, if it does."""
    if op_name(x) not in ("view", "_unsafe_view", "reshape") or not hasattr(x.args[0], "meta"):
        return None
    base, d = _shape(x.args[0]), _shape(x)
    if len(base) >= 3 and d == (1, base[0] * base[1], *base[2:]):
        return base
    return None


class ReduceMapper(GraphMapper):
    """`GraphMapper` over a domain D with reductions over `dims` of it (see the module's docstring)."""

    # col: D-shaped where every dim is reduced
    output_layouts: tuple[str, ...] = ("full", "col", "row", "rowsq")

    def __init__(
        self,
        gm: Any,
        sources: list[str],
        forward_args: list[str],
        domain: tuple[int, ...],
        dims: tuple[int, ...],
        groups: int,
    ):
        if not domain:
            raise Unsupported("a reduction of a 0-d value is not templated")
        super().__init__(gm, sources, forward_args, domain=domain)
        n = len(domain)
        self.dims = dims  # of D
        self.groups = groups
        if groups > 1 and (n < 2 or domain[1] % groups):
            raise Unsupported(f"group norm of {groups} groups over {list(domain)} is not templated")
        # The split dims: D's, with dim 1 viewed as (groups, C / groups) for a group norm.
        self.split = (domain[0], groups, domain[1] // groups, *domain[2:]) if groups > 1 else tuple(domain)
        self.reduced = tuple(sorted(s for d in dims for s in self.of_dim(d) if not (groups > 1 and s == 1)))
        kept = [s for s in range(len(self.split)) if s not in self.reduced]
        self.rows = _numel(tuple(self.split[s] for s in kept))
        self.cols = _numel(tuple(self.split[s] for s in self.reduced))
        self.keep_shape = tuple(1 if d in dims else domain[d] for d in range(n))
        self.present: dict[str, tuple[int, ...]] = {}
        self.skipped = _buffer_updates(gm, sources)

    def of_dim(self, d: int) -> tuple[int, ...]:
        """The split dims of D's dim d."""
        if self.groups == 1:
            return (d,)
        return (d,) if d == 0 else (1, 2) if d == 1 else (d + 1,)

    # -- layouts -----------------------------------------------------------------------------------

    def presence(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The split dims along which a tensor of `shape`, broadcast right-aligned against D, varies;
        None where it does not broadcast to D."""
        n = len(self.o)
        if len(shape) > n:
            return None
        p = _pad(shape, n)
        out: list[int] = []
        for d in range(n):
            if p[d] == self.o[d]:
                out += self.of_dim(d)
            elif p[d] != 1:
                return None
        return tuple(out)

    def layout_for(self, present: tuple[int, ...]) -> str:
        rows = any(s not in self.reduced for s in present)
        cols = any(s in self.reduced for s in present)
        return "full" if rows and cols else "row" if rows else "col" if cols else "scalar"

    def classify(self, shape: tuple[int, ...]) -> str | None:
        present = self.presence(shape)
        return None if present is None else self.layout_for(present)

    def note(self, name: str, present: tuple[int, ...]) -> None:
        if self.present.setdefault(name, present) != present:
            raise Unsupported(
                f"{self.leaf_source[name][0]} is read both per channel and broadcast as torch has it"
            )

    def read(self, v: Any) -> _Val:
        """As `GraphMapper.read`; a tensor viewed with unit dims inserted or removed (a [C] parameter
        viewed as [1, C, 1, 1]) is placed by the view's shape: its memory is the same."""
        if isinstance(v, _Val) and v.leaf is not None and not v.transposed:
            source, base, dtype = self.leaf_source[v.leaf]
            squeezed = [d for d in v.shape if d != 1] == [d for d in base if d != 1]
            shape = v.shape if squeezed and len(v.shape) <= len(self.o) else base
            present = self.presence(shape)
            if present is None:
                raise Unsupported(
                    f"{source} has shape {list(base)}, which does not broadcast to the reduced value's "
                    f"{list(self.o)}"
                )
            layout = self.layout_for(present)
            self.register(v.leaf, source, layout, dtype)
            self.note(v.leaf, present)
            return replace(v, ref=v.leaf, layout=layout, leaf=None)
        return super().read(v)

    def channel(self, v: Any) -> _Val | None:
        """A norm's per-channel parameter ([C], C = D's dim 1) as a value that broadcasts per channel."""
        if v is None:
            return None
        if not (isinstance(v, _Val) and v.leaf is not None and not v.transposed):
            raise Unsupported("a norm's weight, bias or running statistics must be parameters or inputs")
        source, base, dtype = self.leaf_source[v.leaf]
        if base != (self.o[1],):
            raise Unsupported(f"{source} of shape {list(base)} is not one value per channel ({self.o[1]})")
        present = self.of_dim(1)
        self.register(v.leaf, source, self.layout_for(present), dtype)
        self.note(v.leaf, present)
        return _Val(v.leaf, self.layout_for(present), _channel(self.o))

    def check_arg(self, v: _Val, target: tuple[int, ...]) -> None:
        if v.layout == "scalar":
            return
        if v.layout == "rowsq":
            if v.shape != target:
                raise Unsupported(
                    f"a value reduced without keepdim (shape {list(v.shape)}) broadcasts to {list(target)}; "
                    "the templates broadcast reduced values kept with keepdim or unsqueezed back"
                )
            return
        if self.presence(target) is None or self.presence(v.shape) is None:
            raise Unsupported(
                f"a value of shape {list(v.shape)} broadcasts to {list(target)}, which is not a broadcast "
                f"of the reduced value's shape {list(self.o)}"
            )
        if v.layout == "row" and v.ref not in self.tensors and _pad(v.shape, len(self.o)) != self.keep_shape:
            raise Unsupported(f"a reduced value of shape {list(v.shape)} broadcasts to {list(target)}")

    def elementwise(self, op: str, args: list[Any], shape: tuple[int, ...]) -> _Val:
        vals = [self.read(a) for a in args]
        if any(v.layout == "rowsq" for v in vals):
            for v in vals:
                self.check_arg(v, shape)
            return _Val(self.new(op, tuple(v.ref for v in vals)), "rowsq", shape)
        return super().elementwise(op, args, shape)

    def view(self, x: Any, shape: tuple[int, ...]) -> _Val:
        if isinstance(x, _Val) and x.leaf is None and x.layout in ("row", "rowsq"):
            if _numel(shape) != _numel(x.shape):
                raise Unsupported(f"reshaping a reduced value to {list(shape)} is not templated")
            canonical = _pad(shape, len(self.o)) == self.keep_shape and len(shape) <= len(self.o)
            return replace(x, shape=shape, layout="row" if canonical else "rowsq")
        if isinstance(x, _Val) and x.leaf is None and x.layout in ("full", "col") and shape != self.o:
            if _numel(shape) == _numel(self.o):
                # The same memory, row-major, under another shape (unit dims added or dropped, dims
                # merged: `aten_merge`; instance norm's [1, N * C, *S]). Only ops of D's shape read it
                # (`check_arg`: a shape of D's size that broadcasts to D is D up to leading 1s);
                # returned, it is viewed back (`out_view` where only unit dims differ).
                return replace(x, shape=shape)
            raise Unsupported(f"reshaping a value of shape {list(x.shape)} to {list(shape)} is not templated")
        return super().view(x, shape)

    # -- reductions --------------------------------------------------------------------------------

    def reduce(self, op: str, x: Any, dims: Any, keepdim: bool, shape: tuple[int, ...] | None = None) -> _Val:
        v = self.read(x)
        if self.gemm is not None or self.conv is not None or self.pool is not None:
            main = "matmul" if self.gemm else "convolution" if self.conv else "pooling"
            raise Unsupported(f"a reduction after a {main} is not templated")
        got = _dims(dims, len(v.shape))
        if v.layout not in ("full", "col") or v.shape != self.o:
            raise Unsupported(
                f"{op} of a value of shape {list(v.shape)}: the templates reduce one shape per graph, "
                f"{list(self.o)}"
            )
        if self.groups > 1 or got != self.dims:
            raise Unsupported(
                f"{op} over dims {list(got)} and a reduction over dims {list(self.dims)} of {list(self.o)}"
                + (" (group norm's)" if self.groups > 1 else "")
                + ": reductions over different dims in one graph are not templated"
            )
        return self.reduced_value(op, v, keepdim)

    def reduced_value(self, op: str, v: _Val, keepdim: bool) -> _Val:
        """`op` of `v` over this graph's dims: a `row` value, or `rowsq` (squeezed, not broadcastable)."""
        shape = self.keep_shape if keepdim else tuple(d for i, d in enumerate(self.o) if i not in self.dims)
        layout = "row" if keepdim or _pad(shape, len(self.o)) == self.keep_shape else "rowsq"
        return _Val(self.new(op, (v.ref,)), layout, shape)

    def softmax(self, name: str, x: Any, dim: Any, keepdim: bool = True) -> _Val:
        m = self.reduce("amax", x, dim, True)
        d = self.elementwise("sub", [x, m], self.o)
        e = self.elementwise("exp", [d], self.o)
        s = self.reduce("sum", e, dim, keepdim)
        if name == "_softmax":
            return self.elementwise("div", [e, s], self.o)
        log_s = self.elementwise("log", [s], s.shape)
        if name == "_log_softmax":
            return self.elementwise("sub", [d, log_s], self.o)
        return self.elementwise("add", [log_s, m if keepdim else self.view(m, s.shape)], s.shape)

    def var(self, name: str, args: list[Any], kw: dict[str, Any]) -> Any:
        dims = args[1] if len(args) > 1 else kw.get("dim")
        correction = kw.get("correction", 1)
        correction = 1 if correction is None else correction
        keep = bool(kw.get("keepdim", False))
        mean = self.reduce("mean", args[0], dims, True)
        sq = self.elementwise("square", [self.elementwise("sub", [args[0], mean], self.o)], self.o)
        var = self.reduce("mean", sq, dims, keep)
        if correction:  # a constant that depends on cols: shapes with other cols give another graph
            var = self.elementwise("mul", [var, self.cols / (self.cols - correction)], var.shape)
        if name == "var":
            return var
        return (var, mean if keep else self.view(mean, var.shape))

    def normalize(self, x: Any, eps: float, w: Any, b: Any) -> _Val:
        """(x - mean) * rsqrt(biased var + eps) (* w) (+ b), the statistics over this graph's dims."""
        v = self.read(x)
        if self.gemm is not None or self.conv is not None or self.pool is not None:
            main = "matmul" if self.gemm else "convolution" if self.conv else "pooling"
            raise Unsupported(f"a normalization after a {main} is not templated")
        if v.layout not in ("full", "col") or v.shape != self.o:
            raise Unsupported(f"a normalization of a value of shape {list(v.shape)}, not {list(self.o)}")
        mean = self.reduced_value("mean", v, True)
        d = self.elementwise("sub", [v, mean], self.o)
        var = self.reduced_value("mean", self.elementwise("square", [d], self.o), True)
        rstd = self.elementwise("rsqrt", [self.elementwise("add", [var, eps], var.shape)], var.shape)
        y = self.elementwise("mul", [d, rstd], self.o)
        if w is not None:
            y = self.elementwise("mul", [y, w], self.o)
        if b is not None:
            y = self.elementwise("add", [y, b], self.o)
        return y

    def layer_norm(self, x: Any, normalized: Any, w: Any, b: Any, eps: float) -> tuple[Any, ...]:
        if _dims(tuple(range(-len(normalized), 0)), len(self.o)) != self.dims or self.groups > 1:
            raise Unsupported("a layer norm and a reduction over other dims in one graph are not templated")
        y = self.normalize(x, eps, w, b)
        return (y, _NoValue("layer norm's mean"), _NoValue("layer norm's rstd"))

    def group_norm(self, a: dict[str, Any]) -> tuple[Any, ...]:
        if int(a.get("group", 1)) != self.groups or self.dims != tuple(range(1, len(self.o))):
            raise Unsupported("a group norm and a reduction over other dims in one graph are not templated")
        y = self.normalize(
            a["input"], float(a["eps"]), self.channel(a.get("weight")), self.channel(a.get("bias"))
        )
        return (y, _NoValue("group norm's mean"), _NoValue("group norm's rstd"))

    def batch_norm(self, node: Any, a: dict[str, Any]) -> tuple[Any, ...]:
        x = a["input"]
        if len(self.o) < 2:
            raise Unsupported("batch norm of a 1-d value is not templated")
        instance = _instance_base(node.args[0]) is not None
        if instance:
            if not isinstance(x, _Val):
                raise Unsupported("instance norm of a constant is not templated")
            if any(a.get(k) is not None for k in ("weight", "bias", "running_mean", "running_var")):
                raise Unsupported("instance norm with an affine or running statistics is not templated")
            x = replace(x, shape=self.o)
        expected = (
            tuple(range(2, len(self.o))) if instance else tuple(i for i in range(len(self.o)) if i != 1)
        )
        if self.dims != expected or self.groups > 1:
            raise Unsupported("a batch norm and a reduction over other dims in one graph are not templated")
        eps = float(a["eps"])
        w, b = self.channel(a.get("weight")), self.channel(a.get("bias"))
        training = bool(a.get("training", False)) and op_name(node) != "_native_batch_norm_legit_no_training"
        if training or instance:
            y = self.normalize(x, eps, w, b)
        else:
            mean, var = self.channel(a.get("running_mean")), self.channel(a.get("running_var"))
            if mean is None or var is None:
                raise Unsupported("batch norm in eval mode without running statistics is not templated")
            c = _channel(self.o)
            rstd = self.elementwise("rsqrt", [self.elementwise("add", [var, eps], c)], c)
            y = self.elementwise("mul", [self.elementwise("sub", [x, mean], self.o), rstd], self.o)
            y = self.elementwise("mul", [y, w], self.o) if w is not None else y
            y = self.elementwise("add", [y, b], self.o) if b is not None else y
        return (y, *[_NoValue("batch norm's statistics")] * 4)

    def vector_norm(self, a: dict[str, Any], shape: tuple[int, ...]) -> _Val:
        if a.get("dtype") is not None:
            raise Unsupported("linalg_vector_norm with a dtype is not templated")
        p, x, dims, keep = a.get("ord", 2), a["self"], a.get("dim"), bool(a.get("keepdim", False))
        if not isinstance(p, int | float) or p == 0 or (p < 0 and not math.isinf(p)):
            raise Unsupported(f"linalg_vector_norm of order {p} is not templated (2, 1, inf, -inf, p > 0)")
        if math.isinf(p):
            return self.reduce("amax" if p > 0 else "amin", self.elementwise("abs", [x], self.o), dims, keep)
        if p == 2:
            return self.elementwise(
                "sqrt", [self.reduce("sum", self.elementwise("square", [x], self.o), dims, keep)], shape
            )
        if p == 1:
            return self.reduce("sum", self.elementwise("abs", [x], self.o), dims, keep)
        powered = self.elementwise("pow", [self.elementwise("abs", [x], self.o), float(p)], self.o)
        return self.elementwise("pow", [self.reduce("sum", powered, dims, keep), 1.0 / float(p)], shape)

    # -- the walk ----------------------------------------------------------------------------------

    def visit(self, node: Any) -> Any:
        if node in self.skipped:
            return _NoValue("a module buffer's update (batch norm's running statistics)")
        name = op_name(node)
        if name not in {"native_group_norm", "linalg_vector_norm", "max", "min", "sum", "mean", "amax", "amin",
                        *_BATCH_NORMS}:  # fmt: skip
            return super().visit(node)

        def value(a: Any) -> Any:
            if hasattr(a, "op"):
                return self.env.get(a, a)
            if isinstance(a, list | tuple):
                return [self.env.get(x, x) if hasattr(x, "op") else x for x in a]
            return a

        a = {k: value(v) for k, v in _named(node).items()}
        if name == "native_group_norm":
            return self.group_norm(a)
        if name in _BATCH_NORMS:
            return self.batch_norm(node, a)
        shape = _shape(node) if not isinstance(node.meta.get("val"), tuple | list) else ()
        if name == "linalg_vector_norm":
            return self.vector_norm(a, shape)
        if name in ("max", "min"):
            if not isinstance(a.get("dim"), int):
                return super().visit(node)
            v = self.reduce("amax" if name == "max" else "amin", a["self"], a["dim"], bool(a.get("keepdim")))
            return (v, _NoValue("the indices of max/min"))
        return self.reduce(name, a["self"], a.get("dim"), bool(a.get("keepdim", False)), shape)

    def build(self, shape_name: str) -> OpGraph:
        graph = super().build(shape_name)
        graph.pattern = "row"
        layouts = {graph.layout_of(o) for o in graph.outputs}
        out_shape: tuple[int, ...] | None = None
        if layouts <= {"full", "col"}:
            if _shape(self.out_nodes[0]) != self.o and _squeezed(_shape(self.out_nodes[0])) == _squeezed(
                self.o
            ):
                graph.out_view = _unit_view(self.o, _shape(self.out_nodes[0]))
            elif _shape(self.out_nodes[0]) != self.o:
                raise Unsupported(
                    f"an output of shape {list(_shape(self.out_nodes[0]))}, not the reduced value's"
                )
        elif layouts != {"row"} or self.groups > 1:
            raise Unsupported("outputs that are neither all of the reduced shape nor all reduced")
        else:
            out_shape = self.row_output_shape(_shape(self.out_nodes[0]))
        domain = next((t.name for t in graph.tensors if self.leaf_source[t.name][1] == self.o), None)
        if domain is None:
            raise Unsupported(f"no input has the reduced value's shape {list(self.o)}")
        graph.reduce = ReduceInfo(
            rank=len(self.o),
            reduced=self.reduced,
            present=tuple((t.name, self.present[t.name]) for t in graph.tensors),
            domain=domain,
            groups=self.groups,
            out_shape=out_shape,
        )
        return graph

    def row_output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Each dim of an output of one value per row as the kept dim of D whose size it has (-1: 1)."""
        kept = [d for d in range(len(self.o)) if d not in self.dims and self.o[d] != 1]
        out = []
        for size in shape:
            if size == 1:
                out.append(-1)
            elif kept and self.o[kept[0]] == size:
                out.append(kept.pop(0))
            else:
                break
        if kept or len(out) != len(shape):
            raise Unsupported(f"an output of shape {list(shape)} is not the reduced values in order")
        return tuple(out)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _buffer_updates(gm: Any, sources: list[str]) -> set[Any]:
    """Nodes whose only use is a `copy_` into a module buffer (batch norm's running statistics)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    buffers = {p for i, p in enumerate(placeholders) if i < len(sources) and sources[i].startswith("param:")}
    skipped: set[Any] = set()
    for node in reversed(list(gm.graph.nodes)):
        if node.op != "call_function" or not node.users:
            continue
        if all(
            u in skipped
            or (op_name(u).startswith("copy") and u.args and u.args[0] in buffers and u.args[0] is not node)
            for u in node.users
        ):
            skipped.add(node)
    return skipped


__all__ = ["ReduceMapper"]
