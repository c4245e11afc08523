"""Triton code generation for NVIDIA GPUs: an `OpGraph` in, a complete candidate file out.

`generate(graph, config, precision, template)` returns a `Generated`: a file that imports torch and
triton, declares `TUNABLES` and `CONFIG` (and `TILE`, the knobs that size a program's register tile,
where the template has fixed ones; see `kernelevolve/tunables.py`), defines the kernel(s), and a
`ModelNew(nn.Module)` with the reference's constructor whose forward fetches the tensors, allocates
the outputs in the graph's dtype and launches. Kernels read every knob from `CONFIG` at launch time, so
the tuner's rewrite of the `CONFIG` line is all a new configuration takes; `config` here only picks the
values written (defaults come from the graph's shapes, sized for an H100/H200).

Templates per pattern (`variants(graph)` lists them, the first is the default):
- elementwise: `triton-elementwise` (a flat 1-D grid, ITERS blocks per program, unrolled),
  `triton-elementwise-persistent` (a grid of WAVES programs per SM striding over the blocks) and,
  where row or column tensors broadcast, `triton-elementwise-2d` ([BLOCK_R, BLOCK_C] tiles: no
  integer division for the broadcast indices);
- row: `triton-row` (ROWS whole rows per program, in registers; the default up to 16384 columns) and
  `triton-row-looped` (column chunks, one pass per reduction stage; softmax's max and sum share one
  pass through the online rescaling), see `triton_row.py`; reductions over other dims than the last
  address memory through an index plan (`triton_reduce.py`); for a few rows too long for
  registers, `triton-row-split` first (each pass a grid of (rows, SPLITS) programs, one slice of a
  row each, partials combined per row in fp64; the looped kernel where the runtime shape has many
  rows), see `triton_split.py`;
- gemm: `triton-gemm` (tiled, GROUP_M swizzle, batched through the grid's second axis, bias and
  epilogue fused before the store), see `triton_gemm.py`; for few output tiles and a long K,
  `triton-gemm-splitk` first (K cut into SPLIT_K ranges, fp32 partials summed in order by a second
  kernel that runs the epilogue; the one-pass kernel where the runtime shape has enough tiles), see
  `triton_splitk.py`;
- conv: `triton-conv` (1-, 2- and 3-d convolutions as an implicit GEMM, groups through the grid's
  second axis, bias and epilogue fused), see `triton_conv.py`; for a transposed one with a stride > 1
  and dilation 1, `triton-conv-phased` (one GEMM per output phase over only the taps that reach it,
  the phases on the grid's third axis), see `triton_conv_phased.py`; a depthwise one (one input
  channel per group) first gets `triton-conv-depthwise` (a direct stencil kernel), see
  `triton_depthwise.py`.
- pool: `triton-pool` (1-, 2- and 3-d max and average pooling, the window unrolled, epilogue fused),
  see `triton_pool.py`.
- pipeline: each stage's templates composed into one file (`triton-conv+triton-pool`: stage by stage,
  an intermediate between them), see `triton_stages.py`.
- scalar: `triton-scalar` and `triton-scalar-looped` (a loss: the row templates' bodies, per-program
  partial totals, then one program sums them in a fixed order), see `triton_scalar.py`.
- scan: `triton-scan` (cumsum / cumprod along the last dim, chunked with a carried running value;
  reversed and exclusive forms), see `triton_scan.py`.
- arg: `triton-arg` (argmax / argmin over any dims, chunked, ties to the first index and NaN first
  as torch has them; int64 indices), see `triton_arg.py`.

Loop trip counts that depend on shapes are passed as constexprs: the Triton 3.6 interpreter (numpy 2)
cannot loop to a run-time bound, and the compiled kernel is specialized per shape anyway.

Generated code is ours, not a candidate's: it still passes the candidate guards
(`evaluate.guards.check_source`), and the harness evaluates it like any other candidate. Not here:
backward passes, fp64, stream-K schedules (see ir.py for what
the tracer recognizes at all).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from kernelevolve.synth.tuner import (
    triton_arg,
    triton_conv,
    triton_conv_phased,
    triton_depthwise,
    triton_gemm,
    triton_pool,
    triton_row,
    triton_scalar,
    triton_scan,
    triton_split,
    triton_splitk,
    triton_stages,
)
from kernelevolve.synth.tuner.ir import Generated, OpGraph
from kernelevolve.synth.tuner.triton_common import (
    HELPER_IMPORTS,
    HELPERS,
    PRECISIONS,
    CodegenError,
    Parts,
    forward_args,
    helpers_for,
    jit_function,
    kernel_params,
    launch_args,
    load,
    op_expr,
    outputs_tuple,
    pick,
    pow2_at_least,
    prepare,
    prologue,
    store,
)
from kernelevolve.tunables import TunablesError, format_config

Builder = Callable[[OpGraph, str], Parts]


def _always(graph: OpGraph) -> bool:
    return True


# -- elementwise ------------------------------------------------------------------------------------

_EW_BLOCKS = [256, 512, 1024, 2048, 4096, 8192]
_WARPS = [1, 2, 4, 8, 16]


def _elementwise(graph: OpGraph, precision: str, persistent: bool) -> Parts:
    names, tensors, ops = prepare(graph, "elementwise")
    kname = "_ew_persistent_kernel" if persistent else "_ew_kernel"
    params = [*kernel_params(tensors, graph, names), "n", "cols"]
    params += ["BLOCK: tl.constexpr", "ITERS: tl.constexpr", "IDX64: tl.constexpr"]

    body = ["pid = tl.program_id(0)", "if IDX64:", "    pid = pid.to(tl.int64)"]
    if persistent:
        body.append("nprog = tl.num_programs(0)")
    # Scalars (and ops on scalars only) once per program; everything else per block.
    offsets = {"full": "offs", "col": "offs % cols", "row": "offs // cols"}
    masks = dict.fromkeys(offsets, "mask")
    body += [load(t, names, offsets, masks) for t in tensors if t.layout == "scalar"]
    per_block = [op for op in ops if graph.layout_of(op.out) != "scalar"]
    body += [f"{names.var(op.out)} = {op_expr(op, names)}" for op in ops if op not in per_block]
    if persistent:
        inner = ["for it in range(ITERS):", "    offs = (pid + it * nprog) * BLOCK + tl.arange(0, BLOCK)"]
    else:
        inner = [
            "for it in tl.static_range(ITERS):",
            "    offs = (pid * ITERS + it) * BLOCK + tl.arange(0, BLOCK)",
        ]
    loop = ["mask = offs < n"]
    if {"row", "col"} <= {t.layout for t in tensors}:  # one integer division serves both
        loop.append("q = offs // cols")
        offsets.update(row="q", col="(offs - q * cols)")
    loop += [load(t, names, offsets, masks) for t in tensors if t.layout != "scalar"]
    loop += [f"{names.var(op.out)} = {op_expr(op, names)}" for op in per_block]
    for i, out in enumerate(graph.outputs):
        loop.append(store(i, names.var(out), graph.layout_of(out), "offs", "mask", "[BLOCK]"))
    body += inner + ["    " + line for line in loop]
    kernel = jit_function(kname, params, body)

    fwd = prologue(graph, tensors, names, forward_args(graph))
    fwd += [
        "_n = _shape.numel()",
        "if _n == 0:",
        f"    return {outputs_tuple(graph)}",
        "_cols = _shape[-1] if len(_shape) else 1",
        '_block = CONFIG["BLOCK"]',
    ]
    if persistent:
        fwd += [
            "_blocks = triton.cdiv(_n, _block)",
            '_sms = _sm_count(_device.index) if _device.type == "cuda" else 4',
            '_progs = min(_blocks, _sms * CONFIG["WAVES"])',
            "_iters = triton.cdiv(_blocks, _progs)",
        ]
    else:
        fwd += ['_iters = CONFIG["ITERS"]', "_progs = triton.cdiv(_n, _block * _iters)"]
    args = ", ".join([*launch_args(tensors, graph, names), "_n", "_cols"])
    fwd += [
        f"{kname}[(_progs,)](",
        f"    {args},",
        "    BLOCK=_block, ITERS=_iters, IDX64=_progs * _iters * _block >= 2**31,",
        '    num_warps=CONFIG["num_warps"],',
        ")",
        f"return {outputs_tuple(graph)}",
    ]

    numel = max((graph.rows.get(k, 1) * c for k, c in graph.cols.items()), default=1 << 24)
    # Enough blocks for ~4 waves of 132 SMs before the block grows; 16-byte vectors per thread.
    block = pick([1024, 2048, 4096], numel // (132 * 4))
    tunables: dict[str, list[int | str]] = {"BLOCK": list(_EW_BLOCKS), "num_warps": list(_WARPS)}
    defaults: dict[str, int | str] = {"BLOCK": block, "num_warps": 8 if block >= 4096 else 4}
    if persistent:
        tunables["WAVES"] = [1, 2, 4, 8, 16]
        defaults["WAVES"] = 4
    else:
        tunables["ITERS"] = [1, 2, 4, 8]
        defaults["ITERS"] = 1
    helpers = helpers_for(ops) | ({"sm_count"} if persistent else set())
    return Parts([kernel], fwd, tunables, defaults, helpers, tile=("BLOCK",))


def _elementwise_2d(graph: OpGraph, precision: str) -> Parts:
    """[BLOCK_R, BLOCK_C] tiles over (rows, cols): row and column indices without integer division,
    for graphs that broadcast per-row or per-column tensors."""
    names, tensors, ops = prepare(graph, "elementwise")
    params = [*kernel_params(tensors, graph, names), "rows", "cols"]
    params += ["BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr", "IDX64: tl.constexpr"]
    body = [
        "r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
        "if IDX64:",
        "    r = r.to(tl.int64)",
        "c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
        "rmask = r < rows",
        "cmask = c < cols",
        "mask = rmask & cmask",
    ]
    offsets = {"full": "r * cols + c", "col": "c", "row": "r"}
    masks = {"full": "mask", "col": "cmask", "row": "rmask"}
    body += [load(t, names, offsets, masks) for t in tensors]
    body += [f"{names.var(op.out)} = {op_expr(op, names)}" for op in ops]
    for i, out in enumerate(graph.outputs):
        body.append(
            store(i, names.var(out), graph.layout_of(out), "r * cols + c", "mask", "[BLOCK_R, BLOCK_C]")
        )
    kernel = jit_function("_ew2d_kernel", params, body)

    fwd = prologue(graph, tensors, names, forward_args(graph))
    args = ", ".join([*launch_args(tensors, graph, names), "_rows", "_cols"])
    fwd += [
        "_n = _shape.numel()",
        "if _n == 0:",
        f"    return {outputs_tuple(graph)}",
        "_cols = _shape[-1] if len(_shape) else 1",
        "_rows = _n // _cols",
        '_bc = min(CONFIG["BLOCK_C"], triton.next_power_of_2(_cols))',
        '_br = CONFIG["BLOCK_R"]',
        "_grid = (triton.cdiv(_rows, _br), triton.cdiv(_cols, _bc))",
        "_ew2d_kernel[_grid](",
        f"    {args},",
        "    BLOCK_R=_br, BLOCK_C=_bc, IDX64=_grid[0] * _br * _cols >= 2**31,",
        '    num_warps=CONFIG["num_warps"],',
        ")",
        f"return {outputs_tuple(graph)}",
    ]
    cols = pow2_at_least(max(graph.cols.values(), default=1024))
    block_c = pick([64, 128, 256, 512, 1024, 2048], cols)
    tunables: dict[str, list[int | str]] = {
        "BLOCK_R": [1, 2, 4, 8, 16, 32, 64],
        "BLOCK_C": [32, 64, 128, 256, 512, 1024, 2048, 4096],
        "num_warps": list(_WARPS),
    }
    block_r = pick([1, 2, 4, 8, 16, 32, 64], max(1, 4096 // block_c))
    defaults: dict[str, int | str] = {"BLOCK_R": block_r, "BLOCK_C": block_c, "num_warps": 8}
    return Parts([kernel], fwd, tunables, defaults, helpers_for(ops), tile=("BLOCK_R", "BLOCK_C"))


def _broadcasts(graph: OpGraph) -> bool:
    return any(t.layout in ("row", "col") for t in graph.tensors)


# -- registry ---------------------------------------------------------------------------------------

TEMPLATES: dict[str, tuple[str, Builder, Callable[[OpGraph], bool]]] = {
    "triton-elementwise": ("elementwise", lambda g, p: _elementwise(g, p, persistent=False), _always),
    "triton-elementwise-persistent": (
        "elementwise",
        lambda g, p: _elementwise(g, p, persistent=True),
        _always,
    ),
    "triton-elementwise-2d": ("elementwise", _elementwise_2d, _broadcasts),
    "triton-row": ("row", lambda g, p: triton_row.build(g, p, looped=False), _always),
    "triton-row-looped": ("row", lambda g, p: triton_row.build(g, p, looped=True), _always),
    "triton-row-split": ("row", triton_split.build, triton_split.applies),
    "triton-gemm-splitk": ("gemm", triton_splitk.build, triton_splitk.applies),
    "triton-gemm": ("gemm", triton_gemm.build, _always),
    "triton-conv-depthwise": ("conv", triton_depthwise.build, triton_depthwise.applies),
    "triton-conv": ("conv", triton_conv.build, _always),
    "triton-conv-phased": ("conv", triton_conv_phased.build, triton_conv_phased.applies),
    "triton-pool": ("pool", triton_pool.build, _always),
    "triton-scalar": ("scalar", lambda g, p: triton_scalar.build(g, p, looped=False), _always),
    "triton-scalar-looped": ("scalar", lambda g, p: triton_scalar.build(g, p, looped=True), _always),
    "triton-scan": ("scan", triton_scan.build, _always),
    "triton-arg": ("arg", triton_arg.build, _always),
}


def _codegen() -> triton_stages.Codegen:
    """This module's templates and assembly, as a pipeline's stages are generated with them."""
    return triton_stages.Codegen(variants, TEMPLATES, _assemble)


def variants(graph: OpGraph) -> list[str]:
    """The template names that apply to `graph`, the default first."""
    if graph.pattern == "pipeline":
        return triton_stages.variants(graph, _codegen())
    names = [
        name
        for name, (pattern, _, applies) in TEMPLATES.items()
        if pattern == graph.pattern and applies(graph)
    ]
    cols = max(graph.cols.values(), default=0) if graph.pattern in ("row", "scalar") else 0
    if cols > triton_row.SINGLE_PASS_LIMIT_COLS:  # whole rows in registers would not compile in time
        names = [n for n in names if n not in ("triton-row", "triton-scalar")]
    if cols > triton_row.MAX_SINGLE_PASS_COLS:
        names.reverse()  # rows longer than registers hold: the looped template first (a few such
        # rows: the split-row template before it, which falls back to the looped kernel per shape)
    return names


def generate(
    graph: OpGraph,
    config: dict[str, Any] | None = None,
    precision: str = "strict_fp32",
    template: str | None = None,
) -> Generated:
    """A complete Triton candidate for `graph`. `config` overrides some or all default values (each
    must be one of its tunable's choices); `template` picks one of `variants(graph)`."""
    if precision not in PRECISIONS:
        raise CodegenError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if graph.pattern == "pipeline":
        return triton_stages.generate(graph, config, precision, template, _codegen())
    options = variants(graph)
    if not options:
        raise CodegenError(f"no Triton template for pattern {graph.pattern!r}")
    name = template or options[0]
    if name not in options:
        raise CodegenError(
            f"template {name!r} does not apply to a {graph.pattern!r} graph; choose one of {', '.join(options)}"
        )
    parts = TEMPLATES[name][1](graph, precision)
    chosen = dict(parts.defaults)
    for key, value in (config or {}).items():
        if key not in parts.tunables:
            raise TunablesError(f"{name} has no tunable {key!r}; its tunables: {', '.join(parts.tunables)}")
        if value not in parts.tunables[key]:
            raise TunablesError(f"{key} = {value!r} is not one of {parts.tunables[key]}")
        chosen[key] = value
    source = _assemble(graph, name, parts, chosen)
    return Generated(source, name, parts.tunables, chosen, [] if config else list(parts.drafts))


def _assemble(graph: OpGraph, template: str, parts: Parts, config: dict[str, Any]) -> str:
    what = (graph.description or f"{graph.pattern} graph").replace("\\", "/").replace('"', "'")
    doc = f'"""{what}: generated by the kernelevolve tuner (template {template}).\n\n'
    doc += 'Every knob the kernels read is in CONFIG; TUNABLES lists the choices a tuner may make."""\n'
    imports = sorted({HELPER_IMPORTS[h] for h in parts.helpers if h in HELPER_IMPORTS})
    head = "".join(f"import {m}\n" for m in imports) + ("\n" if imports else "")
    head += "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"
    tunables = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in parts.tunables.items()) + "}"
    config_line = format_config({k: config[k] for k in parts.tunables})
    declarations = f"TUNABLES = {tunables}\nCONFIG = {config_line}\n"
    if parts.tile:
        declarations += f"TILE = {tuple(parts.tile)!r}\n"
    if parts.smem:
        declarations += f"SMEM = {tuple(parts.smem)!r}\n"
    blocks = [doc + "\n" + head, declarations]
    blocks += [HELPERS[h] for h in sorted(parts.helpers)]
    blocks += parts.kernels
    blocks.append(_module(graph, parts.forward))
    return "\n\n".join(b.rstrip("\n") + "\n" for b in blocks)


def _module(graph: OpGraph, forward: list[str]) -> str:
    init = textwrap.dedent(graph.init_source).strip("\n")
    if not init.strip():
        init = "def __init__(self):\n    super().__init__()"
    elif not init.lstrip().startswith("def __init__"):  # a bare body: wrap it
        body = init if "super().__init__()" in init else "super().__init__()\n" + init
        init = "def __init__(self):\n" + textwrap.indent(body, "    ")
    args = ", ".join(["self", *forward_args(graph)])
    fwd = f"def forward({args}):\n" + "".join(f"    {line}\n" for line in forward)
    return "class ModelNew(nn.Module):\n" + textwrap.indent(init + "\n\n" + fwd, "    ")


__all__ = ["TEMPLATES", "CodegenError", "generate", "variants"]
