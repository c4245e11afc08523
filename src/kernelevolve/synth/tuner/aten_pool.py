"""The pooling as a graph's main op (`PoolInfo`), for `aten_map.GraphMapper`: max and average
pooling over 1, 2 or 3 dims (`aten.max_poolNd_with_indices`, `aten.max_poolNd`, `aten.avg_poolNd`).

`PoolMapping.pooling` takes a pooling that comes before any compute (an elementwise epilogue may
follow it, in `aten_map`) of an input as given; a 1-d pooling arrives as a 2-d one of a view with a
unit dim, pooled by one without padding along it. It records the `PoolInfo` (kernel, stride,
padding, dilation per pooled dim; the average's `count_include_pad` and `divisor_override`) and the
result's shape as the wrapper allocates it (without the view's unit dims). Max pooling's indices
may be returned by aten but not read.

Deliberately not here: the walk and the epilogue (`aten_map`), the kernel (`triton_pool`),
ceil_mode, read indices, a pooling after another main op (a staged pipeline's next stage), compute
before it. They raise `Unsupported` with the reason.
"""

from __future__ import annotations

from typing import Any

from kernelevolve.synth.tuner.aten_values import MapperCore, Unsupported, _NoValue, _pad, _Val
from kernelevolve.synth.tuner.ir import PoolInfo

# Poolings: (kind, pooled dims) and their arguments after the input, as aten takes them. A 1-d pooling
# arrives as a 2-d one of a view with a unit dim; max pooling's second result (its int64 indices) is
# allowed only unread.
_POOLS = {"max_pool2d_with_indices": ("max", 2), "max_pool3d_with_indices": ("max", 3),
          "max_pool2d": ("max", 2), "max_pool3d": ("max", 3), "avg_pool2d": ("avg", 2), "avg_pool3d": ("avg", 3)}  # fmt: skip
_POOL_ARGS = {
    "max": ("kernel_size", "stride", "padding", "dilation", "ceil_mode"),
    "avg": ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"),
}


class PoolMapping:
    """`GraphMapper`'s pooling (a mixin: its methods take the mapper as `self`)."""

    pool: PoolInfo | None  # what `pooling` assigns (see `MapperCore`)
    main_shape: tuple[int, ...]

    def pooling(self: MapperCore, name: str, args: list[Any], kw: dict[str, Any], node: Any) -> Any:
        """`aten.max_poolNd_with_indices` / `aten.avg_poolNd` of an input as the main op (`PoolInfo`);
        its indices, where returned, may not be read."""
        kind, dims = _POOLS[name]
        if self.gemm is not None or self.conv is not None or self.pool is not None:
            raise Unsupported("a pooling after a matmul, convolution or pooling is not templated")
        if self.ops:
            raise Unsupported("compute before the pooling is not templated (only an elementwise epilogue)")
        val = node.meta.get("val")
        shape = tuple(int(d) for d in (val[0] if isinstance(val, tuple | list) else val).shape)
        x = args[0]
        if not (isinstance(x, _Val) and x.leaf is not None and not x.transposed):
            raise Unsupported("pooling is templated of the forward's inputs as given (no compute before it)")
        src, base, dtype = self.leaf_source[x.leaf]
        x_dims = len(base) - 2
        if not (1 <= x_dims <= dims and len(x.shape) == dims + 2 and base[:2] == x.shape[:2]
                and _pad(base[2:], 3) == _pad(x.shape[2:], 3)):  # fmt: skip
            raise Unsupported(f"pooling of {src} {list(base)} viewed as {list(x.shape)} is not templated")
        given = dict(zip(_POOL_ARGS[kind], args[1:], strict=False)) | kw
        if given.get("ceil_mode"):
            raise Unsupported("pooling with ceil_mode is not templated")

        def per_dim(key: str, default: int | None) -> tuple[int, ...]:
            v = given.get(key)
            v = default if v is None or v == [] else v
            v = v if isinstance(v, list | tuple) else [v] * dims
            if len(v) == 1:
                v = list(v) * dims
            if len(v) != dims or not all(isinstance(i, int) for i in v):
                raise Unsupported(f"pooling {key} {given.get(key)!r} is not templated")
            return tuple(int(i) for i in v)

        kernel = per_dim("kernel_size", None)
        stride = per_dim("stride", None) if given.get("stride") not in (None, []) else kernel
        padding, dilation = per_dim("padding", 0), per_dim("dilation", 1)
        unit = dims - x_dims  # the view's leading unit dims: pooled by one, no padding
        if any(kernel[i] != 1 or padding[i] != 0 for i in range(unit)):
            raise Unsupported("pooling across a unit dim of a view is not templated")
        if [d for d in shape if d != 1] != [d for d in self.o if d != 1]:
            raise Unsupported(
                f"the pooling's result {list(shape)} is not the output {list(self.o)}: only an elementwise "
                "epilogue is templated after a pooling"
            )
        divisor = given.get("divisor_override")
        if divisor is not None and not isinstance(divisor, int):
            raise Unsupported("a pooling divisor that is not an integer is not templated")
        self.register(x.leaf, src, "full", dtype)
        self.pool = PoolInfo(
            x.leaf, kind, dims, x_dims, kernel, stride, padding, dilation,  # type: ignore[arg-type]
            count_include_pad=bool(given.get("count_include_pad", True)), divisor_override=divisor,
        )  # fmt: skip
        acc = _Val("acc", "full", shape)
        self.main_shape = shape[:2] + shape[2 + unit :]  # as the wrapper allocates it: no view's unit dims
        return (acc, _NoValue("the pooling's indices")) if name.endswith("_with_indices") else acc


__all__ = ["PoolMapping"]
