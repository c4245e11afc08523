"""Pieces every Triton template shares: names, the Triton expression of each elementwise op, loads and
stores by layout, and the wrapper's prologue (fetching tensors, the output shape, allocation).

Kernel values are fp32 whatever the tensors' dtypes: every load is cast up, every store cast down to
the output's dtype. Each IR value becomes one kernel variable (`v_<name>`), each tensor one pointer
argument (`<name>_ptr`) and one wrapper local (`t_<name>`); wrapper-only locals start with `_` so a
forward argument's name cannot clash with them.

Deliberately not here: the kernels' control flow (the templates own it) and the file's assembly
(`triton_codegen`).

Why one module (over 450 lines): it is the vocabulary every template writes kernels with (names, op
expressions, loads, stores, dots, helpers), imported together by each; split, every template would
import the same few modules in the same way.
"""

from __future__ import annotations

import keyword
import math
import re
from dataclasses import dataclass, field, replace

from kernelevolve.errors import KernelevolveError
from kernelevolve.synth.tuner import aten_mask, shape_consts
from kernelevolve.synth.tuner.ir import ELEMENTWISE_OPS, REDUCE_OPS, Arg, Op, OpGraph, TensorArg

DTYPES = {"float32", "float16", "bfloat16"}
PRECISIONS = ("strict_fp32", "tf32", "low")
NEG_INF = 'float("-inf")'
POS_INF = 'float("inf")'
NAN_ALL = "propagate_nan=tl.PropagateNan.ALL"  # torch's max/min/clamp/relu keep NaN
HALF_DTYPES = {"bfloat16", "float16"}
# The tl.dot precisions a GEMM-shaped template offers per precision policy, its default first, then
# from least to most precise (`triton_gemm`, `triton_conv`, `triton_flash`: the tuner steps a failed
# candidate's DOT towards the end, `moves.more_precise_configs`); half inputs always take the native
# dot. Beside Triton's input precisions, ROUNDED_DOTS: Triton's TF32 dot truncates its fp32 operands
# where cuBLAS rounds them (rel. norm error of a randn 4096^3 product on an H200: 7.8e-4 truncated,
# 2.9e-4 rounded as cuBLAS; of a rand one, its terms all positive, 6.8e-4 and 2.8e-5: truncation's
# bias adds up), so "tf32ra" rounds a to the nearest TF32 value first and "tf32r" both (`_tf32_round`,
# in registers: 1.2x and 2.0x the truncating kernel's time at 4096^3; benchmarks/results/
# 2026-11-28-h200-gemm-tf32.md).
DOT_CHOICES = {
    "strict_fp32": ["ieee", "tf32x3"],
    "tf32": ["tf32", "tf32ra", "tf32r", "tf32x3", "ieee"],
    "low": ["bf16", "tf32", "tf32ra", "tf32r", "tf32x3", "ieee"],
}
ROUNDED_DOTS = {"tf32ra": ("a",), "tf32r": ("a", "b")}  # dot -> the operands rounded before it


class CodegenError(KernelevolveError, ValueError):
    """The graph (or the template asked for) cannot be generated for Triton."""


@dataclass
class Parts:
    """What a template contributes to the file: kernel sources, the forward's body (unindented
    lines), its tunables and their defaults, module-level helpers it needs (see HELPERS), and the
    knobs whose product is the tile one program holds in registers (written as `TILE`, see
    `kernelevolve/tunables.py`; empty where no fixed knobs size it)."""

    kernels: list[str]
    forward: list[str]
    tunables: dict[str, list[int | str]]
    defaults: dict[str, int | str]
    helpers: set[str] = field(default_factory=set)
    tile: tuple[str, ...] = ()
    # Further configurations worth drafting after the defaults, best guess first (`Generated.drafts`):
    # each overrides some defaults with values from `tunables`.
    drafts: list[dict[str, int | str]] = field(default_factory=list)
    # A lower bound of one program's shared memory in bytes, as terms of knobs and constants (written
    # as `SMEM`, see `kernelevolve/tunables.py`; empty where the template declares none).
    smem: tuple[tuple[int | str, ...], ...] = ()


# Module-level helpers a template may ask for, emitted before the kernels.
HELPERS = {
    "tanh": """@triton.jit
def _tanh(x):
    # tanh from exp(-2|x|) (never overflows); near 0, where 1 - e cancels, the odd Taylor series
    # (its first dropped term is below 6e-8 relative at |x| = 0.2).
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    series = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    return tl.where(ax < 0.2, series, tl.where(x < 0.0, -t, t))
""",
    # fp32 to the nearest TF32 value before a TF32 tl.dot, which truncates (ROUNDED_DOTS)
    "tf32_round": """@triton.jit
def _tf32_round(x):
    # fp32 to the nearest TF32 value (10 mantissa bits), ties to even; inf and NaN as they are
    i = x.to(tl.int32, bitcast=True)
    rounded = ((i + ((i >> 13) & 1) + 0xFFF) & -8192).to(tl.float32, bitcast=True)
    return tl.where((i & 0x7F800000) == 0x7F800000, x, rounded)
""",
    "sm_count": """@functools.lru_cache(maxsize=None)
def _sm_count(index):
    return torch.cuda.get_device_properties(index).multi_processor_count
""",
}
HELPER_IMPORTS = {"sm_count": "functools"}


# -- names ------------------------------------------------------------------------------------------


class Names:
    """Identifiers for a graph's values: unique, valid, and stable within one generated file."""

    def __init__(self, graph: OpGraph):
        self._ids: dict[str, str] = {}
        taken: set[str] = set()
        values = [t.name for t in graph.tensors] + [op.out for op in graph.ops]
        if graph.pattern in ("gemm", "conv", "pool"):
            values.append("acc")
        for name in values:
            base = re.sub(r"\W", "_", name) or "x"
            ident, i = base, 1
            while ident in taken:
                ident, i = f"{base}_{i}", i + 1
            taken.add(ident)
            self._ids[name] = ident

    def ident(self, name: str) -> str:
        if name not in self._ids:
            raise CodegenError(f"the graph uses the value {name!r}, which no tensor or op defines")
        return self._ids[name]

    def var(self, name: str) -> str:
        return "v_" + self.ident(name)

    def ptr(self, name: str) -> str:
        return "p_" + self.ident(name)

    def local(self, name: str) -> str:
        return "t_" + self.ident(name)


# -- elementwise op expressions ---------------------------------------------------------------------


def literal(value: float | int) -> str:
    value = float(value)
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return POS_INF if value > 0 else NEG_INF
    return repr(value)


def op_expr(op: Op, names: Names) -> str:
    """The Triton expression of one elementwise op over fp32 values. Constants are inlined; an op
    whose arguments are all constants gets its first one as a 0-d tensor, since tl functions need a
    tensor to work on."""
    if op.op not in ELEMENTWISE_OPS:
        raise CodegenError(f"op {op.op!r} is not an elementwise op the Triton generator knows")
    if len(op.args) != ELEMENTWISE_OPS[op.op]:
        raise CodegenError(f"op {op.out} = {op.op}{op.args}: expected {ELEMENTWISE_OPS[op.op]} arguments")
    all_const = not any(isinstance(a, str) for a in op.args)

    def arg(i: int) -> str:
        a = op.args[i]
        if isinstance(a, str):
            return names.var(a)
        if a is None:
            raise CodegenError(f"op {op.out} = {op.op}: argument {i} is None")
        if all_const and i == 0:
            return f"tl.full([], {literal(a)}, tl.float32)"
        return literal(a)

    o = op.op
    if o == "clamp":
        expr = arg(0)
        if op.args[1] is not None:
            expr = f"tl.maximum({expr}, {arg(1)}, {NAN_ALL})"
        if op.args[2] is not None:
            expr = f"tl.minimum({expr}, {arg(2)}, {NAN_ALL})"
        return expr
    if o == "pow":
        return _pow(arg(0), op.args[1], names)
    a = arg(0)
    binary = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if o in binary:
        return f"({a} {binary[o]} {arg(1)})"
    if o in ("maximum", "minimum"):
        return f"tl.{o}({a}, {arg(1)}, {NAN_ALL})"
    if o == "where_gt0":
        return f"tl.where({a} > 0.0, {arg(1)}, {arg(2)})"
    if o in ("eq", "ne", "isnan"):  # a comparison as a 1.0/0.0 value; x != x only for NaN
        test = f"{a} != {a}" if o == "isnan" else f"{a} {'==' if o == 'eq' else '!='} {arg(1)}"
        return f"tl.where({test}, 1.0, 0.0)"
    if o == "where_nz":
        return f"tl.where({a} != 0.0, {arg(1)}, {arg(2)})"
    if o == "where_col":  # row and looped-row kernels only: `c` is the column index there
        return f"tl.where(c.to(tl.float32) == {a}, {arg(1)}, 0.0)"
    if o == "causal":  # GEMM epilogues only (`check_graph`): m2 and n2 are the tile's rows and columns
        return f'tl.where(n2 > m2, float("-inf"), {a})'
    unary = {
        "neg": f"(-{a})",
        "abs": f"tl.abs({a})",
        "exp": f"tl.exp({a})",
        "log": f"tl.log({a})",
        # log1p(a) = log(u) - ((u - 1) - a) / u with u = 1 + a (Goldberg): the rounding of 1 + a is
        # undone, so a tiny a gives a, not 0; at a = -1, -inf.
        "log1p": f"tl.where({a} == -1.0, -float('inf'), tl.log(1.0 + {a}) - ((1.0 + {a}) - 1.0 - {a}) / (1.0 + {a}))",
        # expm1(a): (u - 1) * a / log(u) with u = exp(a) near 0 (Kahan; a itself where u rounds to 1),
        # u - 1 elsewhere, where it loses nothing.
        "expm1": f"tl.where(tl.abs({a}) < 0.5, tl.where(tl.exp({a}) == 1.0, {a}, (tl.exp({a}) - 1.0) * {a} / tl.log(tl.exp({a}))), tl.exp({a}) - 1.0)",
        "sqrt": f"tl.sqrt({a})",
        "rsqrt": f"tl.rsqrt({a})",
        "reciprocal": f"(1.0 / {a})",
        "square": f"({a} * {a})",
        "tanh": f"_tanh({a})",
        "sigmoid": f"tl.sigmoid({a})",
        "relu": f"tl.maximum({a}, 0.0, {NAN_ALL})",
        "erf": f"tl.math.erf({a})",
        "silu": f"({a} * tl.sigmoid({a}))",
        "gelu": f"(0.5 * {a} * (1.0 + tl.math.erf({a} * 0.7071067811865476)))",
        # 0.5 * (1 + tanh(u)) == sigmoid(2u): the same function without tanh's cancellation.
        "gelu_tanh": f"({a} * tl.sigmoid(1.5957691216057308 * ({a} + 0.044715 * {a} * {a} * {a})))",
    }
    if o in unary:
        return unary[o]
    raise CodegenError(f"op {o!r} has no Triton expression")  # pragma: no cover - table covers all


def _pow(base: str, exponent: Arg, names: Names) -> str:
    if isinstance(exponent, str):  # a tensor exponent: defined for base > 0 (and 0 ** positive)
        return f"tl.exp2({names.var(exponent)} * tl.log2({base}))"
    if exponent is None:
        raise CodegenError("pow needs an exponent")
    c = float(exponent)
    special = {
        0.0: f"tl.where({base} == {base}, 1.0, 1.0)",  # 1 everywhere, NaN included, like torch
        1.0: base,
        2.0: f"({base} * {base})",
        3.0: f"({base} * {base} * {base})",
        4.0: f"(({base} * {base}) * ({base} * {base}))",
        0.5: f"tl.sqrt({base})",
        -0.5: f"tl.rsqrt({base})",
        -1.0: f"(1.0 / {base})",
        -2.0: f"(1.0 / ({base} * {base}))",
    }
    if c in special:
        return special[c]
    if c.is_integer():  # negative bases are defined: |x| ** c with the sign of an odd power
        mag = f"tl.exp2({literal(c)} * tl.log2(tl.abs({base})))"
        return f"tl.where({base} < 0.0, -{mag}, {mag})" if int(c) % 2 else mag
    # A fractional power: NaN for x < 0 (log2 gives NaN), 0 or inf at x = 0, as torch.
    return f"tl.exp2({literal(c)} * tl.log2({base}))"


def helpers_for(ops: list[Op], dots: list[str] | None = None) -> set[str]:
    """The HELPERS a kernel of these ops (and, for a GEMM-shaped one, these DOT choices) calls."""
    tanh = {"tanh"} if any(op.op == "tanh" for op in ops) else set()
    return tanh | ({"tf32_round"} if set(dots or ()) & ROUNDED_DOTS.keys() else set())


# -- graph queries ----------------------------------------------------------------------------------


def check_graph(graph: OpGraph, pattern: str, reductions: bool = False) -> None:
    """Refuses a graph the template cannot write; reductions only in `row` graphs, or where the
    template says it reduces its tile's rows (`reductions`: the GEMM with a row epilogue)."""
    if graph.pattern != pattern:
        raise CodegenError(f"a {graph.pattern!r} graph given to a {pattern!r} template")
    if graph.dtype not in DTYPES:
        raise CodegenError(
            f"output dtype {graph.dtype!r} is not generated; the Triton templates store "
            + ", ".join(sorted(DTYPES))
        )
    if not graph.outputs:
        raise CodegenError("the graph has no outputs")
    for op in graph.ops:
        if op.op in REDUCE_OPS and pattern != "row" and not reductions:
            raise CodegenError(f"reduction {op.op!r} in a {pattern!r} graph; only `row` graphs reduce")
        if op.op not in REDUCE_OPS and op.op not in ELEMENTWISE_OPS:
            raise CodegenError(f"op {op.op!r} is not supported by the Triton generator")
        if op.op in REDUCE_OPS and len(op.args) != 1:
            raise CodegenError(f"reduction {op.out} = {op.op}{op.args} takes one argument")
        if op.op == "causal" and pattern != "gemm":
            raise CodegenError(
                f"a causal mask in a {pattern!r} graph; only a batched GEMM's epilogue has one"
            )


def needed(graph: OpGraph, targets: list[str]) -> set[str]:
    """Every value (tensor or op) that `targets` depend on, themselves included."""
    producer = {op.out: op for op in graph.ops}
    seen: set[str] = set()
    stack = list(targets)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in producer:
            stack.extend(a for a in producer[name].args if isinstance(a, str))
    return seen


def used_tensors(graph: OpGraph, values: set[str]) -> list[TensorArg]:
    return [t for t in graph.tensors if t.name in values]


def prepare(graph: OpGraph, pattern: str) -> tuple[Names, list[TensorArg], list[Op]]:
    """A checked graph's names, and the tensors and ops its outputs need (dead values dropped)."""
    check_graph(graph, pattern)
    live = needed(graph, graph.outputs)
    return Names(graph), used_tensors(graph, live), [op for op in graph.ops if op.out in live]


# -- loads and stores -------------------------------------------------------------------------------


def load(t: TensorArg, names: Names, offsets: dict[str, str], masks: dict[str, str]) -> str:
    """`v_x = tl.load(...)` for tensor `t`, given the offset and mask expressions per layout."""
    p = names.ptr(t.name)
    if t.layout == "scalar":
        return f"{names.var(t.name)} = tl.load({p}).to(tl.float32)"
    return (
        f"{names.var(t.name)} = tl.load({p} + {offsets[t.layout]}, mask={masks[t.layout]}, "
        "other=0.0).to(tl.float32)"
    )


def store(out_index: int, value: str, layout: str, offset: str, mask: str, full_shape: str) -> str:
    """Store `value` (a kernel variable) into output `out_index`; a value narrower than the output's
    tile is broadcast first."""
    v = value if layout == "full" else f"({value} + tl.zeros({full_shape}, tl.float32))"
    p = f"out{out_index}_ptr"
    return f"tl.store({p} + {offset}, {v}.to({p}.dtype.element_ty), mask={mask})"


# -- the wrapper ------------------------------------------------------------------------------------


def source_expr(t: TensorArg, args: list[str]) -> str:
    """Where the forward gets tensor `t`: a positional argument, the module's parameter/buffer, or an
    arange the reference makes (index masks: triu, tril), as fp32 values."""
    kind, _, rest = t.source.partition(":")
    if kind == "slice":  # slice:<dim>:<start>:<end>:<source> (`aten_mask`: a buffer's mask)
        dim, start, end, what = rest.split(":", 3)
        index = ", ".join([":"] * int(dim) + [f"{int(start)}:{int(end)}"])
        return f"{source_expr(replace(t, source=what), args)}[{index}]"
    if kind == "expand":  # expand:<d0>,<d1>,..:<source>, materialized full by .contiguous()
        dims, _, what = rest.partition(":")
        sizes = ", ".join(str(int(d)) for d in dims.split(","))
        return f"{source_expr(replace(t, source=what), args)}.expand({sizes})"
    if kind == "input":
        i = int(rest)
        if i >= len(args):
            raise CodegenError(f"tensor {t.name} reads forward argument {i}; forward has {len(args)}")
        return args[i]
    if kind == "arange":  # arange:<start>:<step>:<count>, made on the first argument's device
        start, step, count = rest.split(":")
        if not args:
            raise CodegenError(f"tensor {t.name} is an arange, and no forward argument gives its device")
        end = f"{start} + {step} * {count}"
        return f"torch.arange({start}, {end}, {step}, device={args[0]}.device, dtype=torch.float32)"
    if kind in ("strided", "reshape"):  # a permuted view the wrapper takes (`aten_mask`)
        return aten_mask.view_expr(t.source, lambda s: source_expr(replace(t, source=s), args))
    if kind == "dim":  # dim:<i>:<d>:<power>, a constant made from a size (`shape_consts`)
        return shape_consts.dim_expr(t.source, args)
    if kind == "param":
        parts = rest.split(".")
        if all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
            return "self." + rest
        owner = ".".join(parts[:-1])
        return f'getattr(self.get_submodule("{owner}"), "{parts[-1]}")'
    raise CodegenError(f"tensor {t.name}: source {t.source!r} is neither input:<i> nor param:<name>")


def forward_args(graph: OpGraph) -> list[str]:
    if graph.forward_args:
        return list(graph.forward_args)
    n = 1 + max(
        (int(t.source.split(":")[1]) for t in graph.tensors if t.source.startswith("input:")), default=-1
    )
    return [f"in{i}" for i in range(n)]


def prologue(graph: OpGraph, tensors: list[TensorArg], names: Names, args: list[str]) -> list[str]:
    """Fetch and make contiguous every tensor the kernel reads; `_shape`, `_device`; the outputs."""
    lines = [f"{names.local(t.name)} = {source_expr(t, args)}.contiguous()" for t in tensors]
    if not tensors:
        raise CodegenError("the kernel reads no tensor, so nothing fixes the output's shape or device")
    full = [t for t in tensors if t.layout == "full"]
    if full:
        lines.append(f"_shape = {names.local(full[0].name)}.shape")
    else:
        shaped = [t for t in tensors if t.layout in ("row", "col")]
        if not shaped:
            raise CodegenError("only scalar tensors are read: nothing fixes the output's shape")
        lines.append(
            "_shape = torch.broadcast_shapes("
            + ", ".join(f"{names.local(t.name)}.shape" for t in shaped)
            + ")"
        )
    if graph.pattern == "elementwise" and graph.out_view:  # computed over the output's non-unit dims
        n = len(graph.out_view)
        kept = ", ".join(f"_shape[{i - n}]" for i, d in enumerate(graph.out_view) if d >= 0)
        lines.append(f"_shape = torch.Size([{kept}])")
    lines.append(f"_device = {names.local(tensors[0].name)}.device")
    lines += allocate(graph, "_shape")
    return lines


def allocate(graph: OpGraph, shape: str) -> list[str]:
    return [
        f"_out{i} = torch.empty({shape}, device=_device, dtype=torch.{graph.dtype})"
        for i in range(len(graph.outputs))
    ]


def outputs_tuple(graph: OpGraph) -> str:
    outs = [f"_out{i}" for i in range(len(graph.outputs))]
    if graph.out_view:  # the main op's result viewed as the output (unit dims added or dropped)
        outs = [
            f"{o}.view({', '.join('1' if d < 0 else f'{o}.shape[{d}]' for d in graph.out_view)})"
            for o in outs
        ]
    return outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"


def kernel_params(tensors: list[TensorArg], graph: OpGraph, names: Names) -> list[str]:
    return [names.ptr(t.name) for t in tensors] + [f"out{i}_ptr" for i in range(len(graph.outputs))]


def launch_args(tensors: list[TensorArg], graph: OpGraph, names: Names) -> list[str]:
    return [names.local(t.name) for t in tensors] + [f"_out{i}" for i in range(len(graph.outputs))]


def dot_lines(
    dots: list[str], indent: str = "    ", a: str = "a", b: str = "b", acc: str = "acc", knob: str = "DOT"
) -> list[str]:
    """`acc += a @ b` in the precision of the tunable `knob` (a GEMM-shaped template's K-loop body);
    the branches of ROUNDED_DOTS only where `dots` (the tunable's choices) has them."""
    lines = [f'if {knob} == "bf16":', f"    {acc} = tl.dot({a}.to(tl.bfloat16), {b}.to(tl.bfloat16), {acc})",
             f'elif {knob} == "native":', f"    {acc} = tl.dot({a}, {b}, {acc})"]  # fmt: skip
    for dot, rounded in ROUNDED_DOTS.items():
        if dot in dots:
            x, y = (f"_tf32_round({v})" if operand in rounded else v for operand, v in (("a", a), ("b", b)))
            lines += [
                f'elif {knob} == "{dot}":',
                f'    {acc} = tl.dot({x}, {y}, {acc}, input_precision="tf32")',
            ]
    lines += ["else:", f"    {acc} = tl.dot({a}, {b}, {acc}, input_precision={knob})"]
    return [indent + line for line in lines]


def jit_function(name: str, params: list[str], body: list[str]) -> str:
    """A @triton.jit function from its parameters and body lines (unindented)."""
    head = f"@triton.jit\ndef {name}(\n" + "".join(f"    {p},\n" for p in params) + "):\n"
    return head + "".join(f"    {line}\n" for line in body)


def pow2_at_least(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


def pick(choices: list[int], target: int) -> int:
    """The largest choice not above `target`, or the smallest choice."""
    fits = [c for c in choices if c <= target]
    return max(fits) if fits else min(choices)


__all__ = [
    "HELPERS", "HELPER_IMPORTS", "CodegenError", "Names", "Parts", "check_graph", "load", "needed", "op_expr",
    "prologue", "store",
]  # fmt: skip
