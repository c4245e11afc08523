"""The CPU back end of the offline tuner: an `OpGraph` in, a complete C candidate file out.

`generate(graph, config)` writes one fused kernel in C (OpenMP across rows, `omp simd` along them)
and the Python module around it: `TUNABLES`/`CONFIG` (see `kernelevolve/tunables.py`), `ModelNew` with the
reference's constructor, and a forward that only makes its inputs contiguous, allocates the output
and calls the kernel. Every tunable is a preprocessor macro handed to the compiler (`-DKE_THREADS=2`),
so the C text is fixed, each configuration compiles to its own library, and the tuner changes a
candidate by rewriting `CONFIG` alone.

Patterns:
- `elementwise`: one pass over memory for the whole chain (eager makes one pass, and allocates one
  tensor, per op). With only full and scalar tensors the data is cut into blocks of `chunk` elements;
  with per-column or per-row tensors, threads take `chunk` rows at a time.
- `row`: per row, one loop per level of reductions (softmax: max, then sum, then the output), the
  row's reductions vectorized with `omp simd reduction`; values needed again by a later loop are
  either recomputed or kept in a per-thread scratch row (`keep`).

Knobs: `threads` (1..os.cpu_count() at generation time), `grain` (at least this many elements per
thread: a small call runs on one thread, as waking a team costs more than it saves), `schedule` and
`chunk` (OpenMP work split),
`vec` (`simd`: explicit `omp simd`, which also reorders float reductions; `auto`: whatever `-O3`
vectorizes alone, reductions in order), `unroll` (1, 2 or 4 independent column streams per loop: more
accumulators in flight), `math` (`poly`: inline exp/tanh/erf polynomials accurate to a few ulp that
vectorize; `libm`: expf/tanhf/erff, scalar calls), and `keep` for row kernels.

Precision: fp32 throughout, never `-ffast-math`. Only `-fno-math-errno` and `-fno-trapping-math`,
which change no value (errno and FP exception flags are not observed), and without which GCC will not
if-convert, hence not vectorize, loops with selects. The `poly` functions were measured against
float64 over [-87, 88]: exp <= 1.0 ulp, sigmoid <= 2.3, tanh <= 1.3, erf <= 1.0, well inside
strict_fp32's tolerance. Inputs of other dtypes are not generated here.

Deliberately not here: `gemm`. A naive C matmul does not beat eager's MKL/oneDNN GEMM on the CPU, so
`generate` raises NotImplementedError for it (as for float16/bfloat16 graphs); the tuner then seeds
from user candidates only.

Why one module (over 450 lines): it is one template family, and its three sections (planning the
loops, the C kernel, the candidate file around it), in that order, share the private `_Plan`; none
is used without the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kernelevolve.synth.tuner import shape_consts
from kernelevolve.synth.tuner.ir import REDUCE_OPS, Arg, Generated, Op, OpGraph

_TRANSCENDENTAL = {"exp", "tanh", "sigmoid", "silu", "erf", "gelu", "gelu_tanh"}
_REDUCE_INIT = {"sum": "0.0f", "mean": "0.0f", "amax": "-INFINITY", "amin": "INFINITY"}
_REDUCE_CLAUSE = {"sum": "+", "mean": "+", "amax": "max", "amin": "min"}
MAX_UNROLL = 4
# Module-level names of the generated file, which a forward's local variable must not shadow.
_MODULE_NAMES = {"torch", "nn", "compile_c", "TUNABLES", "CONFIG", "C_SOURCE", "_lib", "ModelNew", "self"}


def generate(graph: OpGraph, config: dict | None = None, precision: str = "strict_fp32") -> Generated:
    """A complete candidate for `graph` at `config` (defaults where missing). Raises
    NotImplementedError for what the CPU templates do not cover (gemm, non-fp32 data)."""
    if graph.pattern == "gemm":
        raise NotImplementedError("the CPU templates do not generate GEMM: eager's MKL matmul is faster")
    if graph.pattern == "conv":
        raise NotImplementedError("the CPU templates do not generate convolutions (yet: issue J)")
    if graph.pattern == "pool":
        raise NotImplementedError("the CPU templates do not generate poolings (yet: issue J)")
    if graph.pattern == "pipeline":
        raise NotImplementedError(
            "the CPU templates do not generate pipelines of stages (a main op, then more work: issue J)"
        )
    if graph.reduce is not None:
        raise NotImplementedError(
            "the CPU templates reduce over the last dim only, not over other dims (yet: issue J)"
        )
    if any(t.source.startswith("arange:") for t in graph.tensors):
        raise NotImplementedError(
            "the CPU templates do not generate index masks (an arange in the reference)"
        )
    if any(t.source.startswith(("slice:", "expand:", "strided:", "reshape:")) for t in graph.tensors):
        raise NotImplementedError(
            "the CPU templates do not read a slice of a tensor or a broadcast mask (`aten_mask`)"
        )
    if graph.pattern == "elementwise" and graph.out_view:
        raise NotImplementedError(
            "the CPU templates do not generate an output viewed with unit dims (`out_view`)"
        )
    if graph.pattern in ("scalar", "scan", "arg"):
        raise NotImplementedError(
            f"the CPU templates do not generate {graph.pattern} graphs (losses, scans, argmax and argmin)"
        )
    if graph.dtype != "float32" or any(t.dtype != "float32" for t in graph.tensors):
        raise NotImplementedError("the CPU templates compute fp32 tensors only")
    if precision not in ("strict_fp32", "tf32", "low"):
        raise ValueError(f"unknown precision policy {precision!r}")
    plan = _Plan(graph)
    tunables = _tunables(plan)
    cfg = {k: v[0] if k not in _DEFAULTS else _DEFAULTS[k](v) for k, v in tunables.items()}
    for key, value in (config or {}).items():
        if key not in tunables:
            raise ValueError(f"{key!r} is not a tunable of this template; tunables: {', '.join(tunables)}")
        if value not in tunables[key]:
            raise ValueError(f"{key}={value!r} is not one of {tunables[key]}")
        cfg[key] = value
    template = "c-" + ("flat" if plan.flat else graph.pattern)
    source = _module(plan, tunables, cfg, template)
    return Generated(source=source, template=template, tunables=tunables, config=cfg)


# --- planning -------------------------------------------------------------------------------------


@dataclass
class _Loop:
    """One pass over a row: the reductions it accumulates, or the outputs it stores (the last)."""

    reductions: list[Op]
    outputs: list[tuple[int, str]]  # (output index, value)
    body: list[Op] = field(default_factory=list)  # full and col ops computed per element, in order
    store: list[str] = field(default_factory=list)  # values this loop keeps for later loops


class _Plan:
    def __init__(self, graph: OpGraph):
        self.graph = graph
        self.ops = {op.out: op for op in graph.ops}
        self.tensors = {t.name: t for t in graph.tensors}
        self.layout = {name: graph.layout_of(name) for name in [*self.tensors, *self.ops]}
        self.level: dict[str, int] = {}
        for op in graph.ops:
            deps = [self.level.get(a, 0) for a in op.args if isinstance(a, str)]
            self.level[op.out] = max(deps, default=0) + (1 if op.op in REDUCE_OPS else 0)
        reductions = [op for op in graph.ops if op.op in REDUCE_OPS]
        self.depth = max((self.level[op.out] for op in reductions), default=0)
        # No per-row or per-column data: the tensor is one long row, cut into blocks.
        self.flat = self.depth == 0 and all(self.layout[n] in ("full", "scalar") for n in self.layout)
        self.row_ops = [op for op in graph.ops if op.op not in REDUCE_OPS and self.layout[op.out] == "row"]
        self.scalar_ops = [op for op in graph.ops if self.layout[op.out] == "scalar"]
        self.uses_math = any(
            op.op in _TRANSCENDENTAL and self.layout[op.out] in ("full", "col") for op in graph.ops
        )
        self.loops = {keep: self._loops(reductions, keep) for keep in (False, True)}
        self.can_keep = any(loop.store for loop in self.loops[True])

    def _loops(self, reductions: list[Op], keep: bool) -> list[_Loop]:
        loops = [
            _Loop([op for op in reductions if self.level[op.out] == k], []) for k in range(1, self.depth + 1)
        ]
        loops.append(_Loop([], list(enumerate(self.graph.outputs))))
        computed: dict[str, _Loop] = {}  # full values computed by an earlier loop, and where
        for loop in loops:
            order: list[Op] = []
            seen: set[str] = set()

            def visit(name: Arg, order: list[Op] = order, seen: set[str] = seen) -> None:
                if not isinstance(name, str) or name in seen or name not in self.ops:
                    return
                op = self.ops[name]
                if op.op in REDUCE_OPS or self.layout[name] in ("row", "scalar"):
                    return  # computed once per row (or once) outside the loop
                if keep and name in computed and self.layout[name] == "full":
                    if name not in computed[name].store:
                        computed[name].store.append(name)
                    return
                seen.add(name)
                for a in op.args:
                    visit(a)
                order.append(op)

            for target in [*(op.args[0] for op in loop.reductions), *(v for _, v in loop.outputs)]:
                visit(target)
            loop.body = order
            for op in order:
                computed.setdefault(op.out, loop)
        return loops


_DEFAULTS = {
    "threads": lambda choices: choices[-1],
    "chunk": lambda choices: choices[len(choices) // 2],
    "grain": lambda choices: 32768 if 32768 in choices else choices[0],
}


def _tunables(plan: _Plan) -> dict[str, list[int | str]]:
    cpus = os.cpu_count() or 1
    threads = sorted({1, *(2**i for i in range(1, 8) if 2**i < cpus), cpus})
    t: dict[str, list[int | str]] = {"threads": list(threads)}
    if plan.flat:
        t["chunk"] = [4096, 16384, 65536, 262144]  # elements per block
    else:
        t["chunk"] = [1, 4, 16, 64]  # rows per OpenMP chunk
    t["grain"] = [4096, 32768, 262144]  # elements per thread, at least: small calls stay serial
    t["schedule"] = ["static", "dynamic"]
    t["vec"] = ["simd", "auto"]
    t["unroll"] = [1, 2, 4]
    if plan.uses_math:
        t["math"] = ["poly", "libm"]
    if plan.can_keep:
        t["keep"] = ["scratch", "recompute"]
    return t


# --- C --------------------------------------------------------------------------------------------


def _const(value: Arg) -> str:
    if value is None:
        raise ValueError("a missing constant")
    v = float(value)
    if v != v:
        return "NAN"
    if v in (float("inf"), float("-inf")):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"{v!r}f" if "e" in repr(v) or "." in repr(v) else f"{v!r}.0f"


def _expr(op: Op, ref: dict[str, str]) -> str:
    def arg(a: Arg) -> str:
        return ref[a] if isinstance(a, str) else _const(a)

    a = [arg(x) for x in op.args if x is not None] if op.op != "clamp" else [arg(op.args[0])]
    name = op.op
    binary = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
    if name in binary:
        return f"({a[0]} {binary[name]} {a[1]})"
    if name == "clamp":
        x, lo, hi = a[0], op.args[1], op.args[2]
        out = x
        if lo is not None:
            out = f"ke_max({out}, {_const(lo)})"
        if hi is not None:
            out = f"ke_min({out}, {_const(hi)})"
        return out
    table = {
        "maximum": "ke_max({0}, {1})", "minimum": "ke_min({0}, {1})", "pow": "powf({0}, {1})",
        "neg": "(-{0})", "abs": "fabsf({0})", "exp": "KE_EXP({0})", "log": "logf({0})",
        "log1p": "log1pf({0})", "expm1": "expm1f({0})",
        "sqrt": "sqrtf({0})", "rsqrt": "(1.0f / sqrtf({0}))", "reciprocal": "(1.0f / {0})",
        "square": "({0} * {0})", "tanh": "KE_TANH({0})", "sigmoid": "KE_SIGMOID({0})",
        "relu": "({0} > 0.0f ? {0} : 0.0f)", "erf": "KE_ERF({0})",
        "silu": "({0} * KE_SIGMOID({0}))", "gelu": "(0.5f * {0} * (1.0f + KE_ERF({0} * 0.70710678118654752f)))",
        "gelu_tanh": "(0.5f * {0} * (1.0f + KE_TANH(0.79788456080286536f * ({0} + 0.044715f * {0} * {0} * {0}))))",
        "where_gt0": "({0} > 0.0f ? {1} : {2})",
    }  # fmt: skip
    if name not in table:
        raise NotImplementedError(f"op {name!r} has no C template")
    return table[name].format(*a)


_PRELUDE = r"""#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Configuration (from CONFIG, as -D flags): KE_THREADS, KE_SCHEDULE, KE_CHUNK, KE_SIMD, KE_UNROLL,
   KE_POLY, KE_KEEP. */
static inline float ke_max(float a, float b) { return a > b ? a : b; }
static inline float ke_min(float a, float b) { return a < b ? a : b; }

#if KE_POLY
/* exp(x) = 2^n e^r with n = round(x / ln 2), |r| <= ln(2)/2, e^r by Cephes' polynomial in fmaf
   (one instruction with FMA, and one rounding); 2^n is built in two halves so that n in [-150, 128]
   never overflows the exponent field. Branch free, so `omp simd` vectorizes it. */
static inline float ke_exp(float x) {
    float xa = x < -104.0f ? -104.0f : x;
    float xc = xa > 88.7228394f ? 88.7228394f : xa;
    float n = fmaf(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;
    union { int32_t i; float f; } s1 = {(n1 + 127) << 23}, s2 = {(n2 + 127) << 23};
    float y = p * s1.f * s2.f;
    return x > 88.7228394f ? INFINITY : y;
}
/* tanh: Cephes' odd polynomial for |x| < 0.625, 1 - 2 / (e^2|x| + 1) beyond. */
static inline float ke_tanh(float x) {
    float ax = fabsf(x), z = x * x;
    float small = x + x * z * ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                                + 1.33314422036e-1f) * z - 3.33332819422e-1f);
    float big = 1.0f - 2.0f / (ke_exp(2.0f * ax) + 1.0f);
    big = x < 0.0f ? -big : big;
    return ax < 0.625f ? small : big;
}
/* erf: N. Juffa's single-precision erff (< 1 ulp): an odd polynomial below 0.9277, 1 - e^q(|x|)
   beyond; both computed, one selected, so that it vectorizes. fmaf is one instruction with FMA. */
static inline float ke_erf(float x) {
    float t = fabsf(x), s = x * x;
    float r = fmaf(-1.72853470e-5f, t, 3.83197126e-4f), u = fmaf(-3.88396438e-3f, t, 2.42546219e-2f);
    r = fmaf(r, s, u);
    r = fmaf(r, t, -1.06777877e-1f);
    r = fmaf(r, t, -6.34846687e-1f);
    r = fmaf(r, t, -1.28717512e-1f);
    r = fmaf(r, t, -t);
    float big = 1.0f - ke_exp(r);
    big = x < 0.0f ? -big : big;
    float p = -5.96761703e-4f;
    p = fmaf(p, s, 4.99119423e-3f);
    p = fmaf(p, s, -2.67681349e-2f);
    p = fmaf(p, s, 1.12819925e-1f);
    p = fmaf(p, s, -3.76125336e-1f);
    p = fmaf(p, s, 1.28379166e-1f);
    float small = fmaf(p, x, x);
    return t > 0.927734375f ? big : small;
}
#define KE_EXP ke_exp
#define KE_TANH ke_tanh
#define KE_ERF ke_erf
#else
#define KE_EXP expf
#define KE_TANH tanhf
#define KE_ERF erff
#endif
#define KE_SIGMOID(x) (1.0f / (1.0f + KE_EXP(-(x))))
"""


def _c_source(plan: _Plan) -> str:
    kernels = {keep: _kernel(plan, keep) for keep in ((False, True) if plan.can_keep else (False,))}
    body = f"#if KE_KEEP\n{kernels[True]}#else\n{kernels[False]}#endif\n" if plan.can_keep else kernels[False]
    return _PRELUDE + "\n" + body


def _kernel(plan: _Plan, keep: bool) -> str:
    g = plan.graph
    params = [f"const float *restrict t_{t.name}" for t in g.tensors]
    params += [f"float *restrict out{i}" for i in range(len(g.outputs))]
    params += ["int64_t n"] if plan.flat else ["int64_t rows", "int64_t cols"]
    lines = [f"void ke_kernel({', '.join(params)}) {{"]
    ref: dict[str, str] = {}
    for t in g.tensors:
        ref[t.name] = {"full": f"t_{t.name}_r[c]", "col": f"t_{t.name}[c]", "row": f"t_{t.name}_v"}.get(
            t.layout, f"t_{t.name}_s"
        )
        if t.layout == "scalar":
            lines.append(f"    const float t_{t.name}_s = t_{t.name}[0];")
    for op in plan.scalar_ops:
        lines.append(f"    const float {op.out} = {_expr(op, ref)};")
        ref[op.out] = op.out
    loops = plan.loops[keep]
    kept = [name for loop in loops for name in loop.store]
    # The loop bodies, one macro per loop: (c, s) = column index, stream number.
    for i, loop in enumerate(loops):
        ref_loop = dict(ref)
        for op in plan.row_ops:
            ref_loop[op.out] = op.out
        for op in g.ops:
            if op.op in REDUCE_OPS:
                ref_loop[op.out] = op.out
        for earlier in loops[:i]:
            for name in earlier.store:
                ref_loop[name] = f"k_{name}[c]"
        body = []
        for op in loop.body:
            body.append(f"const float {op.out} = {_expr(op, ref_loop)};")
            ref_loop[op.out] = op.out
        for op in loop.reductions:
            v = ref_loop[op.args[0]] if isinstance(op.args[0], str) else _const(op.args[0])
            acc = f"a_{op.out}_##s"
            if op.op in ("sum", "mean"):
                body.append(f"{acc} += {v};")
            else:
                cmp = ">" if op.op == "amax" else "<"
                body.append(f"{acc} = {v} {cmp} {acc} ? {v} : {acc};")
        body += [f"k_{name}[c] = {name};" for name in loop.store]
        body += [f"out{j}_r[c] = {ref_loop[v]};" for j, v in loop.outputs]
        lines.append(f"#define KE_LOOP{i}(c, s) {{ \\")
        lines += [f"        {line} \\" for line in body]
        lines.append("    }")
    # Where the rows (or blocks) go.
    work = "n" if plan.flat else "rows * cols"
    lines.append(
        f"    const int64_t ke_threads = {work} / KE_GRAIN < KE_THREADS ? {work} / KE_GRAIN : KE_THREADS;"
    )
    lines.append("    #pragma omp parallel num_threads(ke_threads > 1 ? ke_threads : 1)")
    lines.append("    {")
    if kept:
        lines.append(
            f"        float *ke_scratch = (float *)malloc(sizeof(float) * (size_t)cols * {len(kept)});"
        )
        for j, name in enumerate(kept):
            lines.append(f"        float *const k_{name} = ke_scratch + (size_t)cols * {j};")
    if plan.flat:
        lines += [
            "        const int64_t nblocks = (n + KE_CHUNK - 1) / KE_CHUNK;",
            "        #pragma omp for schedule(KE_SCHEDULE)",
            "        for (int64_t b = 0; b < nblocks; ++b) {",
            "            const int64_t start = b * KE_CHUNK;",
            "            const int64_t len = n - start < KE_CHUNK ? n - start : KE_CHUNK;",
        ]
        offset = "start"
        length = "len"
    else:
        lines += [
            "        #pragma omp for schedule(KE_SCHEDULE, KE_CHUNK)",
            "        for (int64_t r = 0; r < rows; ++r) {",
        ]
        offset = "r * cols"
        length = "cols"
    inner = "            "
    for t in g.tensors:
        if t.layout == "full":
            lines.append(f"{inner}const float *restrict t_{t.name}_r = t_{t.name} + {offset};")
        elif t.layout == "row":
            lines.append(f"{inner}const float t_{t.name}_v = t_{t.name}[r];")
    for j in range(len(g.outputs)):
        lines.append(f"{inner}float *restrict out{j}_r = out{j} + {offset};")
    emitted: set[str] = set()

    def emit_row_ops(level: int) -> None:
        for op in plan.row_ops:
            if op.out not in emitted and plan.level[op.out] <= level:
                lines.append(
                    f"{inner}const float {op.out} = {_expr(op, {**ref, **{o: o for o in plan.level}})};"
                )
                emitted.add(op.out)

    emit_row_ops(0)
    for i, loop in enumerate(loops):
        lines += _loop(i, loop, length, inner)
        emit_row_ops(i + 1)
    lines.append("        }")
    if kept:
        lines.append("        free(ke_scratch);")
    lines.append("    }")
    lines.append("}")
    for i in range(len(loops)):
        lines.append(f"#undef KE_LOOP{i}")
    return "\n".join(lines) + "\n"


def _loop(i: int, loop: _Loop, length: str, inner: str) -> list[str]:
    """One pass: `unroll` independent streams over equal segments of the row, then the tail."""
    out = [f"{inner}{{", f"{inner}    const int64_t seg = {length} / KE_UNROLL;"]
    for op in loop.reductions:
        init = _REDUCE_INIT[op.op]
        out.append(f"{inner}    float {', '.join(f'a_{op.out}_{s} = {init}' for s in range(MAX_UNROLL))};")
    clauses = " ".join(
        f"reduction({_REDUCE_CLAUSE[op.op]}:{', '.join(f'a_{op.out}_{s}' for s in range(MAX_UNROLL))})"
        for op in loop.reductions
    )
    out += [
        "#if KE_SIMD",
        f"{inner}    #pragma omp simd {clauses}".rstrip(),
        "#endif",
        f"{inner}    for (int64_t j = 0; j < seg; ++j) {{",
        f"{inner}        KE_LOOP{i}(j, 0);",
        "#if KE_UNROLL >= 2",
        f"{inner}        KE_LOOP{i}(j + seg, 1);",
        "#endif",
        "#if KE_UNROLL >= 4",
        f"{inner}        KE_LOOP{i}(j + 2 * seg, 2);",
        f"{inner}        KE_LOOP{i}(j + 3 * seg, 3);",
        "#endif",
        f"{inner}    }}",
        f"{inner}    for (int64_t j = KE_UNROLL * seg; j < {length}; ++j) KE_LOOP{i}(j, 0);",
    ]
    for op in loop.reductions:
        parts = [f"a_{op.out}_{s}" for s in range(MAX_UNROLL)]
        if op.op in ("sum", "mean"):
            total = f"({parts[0]} + {parts[1]}) + ({parts[2]} + {parts[3]})"
            if op.op == "mean":
                total = f"({total}) / (float){length}"
        else:
            f = "ke_max" if op.op == "amax" else "ke_min"
            total = f"{f}({f}({parts[0]}, {parts[1]}), {f}({parts[2]}, {parts[3]}))"
        out.append(f"{inner}    {op.out}_acc = {total};")
    out.append(f"{inner}}}")
    # The reduction's value must outlive the block: declare before, assign inside.
    decls = [f"{inner}float {op.out}_acc;" for op in loop.reductions]
    finals = [f"{inner}const float {op.out} = {op.out}_acc;" for op in loop.reductions]
    return decls + out + finals


# --- the candidate file ---------------------------------------------------------------------------


def _module(
    plan: _Plan, tunables: dict[str, list[int | str]], cfg: dict[str, int | str], template: str
) -> str:
    g = plan.graph
    c_source = _c_source(plan)
    flags = [
        "f\"-DKE_THREADS={CONFIG['threads']}\"",
        "f\"-DKE_SCHEDULE={CONFIG['schedule']}\"",
        "f\"-DKE_CHUNK={CONFIG['chunk']}\"",
        "f\"-DKE_GRAIN={CONFIG['grain']}\"",
        "f\"-DKE_SIMD={int(CONFIG['vec'] == 'simd')}\"",
        "f\"-DKE_UNROLL={CONFIG['unroll']}\"",
        ("f\"-DKE_POLY={int(CONFIG['math'] == 'poly')}\"" if "math" in tunables else '"-DKE_POLY=0"'),
        ("f\"-DKE_KEEP={int(CONFIG['keep'] == 'scratch')}\"" if "keep" in tunables else '"-DKE_KEEP=0"'),
        '"-fno-math-errno"',
        '"-fno-trapping-math"',
        '"-lm"',
    ]
    tun = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in tunables.items()) + "}"
    conf = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in cfg.items()) + "}"
    init = "\n".join("    " + line if line else "" for line in g.init_source.rstrip().splitlines())
    args = ", ".join(g.forward_args)
    fwd: list[str] = []
    names: list[str] = []
    for t in g.tensors:
        kind, _, what = t.source.partition(":")
        if kind == "input":
            expr = g.forward_args[int(what)]
        elif kind == "dim":  # a constant made from a size (`shape_consts`)
            expr = shape_consts.dim_expr(t.source, g.forward_args)
        else:
            expr = "self" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in what.split("."))
        local = f"ke_{t.name}" if t.name in _MODULE_NAMES else t.name
        fwd.append(f"        {local} = {expr}.contiguous()")
        names.append(local)
    first = names[0]
    full = [n for n, t in zip(names, g.tensors, strict=True) if t.layout == "full"]
    outs = [f"ke_out{i}" for i in range(len(g.outputs))]
    if full:  # the output's shape, cheaper than broadcast_shapes (~20 us)
        fwd += [f"        {o} = torch.empty_like({full[0]})" for o in outs]
    else:
        shaped = [n for n, t in zip(names, g.tensors, strict=True) if t.layout != "scalar"]
        fwd.append(f"        ke_shape = torch.broadcast_shapes({', '.join(f'{n}.shape' for n in shaped)})")
        fwd += [
            f"        {o} = torch.empty(ke_shape, dtype={first}.dtype, device={first}.device)" for o in outs
        ]
    sizes = "ke_out0.numel()" if plan.flat else "ke_out0.numel() // ke_out0.shape[-1], ke_out0.shape[-1]"
    fwd.append(f"        _lib.ke_kernel({', '.join([*names, *outs])}, {sizes})")
    fwd.append(f"        return {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ')'}")
    flag_lines = "\n".join(f"        {f}," for f in flags)
    return f'''"""Generated by the kernelevolve tuner ({template}): {g.description or g.pattern}.

One fused C kernel with OpenMP; CONFIG picks the variant (each configuration compiles separately).
"""

import torch
import torch.nn as nn

from kernelevolve.native import compile_c

TUNABLES = {tun}
CONFIG = {conf}

C_SOURCE = r"""
{c_source}"""

_lib = compile_c(
    C_SOURCE,
    flags=[
{flag_lines}
    ],
)


class ModelNew(nn.Module):
{init}

    def forward(self, {args}):
{chr(10).join(fwd)}
'''


__all__ = ["generate"]
