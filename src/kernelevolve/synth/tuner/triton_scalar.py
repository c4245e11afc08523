"""Triton templates for `scalar` graphs: a loss, every element reduced to one value.

Two kernels, deterministic (no atomics):
- the partial kernel: one program per ROWS rows runs the graph's per-element and per-row part as the
  row templates do (`triton_row`'s single-pass body, whole rows in registers, or its looped body over
  column chunks), with each total's argument summed over its columns (a full value) into one value
  per row; the program's rows are then summed into one partial per total, stored at
  `part[total * programs + program]`;
- the final kernel: one program sums each total's partials in a fixed order (BLOCK at a time, one
  lane-wise vector, reduced once), divides a mean by its count (rows x cols for a full value, rows
  for a per-row one), runs the scalar ops after the totals and stores the one value.

Not here: totals read back per element (two passes; `aten_misc.check` refuses them), split-row
schedules for a few very long rows, scalar tensors read after the totals.
"""

from __future__ import annotations

from kernelevolve.synth.tuner import triton_row
from kernelevolve.synth.tuner.ir import ELEMENTWISE_OPS, REDUCE_OPS, TOTAL_OPS, Op, OpGraph
from kernelevolve.synth.tuner.triton_common import (
    DTYPES,
    CodegenError,
    Names,
    Parts,
    forward_args,
    helpers_for,
    jit_function,
    needed,
    op_expr,
    source_expr,
    used_tensors,
)

_WARPS = [1, 2, 4, 8, 16]


def _split(graph: OpGraph) -> tuple[OpGraph, list[Op], list[Op], dict[str, str]]:
    """The per-element part as a row graph (each total's full argument summed per row), the totals,
    the scalar ops after them, and each total's per-row argument."""
    if graph.pattern != "scalar":
        raise CodegenError(f"a {graph.pattern!r} graph given to a 'scalar' template")
    if graph.dtype not in DTYPES or len(graph.outputs) != 1:
        raise CodegenError("a scalar template stores one float value")
    live = needed(graph, graph.outputs)
    ops = [op for op in graph.ops if op.out in live]
    totals = [op for op in ops if op.op in TOTAL_OPS]
    after: set[str] = {op.out for op in totals}
    post = []
    for op in ops:
        if op.op not in TOTAL_OPS and any(a in after for a in op.args if isinstance(a, str)):
            after.add(op.out)
            post.append(op)
    if not totals or graph.outputs[0] not in after:
        raise CodegenError("a scalar graph's output must be computed from its totals")
    pre = [op for op in ops if op.out not in after]
    per_row: dict[str, str] = {}
    extra = []
    for t in totals:
        arg = t.args[0]
        if not isinstance(arg, str):
            raise CodegenError(f"total {t.out} of a constant")
        if graph.layout_of(arg) == "full":
            extra.append(Op(f"{t.out}_rows", "sum", (arg,)))
            per_row[t.out] = extra[-1].out
        elif graph.layout_of(arg) == "row":
            per_row[t.out] = arg
        else:
            raise CodegenError(f"total {t.out} of a {graph.layout_of(arg)} value")
    for op in pre + post:
        if op.op not in ELEMENTWISE_OPS and op.op not in REDUCE_OPS:
            raise CodegenError(f"op {op.op!r} is not supported by the scalar template")
    if any(isinstance(a, str) and a in {t.name for t in graph.tensors} for op in post for a in op.args):
        raise CodegenError("a tensor read after the totals is not generated")
    pre_live = needed(graph, [t.args[0] for t in totals if isinstance(t.args[0], str)])
    tensors = used_tensors(graph, pre_live)
    if not any(t.layout == "full" for t in tensors):
        raise CodegenError("no full tensor fixes the loss's rows and columns")
    row_graph = OpGraph("row", tensors, pre + extra, [], dtype=graph.dtype, cols=dict(graph.cols))
    return row_graph, totals, post, per_row


def build(graph: OpGraph, precision: str, looped: bool) -> Parts:
    row_graph, totals, post, per_row = _split(graph)
    naming = OpGraph("row", row_graph.tensors, [*row_graph.ops, *totals, *post], [])
    names = Names(naming)
    tensors = row_graph.tensors
    kname = "_loss_partial_looped_kernel" if looped else "_loss_partial_kernel"
    width = "CHUNK" if looped else "BLOCK_C"
    params = [*[names.ptr(t.name) for t in tensors], "part_ptr", "rows", "cols"]
    params += ["ROWS: tl.constexpr", f"{width}: tl.constexpr"]
    params += ["NCHUNK: tl.constexpr"] if looped else []
    params += ["IDX64: tl.constexpr"]
    body = [
        "pid = tl.program_id(0)",
        "nprog = tl.num_programs(0)",
        "r = pid * ROWS + tl.arange(0, ROWS)[:, None]",
        "if IDX64:",
        "    r = r.to(tl.int64)",
        "rmask = r < rows",
    ]
    if looped:
        body += triton_row._looped_body(row_graph, names, row_graph.ops, tensors, triton_row._PLAIN)
        if body[-4].startswith("for i in range(NCHUNK):"):  # the row template's store loop, empty here
            body = body[:-4]
    else:
        body += triton_row._single_body(row_graph, names, row_graph.ops, tensors, triton_row._PLAIN)
    for i, t in enumerate(totals):
        v = names.var(per_row[t.out])
        body += [
            f"part_{i} = tl.sum(tl.where(rmask, {v} + tl.zeros([ROWS, 1], tl.float32), 0.0))",
            f"tl.store(part_ptr + {i} * nprog + pid, part_{i})",
        ]
    partial = jit_function(kname, params, body)

    fin = ["o = tl.arange(0, BLOCK)"]
    fin += [f"acc_{i} = tl.zeros([BLOCK], tl.float32)" for i in range(len(totals))]
    fin += ["for b in range(NBLK):", "    m = b * BLOCK + o < nprog"]
    fin += [
        f"    acc_{i} += tl.load(part_ptr + {i} * nprog + b * BLOCK + o, mask=m, other=0.0)"
        for i in range(len(totals))
    ]
    for i, t in enumerate(totals):
        count = "n_full" if row_graph.layout_of(str(t.args[0])) == "full" else "n_rows"
        red = f"tl.sum(acc_{i})"
        fin.append(f"{names.var(t.out)} = " + (f"{red} / {count}" if t.op == "total_mean" else red))
    fin += [f"{names.var(op.out)} = {op_expr(op, names)}" for op in post]
    out = names.var(graph.outputs[0])
    fin.append(f"tl.store(out0_ptr, ({out} + tl.zeros([], tl.float32)).to(out0_ptr.dtype.element_ty))")
    final = jit_function(
        "_loss_final_kernel",
        ["part_ptr", "out0_ptr", "nprog", "n_full", "n_rows", "BLOCK: tl.constexpr", "NBLK: tl.constexpr"],
        fin,
    )

    args = forward_args(graph)
    fwd = [f"{names.local(t.name)} = {source_expr(t, args)}.contiguous()" for t in tensors]
    first = next(t for t in tensors if t.layout == "full")
    fwd += [
        f"_shape = {names.local(first.name)}.shape",
        f"_device = {names.local(first.name)}.device",
        f"_out0 = torch.empty((), device=_device, dtype=torch.{graph.dtype})",
        "_cols = _shape[-1]",
        "_rows = _shape.numel() // _cols",
    ]
    if looped:
        fwd += ['_chunk = min(CONFIG["CHUNK"], triton.next_power_of_2(_cols))', '_r = CONFIG["ROWS"]']
        fwd += ['_warps = CONFIG["num_warps"]']
        sizes = "ROWS=_r, CHUNK=_chunk, NCHUNK=triton.cdiv(_cols, _chunk)"
    else:
        fwd += triton_row.single_pass_sizes()
        sizes = "ROWS=_r, BLOCK_C=_block_c"
    launch = ", ".join([*[names.local(t.name) for t in tensors], "_part", "_rows", "_cols"])
    fwd += [
        "_progs = triton.cdiv(_rows, _r)",
        f"_part = torch.empty({len(totals)} * _progs, device=_device, dtype=torch.float32)",
        f"{kname}[(_progs,)](",
        f"    {launch},",
        f"    {sizes}, IDX64=_progs * _r * _cols >= 2**31,",
        "    num_warps=_warps,",
        ")",
        '_fb = CONFIG["FINAL_BLOCK"]',
        "_loss_final_kernel[(1,)](",
        "    _part, _out0, _progs, float(_rows * _cols), float(_rows),",
        "    BLOCK=_fb, NBLK=triton.cdiv(_progs, _fb), num_warps=4,",
        ")",
        "return _out0",
    ]
    tunables, defaults = triton_row._knobs(row_graph, looped, triton_row._PLAIN)
    tunables["FINAL_BLOCK"] = [256, 1024, 4096]
    defaults["FINAL_BLOCK"] = 1024
    tile = ("ROWS", "CHUNK") if looped else ()
    helpers = helpers_for([*row_graph.ops, *post])
    return Parts([partial, final], fwd, tunables, defaults, helpers, tile=tile)


__all__ = ["build"]
