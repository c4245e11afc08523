"""The aten ops of losses, scans, index masks and einsum's views, mapped onto the IR for `aten_map.GraphMapper` (issue J).

`visit(mapper, name, args, kw, node)` runs before the mapper's own dispatch and returns `NOT_MINE`
for what it leaves to it. What it maps:

- losses (an output of shape []): the mapper's iteration space is then the largest input's shape
  (`total_space`); `sum`/`mean` over every dim of a full or row value become `total_sum` /
  `total_mean` (a scalar value), and what follows them is scalar arithmetic (`check` refuses a total
  that feeds back into per-element compute: that is two passes). Cross-entropy's pieces: `ne`/`eq`
  /`isnan` masks as 1.0/0.0 values, `where` on such a mask (`where_nz`), and `gather` along the last
  dim by a per-row index (`where_col` then a row sum: exact, one term is not zero);
  `linalg_vector_norm` over the last dim (ord 1, 2, inf) for distances.
- scans: `cumsum`/`cumprod` along the last dim; `flip(cumsum(flip(x)))` over the last dim is the
  reversed scan and `cat([identity column, cumsum(x[..., :-1])])` the exclusive one; the `select`
  that only sizes the identity column is never read.
- slices of an input or parameter (a causal mask's corner of a buffer): a leaf of their own that
  the wrapper fetches sliced (`aten_mask`); a slice of a computed value is refused.
- index masks: `arange` is a tensor the candidate makes (`arange:<start>:<step>:<count>`), read per
  row or per column as its view says; integer `add`/`sub` of such values (triu, tril).
- integer and bool data: index and mask tensors are read as fp32 (exact up to 2**24, as torch's own
  promotion to float computes them); int64 results of these ops are carried the same way.

- views judged by strides: a view or permute of a leaf whose result is contiguous is a plain view,
  one with its last two dims swapped from contiguous a transposed one (a matmul operand), anything
  else waits for a further view (einsum's permutes through unit dims); a full value's reorder that
  keeps the element order only changes its shape.
- constants the forward makes (`torch.tensor(c)`: a get_attr node) as their value (`constant`).

Deliberately not here: gathers along other dims or by full index tensors, scans along other dims,
reductions to one value other than sum and mean, anything that reads a total per element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelevolve.synth.tuner import aten_mask
from kernelevolve.synth.tuner.ir import REDUCE_OPS, SCAN_OPS, TOTAL_OPS

# The `aten_map.GraphMapper` that calls in here (it imports this module, so this one names it only).
GraphMapper = Any

INDEX_DTYPES = ("bool", "int64", "int32", "int16", "int8", "uint8")
NOT_MINE = object()
_INT_VIEWS = {"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "alias", "clone",
              "contiguous", "_to_copy", "to"}  # fmt: skip
_IDENTITY = {"cumsum": 0.0, "cumprod": 1.0}
_RANDOM = {"bernoulli", "native_dropout", "rand", "rand_like", "randn", "randn_like", "uniform"}
_REORDERS = {"permute", "transpose", "t", "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze"}
# What makes a permuted view of a leaf contiguous (the decomposition's way to a bmm operand): the
# wrapper takes the view instead (`aten_mask.materialize`); elementwise ops on it stay refused.
_COPIES = {"expand", "clone", "contiguous", "alias"}


@dataclass(frozen=True)
class _Flip:
    """A value flipped along the last dim: read only by a scan or another flip."""

    pending = "a flip along the last dim (templated only around a scan)"

    value: Any


@dataclass(frozen=True)
class _Head:
    """x[..., :-1] of a full value x: read only by a scan (the exclusive one)."""

    pending = "a slice x[..., :-1] (templated only before an exclusive scan)"

    value: Any


@dataclass(frozen=True)
class _Shifted:
    """An exclusive scan whose first column is still missing (a `cat` adds it)."""

    pending = "an exclusive scan (templated only after its identity column)"

    value: Any
    identity: float


@dataclass(frozen=True)
class _Strided:
    """A permuted view of a leaf that is neither contiguous nor transposed: only a further view or
    permute may read it (einsum's chains end in a plain or transposed view)."""

    pending = "a permuted view (neither contiguous nor its last two dims swapped)"

    value: Any


def total_space(mapper: GraphMapper, gm: Any) -> tuple[int, ...]:
    """The iteration space of a graph whose output has shape []: its largest input's shape."""
    from kernelevolve.synth.tuner.aten_values import Unsupported, _shape

    shapes = [_shape(p) for p in gm.graph.nodes if p.op == "placeholder" and p.users]
    shapes = [s for s in shapes if s and s[-1] >= 1]
    if not shapes:
        raise Unsupported("the output has shape [] and no input has a dim: nothing to reduce")
    return max(shapes, key=lambda s: (_numel(s), len(s)))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def visit(m: GraphMapper, name: str, args: list[Any], kw: dict[str, Any], node: Any) -> Any:
    from kernelevolve.synth.tuner.aten_values import _NoValue, _shape, _Val

    n = len(m.o)
    val = node.meta.get("val")
    shape = _shape(node) if hasattr(val, "shape") else ()
    dtype = str(getattr(val, "dtype", "")).removeprefix("torch.")
    last = n - 1
    if name in _INT_VIEWS and args and isinstance(args[0], _NoValue):
        return args[0]  # a view of what is never read: stays unread
    if name in _INT_VIEWS and dtype in INDEX_DTYPES:
        src = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
        if str(getattr(src, "dtype", "")).removeprefix("torch.") not in INDEX_DTYPES:
            raise _unsupported(
                f"aten.{name} of float data to {dtype} (a rounding): only float data is templated"
            )
        return m.view(args[0], shape)
    if args and isinstance(args[0], _Strided) and name in _COPIES:  # made contiguous: a leaf of its own
        made = aten_mask.materialize(m, args[0].value, node.args[0])
        if made is not None:
            args[0] = made
    if name == "split_with_sizes" and len(args) > 1:  # a projection split into q, k and v
        pieces = aten_mask.split_leaves(
            m, args[0], list(args[1]), args[2] if len(args) > 2 else kw.get("dim", 0)
        )
        if pieces is not None:
            return pieces
    if name in _REORDERS and args and isinstance(args[0], _Strided):
        return _reorder(m, name, args, args[0].value, val, shape) or _Strided(args[0].value)
    if name in _REORDERS and args and isinstance(args[0], _Val) and hasattr(val, "is_contiguous"):
        reordered = _reorder(m, name, args, args[0], val, shape)
        if reordered is not None:
            return reordered
    if name == "empty":  # what fills it decides (dropout's bernoulli is refused below)
        return _NoValue("an uninitialized tensor (aten.empty)")
    if name in _RANDOM:
        raise _unsupported(
            f"aten.{name}: random numbers (dropout in training mode) are not templated; a candidate "
            "cannot draw torch's stream, so only the reference's eval mode or p = 0 could be matched"
        )
    if name == "arange":
        return _arange(m, args, kw, shape, dtype)
    if name in ("add", "sub") and dtype in INDEX_DTYPES and kw.get("alpha", 1) == 1:
        return m.elementwise(name, [args[0], args[1]], shape)  # index arithmetic, exact to 2**24
    if name == "select":  # of a (permuted) view of a leaf: q, k or v out of one projection, say
        x = args[0].value if isinstance(args[0], _Strided) else args[0]
        made = aten_mask.materialize(m, x, node) if isinstance(x, _Val) and x.leaf is not None else None
        return made or _NoValue(f"aten.select of {list(shape)}")
    if name == "scalar_tensor":
        return _Val(float(args[0]), "scalar", shape)
    if name in ("sum", "mean") and _over_all(shape):
        return _total(m, name, args[0])
    if name in ("ne", "eq") and len(args) == 2:
        return m.elementwise(name, [args[0], args[1]], shape)
    if name == "isnan":
        return m.elementwise("isnan", [args[0]], shape)
    if name == "where" and isinstance(args[0], _Val):
        return m.elementwise("where_nz", [args[0], args[1], args[2]], shape)
    if name == "gather":
        return _gather(m, args, shape)
    if name == "linalg_vector_norm":
        return _norm(m, args, kw, shape)
    if name == "flip":
        if [d % n for d in args[1]] != [last] or len(shape) != n:
            raise _unsupported("flip is templated only along the last dim, around a scan")
        return args[0].value if isinstance(args[0], _Flip) else _Flip(args[0])
    if name == "slice":
        dim, start = (*args[1:3], None, None)[:2]
        if len(shape) == n and (dim or 0) % n == last and (start or 0) == 0 and shape[-1] == m.o[-1] - 1:
            return _Head(args[0])
        if len(shape) == n and (dim or 0) % n != last and shape == tuple(getattr(args[0], "shape", ())):
            return args[0]  # a whole-dim slice (x[:, ...]) is the value itself
        sliced = aten_mask.slice_leaf(m, args[0], args, shape)  # a mask from a buffer's corner
        if sliced is not None:
            return sliced
        return _NoValue(
            "a slice (a slice is templated only of an input or parameter with step 1, or as x[..., :-1] "
            "before an exclusive scan)"
        )
    if name in ("cumsum", "cumprod"):
        return _scan(m, name, args, kw, shape)
    if name == "cat":
        return _cat(m, args, shape)
    return NOT_MINE


def _swaps_last_two(name: str, args: list[Any], n: int) -> bool:
    if name == "permute":
        return n >= 2 and [d % n for d in args[1]] == [*range(n - 2), n - 1, n - 2]
    if name == "transpose":
        return n >= 2 and sorted(d % n for d in args[1:3]) == [n - 2, n - 1]
    return n == 2


def _reorder(m: GraphMapper, name: str, args: list[Any], x: Any, val: Any, shape: tuple[int, ...]) -> Any:
    """A view or permute judged by the strides torch gives its result (einsum's chains of permutes
    and unit dims): a leaf's view that is contiguous is a plain view of it, one whose last two dims
    are swapped from contiguous a transposed one; a full value's view that keeps the element order
    (contiguous, as many elements) only changes its shape. None: the mapper's own rules decide."""
    from dataclasses import replace

    if x.leaf is not None:
        if name not in ("permute", "transpose", "t"):
            if x.transposed:  # contiguous only after a clone, whose strides are not the leaf's: the
                return None  # mapper's rule (a transposed leaf's batch dims fold)
            if folded := aten_mask.reshaped_leaf(m, x, shape):
                return folded  # a view of a permuted view the wrapper took: it reshapes it
        if (
            name in ("permute", "transpose", "t")
            and not x.transposed
            and _swaps_last_two(name, args, len(shape))
        ):
            return None  # the mapper's own transpose (a [N, 1] weight's .t() stays a transposed one)
        if val.is_contiguous():
            return replace(x, shape=shape, transposed=False)
        if val.dim() >= 2 and val.transpose(-1, -2).is_contiguous():
            return replace(x, shape=shape, transposed=True)
        if name in ("permute", "transpose") and not x.transposed:
            return _Strided(x)  # einsum's way to a transpose: a later view may make it one
        return None
    keeps_order = x.layout == "full" and val.is_contiguous() and _numel(shape) == _numel(m.o)
    if (
        keeps_order
        and x.shape != shape
        and (name in ("permute", "transpose", "t") or m.classify(shape) is None)
    ):
        return replace(x, shape=shape)
    return None


def _arange(m: GraphMapper, args: list[Any], kw: dict[str, Any], shape: tuple[int, ...], dtype: str) -> Any:
    """arange(start, end, step) as a tensor the wrapper makes: a leaf, so that a view of it ([1, N]
    or [N, 1]) reads it per column or per row (triu and tril's index masks)."""
    from kernelevolve.synth.tuner.aten_values import _Val

    given = [a for a in args if a is not None]
    start, step = (given[0], given[2] if len(given) > 2 else 1) if len(given) > 1 else (0, 1)
    if not all(isinstance(v, int) for v in (start, step)) or len(shape) != 1:
        raise _unsupported("aten.arange of other than integer bounds is not templated")
    name = f"arange{len(m.leaf_source)}"
    m.leaf_source[name] = (f"arange:{start}:{step}:{shape[0]}", shape, dtype)
    return _Val(None, "leaf", shape, leaf=name)


def _unsupported(why: str) -> Exception:
    from kernelevolve.synth.tuner.aten_values import Unsupported

    return Unsupported(why)


def _over_all(shape: tuple[int, ...]) -> bool:
    return shape == ()  # every dim reduced (dim None, [] or all of them)


def _total(m: GraphMapper, name: str, x: Any) -> Any:
    from kernelevolve.synth.tuner.aten_values import _Val

    if not m.total:
        raise _unsupported(
            f"{name} over every dim is templated only as the output (a loss), not read per element"
        )
    v = m.read(x)
    if v.layout not in ("full", "row") or not isinstance(v.ref, str):
        raise _unsupported(f"{name} over every dim of a {v.layout} value is not templated")
    if v.layout == "row" and v.shape not in (m.o[:-1], (*m.o[:-1], 1)):
        raise _unsupported(f"{name} of a per-row value of shape {list(v.shape)} is not templated")
    return _Val(m.new(f"total_{name}", (v.ref,)), "scalar", ())


def _gather(m: GraphMapper, args: list[Any], shape: tuple[int, ...]) -> Any:
    """gather(src, last dim, index [..., 1]): one value per row, picked by the row's index."""
    src, dim, index = args[0], args[1], args[2]
    n = len(m.o)
    full = m.read(src)
    idx = m.read(index)
    if full.layout != "full" or dim % n != n - 1 or idx.layout != "row" or shape != (*m.o[:-1], 1):
        raise _unsupported("gather is templated only along the last dim of a full value by one index per row")
    picked = m.elementwise("where_col", [idx, full], m.o)
    return m.reduce("sum", picked, [-1], True)


def _norm(m: GraphMapper, args: list[Any], kw: dict[str, Any], shape: tuple[int, ...]) -> Any:
    given = dict(zip(("ord", "dim", "keepdim"), args[1:], strict=False)) | kw
    order, dims, keep = given.get("ord", 2), given.get("dim"), bool(given.get("keepdim", False))
    n = len(m.o)
    if dims is None or [d % n for d in ([dims] if isinstance(dims, int) else dims)] != [n - 1]:
        raise _unsupported("linalg_vector_norm is templated only over the last dim")
    if order == 2:
        return m.elementwise(
            "sqrt", [m.reduce("sum", m.elementwise("square", [args[0]], m.o), [-1], keep)], shape
        )
    if order == 1:
        return m.reduce("sum", m.elementwise("abs", [args[0]], m.o), [-1], keep)
    if order == float("inf"):
        return m.reduce("amax", m.elementwise("abs", [args[0]], m.o), [-1], keep)
    raise _unsupported(f"linalg_vector_norm of order {order} is not templated (1, 2, inf)")


def _scan(m: GraphMapper, name: str, args: list[Any], kw: dict[str, Any], shape: tuple[int, ...]) -> Any:
    from kernelevolve.synth.tuner.aten_values import _Val

    x, dim = args[0], args[1] if len(args) > 1 else kw.get("dim")
    n = len(m.o)
    if dim is None or dim % n != n - 1 or len(shape) != n:
        raise _unsupported(f"{name} is templated only along the last dim of the output's shape {list(m.o)}")
    if kw.get("dtype") is not None:
        raise _unsupported(f"{name} with a dtype is not templated")
    if any(op.op in SCAN_OPS for op in m.ops):
        raise _unsupported("more than one scan is not templated")
    kind, inner = name, x
    if isinstance(x, _Flip):
        kind, inner = f"{name}_rev", x.value
    elif isinstance(x, _Head):
        kind, inner = f"{name}_excl", x.value
    v = m.read(inner)
    if v.layout != "full" or v.shape != m.o or not isinstance(v.ref, str):
        raise _unsupported(f"{name} of a {v.layout} value of shape {list(v.shape)} is not templated")
    out = _Val(m.new(kind, (v.ref,)), "full", m.o)
    if isinstance(x, _Flip):
        return _Flip(out)
    if isinstance(x, _Head):
        return _Shifted(out, _IDENTITY[name])
    return out


def _cat(m: GraphMapper, args: list[Any], shape: tuple[int, ...]) -> Any:
    from kernelevolve.synth.tuner.aten_values import _Val

    parts = list(args[0])
    dim = args[1] if len(args) > 1 else 0
    n = len(m.o)
    if (
        len(parts) == 2
        and dim % n == n - 1
        and shape == m.o
        and isinstance(parts[1], _Shifted)
        and isinstance(parts[0], _Val)
        and parts[0].ref == parts[1].identity
    ):
        return parts[1].value
    raise _unsupported("cat is templated only as the identity column before an exclusive scan")


def check(m: GraphMapper) -> None:
    """Refuse what the scalar and scan templates cannot run: a total read per element, reductions
    around a scan."""
    from kernelevolve.synth.tuner.ir import OpGraph

    main = "a matmul" if m.gemm else "a convolution" if m.conv else "a pooling" if m.pool else None
    if main and m.total:
        raise _unsupported(f"a reduction to one value (a loss) after {main} is not templated")
    if main and any(op.op in SCAN_OPS for op in m.ops):
        raise _unsupported(f"a scan after {main} is not templated")
    layouts = OpGraph("row", list(m.tensors.values()), m.ops, [])
    derived: set[str] = set()  # the totals and what is computed from them
    for op in m.ops:
        refs = {a for a in op.args if isinstance(a, str)}
        if op.op in TOTAL_OPS and not refs & derived:
            derived.add(op.out)
        elif refs & derived:
            if (
                op.op in REDUCE_OPS
                or op.op in TOTAL_OPS
                or op.op in SCAN_OPS
                or any(a not in derived and layouts.layout_of(a) != "scalar" for a in refs)
            ):
                raise _unsupported(
                    "a value computed from a total is read per element or reduced again (two passes): "
                    "not templated"
                )
            derived.add(op.out)
    if any(op.op in SCAN_OPS for op in m.ops) and any(op.op in REDUCE_OPS for op in m.ops):
        raise _unsupported("a scan together with a reduction is not templated")


def constant(gm: Any, node: Any) -> Any:
    """A tensor constant of the traced graph (`torch.tensor(c)` in the forward) as its value."""
    from kernelevolve.synth.tuner.aten_values import _Val

    value = getattr(gm, str(node.target), None)
    if value is None or value.numel() != 1 or value.is_meta or value.dtype.is_complex:
        raise _unsupported(f"the constant tensor {node.target} is not templated (only single values)")
    return _Val(float(value.item()), "scalar", tuple(value.shape))


def pattern(m: GraphMapper) -> str | None:
    if m.total:
        return "scalar"
    if any(op.op in SCAN_OPS for op in m.ops):
        return "scan"
    return None


__all__ = ["INDEX_DTYPES", "NOT_MINE", "check", "pattern", "total_space", "visit"]
