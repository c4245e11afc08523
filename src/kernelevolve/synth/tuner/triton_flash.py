"""Attention's three stages as one kernel: the scores never stored (a flash-attention template).

A pipeline cuts attention into the scores' batched GEMM with its elementwise epilogue (the scale, a
mask read from a tensor), the row softmax of the scores and the GEMM of the probabilities with V
(`stages.py`, `aten_attention.py`): the scores, [batch, M, N] fp32, make two round trips through
memory (512 MiB a pass for the suites' prefill attention). Here one program holds BLOCK_M query rows
of one batch entry and streams K and V in blocks of BLOCK_N keys: each block's scores (q k^T, then
stage 0's epilogue, on the tile) update a running row maximum m and sum l, and the output
accumulator is rescaled by exp(m_old - m_new) before the block's exp(s - m) @ V is added (the online
softmax of FlashAttention, Dao et al. 2022). The output is the accumulator over l at the end; where
the softmax stage is SDPA's safe softmax, a row whose scores are all -inf gives 0 (the reference's
guard), otherwise NaN as the reference's softmax of such a row.

`fusable` takes the three stages as the tracer makes them: stage 0 a batched GEMM (a = q [batch, M,
D], b = k read as k^T) whose epilogue is elementwise ops of the scores and of scalar or scores-shaped
tensors (a mask expanded to the scores' shape: `aten_mask`); stage 1 exactly a softmax of stage 0's
output (max, subtract, exp, sum, divide; optionally SDPA's guard); stage 2 a batched GEMM of the
probabilities with V and nothing after it. Head dims are at most MAX_HEAD (q, k and the output's
rows of one program sit in registers).

The scores' product takes the DOT tunable's precision, the values' DOT_PV's (the precision's fast
dot by default: 3xTF32 for strict fp32, rounded TF32 where the spec allows TF32), the probabilities
in fp32 as the pipeline's softmax stage writes them. At TF32 ("tf32r", `triton_common.ROUNDED_DOTS`)
a product's operands (q and each block of k; the probabilities and each block of v) are first
rounded to the nearest TF32 value (`_tf32_round`, ties to even as a TMA load rounds; Triton's plain
"tf32", offered, truncates): the tensor cores truncate the fp32 bits they are given, and the
truncation's bias, exponentiated by the softmax, put the suites' attention outside the TF32
tolerance (rel. norm error 1.7e-3 on an H200, 1.6e-3 emulated on the CPU; rounded, 4.3e-4 emulated,
about what cuBLAS's rounded TF32 gives). Masked scores take 3xTF32 in both products by default even
so: a row that sees a few keys (a causal mask's first rows) has outputs of v's size whose TF32 error
is above the tolerance's absolute part (0.5% of the output's rms) where they cancel to near 0.
Emulated at the suites' causal `batch` shape, 71 of 200 draws had such an element with both products
at TF32, 1 of 200 with the scores' at 3xTF32 (14 with the values' instead); on an H200 the scores'
3xTF32 still failed 2 of 8.4M elements at the causal prefill's scaled inputs (whose sharper softmax
makes more rows few-key ones).

V_KMAJOR copies a v whose head dim is contiguous to one whose keys are (one pass over v, timed with
the kernel): Hopper's TF32 products read their second operand K-contiguous (as the GEMM template's
B_KMAJOR, `triton_gemm.b_copy_knob`).

A causal mask (SDPA's `is_causal`: the IR's `causal` op, `aten_attention`) that makes the scores is
exploited: the key blocks after a query block's last row are never loaded (half the work at long
sequences) and the query blocks run longest first. A mask read from a tensor (MinGPT's buffer) is
read per tile, every block computed.

Not here: a causal buffer recognised as such, dropout, a backward, and a softmax over another dim
than the keys'.
"""

from __future__ import annotations

from kernelevolve.synth.tuner import triton_gemm
from kernelevolve.synth.tuner.ir import ELEMENTWISE_OPS, OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_common import (
    DOT_CHOICES,
    ROUNDED_DOTS,
    CodegenError,
    Parts,
    forward_args,
    helpers_for,
    jit_function,
    load,
    op_expr,
    pow2_at_least,
    source_expr,
)
from kernelevolve.synth.tuner.triton_gemm import FAST_DOT

SPAN = 3  # stages written as one (`triton_stages._FUSIONS`)
NAME = "triton-flash"
MAX_HEAD = 256
NEG_INF = float("-inf")


def fusable(scores: OpGraph, softmax: OpGraph, out: OpGraph, k: int) -> bool:
    """Whether stages k, k + 1 and k + 2 are attention's scores, softmax and output (module doc)."""
    return _why_not(scores, softmax, out, k) is None


def _why_not(scores: OpGraph, softmax: OpGraph, out: OpGraph, k: int) -> str | None:
    gs, go = scores.gemm, out.gemm
    if scores.pattern != "gemm" or gs is None or not gs.batched or gs.bias or gs.a_layout != "mk":
        return "stage 1 is not a batched GEMM of q with k"
    if out.pattern != "gemm" or go is None or not go.batched or go.bias or go.a_layout != "mk":
        return "stage 3 is not a batched GEMM of the probabilities with v"
    if len(scores.outputs) != 1 or out.outputs != ["acc"] or out.ops or out.out_view:
        return "stage 3 has an epilogue or a view of its output, or stage 1 more than one output"
    if scores.dtype != "float32" or softmax.dtype != "float32":
        return "the scores or probabilities are not fp32"
    tensors = {t.name: t for t in scores.tensors}
    if any(t.layout not in ("full", "scalar") for n, t in tensors.items() if n not in (gs.a, gs.b)):
        return "stage 1's epilogue reads a row or column tensor"
    if any(op.op not in ELEMENTWISE_OPS for op in scores.ops):
        return "stage 1's epilogue is not elementwise"
    mid0, mid1 = f"_mid{k}", f"_mid{k + 1}"
    if [t.name for t in softmax.tensors] != [mid0] or softmax.reduce is not None or softmax.pattern != "row":
        return "stage 2 is not a row stage of the scores alone"
    if _softmax_guard(softmax) is None:
        return "stage 2 is not a softmax"
    if go.a != mid1 or {t.name for t in out.tensors} != {mid1, go.b}:
        return "stage 3 does not multiply the probabilities by a tensor"
    if mid0 in (gs.a, gs.b, go.b):
        return "an operand is an intermediate of the span"
    operands = [tensors.get(gs.a), tensors.get(gs.b), next((t for t in out.tensors if t.name == go.b), None)]
    if any(t is None or t.dtype != "float32" for t in operands):
        return "q, k and v are not all fp32 tensors"
    if softmax.forward_args[: len(scores.forward_args)] != scores.forward_args:
        return "the stages' forward arguments differ"
    if out.forward_args[: len(scores.forward_args)] != scores.forward_args:
        return "the stages' forward arguments differ"
    heads = [*scores.inner.values(), *out.cols.values()]
    if not heads or max(heads) > MAX_HEAD:
        return f"a head dim above {MAX_HEAD}"
    return None


def _softmax_guard(softmax: OpGraph) -> bool | None:
    """For a row stage that is exactly softmax(x) over its one input x: whether it has SDPA's guard
    (a row of -inf gives 0); None where it is not such a softmax."""
    ops = softmax.ops
    if len(ops) not in (5, 7):
        return None
    x = softmax.tensors[0].name
    mx, sub, ex, sm, dv = ops[:5]
    plain = (
        (mx.op, mx.args) == ("amax", (x,))
        and (sub.op, sub.args) == ("sub", (x, mx.out))
        and (ex.op, ex.args) == ("exp", (sub.out,))
        and (sm.op, sm.args) == ("sum", (ex.out,))
        and (dv.op, dv.args) == ("div", (ex.out, sm.out))
    )
    if not plain:
        return None
    if len(ops) == 5:
        return False if softmax.outputs == [dv.out] else None
    eq, wh = ops[5:]
    guarded = (
        eq.op == "eq"
        and eq.args == (mx.out, NEG_INF)
        and (wh.op, wh.args) == ("where_nz", (eq.out, 0.0, dv.out))
        and softmax.outputs == [wh.out]
    )
    return True if guarded else None


def build_fused(scores: OpGraph, softmax: OpGraph, out: OpGraph, k: int, precision: str) -> Parts:
    """Stages k, k + 1 and k + 2 as one kernel (the module doc)."""
    why = _why_not(scores, softmax, out, k)
    if why is not None:
        raise CodegenError(f"stages {k + 1}-{k + 3} are not attention as the flash template takes it: {why}")
    guard = bool(_softmax_guard(softmax))
    g = triton_gemm.parse(scores, precision)  # q, k and the scores' epilogue (names, tensors, ops)
    go = out.gemm
    assert go is not None and scores.gemm is not None
    v = next(t for t in out.tensors if t.name == go.b)
    kernel = _kernel(g, guard, DOT_CHOICES[precision])
    v_copy = triton_gemm.b_copy_knob(out, DOT_CHOICES[precision], native=False)
    fwd = _forward(g, scores, out, v, v_copy)
    tunables, defaults = knobs(scores, out, precision, _masked(g), v_copy)
    helpers = helpers_for(g.ops, DOT_CHOICES[precision])
    return Parts([kernel], fwd, tunables, defaults, helpers, ("BLOCK_M", "BLOCK_N"),
                 _drafts(tunables, defaults))  # fmt: skip


def _rounded(x: str, operand: str, dot: str, dots: list[str]) -> list[str]:
    """`x`, the product's `operand` ("a" or "b"), rounded to the nearest TF32 value where the dot knob
    `dot` is one of ROUNDED_DOTS that rounds it (`triton_common.HELPERS["tf32_round"]`); nothing where
    the knob's choices (`dots`) have none."""
    rounding = [d for d, operands in ROUNDED_DOTS.items() if operand in operands and d in dots]
    if not rounding:
        return []
    return ["if " + " or ".join(f'{dot} == "{d}"' for d in rounding) + ":", f"    {x} = _tf32_round({x})"]


def _dot(x: str, y: str, acc: str, dot: str, dots: list[str]) -> list[str]:
    """`acc += x @ y` in the precision of the dot knob `dot` (fp32 operands: one of `dots`; a rounded
    TF32 dot's operands are rounded before, `_rounded`)."""
    rounded = [d for d in ROUNDED_DOTS if d in dots]
    if not rounded:
        return [f"{acc} = tl.dot({x}, {y}, {acc}, input_precision={dot})"]
    return [
        "if " + " or ".join(f'{dot} == "{d}"' for d in rounded) + ":",
        f'    {acc} = tl.dot({x}, {y}, {acc}, input_precision="tf32")',
        "else:",
        f"    {acc} = tl.dot({x}, {y}, {acc}, input_precision={dot})",
    ]


def _kernel(g: triton_gemm.Gemm, guard: bool, dots: list[str]) -> str:
    names = g.names
    q, kk = names.ptr(g.a.name), names.ptr(g.b.name)
    params = [q, kk, "vals_ptr", *(names.ptr(t.name) for t in g.epilogue), "out_ptr", "M", "N", "D", "DV", "H",
              "s_qz", "s_qh", "s_qm", "s_qd", "s_kz", "s_kh", "s_kn", "s_kd", "s_vz", "s_vh", "s_vn", "s_vd"]  # fmt: skip
    params += [f"{c}: tl.constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV", "DOT", "DOT_PV")]
    offsets = {"full": "z * M * N + m2 * N + n2"}
    masks = {"full": "mask"}
    epilogue = [load(t, names, offsets, masks) for t in g.epilogue if t.layout == "full"]
    scalars = [load(t, names, offsets, masks) for t in g.epilogue if t.layout == "scalar"]
    ops = [f"{names.var(op.out)} = {op_expr(op, names)}" for op in g.ops]
    score = names.var(g.graph.outputs[0])
    causal = _causal(g)
    body = [
        "pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # causal: the longest rows first"
        if causal
        else "pid_m = tl.program_id(0)",
        "z = tl.program_id(1).to(tl.int64)  # the batch entry: zb of the outer dims, zh of the last",
        "zb = z // H",
        "zh = z % H",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rd = tl.arange(0, BLOCK_D)",
        "rdv = tl.arange(0, BLOCK_DV)",
        "m2 = rm[:, None]",
        f"a = tl.load({q} + zb * s_qz + zh * s_qh + m2 * s_qm + rd[None, :] * s_qd, mask=(m2 < M) & (rd[None, :] < D), other=0.0)",
        "a = a.to(tl.float32)",
        *_rounded("a", "a", "DOT", dots),
        *scalars,
        'm_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # the running row maximum of the scores',
        "l_i = tl.zeros([BLOCK_M], tl.float32)  # the running sum of exp(score - m_i)",
        "o = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)",
        *(
            ["hi = tl.minimum(N, (pid_m + 1) * BLOCK_M)  # causal: no key after the block's last query"]
            if causal
            else ["hi = N"]
        ),
        "for start in range(0, hi, BLOCK_N):",
        "    rn = start + tl.arange(0, BLOCK_N)",
        "    n2 = rn[None, :]",
        "    mask = (m2 < M) & (n2 < N)",
        f"    b = tl.load({kk} + zb * s_kz + zh * s_kh + rd[:, None] * s_kd + n2 * s_kn, mask=(rd[:, None] < D) & (n2 < N), other=0.0)",
        "    b = b.to(tl.float32)",
        *("    " + line for line in _rounded("b", "b", "DOT", dots)),
        "    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)",
        *("    " + line for line in _dot("a", "b", "acc", "DOT", dots)),
        f"    {names.var('acc')} = acc",
        *("    " + line for line in epilogue + ops),
        f'    s = tl.where(n2 < N, {score}, float("-inf"))  # the keys past N count for nothing',
        "    m_new = tl.maximum(m_i, tl.max(s, 1))",
        '    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row all -inf so far: exp(-inf) = 0',
        "    alpha = tl.exp(m_i - m_use)",
        "    p = tl.exp(s - m_use[:, None])",
        "    l_i = l_i * alpha + tl.sum(p, 1)",
        "    vt = tl.load(vals_ptr + zb * s_vz + zh * s_vh + rn[:, None] * s_vn + rdv[None, :] * s_vd,",
        "                 mask=(rn[:, None] < N) & (rdv[None, :] < DV), other=0.0).to(tl.float32)",
        "    o = o * alpha[:, None]",
        *("    " + line for line in _rounded("vt", "b", "DOT_PV", dots)),
        "    pd = p  # the probabilities as the product takes them (l_i sums them unrounded)",
        *("    " + line for line in _rounded("pd", "a", "DOT_PV", dots)),
        *("    " + line for line in _dot("pd", "vt", "o", "DOT_PV", dots)),
        "    m_i = m_new",
        "o = o / l_i[:, None]",
    ]
    if guard:  # SDPA's safe softmax: a row of -inf scores gives 0
        body.append('o = tl.where(m_i[:, None] == float("-inf"), 0.0, o)')
    body.append(
        "tl.store(out_ptr + z * M * DV + m2 * DV + rdv[None, :], o, mask=(m2 < M) & (rdv[None, :] < DV))"
    )
    return jit_function("_flash_kernel", params, body)


def _masked(g: triton_gemm.Gemm) -> bool:
    """Whether anything masks the scores: a causal op or a mask read per tile (the module doc: such
    attention takes 3xTF32 by default at TF32)."""
    return any(op.op == "causal" for op in g.ops) or any(t.layout == "full" for t in g.epilogue)


def _causal(g: triton_gemm.Gemm) -> bool:
    """Whether the scores are causally masked last (`causal` the op that makes stage 0's output): every
    key after a block's last query is -inf for the whole block, and its blocks are skipped."""
    out = g.graph.outputs[0]
    return any(op.out == out and op.op == "causal" for op in g.ops)


def _forward(g: triton_gemm.Gemm, scores: OpGraph, out: OpGraph, v: TensorArg, v_copy: bool) -> list[str]:
    """q, k and v as [outer batch, last batch dim, rows, dim] views (broadcast over the batch's dims
    where one is; a permuted view of a projection, [B, H, T, D] with T's stride the widest, is read
    in place, where a flat batch would copy it), the epilogue's tensors contiguous, the output, the
    launch."""
    names = g.names
    gs, go = scores.gemm, out.gemm
    assert gs is not None and go is not None
    args = forward_args(scores)
    lq, lk = names.local(g.a.name), names.local(g.b.name)
    k_nk, v_kn = gs.b_layout == "nk", go.b_layout == "kn"
    lines = [
        f"{lq} = {source_expr(g.a, args)}",
        f"{lk} = {source_expr(g.b, args)}",
        f"_v = {source_expr(v, args)}",
        *(f"{names.local(t.name)} = {source_expr(t, args)}.contiguous()" for t in g.epilogue),
        f"_M, _D = {lq}.shape[-2], {lq}.shape[-1]",
        f"_N = {lk}.shape[-2]" if k_nk else f"_N = {lk}.shape[-1]",
        "_DV = _v.shape[-1]" if v_kn else "_DV = _v.shape[-2]",
        f"_bs = torch.broadcast_shapes({lq}.shape[:-2], {lk}.shape[:-2], _v.shape[:-2])",
        "_h = _bs[-1] if len(_bs) else 1",
        "# each operand over the whole batch, its outer dims merged: a view where they merge, else a copy",
        f"_q = {lq}.expand(*_bs, *{lq}.shape[-2:]).reshape(-1, _h, _M, _D)",
        f"_k = {lk}.expand(*_bs, *{lk}.shape[-2:]).reshape(-1, _h, *{lk}.shape[-2:])",
        "_v = _v.expand(*_bs, *_v.shape[-2:]).reshape(-1, _h, *_v.shape[-2:])",
        *(
            [
                'if CONFIG["V_KMAJOR"] and _v.stride(2) != 1:',
                "    # TF32 tensor-core products take v with its keys contiguous: a copy",
                "    _v = _v.transpose(-1, -2).contiguous().transpose(-1, -2)",
            ]
            if v_copy
            else []
        ),
        "_batch = _q.shape[0] * _h",
        "_skn, _skd = " + ("_k.stride(2), _k.stride(3)" if k_nk else "_k.stride(3), _k.stride(2)"),
        "_svn, _svd = " + ("_v.stride(2), _v.stride(3)" if v_kn else "_v.stride(3), _v.stride(2)"),
        f"_out0 = torch.empty((*_bs, _M, _DV), device={lq}.device, dtype=torch.float32)",
        "if _out0.numel() == 0:",
        "    return _out0",
        '_bm, _bn = CONFIG["BLOCK_M"], CONFIG["BLOCK_N"]',
        "_flash_kernel[(triton.cdiv(_M, _bm), _batch)](",
        f"    _q, _k, _v, {''.join(names.local(t.name) + ', ' for t in g.epilogue)}_out0, _M, _N, _D, _DV, _h,",
        "    _q.stride(0), _q.stride(1), _q.stride(2), _q.stride(3), _k.stride(0), _k.stride(1), _skn, _skd,",
        "    _v.stride(0), _v.stride(1), _svn, _svd,",
        "    BLOCK_M=_bm, BLOCK_N=_bn, BLOCK_D=max(16, triton.next_power_of_2(_D)),",
        '    BLOCK_DV=max(16, triton.next_power_of_2(_DV)), DOT=CONFIG["DOT"], DOT_PV=CONFIG["DOT_PV"],',
        '    num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"],',
        ")",
        "return _out0",
    ]
    return lines


def knobs(
    scores: OpGraph, out: OpGraph, precision: str, masked: bool, v_copy: bool
) -> tuple[dict[str, list[int | str]], dict[str, int | str]]:
    """Query and key blocks, warps and stages, each product's precision (the fast one by default; at
    TF32, rounded TF32, and 3xTF32 for both where the scores are masked: the module doc), v copied keys-contiguous where
    a dot may be TF32 (`v_copy`: `triton_gemm.b_copy_knob` of the values' product). A head dim above 64
    halves the key block: q, the accumulator and a block of scores share the registers."""
    dots = DOT_CHOICES[precision]
    head = pow2_at_least(max([*scores.inner.values(), *out.cols.values()], default=64))
    tunables: dict[str, list[int | str]] = {
        "BLOCK_M": [16, 32, 64, 128],
        "BLOCK_N": [16, 32, 64, 128],
        "num_warps": [2, 4, 8],
        "num_stages": [1, 2, 3],
        "DOT": list(dots),
        "DOT_PV": list(dots),
    }
    fast = FAST_DOT.get(precision)
    fast = fast if fast in dots else dots[0]
    if fast == "tf32":  # rounded (the module doc); 3xTF32 where the scores are masked
        fast = "tf32x3" if masked else "tf32r"
    defaults: dict[str, int | str] = {
        "BLOCK_M": 64,
        "BLOCK_N": 64 if head <= 64 else 32,
        "num_warps": 4 if head <= 64 else 8,
        "num_stages": 2,
        "DOT": fast,
        "DOT_PV": fast,
    }
    if v_copy:
        tunables["V_KMAJOR"] = [1, 0]
        defaults["V_KMAJOR"] = 1
    return tunables, defaults


def _drafts(
    tunables: dict[str, list[int | str]], defaults: dict[str, int | str]
) -> list[dict[str, int | str]]:
    """Taller query and key blocks in one stage (the suites' attention's best on an H200 with both
    products at TF32 and v as given, 1.03x of torch.compile at its 2k prefill where the defaults took
    0.42x), taller query blocks (K and V
    read by fewer programs), then shorter ones (more programs)."""
    out = []
    presets = (
        {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 1, "num_warps": 8},
        {"BLOCK_M": 128, "num_warps": 8},
        {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4},
    )
    for preset in presets:
        cfg = {**defaults, **preset}
        if all(v in tunables[key] for key, v in cfg.items()) and cfg != defaults and cfg not in out:
            out.append(cfg)
    return out


__all__ = ["MAX_HEAD", "NAME", "SPAN", "build_fused", "fusable", "knobs"]
