"""The offline tuner's picture of a reference: a small dataflow graph over one iteration space.

`trace.py` builds it from the spec's reference (an aten-level trace, decomposed); the code
generators (`triton_codegen.py` for CUDA, `c_codegen.py` for the CPU) turn it into a complete
candidate file with declared tunables. The patterns recognized:

- `elementwise`: every op is elementwise over the output's shape; tensors are `full` (the output's
  shape), `col` (1-D, broadcast along the last dim), `row` (one value per row) or `scalar`.
  Where the output has unit dims and that picture misses an outer broadcast ([N, 1] + [1, C, 1, 1]),
  the graph is over the output with its unit dims dropped, viewed back (`out_view`, `aten_squeeze`).
- `row`: elementwise ops plus reductions over the last dim (keepdim), whose results have the `row`
  layout and broadcast back: softmax, log-softmax, layer and RMS norms, and their fused neighbours.
  With `reduce` (a `ReduceInfo`, see `aten_reduce.py`), reductions over any dims of a value of
  shape D (a middle dim, several trailing dims, all dims, the batch and spatial dims per channel, or
  grouped channels with dim 1 viewed as (groups, C / groups)): rows enumerate the kept dims and
  cols the reduced ones (row-major each); every tensor read varies along some of those dims
  (`present`); outputs are D-shaped (`full`) or one value per row (`row`, `out_shape`).
  A D-shaped output with unit dims added or dropped (an instance norm of an unsqueezed value,
  squeezed back) is returned so viewed (`out_view`).
- `gemm`: a matrix product (`acc = a @ b`, optionally batched, optionally plus a bias) followed by an
  elementwise epilogue whose ops read the accumulator by the value name "acc".
- `conv`: a convolution (1-, 2- or 3-d; stride, padding, dilation, groups, transposed or not;
  optionally plus a bias) as an implicit GEMM, followed by an elementwise epilogue on "acc" whose tensors are `full` (the
  output's shape), `chan` (one value per output channel: a [C, 1, 1] parameter) or `scalar`.
- `scalar`: a `row` graph reduced to one value (losses): `total_sum` / `total_mean` of a full or
  row value (every element), then scalar ops on the totals; the output has shape [] and the
  iteration space is the largest input's shape (`aten_misc`, `triton_scalar.py`).
- `scan`: an elementwise prologue, one scan along the last dim (`SCAN_OPS`: cumsum or cumprod,
  inclusive, reversed or exclusive) and an elementwise epilogue on its result (`triton_scan.py`).
- `arg`: argmax or argmin over a dim (or every dim) of a value D, after an elementwise prologue:
  a `row` graph with a `reduce` (one `ARG_OPS` op, its int64 result the one output, one index per
  row; `aten_arg.py`, `triton_arg.py`).
- `pool`: a max or average pooling (1-, 2- or 3-d; stride, padding, dilation for max) of an input,
  followed by an elementwise epilogue on "acc" as for `conv` (`chan` is one value per channel).

- `pipeline`: no template covers the whole graph, so it is cut into `stages` (`stages.py`), each an
  OpGraph of one of the patterns above, run in order: stage k writes its one output to an
  intermediate (fp32, contiguous, the traced shape) that later stages read as an extra forward
  argument (`input:<n + j>`, named `_mid<j>`, n the reference's inputs). E.g. conv + epilogue, then
  max pooling; matmul + bias, then softmax over the last dim. The pipeline's own `tensors` and `ops`
  are empty; its `outputs`, `dtype`, `rows` and `cols` are the last stage's.

Iteration space: the (first) output's shape; rows = prod(shape[:-1]), cols = shape[-1] (`pool` too).
For `gemm`, rows = M (times batch), cols = N. For `conv`, the GEMM's: rows = batch x output positions, cols =
output channels per group, inner = input channels per group x kernel positions, batch = groups.
Every `full` tensor is made contiguous by the generated wrapper.

With `reduce`, the iteration space is D's instead of the output's: rows = the product of the kept
dims' sizes, cols = the reduced ones'.

Tensors may hold integer or bool data (class indices, masks): every template reads them as fp32,
exact up to 2**24, as torch's promotion to float computes them. A tensor's source may also be
`arange:<start>:<step>:<count>`, an index vector the candidate makes (triu and tril's masks),
`slice:<dim>:<start>:<end>:<source>` (a unit-step slice of an input or parameter, e.g. a corner of
a causal-mask buffer), `expand:<d0>,<d1>,..:<source>` (a tensor broadcast over the output's outer
dims, materialized `full` by the wrapper), `strided:<shape>:<strides>:<offset>:<source>` (a permuted
view of an input or parameter: attention's q, k and v out of one projection) and
`reshape:<shape>:<source>` (a view of that; `aten_mask`), or `dim:<i>:<d>:<power>` (a scalar made
from a size, `shape_consts`).

Deliberately not here: anything the tuner cannot generate (gathers, two reductions over different dims,
more than one intermediate per stage). `trace.recognize` returns None for those and the tuner seeds only from
candidates that declare tunables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

Pattern = Literal["elementwise", "row", "gemm", "conv", "pool", "pipeline", "scalar", "scan", "arg"]
Layout = Literal["full", "col", "row", "scalar", "chan"]  # chan: per output channel (dim 1), conv and pool

# Elementwise ops and their arity. Constants may stand in for any argument.
ELEMENTWISE_OPS: dict[str, int] = {
    "add": 2, "sub": 2, "mul": 2, "div": 2, "maximum": 2, "minimum": 2,
    "pow": 2,  # pow(x, c) with a constant exponent
    "neg": 1, "abs": 1, "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "reciprocal": 1, "square": 1,
    "log1p": 1, "expm1": 1,  # accurate near 0: softplus and mish (log1p), elu and selu (expm1)
    "tanh": 1, "sigmoid": 1, "relu": 1, "erf": 1, "silu": 1,
    "gelu": 1,  # exact: 0.5 * x * (1 + erf(x / sqrt(2)))
    "gelu_tanh": 1,  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    "clamp": 3,  # clamp(x, lo, hi); lo or hi may be None (a constant)
    "where_gt0": 3,  # where(x > 0, a, b): leaky relu and friends
    # Comparisons as 1.0/0.0 values and a select on them (`aten_misc`): eq, ne and isnan masks.
    "eq": 2, "ne": 2, "isnan": 1, "where_nz": 3,  # where_nz(m, a, b): a where m != 0, else b
    "where_col": 2,  # where_col(i, x): x at the column whose index is i (a row value), else 0: a gather
    # causal(x): x, or -inf where the column is after the row (SDPA's is_causal; batched GEMM epilogues
    # only, whose tiles know each value's row and column: `aten_attention`)
    "causal": 1,
}  # fmt: skip
# Reductions over the last dim, keepdim: the result has the `row` layout.
REDUCE_OPS: tuple[str, ...] = ("sum", "mean", "amax", "amin")
# `arg` graphs: the index (int64) of the first largest / smallest value over the reduced dims, a NaN
# counting as the largest and the smallest (torch's argmax / argmin); the result has the `row` layout.
ARG_OPS: tuple[str, ...] = ("argmax", "argmin")
# `scalar` graphs: a sum or mean of every element of a full or row value; the result is one value.
TOTAL_OPS: tuple[str, ...] = ("total_sum", "total_mean")
# `scan` graphs: an inclusive scan along the last dim of a full value (`_rev`: from the last column
# back; `_excl`: exclusive, each column the scan of the columns before it).
SCAN_OPS: tuple[str, ...] = ("cumsum", "cumprod", "cumsum_rev", "cumprod_rev", "cumsum_excl", "cumprod_excl")

Arg = str | float | int | None  # a value's name, or a constant


@dataclass(frozen=True)
class TensorArg:
    """A tensor the kernel reads. `source` says where the wrapper gets it: `input:<i>` (the forward's
    i-th positional argument) or `param:<state-dict name>` (a parameter or buffer of the module)."""

    name: str  # an identifier used in generated code
    source: str
    layout: Layout
    dtype: str = "float32"


@dataclass(frozen=True)
class Op:
    out: str
    op: str  # a key of ELEMENTWISE_OPS, or one of REDUCE_OPS
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class GemmInfo:
    """acc[m, n] = sum_k a[m, k] * b'[k, n] (+ bias[n]); `b_layout` "kn" for b of shape [K, N],
    "nk" for a Linear weight of shape [N, K]. `batched`: a and b carry a leading batch dim."""

    a: str
    b: str
    b_layout: Literal["kn", "nk"]
    bias: str | None = None
    batched: bool = False
    a_layout: Literal["mk", "km"] = "mk"  # "km": a given as [K, M] (a transposed view), read via strides


SAME = -1  # a convolution's padding that keeps the size: dilation * (kernel size - 1) // 2 (ConvInfo)


@dataclass(frozen=True)
class ConvInfo:
    """acc = convolution(x, w) (+ bias[c]) over `dims` spatial dims (1, 2 or 3): x [N, C_in, *S],
    w [C_out, C_in / groups, *K] (a parameter; [C_in, C_out / groups, *K] where `transposed`), bias
    [C_out]; per spatial dim its stride, padding, dilation (and a transposed one's output padding),
    as torch's `aten.convolution` takes them. A padding of SAME (-1) is dilation * (K - 1) // 2 of
    the weight's kernel size K at each call: a spec whose shapes differ in kernel size (the suites'
    conv1d_serving, `padding=kernel_size // 2`)."""

    x: str
    w: str
    dims: int
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1
    bias: str | None = None
    transposed: bool = False
    output_padding: tuple[int, ...] = ()
    in_per_group: int = 0  # C_in / groups (0: not known); 1 with groups > 1 is a depthwise convolution
    # The weight's kernel size per spatial dim as traced (not compared: it may differ per spec shape
    # where the padding is SAME, `aten_conv.unify_same_padding`).
    kernel: tuple[int, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class PoolInfo:
    """acc = max_pool(x) or avg_pool(x) over the last `dims` dims of x [N, C, *S] (as traced: a 1-d
    pooling arrives as a 2-d one of a view with a unit dim, `x_dims` = 1 being the input's own spatial
    dims); per pooled dim its kernel size, stride, padding and (max only) dilation, as `aten.max_poolNd_
    with_indices` and `aten.avg_poolNd` take them (ceil_mode off). Average: `count_include_pad` and
    `divisor_override` as torch has them."""

    x: str
    kind: Literal["max", "avg"]
    dims: int
    x_dims: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    count_include_pad: bool = True
    divisor_override: int | None = None


@dataclass(frozen=True)
class ReduceInfo:
    """A `row` graph's index mapping where reductions are not over the output's last dim. The domain
    D (the shape of the values reduced) has `rank` dims; with `groups` > 1 its dim 1 is viewed as
    (groups, D[1] // groups), giving the *split* dims. `reduced`: the split dims every reduction runs
    over (cols, row-major); the others are kept (rows, row-major). `present`: per tensor read, the
    split dims along which it varies (it is contiguous, broadcast along the others). `domain`: a
    tensor of shape D exactly (the wrapper takes D's sizes from it). `out_shape`: for outputs of
    one value per row, each output dim as the D dim whose size it has (-1 for a 1); () where the
    outputs have shape D."""

    rank: int
    reduced: tuple[int, ...]
    present: tuple[tuple[str, tuple[int, ...]], ...]
    domain: str
    groups: int = 1
    out_shape: tuple[int, ...] | None = None

    def split_dims(self) -> int:
        return self.rank + (1 if self.groups > 1 else 0)


@dataclass
class OpGraph:
    pattern: Pattern
    tensors: list[TensorArg]
    ops: list[Op]  # topological order
    outputs: list[str]  # value names stored, in the reference's output order; all `full` layout
    dtype: str = "float32"  # the outputs' dtype; compute is fp32 in every template
    gemm: GemmInfo | None = None
    conv: ConvInfo | None = None
    pool: PoolInfo | None = None
    reduce: ReduceInfo | None = None  # row graphs whose reductions are not over the last dim
    forward_args: list[str] = field(default_factory=list)  # the forward's parameter names
    init_source: str = ""  # ModelNew's __init__ (the reference's, cleaned), so parameters match by name
    description: str = ""  # for humans and prompts, e.g. "row reduction: amax, sub, exp, sum, div"
    # Per spec shape: the iteration space (and K for gemm), so templates can size blocks.
    rows: dict[str, int] = field(default_factory=dict)
    cols: dict[str, int] = field(default_factory=dict)
    inner: dict[str, int] = field(default_factory=dict)  # gemm: K per shape
    batch: dict[str, int] = field(default_factory=dict)  # gemm: batch per shape (1 if not batched)
    # `pipeline`: the stages, run in order (each an OpGraph of another pattern); see the module's doc.
    stages: list[OpGraph] = field(default_factory=list)
    # gemm, conv, pool (and row graphs with `reduce`, elementwise ones over squeezed dims): where the
    # output is the main op's result with unit dims added or dropped (a view: `x.unsqueeze(1)` before
    # a 1-d pooling), each output dim as the result dim it is (-1: an added 1); the wrapper returns
    # its outputs so viewed. () where the output has the result's shape.
    out_view: tuple[int, ...] = ()

    def layout_of(self, name: str) -> Layout:
        """The layout of a tensor or op value: reductions give `row`; elementwise ops the widest of
        their arguments (full > col, row > scalar; col and row together make full)."""
        for t in self.tensors:
            if t.name == name:
                return t.layout
        if self.pattern in ("gemm", "conv", "pool") and name == "acc":
            return "full"
        for op in self.ops:
            if op.out == name:
                if op.op in REDUCE_OPS or op.op in ARG_OPS:
                    return "row"
                if op.op in TOTAL_OPS:
                    return "scalar"
                if op.op in SCAN_OPS:
                    return "full"
                seen = {self.layout_of(a) for a in op.args if isinstance(a, str)}
                if "full" in seen or {"col", "row"} <= seen or ("chan" in seen and seen & {"col", "row"}):
                    return "full"
                for narrow in ("chan", "col", "row"):
                    if narrow in seen:
                        return narrow
                return "scalar"
        raise KeyError(name)


@dataclass
class Generated:
    """A complete candidate file, with its tunables declared in the source (see `kernelevolve/tunables.py`)."""

    source: str
    template: str  # e.g. "triton-row", "c-elementwise"
    tunables: dict[str, list[int | str]]
    config: dict[str, int | str]
    # Further whole configurations worth drafting after `config`, best guess first (a GEMM's tile
    # presets and fast dot: `triton_gemm.gemm_drafts`); the tuner drafts them after every
    # template's default (`templates.bases_for`).
    drafts: list[dict[str, int | str]] = field(default_factory=list)


def per_node(
    graphs: list[OpGraph], unify: Callable[[list[OpGraph]], list[OpGraph] | None]
) -> list[OpGraph] | None:
    """`graphs` (one per spec shape) rebuilt from `unify` applied to each column of their nodes (the
    graphs themselves, then each stage in turn: one node per shape); None where their stage counts
    differ or `unify` gives None for a column. The per-shape rewrites (`shape_consts`, `shape_views`,
    `aten_conv.unify_same_padding`) walk the graphs so."""
    nodes = [[g, *g.stages] for g in graphs]
    if len({len(n) for n in nodes}) != 1:
        return None
    out: list[list[OpGraph]] = [[] for _ in graphs]
    for column in zip(*nodes, strict=True):
        unified = unify(list(column))
        if unified is None:
            return None
        for k, node in enumerate(unified):
            out[k].append(node)
    return [replace(n[0], stages=n[1:]) if n[1:] else n[0] for n in out]


__all__ = [
    "ARG_OPS", "ELEMENTWISE_OPS", "REDUCE_OPS", "SCAN_OPS", "TOTAL_OPS", "ConvInfo", "GemmInfo", "Generated", "Op", "OpGraph",
    "PoolInfo", "ReduceInfo", "TensorArg", "per_node",
]  # fmt: skip
