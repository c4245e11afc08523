"""The composite ops that the core aten decompositions leave whole, expanded into the IR's
elementwise ops and row reductions, for `aten_map.GraphMapper`: `_softmax`, `_log_softmax`,
`logsumexp`, `native_layer_norm` (over the last dim), `var` / `var_mean`, and the activations that
are several elementwise ops (`elu` with selu and celu, `leaky_relu`).

Each method of `CompositeMapping` builds its op from the mapper's `reduce` and `elementwise`, so
that the expansion follows the mapper's layouts: a subclass that reduces over other dims
(`aten_reduce.ReduceMapper`) overrides the reductions' expansions with its own. Secondary results
that the templates do not compute (layer norm's mean and rstd) are returned unreadable.

Deliberately not here: the dispatch of aten ops to these (`aten_map.GraphMapper.visit`), the
reductions themselves (`GraphMapper.reduce`), activations that are one IR op (gelu, clamp: in
`aten_map`), norms over other dims (`aten_reduce`).
"""

from __future__ import annotations

from typing import Any

from kernelevolve.synth.tuner.aten_values import MapperCore, Unsupported, _NoValue, _Val


class CompositeMapping:
    """`GraphMapper`'s composite ops (a mixin: its methods take the mapper as `self`)."""

    def softmax(self: MapperCore, name: str, x: Any, dim: Any, keepdim: bool = True) -> _Val:
        dims = dim if isinstance(dim, list | tuple) else [dim]
        row, full = ((*self.o[:-1], 1) if keepdim else self.o[:-1]), self.o
        m = self.reduce("amax", x, dims, True)
        d = self.elementwise("sub", [x, m], full)
        e = self.elementwise("exp", [d], full)
        s = self.reduce("sum", e, [-1], keepdim)
        if name == "_softmax":
            return self.elementwise("div", [e, s], full)
        log_s = self.elementwise("log", [s], row)
        if name == "_log_softmax":
            return self.elementwise("sub", [d, log_s], full)
        return self.elementwise("add", [log_s, m if keepdim else self.view(m, row)], row)

    def layer_norm(self: MapperCore, x: Any, normalized: Any, w: Any, b: Any, eps: float) -> tuple[Any, ...]:
        if len(normalized) != 1:
            raise Unsupported("layer norm over more than the last dim is not templated")
        full, row = self.o, (*self.o[:-1], 1)
        mean = self.reduce("mean", x, [-1], True)
        d = self.elementwise("sub", [x, mean], full)
        var = self.reduce("mean", self.elementwise("square", [d], full), [-1], True)
        rstd = self.elementwise("rsqrt", [self.elementwise("add", [var, eps], row)], row)
        y = self.elementwise("mul", [d, rstd], full)
        if w is not None:
            y = self.elementwise("mul", [y, w], full)
        if b is not None:
            y = self.elementwise("add", [y, b], full)
        return (y, _NoValue("layer norm's mean"), _NoValue("layer norm's rstd"))

    def var(self: MapperCore, name: str, args: list[Any], kw: dict[str, Any]) -> Any:
        dims = args[1] if len(args) > 1 else kw.get("dim")
        correction = kw.get("correction", 1)
        correction = 1 if correction is None else correction
        keep = bool(kw.get("keepdim", False))
        if dims is None:
            raise Unsupported(f"{name} over every dim is not templated")
        full, row = self.o, ((*self.o[:-1], 1) if keep else self.o[:-1])
        mean = self.reduce("mean", args[0], dims, True)
        sq = self.elementwise("square", [self.elementwise("sub", [args[0], mean], full)], full)
        var = self.reduce("mean", sq, [-1], keep)
        if correction:  # a constant that depends on cols: shapes with other cols give another graph
            var = self.elementwise("mul", [var, self.cols / (self.cols - correction)], row)
        if name == "var":
            return var
        return (var, mean if keep else self.view(mean, row))

    def elu(self: MapperCore, args: list[Any], kw: dict[str, Any], shape: tuple[int, ...]) -> _Val:
        """scale * (x if x > 0 else alpha * expm1(input_scale * x)): elu, selu, celu."""
        given = [*args[1:4], *(None,) * (4 - len(args))]
        alpha, scale, input_scale = (
            kw.get(key, value if value is not None else 1.0)
            for key, value in zip(("alpha", "scale", "input_scale"), given, strict=True)
        )
        if not all(isinstance(c, int | float) for c in (alpha, scale, input_scale)):
            raise Unsupported("elu with tensor constants is not templated")
        inner = args[0] if input_scale == 1 else self.elementwise("mul", [args[0], input_scale], shape)
        expm1 = self.elementwise("expm1", [inner], shape)
        neg = self.elementwise("mul", [expm1, float(alpha) * float(scale)], shape)
        pos = args[0] if scale == 1 else self.elementwise("mul", [args[0], scale], shape)
        return self.elementwise("where_gt0", [args[0], pos, neg], shape)

    def leaky_relu(self: MapperCore, args: list[Any], shape: tuple[int, ...]) -> _Val:
        slope = args[1] if len(args) > 1 else 0.01
        scaled = self.elementwise("mul", [args[0], slope], shape)
        return self.elementwise("where_gt0", [args[0], args[0], scaled], shape)


__all__ = ["CompositeMapping"]
