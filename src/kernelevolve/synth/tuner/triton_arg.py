"""Triton template for `arg` graphs: argmax or argmin over some dims of a value D, after an
elementwise prologue, one int64 index per kept position (torch's `argmax` / `argmin`, exactly).

One program per ROWS rows (the kept positions, row-major; the index plan of `triton_reduce.py` says
where each tensor's element is) walks the reduced positions in CHUNK-wide chunks. Per chunk it finds
the largest value (argmin: of the negated values) and the first column holding it; a later chunk
replaces the running best only where its best is strictly larger, so ties go to the first index, as
torch's do. NaN counts as larger than everything (torch returns the first NaN's index, for argmax and
argmin alike): the first NaN column is tracked apart from the values and wins where there is one.
A row whose values are all -inf (argmin: +inf) keeps index 0, as torch's. The index is the column
within the reduced dims, row-major, which is what torch returns (a flat index for `dim=None`).

The kernel is compiled without fused multiply-adds (`enable_fp_fusion=False`; Triton contracts a
multiply and an add into one FMA by default, one rounding where torch's two kernels round twice): a
prologue's values are then torch's to the bit (`aten_arg.EXACT_OPS`).

Not here: a split of one long row over several programs (a few rows of millions of values run one
program each), returning the value with the index (`torch.max(x, dim)`'s pair).
"""

from __future__ import annotations

from kernelevolve.synth.tuner import triton_reduce
from kernelevolve.synth.tuner.ir import ARG_OPS, ELEMENTWISE_OPS, OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_common import (
    NEG_INF,
    CodegenError,
    Names,
    Parts,
    forward_args,
    helpers_for,
    jit_function,
    kernel_params,
    launch_args,
    load,
    needed,
    op_expr,
    outputs_tuple,
    pick,
    pow2_at_least,
    source_expr,
    used_tensors,
)

_WARPS = [1, 2, 4, 8, 16]
_MASKS = {"full": "mask", "col": "cmask", "row": "rmask"}


def build(graph: OpGraph, precision: str) -> Parts:
    if graph.pattern != "arg" or graph.reduce is None:
        raise CodegenError(f"a {graph.pattern!r} graph given to the 'arg' template")
    if graph.dtype != "int64" or len(graph.outputs) != 1:
        raise CodegenError("an arg graph has one int64 output")
    live = needed(graph, graph.outputs)
    ops = [op for op in graph.ops if op.out in live]
    arg = ops[-1]
    if arg.op not in ARG_OPS or arg.out != graph.outputs[0] or not isinstance(arg.args[0], str):
        raise CodegenError("an arg graph ends in one argmax or argmin of a value, its output")
    for op in ops[:-1]:
        if op.op not in ELEMENTWISE_OPS:
            raise CodegenError(f"op {op.op!r} before an {arg.op} is not supported by the arg template")
    names = Names(graph)
    tensors = used_tensors(graph, live)
    idx = triton_reduce.plan(graph)
    assert idx is not None

    params = [*kernel_params(tensors, graph, names), "rows", "cols", *idx.params()]
    params += ["ROWS: tl.constexpr", "CHUNK: tl.constexpr", "NCHUNK: tl.constexpr", "IDX64: tl.constexpr"]
    per_row = [t for t in tensors if t.layout in ("row", "scalar")]
    per_col = [t for t in tensors if t.layout not in ("row", "scalar")]
    body = [
        "r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]",
        "if IDX64:",
        "    r = r.to(tl.int64)",
        "rmask = r < rows",
        *idx.row_lines(),
        *[_load(t, names, idx) for t in per_row],
        f"best = tl.full([ROWS, 1], {NEG_INF}, tl.float32)",
        "best_i = tl.zeros([ROWS, 1], tl.int64)",
        "none = tl.zeros([ROWS, 1], tl.int64) + cols  # no column: past the last",
        "nan_i = none",
    ]
    value = names.var(str(arg.args[0]))
    loop = [
        "c = i * CHUNK + tl.arange(0, CHUNK)[None, :]",
        *idx.col_lines(),
        "cmask = c < cols",
        "mask = rmask & cmask",
        *[_load(t, names, idx) for t in per_col],
        *[f"{names.var(op.out)} = {op_expr(op, names)}" for op in ops[:-1]],
        f"v = {value} + tl.zeros([ROWS, CHUNK], tl.float32)" if arg.op == "argmax"
        else f"v = -{value} + tl.zeros([ROWS, CHUNK], tl.float32)",  # argmin: the argmax of -x
        "nan = mask & (v != v)",
        f"key = tl.where(mask & (v == v), v, {NEG_INF})",
        "top = tl.max(key, axis=1, keep_dims=True)",
        "at = tl.min(tl.where(mask & (key == top), c, none), axis=1, keep_dims=True)",
        "better = top > best  # strictly: an equal value in a later chunk is a later index",
        "best_i = tl.where(better, at, best_i)",
        "best = tl.where(better, top, best)",
        "nan_i = tl.minimum(nan_i, tl.min(tl.where(nan, c, none), axis=1, keep_dims=True))",
    ]  # fmt: skip
    body += ["for i in range(NCHUNK):"] + ["    " + line for line in loop]
    body += [
        "found = tl.where(nan_i < cols, nan_i, best_i)",
        "tl.store(out0_ptr + r, found, mask=rmask)",
    ]
    kernel = jit_function("_arg_kernel", params, body)

    fwd = [f"{names.local(t.name)} = {source_expr(t, forward_args(graph))}.contiguous()" for t in tensors]
    fwd += triton_reduce.wrapper_lines(graph, idx, tensors, names)
    fwd += [
        "if _rows == 0:",
        f"    return {outputs_tuple(graph)}",
        "if _cols == 0:",
        f'    raise RuntimeError("{arg.op} of an empty dim: torch raises too")',
        '_chunk = min(CONFIG["CHUNK"], triton.next_power_of_2(_cols))',
        '_r = CONFIG["ROWS"]',
        "_progs = triton.cdiv(_rows, _r)",
        "_arg_kernel[(_progs,)](",
        "    " + ", ".join([*launch_args(tensors, graph, names), "_rows", "_cols", *idx.args()]) + ",",
        "    ROWS=_r, CHUNK=_chunk, NCHUNK=triton.cdiv(_cols, _chunk), IDX64=_progs * _r * _cols >= 2**31,",
        # no fused multiply-adds: torch rounds a prologue's x * c - y twice, and the indices are exact
        '    num_warps=CONFIG["num_warps"], enable_fp_fusion=False,',
        ")",
        f"return {outputs_tuple(graph)}",
    ]
    cols = pow2_at_least(max(graph.cols.values(), default=1024))
    if idx.inner_kept():  # memory runs along the rows: tall, narrow tiles read neighbouring rows together
        defaults: dict[str, int | str] = {"CHUNK": pick([8, 16, 32], cols), "ROWS": 64, "num_warps": 4}
    else:
        chunk = pick([256, 512, 1024, 2048], cols)
        defaults = {"CHUNK": chunk, "ROWS": 1, "num_warps": 8 if chunk >= 2048 else 4}
    tunables: dict[str, list[int | str]] = {
        "CHUNK": [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
        "ROWS": [1, 2, 4, 8, 16, 32, 64, 128, 256],
        "num_warps": list(_WARPS),
    }
    return Parts([kernel], fwd, tunables, defaults, helpers_for(ops), tile=("ROWS", "CHUNK"))


def _load(t: TensorArg, names: Names, idx: triton_reduce.IndexPlan) -> str:
    offsets: dict[str, str] = {t.layout: idx.offset(t.name, t.layout)} if t.layout != "scalar" else {}
    return load(t, names, offsets, _MASKS)


__all__ = ["build"]
