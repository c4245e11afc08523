"""Triton template for `gemm` graphs: acc = a @ b (+ bias), an elementwise epilogue, one store.

The Triton matmul tutorial's kernel: a BLOCK_M x BLOCK_N tile per program, GROUP_M rows of tiles
swizzled together so neighbours share panels in L2, a K loop of BLOCK_K slices (the trip count a
constexpr, EVEN_K dropping the K masks when K divides), rows and columns past the edge wrapped
(`% M`, `% N`) so the loads stay unmasked and only the store is masked. A batched product takes the
batch from the grid's second axis; a `b` with one batch is broadcast through a zero stride. A Linear
weight (`b_layout` "nk", shape [N, K]) is read transposed through its strides, never copied. Bias and
the epilogue run on the fp32 accumulator before the store.

Precision (the `DOT` tunable): strict_fp32 -> `input_precision="ieee"` by default, with "tf32x3"
(three TF32 products, about fp32 accuracy on tensor cores) offered to the tuner; tf32 -> "tf32";
low -> bf16 operands with fp32 accumulation. bf16/fp16 inputs always take the native dot. A b given
as [K, N] to a TF32 dot can be copied K-contiguous first (`B_KMAJOR`, see `b_copy_knob`); a K that
is not a multiple of the K slice can be padded with zeros, a and b copied (`PAD_K`, `pad_k_lines`).

A K loop of more than FOLD_ABOVE tiles sums in two levels (see FOLD_ABOVE).

Its pieces (`parse`, `tile_lines`, `k_loop`, `epilogue_lines`, `finish_lines`, `forward_setup`,
`launch_lines`) also write the split-K template (`triton_splitk.py`: few output tiles and a long K,
K cut into ranges whose fp32 partials a second kernel sums before the epilogue), which falls back to
this kernel, and a pipeline's fused pairs (`triton_gemm_row.py`: a row stage in the epilogue;
`triton_gemm_ce.py`: a cross-entropy's partials in the epilogue).

Why one module (over 450 lines): the pieces are one kernel's source in order, with the knobs and
presets that size it; the templates that reuse them read them here, as one kernel.

Not here: split-K (`triton_splitk.py`), persistent or TMA/warp-specialized schedules, batch > 65535
(the grid's y limit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernelevolve.synth.tuner.ir import Op, OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_common import (
    DOT_CHOICES,
    HALF_DTYPES,
    CodegenError,
    Names,
    Parts,
    allocate,
    check_graph,
    dot_lines,
    forward_args,
    helpers_for,
    jit_function,
    load,
    needed,
    op_expr,
    outputs_tuple,
    pick,
    pow2_at_least,
    source_expr,
    store,
)

# K loops of more tiles than this accumulate in two levels: acc takes FOLD (about sqrt(K tiles)) tiles,
# then joins a second fp32 total, so no accumulator takes more than ~sqrt(K tiles) terms (a matvec of
# K = 2**20 summed in one accumulator, 32768 tiles, was off by 1.5e-4). Shorter loops keep one
# accumulator (no second tile of registers).
FOLD_ABOVE = 1024
PAD_K_MIN = 128  # M and N at least, for PAD_K on by default (`knobs`)


# Tile presets a GEMM-shaped template (`triton_gemm`, `triton_conv`) drafts after its default, best guess
# first. Half operands: the Triton matmul tutorial's first autotune configs for CUDA. fp32 (32-wide K
# slices: three stages of a 128 x 256 fp32 tile's panels fit Hopper's shared memory, 64-wide do not):
# the default tile, a wide-N and a narrow-N one, with the precision's fastest dot (3xTF32 for strict fp32),
# the tuner's winners on an H100 at KernelBench's square and 4-D GEMMs, found before only by luck.
HALF_PRESETS: list[dict[str, int | str]] = [
    {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8},
    {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 4, "num_warps": 4},
    {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 4, "num_warps": 4},
]
FP32_PRESETS: list[dict[str, int | str]] = [
    {},
    {"BLOCK_M": 32, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 4, "num_stages": 3, "num_warps": 4},
    {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 16, "num_stages": 3, "num_warps": 4},
]
# The dot a precision's drafts take: strict fp32's default is IEEE (fp32 SIMT), its fast choice 3xTF32.
FAST_DOT = {"strict_fp32": "tf32x3", "tf32": "tf32", "low": "bf16"}
# A batched b's copy is a pass over as many bytes as the product reads: KernelBench 1/3 (b 1 GiB) ran
# 1.14x of cuBLAS fp32 at 3xTF32 32 x 256 with b as given, 0.96x at best copied (h100-gemm-layout).
BATCHED_B_PRESET: dict[str, int | str] = {**FP32_PRESETS[1], "B_KMAJOR": 0}


def gemm_drafts(tunables: dict[str, list[int | str]], defaults: dict[str, int | str], precision: str,
                native: bool, b_batched: bool = False) -> list[dict[str, int | str]]:  # fmt: skip
    """The presets (HALF_PRESETS or FP32_PRESETS with the precision's FAST_DOT; and BATCHED_B_PRESET
    for a `b_batched` product that offers B_KMAJOR) as full configurations for this shape: a block no
    larger than the default's where the default is below 128 (that dim is small: a wider tile only
    masks), values the tunables offer, none equal to the default or to an earlier draft."""
    presets = list(HALF_PRESETS if native else FP32_PRESETS)
    if b_batched and not native and "B_KMAJOR" in defaults:
        presets.append(BATCHED_B_PRESET)
    out: list[dict[str, int | str]] = []
    for preset in presets:
        cfg = {**defaults, **preset}
        if not native:
            cfg["DOT"] = FAST_DOT.get(precision, defaults["DOT"])
            if "B_KMAJOR" in defaults and "B_KMAJOR" not in preset:
                cfg["B_KMAJOR"] = int(str(cfg["DOT"]).startswith("tf32"))
        for dim in ("BLOCK_M", "BLOCK_N"):
            if int(defaults[dim]) < 128:
                cfg[dim] = min(int(cfg[dim]), int(defaults[dim]))
        if all(v in tunables[k] for k, v in cfg.items()) and cfg != defaults and cfg not in out:
            out.append(cfg)
    return out


@dataclass
class Gemm:
    """A gemm graph's pieces, as the GEMM kernels are written from them (here and `triton_splitk`)."""

    graph: OpGraph
    names: Names
    a: TensorArg
    b: TensorArg
    bias: TensorArg | None
    epilogue: list[TensorArg]  # tensors the epilogue reads
    ops: list[Op]  # the epilogue's ops
    native: bool  # half operands: the native dot
    dots: list[str]

    @property
    def ptrs(self) -> list[str]:
        """The kernel's pointer parameters: a, b, the bias, the epilogue's tensors, the outputs."""
        names = self.names
        ptrs = [names.ptr(self.a.name), names.ptr(self.b.name)]
        ptrs += [names.ptr(self.bias.name)] if self.bias else []
        return ptrs + [names.ptr(t.name) for t in self.epilogue] + self.out_ptrs

    @property
    def out_ptrs(self) -> list[str]:
        return [f"out{i}_ptr" for i in range(len(self.graph.outputs))]


def parse(graph: OpGraph, precision: str, reductions: bool = False) -> Gemm:
    """The graph's pieces; `reductions` lets its epilogue reduce over the tile's rows (only the GEMM
    with a row epilogue, `triton_gemm_row`, whose tile holds whole rows, writes those)."""
    check_graph(graph, "gemm", reductions)
    gi = graph.gemm
    if gi is None:
        raise CodegenError("a gemm graph without its GemmInfo")
    by_name = {t.name: t for t in graph.tensors}
    for role, name in (("a", gi.a), ("b", gi.b), ("bias", gi.bias)):
        if name is not None and name not in by_name:
            raise CodegenError(f"gemm {role} {name!r} is not one of the graph's tensors")
    a, b = by_name[gi.a], by_name[gi.b]
    if not gi.batched and any(op.op == "causal" for op in graph.ops):
        raise CodegenError("a causal mask after an unbatched GEMM: its rows are not the queries")
    live = needed(graph, graph.outputs)
    epilogue = [t for t in graph.tensors if t.name in live and t.name not in (gi.a, gi.b, gi.bias)]
    native = a.dtype == b.dtype and a.dtype in HALF_DTYPES
    return Gemm(
        graph,
        Names(graph),
        a,
        b,
        by_name[gi.bias] if gi.bias else None,
        epilogue,
        [op for op in graph.ops if op.out in live],
        native,
        ["native"] if native else DOT_CHOICES[precision],
    )


# The K loop's constexprs, after BLOCK_M and BLOCK_N.
LOOP_CONSTS = ("BLOCK_K", "GROUP_M", "K_TILES", "EVEN_K", "DOT", "FOLD")
STRIDES = ["stride_az", "stride_am", "stride_ak", "stride_bz", "stride_bk", "stride_bn"]


def tile_lines(g: Gemm) -> list[str]:
    """The program's tile (GROUP_M swizzle) and batch, its rows and columns, a and b's first K slice."""
    a_ptr, b_ptr = g.names.ptr(g.a.name), g.names.ptr(g.b.name)
    return [
        "pid = tl.program_id(0)",
        "z = tl.program_id(1).to(tl.int64)",
        "num_pid_m = tl.cdiv(M, BLOCK_M)",
        "num_pid_n = tl.cdiv(N, BLOCK_N)",
        "num_pid_in_group = GROUP_M * num_pid_n",
        "first_pid_m = (pid // num_pid_in_group) * GROUP_M",
        "group_size_m = min(num_pid_m - first_pid_m, GROUP_M)",
        "pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)",
        "pid_n = (pid % num_pid_in_group) // group_size_m",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "rk = tl.arange(0, BLOCK_K)",
        "am = rm % M  # past the edge: wrap, so loads need no mask (the store has one)",
        "bn = rn % N",
        f"a_ptrs = {a_ptr} + z * stride_az + am[:, None] * stride_am + rk[None, :] * stride_ak",
        f"b_ptrs = {b_ptr} + z * stride_bz + rk[:, None] * stride_bk + bn[None, :] * stride_bn",
    ]


def k_loop(g: Gemm, left: str = "K") -> list[str]:
    """acc = the sum over K_TILES slices from a_ptrs/b_ptrs on, in fp32 (two levels past FOLD);
    `left` is how much of K is left at the first slice (the masks' bound where not EVEN_K)."""
    cast_a = "" if g.native or g.a.dtype == "float32" else ".to(tl.float32)"
    cast_b = "" if g.native or g.b.dtype == "float32" else ".to(tl.float32)"
    return [
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "if FOLD > 0:  # a long K loop: acc takes FOLD tiles, then joins the total",
        "    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "for kt in range(K_TILES):",
        "    if EVEN_K:",
        f"        a = tl.load(a_ptrs){cast_a}",
        f"        b = tl.load(b_ptrs){cast_b}",
        "    else:",
        f"        a = tl.load(a_ptrs, mask=rk[None, :] < {left} - kt * BLOCK_K, other=0.0){cast_a}",
        f"        b = tl.load(b_ptrs, mask=rk[:, None] < {left} - kt * BLOCK_K, other=0.0){cast_b}",
        *dot_lines(g.dots),
        "    a_ptrs += BLOCK_K * stride_ak",
        "    b_ptrs += BLOCK_K * stride_bk",
        "    if FOLD > 0:",
        "        if kt % FOLD == FOLD - 1:",
        "            total += acc",
        "            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "if FOLD > 0:",
        "    acc = total + acc",
    ]


EDGE = ["m2 = rm[:, None]", "n2 = rn[None, :]", "mask = (m2 < M) & (n2 < N)"]


def finish_lines(g: Gemm, expr: Callable[[Op], str] | None = None) -> list[str]:
    """From the full sum `acc` (fp32) on: the bias, the epilogue, the stores (needs z, m2, n2, mask).
    `expr` writes an op's expression where the template has ops of its own (a row's reductions)."""
    body, at = epilogue_lines(g, expr), "z * M * N + m2 * N + n2"
    for i, out in enumerate(g.graph.outputs):
        body.append(store(i, g.names.var(out), g.graph.layout_of(out), at, "mask", "[BLOCK_M, BLOCK_N]"))
    return body


def epilogue_lines(g: Gemm, expr: Callable[[Op], str] | None = None) -> list[str]:
    """`finish_lines` without the stores: the bias and the epilogue's ops, each output a variable."""
    names = g.names
    acc = names.var("acc")
    if g.bias:
        bias = names.ptr(g.bias.name)
        body = [f"{acc} = acc + tl.load({bias} + n2, mask=n2 < N, other=0.0).to(tl.float32)"]
    else:
        body = [f"{acc} = acc"]
    offsets = {"full": "z * M * N + m2 * N + n2", "col": "n2", "row": "z * M + m2"}
    masks = {"full": "mask", "col": "n2 < N", "row": "m2 < M"}
    body += [load(t, names, offsets, masks) for t in g.epilogue]
    body += [f"{names.var(op.out)} = {expr(op) if expr else op_expr(op, names)}" for op in g.ops]
    return body


def build(graph: OpGraph, precision: str) -> Parts:
    g = parse(graph, precision)
    params = [*g.ptrs, "M", "N", "K", *STRIDES]
    params += [f"{k}: tl.constexpr" for k in ("BLOCK_M", "BLOCK_N", *LOOP_CONSTS)]
    body = [*tile_lines(g), *k_loop(g), *EDGE, *finish_lines(g)]
    kernel = jit_function("_gemm_kernel", params, body)

    fwd = forward_setup(g) + launch_lines(g)
    tunables, defaults = knobs(graph, g.dots, g.native)
    drafts = gemm_drafts(tunables, defaults, precision, g.native, bool(graph.gemm and graph.gemm.batched))
    helpers = helpers_for(g.ops, g.dots)
    return Parts([kernel], fwd, tunables, defaults, helpers, ("BLOCK_M", "BLOCK_N"), drafts, smem_terms(g))


def smem_terms(g: Gemm) -> tuple[tuple[int | str, ...], ...]:
    """The K loop's shared memory (`tunables` SMEM): num_stages buffers of a's [BLOCK_M, BLOCK_K] and
    b's [BLOCK_K, BLOCK_N] slices, fp32 (half where the dot is native). Exactly what Triton 3.6 asked
    for in each of 5 failures to compile on an H200 (TF32 and 3xTF32 dots); a lower bound where the
    kernel needs more (the fused cross-entropy's epilogue: 64 KiB more at 128 x 256)."""
    size = 2 if g.native else 4
    return ((size, "num_stages", "BLOCK_M", "BLOCK_K"), (size, "num_stages", "BLOCK_K", "BLOCK_N"))


TILE = ['_bm, _bn, _bk = CONFIG["BLOCK_M"], CONFIG["BLOCK_N"], CONFIG["BLOCK_K"]']


def forward_setup(g: Gemm, tile: list[str] = TILE, outputs: bool = True) -> list[str]:
    """The forward up to the launch: a and b as [batch, M, K] / [batch, K, N] views with their strides
    (`_a`, `_b`, `_M`, `_N`, `_K`, `_batch`, `_saz`.. `_sbn`), `_device`, the outputs (`outputs`:
    allocated in the GEMM output's shape, returned at once where empty), the tile (`_bm`.. `_bk`, set by
    the `tile` lines)."""
    graph, names, a, b, bias, epilogue = g.graph, g.names, g.a, g.b, g.bias, g.epilogue
    gi = graph.gemm
    assert gi is not None
    args = forward_args(graph)
    la, lb = names.local(a.name), names.local(b.name)
    lines = [f"{la} = {source_expr(a, args)}", f"{lb} = {source_expr(b, args)}"]
    lines += [
        f"{names.local(t.name)} = {source_expr(t, args)}.contiguous()"
        for t in [*([bias] if bias else []), *epilogue]
    ]
    kn, km = gi.b_layout == "kn", gi.a_layout == "km"
    if gi.batched and km:  # a given as [batch, K, M]: read transposed through its strides
        lines += [
            f"_K, _M = {la}.shape[-2], {la}.shape[-1]",
            f"_a = {la}.reshape(-1, _K, _M)",
            f"_b = {lb}.reshape(-1, {lb}.shape[-2], {lb}.shape[-1])",
            "_batch = _a.shape[0]",
            "_N = _b.shape[2]" if kn else "_N = _b.shape[1]",
            "_saz, _sam, _sak = _a.stride(0), _a.stride(2), _a.stride(1)",
            "_sbz = _b.stride(0) if _b.shape[0] > 1 else 0  # one b for every batch: broadcast",
            "_sbk, _sbn = " + ("_b.stride(1), _b.stride(2)" if kn else "_b.stride(2), _b.stride(1)"),
        ]
    elif km:
        lines += [
            f"_a = {la}",
            f"_b = {lb}",
            "_K, _M, _batch = _a.shape[0], _a.shape[1], 1",
            "_N = _b.shape[1]" if kn else "_N = _b.shape[0]",
            "_saz, _sam, _sak = 0, _a.stride(1), _a.stride(0)",
            "_sbz = 0",
            "_sbk, _sbn = " + ("_b.stride(0), _b.stride(1)" if kn else "_b.stride(1), _b.stride(0)"),
        ]
    elif gi.batched:
        lines += [
            f"_M, _K = {la}.shape[-2], {la}.shape[-1]",
            f"_a = {la}.reshape(-1, _M, _K)",
            f"_b = {lb}.reshape(-1, {lb}.shape[-2], {lb}.shape[-1])",
            "_batch = _a.shape[0]",
            "_N = _b.shape[2]" if kn else "_N = _b.shape[1]",
            "_saz, _sam, _sak = _a.stride(0), _a.stride(1), _a.stride(2)",
            "_sbz = _b.stride(0) if _b.shape[0] > 1 else 0  # one b for every batch: broadcast",
            "_sbk, _sbn = " + ("_b.stride(1), _b.stride(2)" if kn else "_b.stride(2), _b.stride(1)"),
        ]
    else:
        lines += [
            f"_K = {la}.shape[-1]",
            f"_a = {la}.reshape(-1, _K)",
            f"_b = {lb}",
            "_M, _batch = _a.shape[0], 1",
            "_N = _b.shape[1]" if kn else "_N = _b.shape[0]",
            "_saz, _sam, _sak = 0, _a.stride(0), _a.stride(1)",
            "_sbz = 0",
            "_sbk, _sbn = " + ("_b.stride(0), _b.stride(1)" if kn else "_b.stride(1), _b.stride(0)"),
        ]
    b_copy = b_copy_knob(graph, g.dots, g.native)
    if b_copy:  # (PAD_K's copy makes b K-contiguous itself where it pads: one copy, not two)
        lines += [
            'if CONFIG["B_KMAJOR"] and _sbk != 1 and not (CONFIG["PAD_K"] and _K % CONFIG["BLOCK_K"]):',
            "    # TF32 tensor-core dots take b K-contiguous: a copy",
            "    _b = _b.transpose(-1, -2).contiguous().transpose(-1, -2)",
            "    _sbk, _sbn = _b.stride(-2), _b.stride(-1)",
            "    _sbz = _b.stride(0) if _b.dim() == 3 and _b.shape[0] > 1 else 0",
        ]
    full = [t for t in epilogue if t.layout == "full"]
    # A full epilogue tensor has the output's shape exactly; otherwise a's leading dims, then N (the
    # shape `out_view` views as the output's).
    leading = f"(*{la}.shape[:-2], _M, _N)" if km else f"(*{la}.shape[:-1], _N)"
    shape = f"{names.local(full[0].name)}.shape" if full and not graph.out_view else leading
    lines += [f"_device = {la}.device"]
    if outputs:
        lines += [f"_shape = {shape}", *allocate(graph, "_shape")]
        lines += ["if _out0.numel() == 0:", f"    return {outputs_tuple(graph)}"]
    return [*lines, *tile, *pad_k_lines(km, kn, b_copy)]


def pad_k_lines(km: bool, kn: bool, b_copy: bool) -> list[str]:
    """PAD_K: where K is not a multiple of the K slice, a and b copied into zeroed buffers of K rounded
    up to it (zeros past K add nothing), each keeping its contiguous dim, its rows 16-byte aligned, so
    that every K slice is whole (EVEN_K drops the masks) and loads vectorize (KernelBench 1/8's
    8205 x 2949 x 5921: each load of the unpadded operands masked and unvectorized, no variant above
    0.44x of cuBLAS). One pass over a and b, timed with the kernel; where B_KMAJOR asks for b
    K-contiguous (`b_copy`), this copy makes it so."""
    a_k, a_m = (-2, -1) if km else (-1, -2)  # a's K and M dims as the forward holds it
    b_k, b_n = (-2, -1) if kn else (-1, -2)
    return [
        'if CONFIG["PAD_K"] and _K % _bk:  # zeros past K: whole, aligned K slices',
        "    _Kp = triton.cdiv(_K, _bk) * _bk",
        "    def _padded(t, k, o, k_last=False):  # K (dim k) padded; t's contiguous dim kept, or K's",
        "        if k_last or t.stride(k) == 1:",
        "            p = t.movedim(k, -1)",
        "            q = p.new_zeros(*p.shape[:-1], _Kp)",
        "            q[..., : p.shape[-1]] = p",
        "            return q.movedim(-1, k)",
        "        p = t.movedim(o, -1)  # [.., K, O]: rows of O padded to a multiple of 16",
        "        q = p.new_zeros(*p.shape[:-2], _Kp, triton.cdiv(p.shape[-1], 16) * 16)",
        "        q[..., : p.shape[-2], : p.shape[-1]] = p",
        "        return q[..., : p.shape[-1]].movedim(-1, o)",
        f"    _a, _b = _padded(_a, {a_k}, {a_m}), _padded(_b, {b_k}, {b_n}"
        + (', CONFIG["B_KMAJOR"] == 1)' if b_copy else ")"),
        "    _K = _Kp",
        "    _saz = _a.stride(0) if _a.dim() == 3 else 0",
        f"    _sam, _sak = _a.stride({a_m}), _a.stride({a_k})",
        "    _sbz = _b.stride(0) if _b.dim() == 3 and _b.shape[0] > 1 else 0",
        f"    _sbk, _sbn = _b.stride({b_k}), _b.stride({b_n})",
    ]


def finish_args(g: Gemm) -> list[str]:
    """The forward's arguments for what `finish_lines` reads: the bias, the epilogue's tensors, the
    outputs."""
    names = g.names
    return [names.local(t.name) for t in [*([g.bias] if g.bias else []), *g.epilogue]] + [
        f"_out{i}" for i in range(len(g.graph.outputs))
    ]


def fold_line(k_tiles: str) -> str:
    """The forward's `_fold` for a K loop of `k_tiles` slices (a variable's name): 0 up to FOLD_ABOVE."""
    return f"_fold = 0 if {k_tiles} <= {FOLD_ABOVE} else 1 << (({k_tiles}.bit_length() + 1) // 2)  # about sqrt(K tiles)"


def launch_lines(g: Gemm) -> list[str]:
    """The one-pass kernel's launch, and the forward's return."""
    graph = g.graph
    launch = ["_a", "_b", *finish_args(g)]
    return [
        "_kt = triton.cdiv(_K, _bk)",
        fold_line("_kt"),
        "_gemm_kernel[(triton.cdiv(_M, _bm) * triton.cdiv(_N, _bn), _batch)](",
        f"    {', '.join(launch)},",
        "    _M, _N, _K, _saz, _sam, _sak, _sbz, _sbk, _sbn,",
        '    BLOCK_M=_bm, BLOCK_N=_bn, BLOCK_K=_bk, GROUP_M=CONFIG["GROUP_M"],',
        '    K_TILES=_kt, EVEN_K=_K % _bk == 0, DOT=CONFIG["DOT"], FOLD=_fold,',
        '    num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"],',
        ")",
        f"return {outputs_tuple(graph)}",
    ]


def b_copy_knob(graph: OpGraph, dots: list[str], native: bool) -> bool:
    """Whether the forward offers B_KMAJOR: b given as [K, N] (N contiguous) to an fp32 GEMM that may
    take a TF32 dot. Hopper's TF32 tensor-core products read b K-contiguous; Triton 3.6 runs an
    N-contiguous one on a slower path (KernelBench 1/2's 2048 x 8192 x 4096 at 3xTF32: 0.68x of
    cuBLAS's fp32 where the same product with b given as [N, K], 1/17, took 1.65x). B_KMAJOR=1 copies
    b K-contiguous before the launch (one pass over b, timed with the kernel)."""
    gi = graph.gemm
    return gi is not None and gi.b_layout == "kn" and not native and any(d.startswith("tf32") for d in dots)


def with_fast_dot(defaults: dict[str, int | str], dots: list[str], native: bool, precision: str) -> None:
    """`defaults` set to the precision's FAST_DOT (and B_KMAJOR to match) where it is offered: a fused
    variant's defaults (`triton_gemm_row`, `triton_gemm_ce`), whose point is the GEMM at tensor-core
    speed (at strict fp32 the fused cross-entropy at its IEEE default ran 0.47x of torch.compile
    where the stage-by-stage one at 3xTF32 ran 1.56x, H200)."""
    fast = FAST_DOT.get(precision)
    if not native and fast in dots:
        defaults["DOT"] = fast
        if "B_KMAJOR" in defaults:
            defaults["B_KMAJOR"] = int(str(fast).startswith("tf32"))


def knobs(
    graph: OpGraph, dots: list[str], native: bool
) -> tuple[dict[str, list[int | str]], dict[str, int | str]]:
    m = max((graph.rows[k] // max(1, graph.batch.get(k, 1)) for k in graph.rows), default=4096)
    n = max(graph.cols.values(), default=4096)
    bm = pick([16, 32, 64, 128], pow2_at_least(m))
    bn = pick([16, 32, 64, 128], pow2_at_least(n))
    # fp32 operands: 32-wide K slices keep three stages of 128x128 tiles within Hopper's shared memory.
    tunables: dict[str, list[int | str]] = {
        "BLOCK_M": [16, 32, 64, 128, 256],
        "BLOCK_N": [16, 32, 64, 128, 256],
        "BLOCK_K": [16, 32, 64, 128],
        "GROUP_M": [1, 4, 8, 16],
        "num_warps": [2, 4, 8],
        "num_stages": [1, 2, 3, 4, 5],
        "DOT": list(dots),
    }
    if str(dots[0]).startswith("tf32") and bm == 128 and n >= 256:
        # A TF32 default dot: 128 x 256 (8 warps, 3 stages of 32-wide K slices) ran 1.24-1.42x the
        # 128 x 128 tile's speed on an H200 at 4096^3 and the suites' Linear shapes, 0.76-0.88x of
        # cuBLAS's TF32 (benchmarks/results/2026-11-28-h200-gemm-tf32.md).
        bn = 256
    defaults: dict[str, int | str] = {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": 64 if native else 32,
        "GROUP_M": 8,
        "num_warps": 8 if bm * bn >= 128 * 128 else 4,
        "num_stages": 4 if native else 3,
        "DOT": dots[0],
    }
    if b_copy_knob(graph, dots, native):  # on by default where the default dot is a TF32 one
        tunables["B_KMAJOR"] = [0, 1]
        defaults["B_KMAJOR"] = int(str(dots[0]).startswith("tf32"))
    # PAD_K (`pad_k_lines`): on by default where some spec shape's K leaves rows unaligned and its
    # product is large both ways (a thin one, a mat-vec, is a pass over its large operand: a copy of
    # that operand would cost as much again).
    unaligned = any(k % 16 for k in graph.inner.values())
    large = all(min(graph.rows.get(s, 0) // max(1, graph.batch.get(s, 1)), graph.cols.get(s, 0)) >= PAD_K_MIN
                for s in graph.inner)  # fmt: skip
    tunables["PAD_K"] = [0, 1]
    defaults["PAD_K"] = int(bool(graph.inner) and unaligned and large)
    return tunables, defaults


__all__ = [
    "FAST_DOT", "FP32_PRESETS", "HALF_PRESETS", "Gemm", "b_copy_knob", "build", "epilogue_lines", "finish_lines",
    "forward_setup", "gemm_drafts", "k_loop", "knobs", "launch_lines", "pad_k_lines", "parse", "smem_terms",
    "tile_lines", "with_fast_dot",
]  # fmt: skip
