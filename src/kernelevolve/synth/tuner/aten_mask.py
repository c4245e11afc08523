"""Masks read from a parameter or buffer: a slice of it, broadcast over the output's outer dims (issue K).

MinGPT's causal attention masks its scores with a registered buffer, `bias[:, :, :T, :T] == 0`, of
shape [1, 1, T, T] against scores [B, H, T, T]. Two pieces make that readable by the templates:

- `slice_leaf`: a unit-step slice of a leaf (a forward argument or a parameter, not transposed, read
  as its own shape) is a leaf of its own whose source is `slice:<dim>:<start>:<end>:<source>`; the
  wrapper fetches `source[:, .., start:end]` (`triton_common.source_expr`) and makes it contiguous,
  as it does every tensor it reads.
- `broadcast_leaf`: a leaf expanded to the output's shape over dims where it has size 1 (an outer
  broadcast, which no layout reads: `full`, `row`, `col`, `scalar`, `chan`) is read `full` from the
  source `expand:<d0>,<d1>,..:<source>`, which the wrapper materializes (`.expand(..).contiguous()`):
  one extra copy of the output's size per call, exact. `aten_attention` puts the `expand` in the
  graph where such a mask meets the scores (torch broadcasts it inside the `where`).

Attention behind a projection (MinGPT's `c_attn(x).split(C, 2)`, each piece viewed [B, T, H, D] and
transposed to [B, H, T, D]) reads its operands as permuted views of the projection's output:

- `split_leaves`: `split_with_sizes` of a leaf is a slice leaf per piece (`slice_leaf`).
- `materialize`: a permuted view of a leaf that is neither contiguous nor transposed (`aten_misc`'s
  `_Strided`), once something other than a further view reads it (the decomposition's `expand` and
  `clone` before a `bmm`), is a leaf of its own, `strided:<shape>:<strides>:<offset>:<root>`: the
  wrapper takes it with `torch.as_strided` of the root (a forward argument or parameter, traced
  contiguous, made contiguous first) with the traced strides and offset, and the template copies it
  contiguous as it reads it (a GEMM's reshape), one pass over the operand.
- `reshaped_leaf`: a view of such a leaf that changes its last dim is `reshape:<shape>:<source>` (its
  sizes are the wrapper's then, so a GEMM's K is the viewed one: `y.transpose(1, 2).contiguous()
  .view(B, T, C)`).

These sources embed sizes, so a spec whose shapes slice, broadcast or permute differently traces to
different graphs: the views' numbers are fitted to their root's sizes where they can be (`shape_views`,
which reads the root's traced sizes that `materialize` records as `shaped:<sizes>:<root>`), the rest
refused as such. The CPU generator does not read them (`c_codegen` refuses them).

Deliberately not here: reading a broadcast tensor in place (a layout indexed modulo its size, which
would need every template's indexing), slices with a step, slices of computed values.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kernelevolve.synth.tuner import shape_views
from kernelevolve.synth.tuner.aten_graph import op_name
from kernelevolve.synth.tuner.aten_values import _numel, _pad, _Val

_SLICEABLE = ("input", "param", "slice")


def slice_leaf(m: Any, x: Any, args: list[Any], shape: tuple[int, ...]) -> _Val | None:
    """`x[.., start:end]` (aten.slice's `args`: x, dim, start, end, step) as a leaf of its own, or None where it is not a unit-step slice of a leaf."""
    if not isinstance(x, _Val) or x.leaf is None or x.transposed:
        return None
    source, base, dtype = m.leaf_source[x.leaf]
    if x.shape != base or source.partition(":")[0] not in _SLICEABLE or not base:
        return None
    given = [*args[1:5], *[None] * (5 - len(args))]
    dim, start, end, step = (given[0] or 0), given[1], given[2], 1 if given[3] is None else given[3]
    if step != 1 or not all(isinstance(v, int | None) for v in (dim, start, end)):
        return None
    n = len(base)
    dim, size = dim % n, base[dim % n]
    start, end = slice(start, end).indices(size)[:2]
    if shape != (*base[:dim], max(end - start, 0), *base[dim + 1 :]):
        return None
    name = f"{x.leaf}_s{dim}_{start}_{end}"
    m.leaf_source[name] = (f"slice:{dim}:{start}:{end}:{source}", shape, dtype)
    return _Val(None, "leaf", shape, leaf=name)


def broadcast_leaf(m: Any, v: _Val, source: str, base: tuple[int, ...]) -> tuple[str, str] | None:
    """(the name, the source) of leaf `v` read `full`, materialized, where `v` is its `base` shape
    expanded to the output's over dims of size 1; None otherwise."""
    o = m.o
    if v.shape != o or len(base) > len(o) or _numel(base) >= _numel(o):
        return None
    if not all(b in (1, d) for b, d in zip(_pad(base, len(o)), o, strict=True)):
        return None
    return f"{v.leaf}_full", f"expand:{','.join(map(str, o))}:{source}"


def read_broadcast(m: Any, v: _Val, source: str, base: tuple[int, ...], dtype: str) -> _Val | None:
    """`v` read from its materialized broadcast (see `broadcast_leaf`), registered; None where not one."""
    found = broadcast_leaf(m, v, source, base)
    if found is None:
        return None
    name, full = found
    m.register(name, full, "full", dtype)
    return replace(v, ref=name, layout="full", leaf=None)


def split_leaves(m: Any, x: Any, sizes: list[int], dim: int) -> tuple[_Val, ...] | None:
    """`split_with_sizes(x, sizes, dim)` of a leaf: a slice leaf per piece, or None where `x` is not
    a leaf a slice can take."""
    if not isinstance(x, _Val) or x.leaf is None or not all(isinstance(n, int) for n in sizes):
        return None
    dim = dim % len(x.shape)
    pieces, start = [], 0
    for size in sizes:
        shape = (*x.shape[:dim], size, *x.shape[dim + 1 :])
        piece = slice_leaf(m, x, [x, dim, start, start + size], shape)
        if piece is None:
            return None
        pieces.append(piece)
        start += size
    return tuple(pieces)


def materialize(m: Any, x: _Val, node: Any) -> _Val | None:
    """The permuted view `node` (an fx node whose value is a strided view of leaf `x`'s root) as a leaf
    of its own (`strided:` source); None where the root is not a forward argument or parameter that
    was traced contiguous from its start."""
    val, root = node.meta.get("val"), node
    while getattr(root, "op", None) == "call_function" and root.args:
        if op_name(root) not in _PURE_VIEWS:  # a copy (clone, a reshape that copies): strides of its own
            return None
        root = root.args[0]
    base = getattr(root, "meta", {}).get("val")
    if val is None or base is None or not base.is_contiguous() or base.storage_offset() != 0:
        return None
    source = m.leaf_source[x.leaf][0]
    while source.startswith(("slice:", "strided:")):  # the traced strides are the root's
        source = _strip_shaped(source.split(":", 4)[4])
    if source.partition(":")[0] not in ("input", "param"):
        return None
    shape, stride = tuple(val.shape), tuple(val.stride())
    name = f"{x.leaf}_v{len(m.leaf_source)}"
    # The root's traced sizes go with the view (`shaped:`): `shape_views` fits the view's numbers to
    # them where a spec's shapes trace to different views.
    root = f"shaped:{_csv(tuple(base.shape))}:{source}"
    made = f"strided:{_csv(shape)}:{_csv(stride)}:{val.storage_offset()}:{root}"
    m.leaf_source[name] = (made, shape, m.leaf_source[x.leaf][2])
    return _Val(None, "leaf", shape, leaf=name)


def reshaped_leaf(m: Any, x: _Val, shape: tuple[int, ...]) -> _Val | None:
    """A view of a `strided:` leaf (or of its reshape) that changes its last dim, as a leaf of the
    viewed shape; None for others (a view of the leading dims is read as any leaf's is: the GEMM's
    batch, say)."""
    source, base, dtype = m.leaf_source[x.leaf]
    if x.transposed or source.partition(":")[0] not in ("strided", "reshape") or shape[-1:] == base[-1:]:
        return None
    inner = source.split(":", 2)[2] if source.startswith("reshape:") else source
    name = f"{x.leaf}_r{len(m.leaf_source)}"
    m.leaf_source[name] = (f"reshape:{_csv(shape)}:{inner}", shape, dtype)
    return _Val(None, "leaf", shape, leaf=name)


def view_expr(source: str, inner: Any) -> str:
    """The wrapper's expression for a `strided:` or `reshape:` source; `inner(source)` writes the one
    it reads. Sizes, strides and offsets are numbers, or expressions of the root's sizes
    (`shape_views`), read from the root at the call."""
    kind, _, rest = source.partition(":")
    if kind == "reshape":
        dims, what = rest.split(":", 1)
        if "r" in dims:  # sizes of the strided view's root
            base = inner(_root_of(what))
            dims = ",".join(shape_views.expr(d, base) for d in dims.split(","))
        return f"{inner(what)}.reshape({dims},)"
    dims, strides, offset, what = rest.split(":", 3)
    base = inner(_strip_shaped(what))
    root = f"{base}.contiguous()"
    dims, strides = (",".join(shape_views.expr(v, base) for v in f.split(",")) for f in (dims, strides))
    offset = shape_views.expr(offset, base)
    return f"torch.as_strided({root}, ({dims},), ({strides},), {root}.storage_offset() + {offset})"


def _strip_shaped(source: str) -> str:
    """A root source without its recorded sizes (`shaped:<sizes>:<root>`, see `materialize`)."""
    return source.split(":", 2)[2] if source.startswith("shaped:") else source


def _root_of(source: str) -> str:
    """The root a `strided:` source (or a reshape of one) views."""
    while source.startswith(("strided:", "reshape:")):
        source = source.split(":", 4)[4] if source.startswith("strided:") else source.split(":", 2)[2]
    return _strip_shaped(source)


# Ops whose result shares its input's storage: a materialized view's strides are its root's.
_PURE_VIEWS = {"view", "_unsafe_view", "permute", "transpose", "t", "expand", "slice", "select",
               "split_with_sizes", "getitem", "unsqueeze", "squeeze", "alias"}  # fmt: skip


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(int(v)) for v in values)


__all__ = [
    "broadcast_leaf", "materialize", "read_broadcast", "reshaped_leaf", "slice_leaf", "split_leaves", "view_expr",
]  # fmt: skip
