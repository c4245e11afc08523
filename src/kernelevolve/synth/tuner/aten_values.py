"""The values a graph mapper passes around (`aten_map.GraphMapper` and the op families it hands to
`aten_misc`): a traced value, a comparison pending its `where`, an unreadable secondary result, a
node's shape and dtype, the shape helpers, and the refusal; and `MapperCore`, what the op families
that `GraphMapper` composes (`aten_gemm`, `aten_conv`, `aten_pool`, `aten_composite`) use of it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from kernelevolve.synth.tuner.ir import Arg, ConvInfo, GemmInfo, Op, PoolInfo, TensorArg


class Unsupported(Exception):
    """Why the reference is outside what the templates generate."""


@dataclass(frozen=True)
class _Val:
    """A traced value: an IR name or a constant, its layout, its torch shape. `leaf` values are
    tensors not yet read by any op (a placeholder, possibly viewed); `transposed` marks a leaf whose
    last two dims were swapped, which only a matmul operand may be."""

    ref: Arg
    layout: str  # "full" | "col" | "row" | "scalar" | "cond" (a comparison, pending a where)
    shape: tuple[int, ...]
    leaf: str | None = None  # placeholder name, while the value is a view of it
    transposed: bool = False


@dataclass(frozen=True)
class _Cond:
    """A comparison, pending the `where` that reads it."""

    value: _Val  # `value > 0` (gt, lt) or `value > 0` with the branches swapped (ge, le)
    kind: str


@dataclass(frozen=True)
class _NoValue:
    """A secondary result (layer norm's mean, max's indices): reading it is refused."""

    what: str


def _shape(node: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


def _dtype(node: Any) -> str:
    return str(node.meta["val"].dtype).removeprefix("torch.")


def _dtype_of(v: Any) -> str:
    return str(getattr(v, "dtype", "")).removeprefix("torch.")


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _pad(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    return (1,) * (n - len(shape)) + shape


def _unit_view(result: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...]:
    """`out` as `result` with unit dims added or dropped (`OpGraph.out_view`): per dim of `out`, the
    dim of `result` it is, -1 for an added 1."""
    dims, j = [], 0
    for d in out:
        while j < len(result) and result[j] != d and result[j] == 1:
            j += 1  # a unit dim of the result that the output drops
        if j < len(result) and result[j] == d:
            dims.append(j)
            j += 1
        elif d == 1:
            dims.append(-1)
        else:
            j = len(result) + 1
            break
    if j > len(result) or any(r != 1 for r in result[j:]):
        raise Unsupported(f"the main op's result {list(result)} is reshaped to the output {list(out)}")
    return tuple(dims)


def _channel(o: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of one value per channel (dim 1) of an output of shape `o`, padded to its rank."""
    return (1, o[1], *(1,) * (len(o) - 2))


class MapperCore(Protocol):
    """What `aten_map.GraphMapper`'s op-family mixins read and write of it (their methods take it as
    `self`): the output's shape, the table of values, the record of the main op, and the methods
    that read, register and make values. A mixin also declares, as a class attribute, each of these
    that it assigns (mypy would otherwise take the type of its assignment)."""

    o: tuple[int, ...]
    cols: int
    ops: list[Op]
    tensors: dict[str, TensorArg]
    leaf_source: dict[str, tuple[str, tuple[int, ...], str]]
    gemm: GemmInfo | None
    gemm_sizes: tuple[int, int, int, int]
    conv: ConvInfo | None
    conv_sizes: tuple[int, int, int, int]
    pool: PoolInfo | None
    main_shape: tuple[int, ...]

    def read(self, v: Any) -> _Val: ...

    def register(self, name: str, source: str, layout: str, dtype: str) -> None: ...

    def view(self, x: Any, shape: tuple[int, ...]) -> _Val: ...

    def elementwise(self, op: str, args: list[Any], shape: tuple[int, ...]) -> _Val: ...

    def reduce(
        self, op: str, x: Any, dims: Any, keepdim: bool, shape: tuple[int, ...] | None = None
    ) -> _Val: ...


__all__ = ["MapperCore", "Unsupported"]
