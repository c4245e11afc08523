"""The matmul as a graph's main op (`GemmInfo`), for `aten_map.GraphMapper`: `mm`, `addmm` and
`bmm` of the forward's inputs or the module's parameters, and the transposes that mark an operand.

`GemmMapping.transpose` marks a leaf viewed with its last two dims swapped (`t`, `permute`,
`transpose`): only a matmul may read it. `GemmMapping.matmul` takes a matmul that comes before any
compute (an elementwise epilogue may follow it, in `aten_map`). Operand a is a contiguous [M, K]
(batch dims folded into M) or a transposed view of a [K, M]; b a contiguous [K, N], or a transposed
view of an [N, K] (a Linear weight, read through its strides, never copied); `addmm`'s bias one
value per column. It records the `GemmInfo`, the GEMM's sizes (batch, M, N, K) and the result's
shape as the wrapper allocates it.

Deliberately not here: the walk and the epilogue (`aten_map`), views judged by their strides
(einsum's permutes: `aten_misc`), the kernel (`triton_gemm`), a second matmul (attention: `stages`
names it) and compute before the matmul (a staged pipeline's first stage). They raise `Unsupported`
with the reason.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kernelevolve.synth.tuner.aten_values import MapperCore, Unsupported, _numel, _Val
from kernelevolve.synth.tuner.ir import GemmInfo


class GemmMapping:
    """`GraphMapper`'s matmul and transposes (a mixin: its methods take the mapper as `self`)."""

    gemm: GemmInfo | None  # what `matmul` assigns (see `MapperCore`)
    gemm_sizes: tuple[int, int, int, int]
    main_shape: tuple[int, ...]

    def transpose(self: MapperCore, name: str, args: list[Any], shape: tuple[int, ...]) -> _Val:
        """A transposed view of a leaf (its last two dims swapped), which only a matmul operand may be."""
        x = args[0]
        n = len(shape)
        if name == "permute":
            swap = n >= 2 and [d % n for d in args[1]] == [*range(n - 2), n - 1, n - 2]
        elif name == "transpose":
            swap = n >= 2 and sorted(d % n for d in args[1:3]) == [n - 2, n - 1]
        else:
            swap = n == 2
        if not (isinstance(x, _Val) and x.leaf is not None and swap and not x.transposed):
            raise Unsupported("transposes are templated only of a weight that feeds a matmul")
        return replace(x, shape=shape, transposed=True)

    def matmul(
        self: MapperCore, name: str, args: list[Any], kw: dict[str, Any], shape: tuple[int, ...]
    ) -> _Val:
        """`aten.mm(a, b)`, `aten.addmm(bias, a, b)` or `aten.bmm(a, b)` as the main op (`GemmInfo`)."""
        if self.gemm is not None or self.conv is not None or self.pool is not None:
            raise Unsupported("more than one matmul, convolution or pooling is not templated")
        if self.ops:
            raise Unsupported("compute before the matmul is not templated (only an elementwise epilogue)")
        bias, a, b = (args[0], args[1], args[2]) if name == "addmm" else (None, args[0], args[1])
        if kw.get("beta", 1) != 1 or kw.get("alpha", 1) != 1:
            raise Unsupported("addmm with beta or alpha other than 1 is not templated")
        for operand in (a, b):
            if not (isinstance(operand, _Val) and operand.leaf is not None):
                raise Unsupported("matmul operands must be the forward's inputs or the module's parameters")
        batched = name == "bmm"
        batch = a.shape[0] if batched else 1
        m, k = a.shape[-2], a.shape[-1]
        n = shape[-1]
        a_src, a_base, a_dtype = self.leaf_source[a.leaf]
        b_src, b_base, b_dtype = self.leaf_source[b.leaf]
        a_km = (
            a.transposed
            and a_base[-2:] == (k, m)
            and _numel(a_base[:-2]) == batch
            and (batched or len(a_base) == 2)
        )
        if not a_km and (a.transposed or _numel(a_base) != batch * m * k or a_base[-1] != k):
            raise Unsupported(
                f"matmul operand {a_src} of shape {list(a_base)} is not a contiguous [M, K] or [K, M]"
            )
        b_layout = "nk" if b.transposed else "kn"
        matrix = (n, k) if b.transposed else (k, n)
        if b_base[-2:] != matrix or _numel(b_base[:-2]) != batch or (not batched and len(b_base) != 2):
            raise Unsupported(
                f"matmul operand {b_src} of shape {list(b_base)} is not a contiguous [K, N] or [N, K]"
            )
        self.register(a.leaf, a_src, "full", a_dtype)
        self.register(b.leaf, b_src, "full", b_dtype)
        bias_name = None
        if bias is not None:
            bv = self.read(bias)
            if bv.layout != "col" or not isinstance(bv.ref, str) or bv.ref not in self.tensors:
                raise Unsupported("addmm's bias must be a [N] parameter or input")
            bias_name = bv.ref
        self.gemm = GemmInfo(a.leaf, b.leaf, b_layout, bias_name, batched, "km" if a_km else "mk")  # type: ignore[arg-type]
        self.gemm_sizes = (batch, m, n, k)
        self.main_shape = (*a_base[:-2], m, n) if a_km else (*a_base[:-1], n)  # as the wrapper allocates it
        return _Val("acc", "full", shape)


__all__ = ["GemmMapping"]
