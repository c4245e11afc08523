"""Triton template for `scan` graphs: a cumulative sum or product along the last dim, with an
elementwise prologue (its argument) and epilogue (what reads its result).

One program per ROWS rows walks the row in CHUNK-wide chunks: the prologue is computed per chunk, the
chunk is scanned in registers (`tl.cumsum` / `tl.cumprod` along axis 1) and combined with the running
value carried from the chunks before (a sum or product of each chunk, per row), and the epilogue and
the stores follow in the same chunk. A reversed scan walks the columns from the last (`c = cols - 1 -
k`), so the same forward scan runs over them; an exclusive one reads its argument one column back
(`c - 1`, the identity at column 0). Masked lanes hold the scan's identity (0 or 1). The number of
chunks is a constexpr (see triton_codegen).

Not here: scans along other dims, decoupled look-back across programs for a few very long rows
(each row is one program's), an epilogue that reads the prologue's values of an exclusive scan.
"""

from __future__ import annotations

from kernelevolve.synth.tuner.ir import ELEMENTWISE_OPS, SCAN_OPS, OpGraph
from kernelevolve.synth.tuner.triton_common import (
    DTYPES,
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
    prologue,
    store,
    used_tensors,
)

_MUL = """@triton.jit
def _scan_mul(a, b):
    return a * b
"""


def build(graph: OpGraph, precision: str) -> Parts:
    if graph.pattern != "scan":
        raise CodegenError(f"a {graph.pattern!r} graph given to a 'scan' template")
    if graph.dtype not in DTYPES or not graph.outputs:
        raise CodegenError("a scan template stores float outputs")
    live = needed(graph, graph.outputs)
    ops = [op for op in graph.ops if op.out in live]
    scans = [op for op in ops if op.op in SCAN_OPS]
    if len(scans) != 1 or not isinstance(scans[0].args[0], str):
        raise CodegenError("a scan graph has one scan of a value")
    scan = scans[0]
    arg = str(scan.args[0])
    for op in ops:
        if op is not scan and op.op not in ELEMENTWISE_OPS:
            raise CodegenError(f"op {op.op!r} is not supported by the scan template")
    kind = scan.op.split("_")[0]
    rev, excl = scan.op.endswith("_rev"), scan.op.endswith("_excl")
    ident = "0.0" if kind == "cumsum" else "1.0"
    before = needed(graph, [arg])
    pro = [op for op in ops if op.out in before]
    epi = [op for op in ops if op.out not in before and op is not scan]
    names = Names(graph)
    tensors = used_tensors(graph, live)
    pro_tensors = [t for t in tensors if t.name in before]
    epi_refs = {a for op in epi for a in op.args if isinstance(a, str)} | set(graph.outputs)
    if excl and epi_refs & before:
        raise CodegenError("an exclusive scan's epilogue reads its prologue's values (another column)")
    epi_tensors = [t for t in tensors if t.name in needed(graph, graph.outputs) - before]
    epi_tensors = [t for t in epi_tensors if t.name not in before]

    params = [*kernel_params(tensors, graph, names), "rows", "cols"]
    params += ["ROWS: tl.constexpr", "CHUNK: tl.constexpr", "NCHUNK: tl.constexpr", "IDX64: tl.constexpr"]
    body = [
        "r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]",
        "if IDX64:",
        "    r = r.to(tl.int64)",
        "rmask = r < rows",
    ]
    once = {"row": "r"}
    body += [load(t, names, once, {"row": "rmask"}) for t in tensors if t.layout in ("row", "scalar")]
    body.append(f"carry = tl.full([ROWS, 1], {ident}, tl.float32)")
    loop = [
        "k = i * CHUNK + tl.arange(0, CHUNK)[None, :]",
        "c = cols - 1 - k" if rev else "c = k",
        "cmask = k < cols",
        "mask = rmask & cmask",
    ]
    if excl:
        loop += ["cs = c - 1", "scmask = cmask & (c >= 1)", "smask = rmask & scmask"]
        src_offsets, src_masks = {"full": "r * cols + cs", "col": "cs"}, {"full": "smask", "col": "scmask"}
    else:
        src_offsets, src_masks = {"full": "r * cols + c", "col": "c"}, {"full": "mask", "col": "cmask"}
        loop.append("smask = mask")
    loop += [load(t, names, src_offsets, src_masks) for t in pro_tensors if t.layout in ("full", "col")]
    loop += [f"{names.var(op.out)} = {op_expr(op, names)}" for op in pro]
    x = f"tl.where(smask, {names.var(arg)} + tl.zeros([ROWS, CHUNK], tl.float32), {ident})"
    loop.append(f"x = {x}")
    if kind == "cumsum":
        loop += [
            f"{names.var(scan.out)} = tl.cumsum(x, axis=1) + carry",
            "carry = carry + tl.sum(x, axis=1, keep_dims=True)",
        ]
    else:
        loop += [
            f"{names.var(scan.out)} = tl.cumprod(x, axis=1) * carry",
            "carry = carry * tl.reduce(x, 1, _scan_mul, keep_dims=True)",
        ]
    offsets, masks = {"full": "r * cols + c", "col": "c"}, {"full": "mask", "col": "cmask"}
    loop += [load(t, names, offsets, masks) for t in epi_tensors if t.layout in ("full", "col")]
    loop += [f"{names.var(op.out)} = {op_expr(op, names)}" for op in epi]
    for i, out in enumerate(graph.outputs):
        loop.append(store(i, names.var(out), graph.layout_of(out), "r * cols + c", "mask", "[ROWS, CHUNK]"))
    body += ["for i in range(NCHUNK):"] + ["    " + line for line in loop]
    kernel = jit_function("_scan_kernel", params, body)

    fwd = prologue(graph, tensors, names, forward_args(graph))
    args = ", ".join([*launch_args(tensors, graph, names), "_rows", "_cols"])
    fwd += [
        "_n = _shape.numel()",
        "if _n == 0:",
        f"    return {outputs_tuple(graph)}",
        "_cols = _shape[-1]",
        "_rows = _n // _cols",
        '_chunk = min(CONFIG["CHUNK"], triton.next_power_of_2(_cols))',
        '_r = CONFIG["ROWS"]',
        "_progs = triton.cdiv(_rows, _r)",
        "_scan_kernel[(_progs,)](",
        f"    {args},",
        "    ROWS=_r, CHUNK=_chunk, NCHUNK=triton.cdiv(_cols, _chunk), IDX64=_progs * _r * _cols >= 2**31,",
        '    num_warps=CONFIG["num_warps"],',
        ")",
        f"return {outputs_tuple(graph)}",
    ]
    cols = pow2_at_least(max(graph.cols.values(), default=1024))
    chunk = pick([256, 512, 1024, 2048], cols)
    tunables: dict[str, list[int | str]] = {
        "CHUNK": [256, 512, 1024, 2048, 4096],
        "ROWS": [1, 2, 4, 8, 16],
        "num_warps": [1, 2, 4, 8, 16],
    }
    defaults: dict[str, int | str] = {
        "CHUNK": chunk,
        "ROWS": pick([1, 2, 4, 8, 16], max(1, 2048 // chunk)),
        "num_warps": 8 if chunk >= 2048 else 4,
    }
    kernels = ([_MUL] if kind == "cumprod" else []) + [kernel]
    return Parts(kernels, fwd, tunables, defaults, helpers_for(ops), tile=("ROWS", "CHUNK"))


__all__ = ["build"]
