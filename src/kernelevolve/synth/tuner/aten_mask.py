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

Both sources embed sizes, so a spec whose shapes slice or broadcast differently traces to different
graphs (refused as such). The CPU generator does not read these sources (`c_codegen` refuses them).

Deliberately not here: reading a broadcast tensor in place (a layout indexed modulo its size, which
would need every template's indexing), slices with a step, slices of computed values.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

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


__all__ = ["broadcast_leaf", "read_broadcast", "slice_leaf"]
