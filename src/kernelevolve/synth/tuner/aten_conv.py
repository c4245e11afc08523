"""The convolution as a graph's main op (`ConvInfo`), for `aten_map.GraphMapper`: `aten.convolution`
over 1, 2 or 3 spatial dims, grouped or transposed, with an optional bias per output channel.

`ConvMapping.convolution` takes a convolution that comes before any compute (an elementwise epilogue
may follow it, in `aten_map`) of an input and a weight as given (batched, not reshaped), its result
the output's shape. It records the `ConvInfo` (stride, padding, dilation and a transposed one's
output padding per spatial dim), the implicit GEMM's sizes (groups, M, N and K per group) and the
result's shape. `unify_same_padding` lets a spec whose shapes differ in kernel size with SAME
padding (`padding=kernel_size // 2`, the suites' conv1d_serving) trace to one graph: the padding is
then computed from the weight at each call (`ir.SAME`).

Deliberately not here: the walk and the epilogue (`aten_map`), the kernel (`triton_conv`), string
padding ("same"), a pooling, reduction or reshape after the convolution (a staged pipeline's next
stage), compute before it. They raise `Unsupported` with the reason.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kernelevolve.synth.tuner.aten_values import MapperCore, Unsupported, _numel, _Val
from kernelevolve.synth.tuner.ir import SAME, ConvInfo, OpGraph, per_node


class ConvMapping:
    """`GraphMapper`'s convolution (a mixin: its methods take the mapper as `self`)."""

    conv: ConvInfo | None  # what `convolution` assigns (see `MapperCore`)
    conv_sizes: tuple[int, int, int, int]
    main_shape: tuple[int, ...]

    def convolution(self: MapperCore, args: list[Any], shape: tuple[int, ...]) -> _Val:
        """`aten.convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)`
        as the main op: x an input (or parameter), w a parameter, an optional [C_out] bias."""
        if self.gemm is not None or self.conv is not None or self.pool is not None:
            raise Unsupported("more than one matmul, convolution or pooling is not templated")
        if self.ops:
            raise Unsupported(
                "compute before the convolution is not templated (only an elementwise epilogue)"
            )
        x, w, bias, stride, padding, dilation, transposed, output_padding, groups = (*args, *(None,) * 9)[:9]
        for operand in (x, w):
            if not (isinstance(operand, _Val) and operand.leaf is not None and not operand.transposed):
                raise Unsupported(
                    "convolution operands must be the forward's inputs or the module's parameters"
                )
        x_src, x_base, x_dtype = self.leaf_source[x.leaf]
        w_src, w_base, w_dtype = self.leaf_source[w.leaf]
        dims = len(x.shape) - 2
        if dims not in (1, 2, 3) or x_base != x.shape or w_base != w.shape or len(w.shape) != dims + 2:
            raise Unsupported(
                f"convolution of {x_src} {list(x_base)} by {w_src} {list(w_base)}: templated over 1, 2 "
                "or 3 spatial dims of the tensors as given (batched, not reshaped)"
            )
        if shape != self.o:
            raise Unsupported(
                f"the convolution's result {list(shape)} is not the output {list(self.o)}: only an "
                "elementwise epilogue is templated after a convolution (no pooling, reduction or reshape)"
            )
        if isinstance(padding, str):
            raise Unsupported(f"convolution padding {padding!r} is not templated")
        per_dim = [tuple(int(v) for v in (p if isinstance(p, list | tuple) else [p or 0] * dims)) for p in
                   (stride, padding, dilation, output_padding)]  # fmt: skip
        if any(len(p) != dims for p in per_dim):
            raise Unsupported("convolution stride, padding and dilation must give one value per spatial dim")
        self.register(x.leaf, x_src, "full", x_dtype)
        self.register(w.leaf, w_src, "full", w_dtype)
        bias_name = None
        g = int(groups or 1)
        out_channels = w.shape[1] * g if transposed else w.shape[0]
        if bias is not None:
            if not (isinstance(bias, _Val) and bias.leaf is not None and bias.shape == (out_channels,)):
                raise Unsupported("a convolution's bias must be a [C_out] parameter")
            b_src, _, b_dtype = self.leaf_source[bias.leaf]
            self.register(bias.leaf, b_src, "chan", b_dtype)
            bias_name = bias.leaf
        stride_t, padding_t, dilation_t, output_padding_t = per_dim
        positions, in_per_group = _numel(shape[2:]), x.shape[1] // g
        self.conv = ConvInfo(
            x.leaf, w.leaf, dims, stride_t, padding_t, dilation_t, groups=g, bias=bias_name,
            transposed=bool(transposed), output_padding=output_padding_t if transposed else (),
            in_per_group=in_per_group, kernel=tuple(int(k) for k in w.shape[2:]),
        )  # fmt: skip
        self.conv_sizes = (g, shape[0] * positions, shape[1] // g, in_per_group * _numel(w.shape[2:]))
        self.main_shape = shape
        return _Val("acc", "full", shape)


def unify_same_padding(graphs: list[OpGraph]) -> list[OpGraph]:
    """`graphs` (one per spec shape) where each convolution that differs between them only in its
    padding, kept SAME at every shape (dilation * (K - 1) // 2 of that shape's kernel size K), and its
    input channels per group, takes a padding of `SAME` (the wrapper computes it from the weight at
    each call) and an unknown `in_per_group` where that differs; the graphs as they are otherwise."""
    if len(graphs) < 2:
        return graphs
    return per_node(graphs, _same_padding) or graphs


def _same_padding(nodes: list[OpGraph]) -> list[OpGraph]:
    """One node per shape, its convolution's padding SAME where that is all that differs."""
    infos = [n.conv for n in nodes]
    first = infos[0]
    if first is None or first.transposed or all(c == first for c in infos):
        return nodes
    if any(c is None or replace(c, padding=first.padding, in_per_group=first.in_per_group) != first
           for c in infos):  # fmt: skip
        return nodes
    same = [c for c in infos if c is not None]
    if not all(_is_same(c) for c in same):
        return nodes
    per_group = first.in_per_group if all(c.in_per_group == first.in_per_group for c in same) else 0
    return [
        replace(n, conv=replace(c, padding=(SAME,) * c.dims, in_per_group=per_group))
        for n, c in zip(nodes, same, strict=True)
    ]


def _is_same(c: ConvInfo) -> bool:
    return len(c.kernel) == c.dims and all(
        p == d * (k - 1) // 2 for p, d, k in zip(c.padding, c.dilation, c.kernel, strict=True)
    )


__all__ = ["ConvMapping", "unify_same_padding"]
