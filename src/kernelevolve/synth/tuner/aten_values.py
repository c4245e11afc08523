"""The values a graph mapper passes around (`aten_map.GraphMapper` and the op families it hands to
`aten_misc`): a traced value, an unreadable secondary result, a node's shape, and the refusal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelevolve.synth.tuner.ir import Arg


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


def _shape(node: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


@dataclass(frozen=True)
class _NoValue:
    """A secondary result (layer norm's mean, max's indices): reading it is refused."""

    what: str


__all__ = ["Unsupported"]
