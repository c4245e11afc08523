"""Map one traced aten graph onto the tuner's IR (`ir.OpGraph`): ops, layouts, constants, one matmul,
convolution or pooling.

`trace.py` traces the reference (make_fx on fake tensors, core aten decompositions) and hands each
shape's graph here. `GraphMapper` walks the nodes in order and keeps, for every value, what it means:
an IR value or a constant, its layout (`full`, `col`, `row`, `scalar`) and its torch shape. Layouts
follow from what ops mean (a reduction's result is a `row` value), and every broadcast is checked
against torch's right-aligned rules, so a reduction without keepdim that torch would broadcast along
the columns is refused rather than misread.

Here: the walk (`build`, `visit`), the table of values and their layouts, the elementwise ops and
the reductions over the last dim. `GraphMapper` composes the op families that read and write the
same table, each a mixin typed against `aten_values.MapperCore`: the main ops (`aten_gemm`,
`aten_conv`, `aten_pool`) and the composite ops the decompositions leave whole (`aten_composite`).

Deliberately not here: tracing, the constructor's source, comparing shapes (all in `trace.py`).
Anything outside the IR raises `Unsupported` with the reason.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kernelevolve.synth.tuner import aten_graph, aten_mask, aten_misc
from kernelevolve.synth.tuner.aten_composite import CompositeMapping
from kernelevolve.synth.tuner.aten_conv import ConvMapping
from kernelevolve.synth.tuner.aten_gemm import GemmMapping
from kernelevolve.synth.tuner.aten_pool import _POOLS, PoolMapping
from kernelevolve.synth.tuner.aten_values import (
    Unsupported,
    _channel,
    _Cond,
    _dtype,
    _dtype_of,
    _NoValue,
    _numel,
    _pad,
    _shape,
    _unit_view,
    _Val,
)
from kernelevolve.synth.tuner.ir import REDUCE_OPS, Arg, ConvInfo, GemmInfo, Op, OpGraph, PoolInfo, TensorArg

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def _ident(text: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in text)
    return out if out and not out[0].isdigit() else "t_" + out


_VIEWS = {"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "alias", "clone",
          "contiguous", "detach", "lift_fresh_copy", "_to_copy", "to"}  # fmt: skip
_TRANSPOSES = {"t", "permute", "transpose"}
_UNARY = {"neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
          "reciprocal": "reciprocal", "tanh": "tanh", "sigmoid": "sigmoid", "relu": "relu", "erf": "erf",
          "silu": "silu", "square": "square", "log1p": "log1p", "expm1": "expm1", "causal_mask": "causal"}  # fmt: skip
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "maximum", "minimum": "minimum"}
_COMPARE = {"gt", "lt", "ge", "le"}
_FOLD: dict[str, Callable[..., Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "neg": operator.neg,
}


class GraphMapper(GemmMapping, ConvMapping, PoolMapping, CompositeMapping):
    """Walks one traced graph and builds the OpGraph (sizes for that one shape)."""

    # The layouts an output may have (`aten_reduce` adds one value per row).
    output_layouts: tuple[str, ...] = ("full",)
    # The dtypes an output may have (`aten_arg` maps argmax's int64 indices).
    output_dtypes: tuple[str, ...] = FLOAT_DTYPES

    def __init__(
        self, gm: Any, sources: list[str], forward_args: list[str], domain: tuple[int, ...] | None = None
    ):
        """`domain`: the iteration space's shape where it is not the output's (`aten_reduce`)."""
        self.gm = gm
        self.sources = sources
        self.forward_args = forward_args
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        outs = out_node.args[0] if isinstance(out_node.args[0], list | tuple) else [out_node.args[0]]
        if not outs or any(getattr(o, "meta", {}).get("val") is None for o in outs):
            raise Unsupported("the reference returns no tensor")
        self.out_nodes = list(outs)
        self.o = domain if domain is not None else _shape(outs[0])
        self.total = (
            domain is None and not self.o
        )  # one value (a loss): reduced over the largest input's shape
        if self.total and _dtype(outs[0]) in FLOAT_DTYPES:
            self.o = aten_misc.total_space(self, gm)
        if not self.o or self.o[-1] < 1:
            raise Unsupported(f"the output has shape {list(self.o)}; the templates need at least one dim")
        if any(_shape(o) != _shape(outs[0]) for o in outs):
            shapes = ", ".join(str(list(_shape(o))) for o in outs)
            raise Unsupported(f"outputs of different shapes ({shapes}) are not templated")
        self.dtype = _dtype(outs[0])
        if any(_dtype(o) != self.dtype for o in outs):
            dtypes = ", ".join(_dtype(o) for o in outs)
            raise Unsupported(f"outputs of different dtypes ({dtypes}) are not templated")
        if self.dtype not in self.output_dtypes:
            raise Unsupported(f"output dtype {self.dtype} is not templated ({', '.join(self.output_dtypes)})")
        self.rows, self.cols = _numel(self.o[:-1]), self.o[-1]
        self.tensors: dict[str, TensorArg] = {}
        self.ops: list[Op] = []
        self.gemm: GemmInfo | None = None
        self.gemm_sizes: tuple[int, int, int, int] = (0, 0, 0, 0)  # batch, M, N, K
        self.conv: ConvInfo | None = None
        self.conv_sizes: tuple[int, int, int, int] = (0, 0, 0, 0)  # groups, M, N per group, K per group
        self.pool: PoolInfo | None = None
        self.main_shape: tuple[int, ...] = ()  # the matmul's, convolution's or pooling's result
        self.env: dict[Any, Any] = {}
        self.leaf_source: dict[str, tuple[str, tuple[int, ...], str]] = {}

    # -- values ------------------------------------------------------------------------------------

    def new(self, op: str, args: tuple[Arg, ...]) -> str:
        """The value of `op(args)`: an existing one when the same op already reads the same args
        (decompositions repeat themselves: two softmaxes of x share one max)."""
        for existing in self.ops:
            if (
                existing.op == op
                and existing.args == args
                and all(type(a) is type(b) for a, b in zip(existing.args, args, strict=True))
            ):
                return existing.out
        name = f"v{len(self.ops)}"
        self.ops.append(Op(name, op, args))
        return name

    def classify(self, shape: tuple[int, ...]) -> str | None:
        """A tensor's layout from its own shape. Exact forms only, so that the generated wrapper can
        size the output as the broadcast of its inputs' shapes."""
        o, n = self.o, len(self.o)
        if shape == o:
            return "full"
        if len(shape) <= n and shape and shape[-1] == self.cols and all(d == 1 for d in shape[:-1]):
            return "col"
        if len(shape) <= n and shape and _pad(shape, n) == (*o[:-1], 1):
            return "row"
        if self.total and shape and shape == o[:-1]:  # a loss's per-row targets (checked as read)
            return "row"
        if _numel(shape) == 1 and len(shape) <= n:
            return "scalar"
        if (
            (self.conv or self.pool) is not None
            and n >= 3
            and len(shape) <= n
            and _pad(shape, n) == _channel(o)
        ):
            return "chan"
        return None

    def read(self, v: Any) -> _Val:
        """A value an elementwise op or reduction reads: leaves become TensorArgs here."""
        if isinstance(v, _NoValue):
            raise Unsupported(f"{v.what} is used; the templates compute only the main result")
        if hasattr(v, "pending"):  # aten_misc's flips, slices and permuted views, read too early
            raise Unsupported(f"{v.pending} is read other than where it is templated")
        if isinstance(v, bool) or not isinstance(v, int | float | _Val):
            raise Unsupported(f"an argument of type {type(v).__name__} is not templated")
        if not isinstance(v, _Val):
            return _Val(float(v) if isinstance(v, float) else v, "scalar", ())
        if v.leaf is None:
            return v
        if v.transposed:
            raise Unsupported("transposed tensors are templated only as matmul operands")
        source, base, dtype = self.leaf_source[v.leaf]
        layout = self.classify(base)
        if v.shape != base and self.classify(v.shape) == "row" and _numel(v.shape) == _numel(base):
            layout = "row"  # a vector viewed as one value per row ([N] as [N, 1]): the same order
        if layout is None and (wide := aten_mask.read_broadcast(self, v, source, base, dtype)):
            return wide  # a mask broadcast over outer dims, materialized by the wrapper
        if layout is None:
            bigger = (
                " (an output reduced from its inputs is not templated)"
                if _numel(base) > _numel(self.o)
                else ""
            )
            raise Unsupported(
                f"{source} has shape {list(base)}, which is neither the output's {list(self.o)}, one value "
                f"per row, one per column, nor a scalar{bigger}"
            )
        self.register(v.leaf, source, layout, dtype)
        return replace(v, ref=v.leaf, layout=layout, leaf=None)

    def register(self, name: str, source: str, layout: str, dtype: str) -> None:
        if dtype not in FLOAT_DTYPES and dtype not in aten_misc.INDEX_DTYPES:
            raise Unsupported(f"{source} has dtype {dtype}; the templates read float and integer tensors")
        arg = TensorArg(name, source, layout, dtype)  # type: ignore[arg-type]
        if self.tensors.get(name, arg) != arg:
            raise Unsupported(f"{source} is read with two layouts ({self.tensors[name].layout}, {layout})")
        self.tensors[name] = arg

    def check_arg(self, v: _Val, target: tuple[int, ...]) -> None:
        """Torch broadcasts `v` to `target` right-aligned; refuse where that disagrees with its layout."""
        n = len(target)
        if v.layout == "scalar":
            return
        if len(v.shape) > n:
            raise Unsupported("an argument has more dims than the op's result")
        p, o = _pad(v.shape, n), self.o
        ok = {
            "full": p == o == target,
            "row": (p[:-1] == target[:-1] == o[:-1]) or (p == target == o[:-1]),
            "col": p[-1] == target[-1] == self.cols
            and all(d in (1, t) for d, t in zip(p[:-1], target[:-1], strict=True)),
            "chan": n >= 3 and p == _channel(o) and target[1] == o[1],
        }.get(v.layout, False)
        if not ok:
            raise Unsupported(
                f"a {v.layout} value of shape {list(v.shape)} broadcasts to {list(target)} in a way the "
                f"templates do not read (output shape {list(o)}; reductions need keepdim or an unsqueeze)"
            )

    def elementwise(self, op: str, args: list[Any], shape: tuple[int, ...]) -> _Val:
        vals = [self.read(a) for a in args]
        if all(not isinstance(v.ref, str) for v in vals) and op in _FOLD:
            return _Val(_FOLD[op](*[v.ref for v in vals]), "scalar", shape)
        for v in vals:
            self.check_arg(v, shape)
        layouts = {v.layout for v in vals}
        if "chan" in layouts and layouts & {"row", "col"}:
            raise Unsupported(
                "a per-channel value combined with a per-row or per-column one is not templated"
            )
        layout = (
            "full" if "full" in layouts or {"row", "col"} <= layouts
            else "chan" if "chan" in layouts else "col" if "col" in layouts
            else "row" if "row" in layouts else "scalar"
        )  # fmt: skip
        if layout == "full" and shape != self.o:
            raise Unsupported(
                f"an elementwise result of shape {list(shape)} is not the output's {list(self.o)}"
            )
        return _Val(self.new(op, tuple(v.ref for v in vals)), layout, shape)

    def reduce(self, op: str, x: Any, dims: Any, keepdim: bool, shape: tuple[int, ...] | None = None) -> _Val:
        v = self.read(x)
        n = len(self.o)
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        if v.layout != "full" or v.shape != self.o or [d % n for d in dims] != [n - 1]:
            raise Unsupported(
                f"{op} over dims {dims} of a value of shape {list(v.shape)}: only reductions over the last "
                f"dim of the output's shape {list(self.o)} are templated"
            )
        if self.gemm is not None or self.conv is not None or self.pool is not None:
            main = "matmul" if self.gemm else "convolution" if self.conv else "pooling"
            raise Unsupported(f"a reduction after a {main} is not templated")
        out = shape if shape is not None else ((*self.o[:-1], 1) if keepdim else self.o[:-1])
        return _Val(self.new(op, (v.ref,)), "row", out)

    # -- the walk ----------------------------------------------------------------------------------

    def build(self, shape_name: str) -> OpGraph:
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        used = {i: p for i, p in enumerate(placeholders) if p.users}
        for i, p in used.items():
            source = self.sources[i]
            kind, _, what = source.partition(":")
            name = _ident(("p_" if kind == "param" else "") + (
                self.forward_args[int(what)] if kind == "input" and int(what) < len(self.forward_args)
                else what
            ))  # fmt: skip
            if re.fullmatch(r"v\d+|acc", name) or name in self.leaf_source:  # op values' names
                name = f"t{i}_{name}"
            self.leaf_source[name] = (source, _shape(p), _dtype(p))
            self.env[p] = _Val(None, "leaf", _shape(p), leaf=name)
        for node in self.gm.graph.nodes:
            if node.op in ("placeholder", "output") or not node.users:
                continue
            if node.op == "get_attr":  # a constant the forward made (torch.tensor(c))
                self.env[node] = aten_misc.constant(self.gm, node)
                continue
            if node.op != "call_function":
                raise Unsupported(f"graph node {node.op} {node.target} is not templated")
            self.env[node] = self.visit(node)
        outputs = []
        aten_misc.check(self)
        for o in self.out_nodes:
            v = self.read(self.env[o])
            allowed = ("scalar",) if self.total else self.output_layouts
            if not isinstance(v.ref, str) or v.ref in self.tensors or v.layout not in allowed:
                raise Unsupported("an output that is an input or a broadcast value is not templated")
            outputs.append(v.ref)
        pattern = aten_misc.pattern(self) or (
            "pool" if self.pool else "conv" if self.conv else "gemm" if self.gemm
            else "row" if any(op.op in REDUCE_OPS for op in self.ops) else "elementwise"
        )  # fmt: skip
        graph = OpGraph(
            pattern=pattern,  # type: ignore[arg-type]
            tensors=list(self.tensors.values()),
            ops=self.ops,
            outputs=outputs,
            dtype=self.dtype,
            gemm=self.gemm,
            conv=self.conv,
            pool=self.pool,
            forward_args=list(self.forward_args),
        )
        if self.gemm is not None:
            batch, m, n, k = self.gemm_sizes
            if batch * m != self.rows or n != self.cols:
                raise Unsupported("the matmul's result is reshaped into something other than the output")
            graph.inner[shape_name], graph.batch[shape_name] = k, batch
        graph.rows[shape_name], graph.cols[shape_name] = self.rows, self.cols
        if pattern in ("gemm", "conv", "pool") and self.main_shape != self.o:
            graph.out_view = _unit_view(self.main_shape, self.o)
        if self.conv is not None:  # the implicit GEMM's sizes
            groups, m, n, k = self.conv_sizes
            graph.rows[shape_name], graph.cols[shape_name] = m, n
            graph.inner[shape_name], graph.batch[shape_name] = k, groups
        return graph

    def visit(self, node: Any) -> Any:
        args = [self.env.get(a, a) if hasattr(a, "op") else a for a in node.args]
        args = [[self.env.get(x, x) for x in a] if isinstance(a, list | tuple) else a for a in args]
        kw = dict(node.kwargs)
        if node.target is operator.getitem:
            return args[0][args[1]]
        name = aten_graph.op_name(node)
        if not str(getattr(node.target, "namespace", "aten")) == "aten":
            raise Unsupported(f"{node.target} is not templated")
        if name in _POOLS:  # before the dtype check: max pooling's unread indices are int64
            return self.pooling(name, args, kw, node)
        mine = aten_misc.visit(self, name.removesuffix("_"), args, kw, node)  # losses, scans, int data
        if mine is not aten_misc.NOT_MINE:
            return mine
        vals = (
            [v for v in node.meta.get("val", ()) if hasattr(v, "shape")]
            if isinstance(node.meta.get("val"), tuple | list)
            else [node.meta.get("val")]
        )
        odd = [_dtype_of(v) for v in vals if v is not None and _dtype_of(v) not in (*FLOAT_DTYPES, "bool")]
        if odd and not (name in ("max", "min") and len(vals) == 2 and odd == ["int64"]):  # unread indices
            raise Unsupported(f"aten.{name} produces {odd[0]} data; only float data is templated")
        shape = _shape(node) if not isinstance(node.meta.get("val"), tuple | list) else ()
        name = name.removesuffix("_") if name.endswith("_") and not name.startswith("_") else name
        if name in _VIEWS:
            return self.view(args[0], shape)
        if name in _TRANSPOSES:
            return self.transpose(name, args, shape)
        if name in ("mm", "addmm", "bmm"):
            return self.matmul(name, args, kw, shape)
        if name == "convolution":
            return self.convolution(args, shape)
        if name in _UNARY:
            return self.elementwise(_UNARY[name], args[:1], shape)
        if name in _BINARY:
            if kw.get("rounding_mode") is not None:
                raise Unsupported("division with a rounding mode is not templated")
            a, b = args[0], args[1]
            alpha = kw.get("alpha", 1)
            if alpha != 1:
                b = self.elementwise("mul", [b, alpha], shape)
            return self.elementwise(_BINARY[name], [a, b], shape)
        if name == "rsub":
            b = args[0] if kw.get("alpha", 1) == 1 else self.elementwise("mul", [args[0], kw["alpha"]], shape)
            return self.elementwise("sub", [args[1], b], shape)
        if name == "pow":
            exponent = args[1]
            if isinstance(exponent, _Val) or not isinstance(args[0], _Val):
                raise Unsupported("pow with a tensor exponent is not templated")
            simple = {2: "square", 0.5: "sqrt", -1: "reciprocal", -0.5: "rsqrt"}
            if exponent == 1:
                return self.read(args[0])
            if exponent in simple:
                return self.elementwise(simple[exponent], args[:1], shape)
            return self.elementwise("pow", [args[0], exponent], shape)
        if name == "gelu":
            approx = kw.get("approximate", args[1] if len(args) > 1 else "none")
            return self.elementwise("gelu_tanh" if approx == "tanh" else "gelu", args[:1], shape)
        if name in ("clamp", "hardtanh", "clamp_min", "clamp_max"):
            lo = args[1] if name != "clamp_max" and len(args) > 1 else kw.get("min")
            hi = args[2] if name in ("clamp", "hardtanh") and len(args) > 2 else kw.get("max")
            if name == "clamp_max":
                lo, hi = None, args[1]
            if name == "hardtanh":
                lo, hi = (args[1] if len(args) > 1 else -1.0), (args[2] if len(args) > 2 else 1.0)
            if isinstance(lo, _Val) or isinstance(hi, _Val):
                raise Unsupported("clamp with tensor bounds is not templated")
            x = self.read(args[0])
            self.check_arg(x, shape)
            return _Val(self.new("clamp", (x.ref, lo, hi)), x.layout, shape)
        if name == "elu":
            return self.elu(args, kw, shape)
        if name == "leaky_relu":
            return self.leaky_relu(args, shape)
        if name in _COMPARE:
            # x > c  <=>  x - c > 0, exactly, in IEEE arithmetic; `ge`/`le` swap the where's branches.
            x, c = args[0], args[1]
            diff = self.elementwise("sub", [x, c] if name in ("gt", "le") else [c, x], shape)
            return _Cond(diff, name)
        if name == "where":
            cond = args[0]
            if not isinstance(cond, _Cond):
                raise Unsupported("where() is templated only on a comparison with the result")
            a, b = (args[1], args[2]) if cond.kind in ("gt", "lt") else (args[2], args[1])
            return self.elementwise("where_gt0", [cond.value, a, b], shape)
        if name in ("scalar_tensor", "full", "full_like", "zeros_like", "ones_like", "zeros", "ones"):
            value = {"zeros_like": 0.0, "ones_like": 1.0, "zeros": 0.0, "ones": 1.0}.get(name)
            value = value if value is not None else args[1] if name in ("full", "full_like") else args[0]
            return _Val(float(value), "scalar", shape)
        if name in ("sum", "mean", "amax", "amin"):
            dims = args[1] if len(args) > 1 else kw.get("dim")
            keep = args[2] if len(args) > 2 else kw.get("keepdim", False)
            if dims is None:
                raise Unsupported(f"{name} over every dim is not templated (only over the last dim)")
            return self.reduce(name, args[0], dims, bool(keep), shape)
        if name in ("max", "min") and len(args) > 1 and isinstance(args[1], int):
            keep = args[2] if len(args) > 2 else kw.get("keepdim", False)
            v = self.reduce("amax" if name == "max" else "amin", args[0], args[1], bool(keep))
            return (v, _NoValue("the indices of max/min"))
        if name in ("_softmax", "_log_softmax", "logsumexp"):
            keep = bool(args[2] if len(args) > 2 else kw.get("keepdim", False)) or name != "logsumexp"
            return self.softmax(name, args[0], args[1], keep)
        if name == "native_layer_norm":
            return self.layer_norm(args[0], args[1], args[2], args[3], args[4])
        if name in ("var", "var_mean"):
            return self.var(name, args, kw)
        raise Unsupported(f"aten.{name} is not templated")

    def view(self, x: Any, shape: tuple[int, ...]) -> _Val:
        if isinstance(x, _NoValue):
            raise Unsupported(f"{x.what} is used; the templates compute only the main result")
        if isinstance(x, int | float):
            return _Val(x, "scalar", shape)
        if not isinstance(x, _Val):
            raise Unsupported(f"a view of {type(x).__name__} is not templated")
        if x.leaf is not None:
            if x.transposed and (_numel(shape) != _numel(x.shape) or shape[-2:] != x.shape[-2:]):
                raise Unsupported("a reshaped transposed tensor is not templated (only its batch dims fold)")
            return replace(x, shape=shape)
        layout = x.layout if x.layout != "full" or self.classify(shape) == "full" else None
        if layout == "row" and not (self.classify(shape) == "row" or shape in (self.o, self.o[:-1])):
            layout = None
        if layout == "col" and not (self.classify(shape) == "col" or shape == self.o):
            layout = None
        if layout is None:
            raise Unsupported(f"reshaping a {x.layout} value to {list(shape)} is not templated")
        return replace(x, shape=shape)


__all__ = ["FLOAT_DTYPES", "GraphMapper", "Unsupported"]
