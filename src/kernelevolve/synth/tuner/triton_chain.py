"""A pipeline's two GEMMs and the row stages after each as one kernel: the hidden never stored.

The suites' ffn_block, a transformer's normalized FFN: x @ W1 with an elementwise epilogue (a GELU),
a row stage that scales each hidden row by a value of the row's own reductions (an RMSNorm:
h * rsqrt(mean(h^2) + eps) * g), @ W2, and a row stage over the output's whole rows (a second
RMSNorm). Stage by stage, or as two GEMM + row kernels (`triton_gemm_row`), the [tokens, hidden]
intermediate makes round trips through memory (32 MiB a pass at the suites' 16k tokens x 512). Here
one program holds BLOCK_M rows of x and walks the hidden dim in chunks of BLOCK_H: each chunk's
x @ W1[:, chunk] (a K loop over x's columns), its epilogue, the row stage's per-element ops, the
chunk's share of the row's sums, and the chunk's product with W2[chunk, :] added into an
accumulator of the output's whole rows. The row scale is deferred (`deferral`): where the row stage's
output is P * r, P made of the hidden element and per-column values alone and r of the row's
reductions, each output row is (P * r) @ W2 = r * (P @ W2), so r multiplies the accumulator once
the row's sums are complete. Then the second GEMM's epilogue and the last row stage run on the
accumulator as the GEMM with a row epilogue runs them (`triton_gemm_row`), and one store.

`fusable` takes four stages: a GEMM (not batched, fp32 operands, an elementwise epilogue of column
or scalar tensors), a row stage whose output so factors (its reductions sums or means of values free
of row values), a GEMM of that output, and a row stage over whole output rows of at most MAX_N
columns (the accumulator sits in registers: BLOCK_M is capped as `triton_gemm_row` caps it).
Anything else (a LayerNorm between the GEMMs: x - mean(x) is no scale) is left to the other
templates.

Each product takes its own precision knob (DOT for x @ W1, DOT2 for the chunk's P @ W2; the
precision's fast dot by default, as the fused pairs take it), and W1, W2 given [K, N] are copied
K-contiguous for TF32 dots (`B_KMAJOR`, as the GEMM template: a pass over each weight). The output
rows are r * sum(P W2) rather than sum((r P) W2): exact in real arithmetic, fp32 rounding apart.

Not here: a chain without a row stage between the GEMMs (an MLP: GEMM, GELU, GEMM), three GEMMs,
half inputs, batched GEMMs, a tensor read by both GEMMs' stages (a residual of x).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kernelevolve.synth.tuner import triton_gemm, triton_gemm_row, triton_row
from kernelevolve.synth.tuner.ir import ELEMENTWISE_OPS, REDUCE_OPS, Arg, Op, OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_common import (
    DOT_CHOICES,
    CodegenError,
    Names,
    Parts,
    allocate,
    dot_lines,
    forward_args,
    helpers_for,
    jit_function,
    literal,
    load,
    op_expr,
    outputs_tuple,
    source_expr,
)
from kernelevolve.synth.tuner.triton_gemm import FAST_DOT

SPAN = 4  # stages written as one (`triton_stages._FUSIONS`)
NAME = "triton-chain"
MAX_N = 256  # the output's row: BLOCK_M x next_power_of_2(N) fp32 accumulators in registers
MAX_K = 16384  # x's width: one accumulator over its K slices (the GEMM template folds longer loops)
HIDDEN = "_hid"  # the name the first GEMM's accumulator (a chunk of it) takes in the kernel


@dataclass
class Deferral:
    """A row stage's ops as the chain runs them: `constants` before the hidden loop, `per_element`
    each hidden chunk (values free of row values: the hidden element, columns), `sums` accumulated
    over the chunks (a sum or mean over the hidden row of a per-element value), `per_row` once the
    sums are complete; and its output as the product of `factors` (per-element values or constants)
    times the row values `scale` over the row values `divide`."""

    constants: list[Op]
    per_element: list[Op]
    sums: list[Op]
    per_row: list[Op]
    factors: list[Arg]
    scale: list[str]
    divide: list[str]


def deferral(row: OpGraph, mid: str) -> Deferral | str:
    """How the chain runs row stage `row` over the hidden `mid`, or why it cannot (the module doc)."""
    kind: dict[str, str] = {}
    for t in row.tensors:
        if t.name == mid:
            kind[t.name] = "elem"
        elif t.layout in ("col", "scalar"):
            kind[t.name] = "col" if t.layout == "col" else "const"
        else:
            return f"the row stage reads {t.name!r} ({t.layout}) besides the hidden"
    producer: dict[str, Op] = {}
    plan = Deferral([], [], [], [], [], [], [])
    for op in row.ops:
        args = [kind[a] if isinstance(a, str) else "const" for a in op.args]
        if op.op in REDUCE_OPS:
            if op.op not in ("sum", "mean") or args != ["elem"]:
                return f"{op.op} over the hidden row (only sums and means of per-element values defer)"
            kind[op.out] = "row"
            plan.sums.append(op)
            continue
        if op.op not in ELEMENTWISE_OPS:
            return f"op {op.op!r} in the row stage"
        ks = set(args) - {"const"}
        if "mixed" in ks or ("row" in ks and ks & {"elem", "col"}):
            kind[op.out] = "mixed"  # a per-element value of row values: only as the output's factor
        elif "elem" in ks:
            kind[op.out] = "elem"
        else:
            kind[op.out] = ks.pop() if ks else "const"
        producer[op.out] = op
        if kind[op.out] == "const":
            plan.constants.append(op)
        elif kind[op.out] in ("elem", "col"):
            plan.per_element.append(op)
        elif kind[op.out] == "row":
            plan.per_row.append(op)
    if len(row.outputs) != 1:
        return "a row stage of several outputs"

    def factor(v: Arg) -> str | None:
        k = kind[v] if isinstance(v, str) else "const"
        if k in ("elem", "col", "const"):
            plan.factors.append(v)
        elif k == "row":
            plan.scale.append(str(v))
        elif isinstance(v, str) and producer[v].op == "mul":
            return factor(producer[v].args[0]) or factor(producer[v].args[1])
        elif isinstance(v, str) and producer[v].op == "div" and kind.get(str(producer[v].args[1])) == "row":
            plan.divide.append(str(producer[v].args[1]))
            return factor(producer[v].args[0])
        else:
            return f"{producer[v].op if isinstance(v, str) else v} mixes the hidden and its row's values"
        return None

    why = factor(row.outputs[0])
    if why is not None:
        return why
    if not any(isinstance(f, str) and kind[f] == "elem" for f in plan.factors):
        return "the row stage's output does not depend on the hidden element"
    return plan


def fusable(g1: OpGraph, r1: OpGraph, g2: OpGraph, r2: OpGraph, k: int) -> bool:
    """Whether stages k..k + 3 are the chain the module doc describes."""
    return _why_not(g1, r1, g2, r2, k) is None


def _why_not(g1: OpGraph, r1: OpGraph, g2: OpGraph, r2: OpGraph, k: int) -> str | None:
    i1, i2 = g1.gemm, g2.gemm
    if g1.pattern != "gemm" or i1 is None or i1.batched or i1.a_layout != "mk" or len(g1.outputs) != 1:
        return "stage 1 is not an unbatched GEMM of one output"
    if g2.pattern != "gemm" or i2 is None or i2.batched or i2.a_layout != "mk" or i2.a != f"_mid{k + 1}":
        return "stage 3 is not an unbatched GEMM of stage 2's output"
    if any(t.dtype != "float32" for t in [*g1.tensors, *g2.tensors]) or g1.out_view or r1.out_view:
        return "half operands, or a viewed intermediate"
    if not triton_gemm_row.fusable(g2, r2, k + 2) or max(g2.cols.values(), default=0) > MAX_N:
        return f"stage 4 is not a row stage over whole rows of at most {MAX_N}"
    if max(g1.inner.values(), default=0) > MAX_K or g1.cols != g2.inner or g1.rows != g2.rows:
        return "the GEMMs' shapes do not chain"
    epilogue = [t for t in g1.tensors if t.name not in (i1.a, i1.b)]
    if any(t.layout not in ("col", "scalar") for t in epilogue):
        return "stage 1's epilogue reads more than columns and scalars"
    if not all(op.op in ELEMENTWISE_OPS for op in g1.ops) or any(op.op == "causal" for op in g1.ops):
        return "stage 1's epilogue is not elementwise"
    if r1.pattern != "row" or r1.reduce is not None or r1.rows != g1.rows or r1.cols != g1.cols:
        return "stage 2 is not a row stage over stage 1's output"
    plan = deferral(r1, f"_mid{k}")
    if isinstance(plan, str):
        return plan
    if f"_mid{k}" in {t.name for t in [*g2.tensors, *r2.tensors]}:
        return "a later stage reads stage 1's output"
    fa = list(g1.forward_args)
    if any(list(s.forward_args)[: len(fa)] != fa for s in (r1, g2, r2)):
        return "the stages' forward arguments differ"
    first = {t.name for t in [*g1.tensors, *r1.tensors]}
    second = {t.name for t in [*g2.tensors, *r2.tensors]} - {f"_mid{k + 1}", f"_mid{k + 2}"}
    if first & second:  # (a residual of x after the second GEMM: one pointer, two layouts)
        return f"the second GEMM's stages read {sorted(first & second)} too"
    if HIDDEN in first | second:
        return f"a tensor named {HIDDEN!r}"
    return None


@dataclass
class _Chain:
    """The four stages' pieces in one namespace (`_parse`)."""

    names: Names
    x: TensorArg
    w1: TensorArg
    bias1: TensorArg | None
    epilogue1: list[TensorArg]  # stage 1's and the row stage's column and scalar tensors
    ops1: list[Op]  # stage 1's epilogue, then the row stage's per-element ops (renamed), each chunk
    plan: Deferral  # the row stage (renamed)
    g2: triton_gemm.Gemm  # the second GEMM with the last row stage (`triton_gemm_row.fuse`), renamed
    kn1: bool
    kn2: bool
    dots: list[str]


def _renamed(ops: list[Op], prefix: str, args: dict[str, str]) -> tuple[list[Op], dict[str, str]]:
    """`ops` with their values renamed `<prefix><name>` and their arguments mapped by `args`."""
    names = dict(args)
    out = []
    for op in ops:
        new = Op(prefix + op.out, op.op, tuple(names.get(a, a) if isinstance(a, str) else a for a in op.args))
        names[op.out] = new.out
        out.append(new)
    return out, names


def _parse(g1: OpGraph, r1: OpGraph, g2: OpGraph, r2: OpGraph, k: int, precision: str) -> _Chain:
    why = _why_not(g1, r1, g2, r2, k)
    if why is not None:
        raise CodegenError(f"stages {k + 1}-{k + 4} are not the chain the chain template takes: {why}")
    i1 = g1.gemm
    assert i1 is not None
    mid = f"_mid{k}"
    ops1, names1 = _renamed(g1.ops, "c1_", {"acc": HIDDEN})
    hidden = names1.get(g1.outputs[0], HIDDEN)
    plan = deferral(r1, mid)
    assert not isinstance(plan, str)
    row_ops, names2 = _renamed(r1.ops, "c2_", {mid: hidden})
    by_out = {op.out: op for op in row_ops}

    def pick(ops: list[Op]) -> list[Op]:
        return [by_out[names2[op.out]] for op in ops]

    plan = Deferral(
        pick(plan.constants),
        pick(plan.per_element),
        pick(plan.sums),
        pick(plan.per_row),
        [names2.get(f, f) if isinstance(f, str) else f for f in plan.factors],
        [names2[v] for v in plan.scale],
        [names2[v] for v in plan.divide],
    )
    fused = triton_gemm_row.fuse(g2, r2, k + 2)
    ops3, names3 = _renamed(fused.ops, "c3_", {})
    fused = replace(fused, ops=ops3, outputs=[names3.get(o, o) for o in fused.outputs])
    g2p = triton_gemm.parse(fused, precision, reductions=True)
    by_name = {t.name: t for t in g1.tensors}
    x, w1 = by_name[i1.a], by_name[i1.b]
    bias1 = by_name[i1.bias] if i1.bias else None
    extra = [t for t in g1.tensors if t.name not in (i1.a, i1.b, i1.bias)]
    extra += [t for t in r1.tensors if t.name != mid and t.name not in {e.name for e in extra}]
    tensors = [x, w1, *([bias1] if bias1 else []), *extra, TensorArg(HIDDEN, "none", "full")]
    tensors += [t for t in fused.tensors if t.name not in {u.name for u in tensors} | {g2p.a.name}]
    merged = replace(fused, tensors=tensors, ops=[*ops1, *row_ops, *ops3])
    names = Names(merged)
    g2p = replace(g2p, names=names)
    assert g2.gemm is not None
    dots = DOT_CHOICES[precision]
    return _Chain(names, x, w1, bias1, extra, [*ops1, *plan.per_element], plan, g2p,
                  i1.b_layout == "kn", g2.gemm.b_layout == "kn", dots)  # fmt: skip


def build_fused(g1: OpGraph, r1: OpGraph, g2: OpGraph, r2: OpGraph, k: int, precision: str) -> Parts:
    """Stages k..k + 3 as one kernel (the module doc)."""
    c = _parse(g1, r1, g2, r2, k, precision)
    kernel = _kernel(c)
    tunables, defaults = knobs(c, precision)
    helpers = helpers_for([*c.plan.constants, *c.ops1, *c.plan.per_row, *c.g2.ops], c.dots)
    smem = ((4, "num_stages", "BLOCK_M", "BLOCK_K"), (4, "num_stages", "BLOCK_K", "BLOCK_H"))
    return Parts([kernel], _forward(c, g1), tunables, defaults, helpers, ("BLOCK_M", "BLOCK_H"),
                 _drafts(tunables, defaults), smem)  # fmt: skip


def _kernel(c: _Chain) -> str:
    names, plan = c.names, c.plan
    x, w1, w2 = names.ptr(c.x.name), names.ptr(c.w1.name), names.ptr(c.g2.b.name)
    first = [*([c.bias1] if c.bias1 else []), *c.epilogue1]
    second = [*([c.g2.bias] if c.g2.bias else []), *c.g2.epilogue]
    params = [x, w1, *(names.ptr(t.name) for t in first), w2, *(names.ptr(t.name) for t in second)]
    params += c.g2.out_ptrs
    params += ["M", "N", "K", "H", "s_xm", "s_xk", "s_1k", "s_1h", "s_2h", "s_2n"]
    params += [
        f"{k}: tl.constexpr"
        for k in ("BLOCK_M", "BLOCK_N", "BLOCK_H", "BLOCK_K", "K_TILES", "EVEN_K", "DOT", "DOT2")
    ]
    scalars = [load(t, names, {}, {}) for t in c.epilogue1 if t.layout == "scalar"]
    cols = [load(t, names, {"col": "h2"}, {"col": "hmask"}) for t in c.epilogue1 if t.layout == "col"]
    hid = names.var(HIDDEN)
    bias = (
        f" + tl.load({names.ptr(c.bias1.name)} + h2, mask=hmask, other=0.0).to(tl.float32)" if c.bias1 else ""
    )
    sums = [f"_sum{i}" for i in range(len(plan.sums))]
    factors = " * ".join(names.var(f) if isinstance(f, str) else literal(f or 0.0) for f in plan.factors)
    scale = " * ".join(names.var(v) for v in plan.scale) or "1.0"
    scale += "".join(f" / {names.var(v)}" for v in plan.divide)
    body = [
        "pid = tl.program_id(0)",
        "rm = pid * BLOCK_M + tl.arange(0, BLOCK_M)",
        "am = rm % M  # rows past M: wrapped for the loads, masked at the store",
        "rk = tl.arange(0, BLOCK_K)",
        "rn = tl.arange(0, BLOCK_N)",
        *scalars,
        *(f"{names.var(op.out)} = {op_expr(op, names)}" for op in plan.constants),
        "acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # the output's whole rows",
        *(f"{s} = tl.zeros((BLOCK_M,), dtype=tl.float32)" for s in sums),
        "for h0 in range(0, H, BLOCK_H):  # the hidden, a chunk at a time",
        "    rh = h0 + tl.arange(0, BLOCK_H)",
        "    h2 = rh[None, :]",
        "    hmask = h2 < H",
        "    hh = rh % H",
        f"    a_ptrs = {x} + am[:, None] * s_xm + rk[None, :] * s_xk",
        f"    b_ptrs = {w1} + rk[:, None] * s_1k + hh[None, :] * s_1h",
        "    acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)",
        "    for kt in range(K_TILES):",
        "        if EVEN_K:",
        "            a = tl.load(a_ptrs)",
        "            b = tl.load(b_ptrs)",
        "        else:",
        "            a = tl.load(a_ptrs, mask=rk[None, :] < K - kt * BLOCK_K, other=0.0)",
        "            b = tl.load(b_ptrs, mask=rk[:, None] < K - kt * BLOCK_K, other=0.0)",
        *dot_lines(c.dots, "        "),
        "        a_ptrs += BLOCK_K * s_xk",
        "        b_ptrs += BLOCK_K * s_1k",
        f"    {hid} = acc{bias}",
        *("    " + line for line in cols),
        *(f"    {names.var(op.out)} = {op_expr(op, names)}" for op in c.ops1),
        *(
            f"    {s} += tl.sum(tl.where(hmask, {names.var(str(op.args[0]))}, 0.0), axis=1)"
            for s, op in zip(sums, plan.sums, strict=True)
        ),
        f"    p = tl.where(hmask, {factors}, 0.0)  # the chunk of the row stage's output, unscaled",
        f"    w = tl.load({w2} + rh[:, None] * s_2h + rn[None, :] * s_2n,",
        "                mask=(rh[:, None] < H) & (rn[None, :] < N), other=0.0)",
        *dot_lines(c.dots, "    ", "p", "w", "acc2", "DOT2"),
        *(
            f"{names.var(op.out)} = {s}[:, None]" + (" / H" if op.op == "mean" else "")
            for s, op in zip(sums, plan.sums, strict=True)
        ),
        *(f"{names.var(op.out)} = {op_expr(op, names)}" for op in plan.per_row),
        f"acc = acc2 * ({scale})  # each row's deferred scale",
        "z = 0",
        "m2 = rm[:, None]",
        "n2 = rn[None, :]",
        "mask = (m2 < M) & (n2 < N)",
        "cmask = n2 < N  # the row's columns, as the row templates' reductions name them",
        "cols = N",
    ]
    fused = c.g2.graph

    def expr(op: Op) -> str:
        return triton_row._reduce_expr(op, fused, names) if op.op in REDUCE_OPS else op_expr(op, names)

    body += triton_gemm.finish_lines(c.g2, expr)
    return jit_function("_chain_kernel", params, body)


def _weight(t: TensorArg, local: str, kn: bool, k: str, n: str) -> list[str]:
    """The forward's lines for a weight given [K, N] (`kn`) or [N, K]: its K and N strides."""
    if kn:
        return [f"{n} = {local}.shape[1]", f"_s{k}k, _s{k}n = {local}.stride(0), {local}.stride(1)"]
    return [f"{n} = {local}.shape[0]", f"_s{k}k, _s{k}n = {local}.stride(1), {local}.stride(0)"]


def _forward(c: _Chain, g1: OpGraph) -> list[str]:
    names, g2 = c.names, c.g2
    args = forward_args(g1)
    lx, l1, l2 = names.local(c.x.name), names.local(c.w1.name), names.local(g2.b.name)
    first = [*([c.bias1] if c.bias1 else []), *c.epilogue1]
    lines = [f"{lx} = {source_expr(c.x, args)}", f"{l1} = {source_expr(c.w1, args)}"]
    lines += [f"{l2} = {source_expr(g2.b, args)}"]
    lines += [f"{names.local(t.name)} = {source_expr(t, args)}.contiguous()"
              for t in [*first, *([g2.bias] if g2.bias else []), *g2.epilogue]]  # fmt: skip
    lines += ["_K = " + f"{lx}.shape[-1]", f"_a = {lx}.reshape(-1, _K)", "_M = _a.shape[0]"]
    lines += _weight(c.w1, l1, c.kn1, "1", "_H")
    lines += _weight(g2.b, l2, c.kn2, "2", "_N")
    if c.kn1 or c.kn2:
        lines.append('if CONFIG["B_KMAJOR"]:  # TF32 tensor-core dots take b K-contiguous: a copy')
        if c.kn1:
            lines += [
                f"    {l1} = {l1}.t().contiguous().t()",
                f"    _s1k, _s1n = {l1}.stride(0), {l1}.stride(1)",
            ]
        if c.kn2:
            lines += [
                f"    {l2} = {l2}.t().contiguous().t()",
                f"    _s2k, _s2n = {l2}.stride(0), {l2}.stride(1)",
            ]
    shape = f"(*{lx}.shape[:-1], _N)"
    full = [t for t in g2.epilogue if t.layout == "full"]
    if full and not g2.graph.out_view:
        shape = f"{names.local(full[0].name)}.shape"
    lines += [f"_device = {lx}.device", f"_shape = {shape}", *allocate(g2.graph, "_shape")]
    lines += ["if _out0.numel() == 0:", f"    return {outputs_tuple(g2.graph)}"]
    launch = ["_a", l1, *(names.local(t.name) for t in first), l2, *triton_gemm.finish_args(g2)]
    per_thread = triton_gemm_row.ACC_PER_THREAD * 32
    lines += [
        '_bk, _bh = CONFIG["BLOCK_K"], CONFIG["BLOCK_H"]',
        "_bn = max(16, triton.next_power_of_2(_N))  # whole output rows",
        f'_bm = max(16, min(CONFIG["BLOCK_M"], {per_thread} * CONFIG["num_warps"] // _bn))  # the accumulators fit',
        "_chain_kernel[(triton.cdiv(_M, _bm),)](",
        f"    {', '.join(launch)},",
        "    _M, _N, _K, _H, _a.stride(0), _a.stride(1), _s1k, _s1n, _s2k, _s2n,",
        "    BLOCK_M=_bm, BLOCK_N=_bn, BLOCK_H=_bh, BLOCK_K=_bk, K_TILES=triton.cdiv(_K, _bk),",
        '    EVEN_K=_K % _bk == 0, DOT=CONFIG["DOT"], DOT2=CONFIG["DOT2"],',
        '    num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"],',
        ")",
        f"return {outputs_tuple(g2.graph)}",
    ]
    return lines


def knobs(c: _Chain, precision: str) -> tuple[dict[str, list[int | str]], dict[str, int | str]]:
    """Row and hidden blocks, the K slice, warps and stages, each product's precision (the fast one
    by default), and the weights' copy K-contiguous where one is given [K, N] (on by default for
    TF32 dots)."""
    fast = FAST_DOT.get(precision)
    fast = fast if fast in c.dots else c.dots[0]
    tunables: dict[str, list[int | str]] = {
        "BLOCK_M": [16, 32, 64, 128], "BLOCK_H": [16, 32, 64, 128], "BLOCK_K": [16, 32, 64], "num_warps": [2, 4, 8],
        "num_stages": [1, 2, 3], "DOT": list(c.dots), "DOT2": list(c.dots),
    }  # fmt: skip
    defaults: dict[str, int | str] = {
        "BLOCK_M": 64, "BLOCK_H": 64, "BLOCK_K": 32, "num_warps": 8, "num_stages": 2, "DOT": fast, "DOT2": fast,
    }  # fmt: skip
    if c.kn1 or c.kn2:
        tunables["B_KMAJOR"] = [0, 1]
        defaults["B_KMAJOR"] = int(str(fast).startswith("tf32"))
    return tunables, defaults


def _drafts(
    tunables: dict[str, list[int | str]], defaults: dict[str, int | str]
) -> list[dict[str, int | str]]:
    """One stage (at TF32 on an H200 the default's only child that beat it, 0.80x -> 0.86x of
    torch.compile, 1.25x at the suites' long_history shape), fewer rows a program (more programs,
    fewer accumulators each), then a narrower hidden chunk."""
    out = []
    presets = (
        {"num_stages": 1},
        {"BLOCK_M": 32, "num_warps": 4},
        {"BLOCK_H": 32},
        {"BLOCK_M": 128, "BLOCK_H": 32},
    )
    for preset in presets:
        cfg = {**defaults, **preset}
        if all(v in tunables[key] for key, v in cfg.items()) and cfg != defaults and cfg not in out:
            out.append(cfg)
    return out


__all__ = ["MAX_N", "NAME", "SPAN", "build_fused", "deferral", "fusable"]
