"""Prompt synthesis for the universal operator: one operator, one prompt builder, no per-task templates.

`synthesize(task, max_tokens, tool_mode)` assembles the system and user messages from what the task
holds: the spec (reference source, shapes, precision policy, tolerances), the platform and what it
runs, the rules the harness enforces, the parents' kernels with their verdicts (a failed parent's
error text is the prompt's center: debugging is the same operator as optimizing), the history that
the memory mode selects, retrieved knowledge, and the output contract.

Budget. Prompts are measured with a rough estimate (characters / 4). When the whole does not fit in
`max_tokens`, parts give way in a fixed order: knowledge is shortened, then dropped (lowest score
first); then history, most distant first; then long sources are elided in the middle (longest
first); then the parent's error text is shortened; a final cut guarantees the bound. The system
message (rules and contract) never gives way.

History by memory mode: `inherit` shows the parent's ancestors, oldest first, with what each step
changed and gained; `compare` shows the parent's siblings, fastest first, with what separated the fast
from the slow; `combine` shows both; `fresh` and `draft` show none, whatever the task carries.

Deliberately not here: calling a model, choosing knowledge (the engine retrieves it), tool schemas
(`synth/operator.py`), how one node, verdict or diagnosis reads (`synth/render.py`).

Why one module (over 450 lines): the whole prompt, its parts in the order the model reads them
and the budget's order of giving way, read as one text; splitting it would scatter that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernelevolve.synth.base import NodeView, Snippet, Task
from kernelevolve.synth.render import bound_of, clip, contrast, diagnosis_text, node_line, verdict_text

CHARS_PER_TOKEN = 4
MESSAGE_CHARS = 6000  # a verdict's message (compile log, traceback) is clipped to this at first
SNIPPET_CHARS = 400  # knowledge snippets are cut to this before any is dropped
MIN_SOURCE_CHARS = 600

# What native source may hold: the signature reader (kernelevolve.native) and the static guards.
_NATIVE_RULES = (
    "The source may use anything the compiler takes: `#include` of system headers (math.h, stdint.h, "
    "omp.h, immintrin.h, cuda_fp16.h, ...), `#define` and `#if` lines, OpenMP pragmas, static or inline "
    "helper functions, device functions and templates. What Python calls must be a top-level, non-static, "
    "non-inline function written out in full (not produced by a macro or a template), returning void or "
    "a number, whose parameters are pointers (tensors) or int/int64_t/float/double/bool scalars. Refused "
    "by the harness: threads or processes, running programs, dlopen, the environment, files and sockets, "
    "streams, graphs and events of your own, vendor libraries (cuBLAS, cuDNN, MKL, OpenBLAS), torch ops."
)

_KIND_GUIDE = {
    "triton": (
        "Triton: `import triton` and `import triton.language as tl`; `@triton.jit` kernels launched from "
        "`forward` as `kernel[grid](...)`; block sizes are `tl.constexpr` powers of 2."
    ),
    "cuda": (
        "CUDA C++: `from kernelevolve.native import compile_cuda`; `lib = compile_cuda(SOURCE)` at module "
        'level; expose `extern "C"` host functions whose last parameter is `cudaStream_t stream` and launch '
        "with `<<<grid, block, 0, stream>>>`; call `lib.fn(x, y, n)` (pointers take contiguous tensors, "
        "scalars take Python numbers, the stream defaults to torch's current stream). " + _NATIVE_RULES
    ),
    "c": (
        "C for the CPU: `from kernelevolve.native import compile_c`; `lib = compile_c(SOURCE)` at module "
        "level (built with -O3 -march=native -fopenmp); call `lib.fn(x, y, n)` with contiguous CPU tensors "
        "of the dtype the C code expects. " + _NATIVE_RULES
    ),
    "hip": "HIP C++ for AMD GPUs, built with `torch.utils.cpp_extension.load_inline`.",
}

_POLICY = {
    "strict_fp32": (
        "strict_fp32: compute and accumulate in fp32 everywhere. No TF32 (write tl.dot(..., "
        "input_precision='ieee')), no bf16/fp16 intermediates; the tolerance refuses TF32-level error."
    ),
    "tf32": "tf32: TF32 tensor-core products are allowed for fp32 matmuls; accumulate and do all other math in fp32.",
    "low": "low: bf16/fp16 arithmetic is allowed; accumulate reductions in fp32.",
}


def estimate_tokens(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


# --- what a tool loop sees ------------------------------------------------------------------------------

CANDIDATE_FILE = "candidate.py"
REFERENCE_FILE = "reference.py"


def node_file(node_id: int) -> str:
    return f"node_{node_id}.py"


def starting_source(task: Task) -> str:
    """The file the operator edits at first: the (fitter) parent's source, or nothing for a draft."""
    parents = [p for p in task.parents if p.source]
    if not parents:
        return ""
    return max(parents, key=lambda p: p.fitness).source or ""


def visible_files(task: Task) -> dict[str, str]:
    """Read-only files of a tool loop: the reference and every node's kernel the task carries."""
    files = {REFERENCE_FILE: task.spec.source}
    for node in [*task.parents, *task.history]:
        if node.source:
            files.setdefault(node_file(node.id), node.source)
    return files


# --- the system message: role, rules, contract ------------------------------------------------------


def rules(task: Task) -> list[str]:
    """The harness's anti-cheating rules, as the model is told them."""
    kinds = _kind_names(task)
    allowed = ", ".join(
        [
            "torch (nn, autograd, cuda, utils.cpp_extension)",
            "triton",
            "math, functools, itertools, operator, typing, dataclasses, enum, collections",
            "kernelevolve.native",
            *task.spec.allow_imports,
        ]
    )
    policy = task.spec.precision
    downgrade = (
        "Under strict_fp32 never downgrade precision: no TF32, bf16 or fp16 anywhere, no allow_tf32."
        if policy == "strict_fp32"
        else f"Stay within the precision policy ({policy}); never go below it."
    )
    return [
        f"Compute every output in your own {kinds} kernels. torch is glue only: allocation (empty, "
        "empty_like, zeros), views and reshapes, .contiguous(), shape/dtype/device queries, launching. No "
        "torch or torch.nn.functional compute, no `@`/matmul, no vendor libraries, and no fallback to the "
        "reference: do not subclass, import or name `Model`.",
        "No try/except: no fallback path, no swallowed errors.",
        "No side streams, events or CUDA graphs: launch on the current stream.",
        "No caching of outputs or results between calls: every call computes from its inputs (they are "
        "fresh random tensors each trial, outputs are poisoned beforehand, inputs must stay unchanged).",
        downgrade,
        "Do not patch or monkey-patch anything: no timers, torch functions, modules or classes; do not "
        "change global flags (torch.backends.*); no dunder access, setattr, exec, eval, frames or inspect.",
        "No threads or processes, files, environment variables or network.",
        f"Import only: {allowed}.",
    ]


_KIND_NAMES = {"triton": "Triton", "cuda": "CUDA C++", "c": "C", "hip": "HIP"}


def _kind_names(task: Task) -> str:
    return " or ".join(_KIND_NAMES.get(k, k) for k in task.kinds) or "native"


def _system(task: Task, tool_mode: bool) -> str:
    kinds = _kind_names(task)
    numbered = "\n".join(f"{i}. {r}" for i, r in enumerate(rules(task), 1))
    if tool_mode:
        how = (
            f"Work on `{CANDIDATE_FILE}` with the tools: read_file, write_file (the whole file), replace "
            "(an exact, unique search/replace), lint (the static guards), quick_run (the harness on the "
            "smallest shape: correctness and a short timing), search_knowledge. lint and quick_run before "
            "you submit; a failing quick_run is a failing candidate. End with submit and a one-line note "
            "of what you changed and why. Your turns are limited."
        )
    else:
        how = (
            "Answer with a short paragraph on what you changed and why, then the complete file in one "
            "```python block. The last ```python block of your answer is taken as the candidate."
        )
    return f"""You write fast, correct {kinds} kernels for {task.platform_target}, as a replacement for a PyTorch \
reference. An isolated harness checks every candidate: fresh random inputs at every declared shape (several \
seeds, two distributions), outputs poisoned before each call, inputs checked unchanged, tolerances by dtype \
and precision policy, NaN never passes. It then times the candidate against eager PyTorch and torch.compile, \
interleaved, with a cold L2. Fitness is the traffic-weighted speedup; any failure scores 0.

Rules (checked statically and at run time; a violation scores 0):
{numbered}

Output contract: one complete Python file defining `class ModelNew(nn.Module)` with the reference `Model`'s \
constructor signature and a `forward` with the same inputs and outputs (shapes, dtypes), correct at every \
declared shape. Parameters and buffers get the same names and shapes as the reference's (the harness copies \
the reference's weights into them). If the kernel has knobs (block sizes, warps, stages), declare them as \
module-level literal dicts `TUNABLES = {{"BLOCK": [512, 1024, 2048]}}` and `CONFIG = {{"BLOCK": 1024}}` and \
read CONFIG, so that a tuner can search them.

{how}"""


# --- the user message -------------------------------------------------------------------------------


@dataclass
class _Fit:
    """What the renderer includes; `synthesize` shrinks it until the prompt fits."""

    knowledge: list[Snippet]
    history: list[NodeView]
    snippet_chars: int | None = None
    source_caps: dict[str, int] = field(default_factory=dict)
    message_chars: int = MESSAGE_CHARS


def synthesize(task: Task, max_tokens: int, tool_mode: bool) -> tuple[str, str]:
    """(system, user) for one expansion of `task`, together within `max_tokens` (estimated)."""
    system = _system(task, tool_mode)
    budget_chars = max(0, max_tokens - estimate_tokens(system)) * CHARS_PER_TOKEN
    fit = _Fit(
        knowledge=sorted(task.knowledge, key=lambda s: -s.score),
        history=_by_distance(task, select_history(task)),
    )

    def render() -> str:
        return _user(task, fit, tool_mode)

    user = render()
    if len(user) > budget_chars and fit.knowledge:  # 1. knowledge: shorten, then drop the weakest
        fit.snippet_chars = SNIPPET_CHARS
        user = render()
        while len(user) > budget_chars and fit.knowledge:
            fit.knowledge.pop()
            user = render()
    while len(user) > budget_chars and fit.history:  # 2. history: the most distant first
        fit.history.pop()
        user = render()
    sources = _sources(task)
    while len(user) > budget_chars:  # 3. long sources: halve the longest that can still give way
        sizes = {k: min(len(v), fit.source_caps.get(k, len(v))) for k, v in sources.items()}
        key = max(sizes, key=lambda k: sizes[k], default=None)
        if key is None or sizes[key] <= MIN_SOURCE_CHARS:
            break
        fit.source_caps[key] = max(MIN_SOURCE_CHARS, sizes[key] // 2)
        user = render()
    while len(user) > budget_chars and fit.message_chars > 800:  # 4. the error text
        fit.message_chars //= 2
        user = render()
    if len(user) > budget_chars:  # 5. whatever is left over, cut
        marker = "\n[... prompt cut to fit the model's context ...]"
        user = user[: max(0, budget_chars - len(marker))] + marker
    return system, user


def select_history(task: Task) -> list[NodeView]:
    """The history the memory mode shows: none for fresh and draft, whatever the task carries."""
    if task.mode in ("fresh", "draft"):
        return []
    return list(task.history)


def _ancestor_ids(task: Task) -> list[int]:
    """Ids of the first parent's ancestors, nearest first, as far as the task's nodes reach."""
    if not task.parents:
        return []
    known = {n.id: n for n in [*task.history, *task.parents]}
    out, cursor = [], task.parents[0].parent
    while cursor is not None and cursor not in out:
        out.append(cursor)
        cursor = known[cursor].parent if cursor in known else None
    return out


def _by_distance(task: Task, history: list[NodeView]) -> list[NodeView]:
    """History sorted nearest first, so that dropping from the end drops the most distant node.
    Distance: steps up the parent's lineage for ancestors; 1 for the parent's siblings; others by
    age (older is farther). Ties: the fitter node stays longer."""
    ancestors = _ancestor_ids(task)
    parent_of_parent = task.parents[0].parent if task.parents else None

    def distance(n: NodeView) -> tuple[float, float]:
        if n.id in ancestors:
            d = float(ancestors.index(n.id) + 1)
        elif task.parents and n.parent == parent_of_parent:
            d = 1.0
        else:
            d = 2.0 + 1.0 / (1 + n.id)
        return d, -n.fitness

    return sorted(history, key=distance)


def _sources(task: Task) -> dict[str, str]:
    out = {"reference": task.spec.source}
    for p in task.parents:
        if p.source:
            out[f"parent:{p.id}"] = p.source
    return out


def _problem(task: Task, fit: _Fit) -> list[str]:
    spec = task.spec
    ref = clip(spec.source, fit.source_caps.get("reference", len(spec.source)))
    out = [f"# Problem: {spec.name}"]
    if spec.description:
        out.append(spec.description)
    out.append(f"## Reference (`Model`, the function to reproduce; {REFERENCE_FILE})\n```python\n{ref}\n```")
    shapes = ["## Shapes (weight = share of production traffic; every one must be correct)"]
    for s in spec.shapes:
        params = ", ".join(f"{k}={v!r}" for k, v in s.params.items())
        line = f"- {s.name} (weight {s.weight:.2f}): get_inputs({params})"
        ins = spec.inputs.get(s.name)
        outs = spec.outputs.get(s.name)
        if ins:
            line += " -> inputs " + ", ".join(str(t) for t in ins)
        if outs:
            line += "; outputs " + ", ".join(str(t) for t in outs)
        shapes.append(line)
    out.append("\n".join(shapes))
    precision = [f"## Precision\n{_POLICY.get(spec.precision, spec.precision)}"]
    if spec.dtype:
        precision.append(f"Floating inputs and parameters are cast to {spec.dtype}.")
    precision.append(_tolerance_line(task))
    if spec.backward:
        precision.append("Backward too: gradients are checked, and forward + backward is timed.")
    out.append("\n".join(precision))
    return out


def _tolerance_line(task: Task) -> str:
    spec = task.spec
    dtypes = {t.dtype for outs in spec.outputs.values() if outs for t in outs} or {spec.dtype or "float32"}
    try:
        from kernelevolve.evaluate.correctness import tolerance_for

        parts = []
        for d in sorted(dtypes):
            tol = tolerance_for(d, spec.precision, spec.tolerance)
            parts.append(
                f"{d}: rtol {tol.rtol:g}, atol {tol.atol:g} (times the reference's rms), "
                f"relative norm {tol.rel_norm:g}"
            )
        return "Tolerance: " + "; ".join(parts) + "."
    except Exception:  # a dtype the table does not know: the harness decides; say what the spec says
        return f"Tolerance: {spec.tolerance or 'by dtype and policy'}."


def _platform(task: Task) -> str:
    timed: set[str] = set(task.kinds)
    try:
        from kernelevolve.platforms import get_platform

        timed = set(get_platform(task.platform).timed_kinds)
    except Exception:
        pass
    lines = [f"## Platform: {task.platform_target}", "Kernel kinds this platform runs:"]
    for kind in task.kinds:
        guide = _KIND_GUIDE.get(kind, kind)
        if kind not in timed:
            guide += f" (on {task.platform} {kind} is checked for correctness only and never timed: prefer a timed kind)"
        lines.append(f"- {guide}")
    hw = task.hardware or {}
    peaks = []
    if hw.get("device"):
        peaks.append(str(hw["device"]))
    if hw.get("bandwidth"):
        peaks.append(f"measured bandwidth {hw['bandwidth'] / 1e12:.2f} TB/s")
    for cls, rate in (hw.get("flops") or {}).items():
        peaks.append(f"{cls} {rate / 1e12:.1f} TFLOP/s")
    if peaks:
        lines.append("Hardware: " + ", ".join(peaks) + ".")
    return "\n".join(lines)


def _parents(task: Task, fit: _Fit, tool_mode: bool) -> list[str]:
    out = []
    for p in task.parents:
        where = f" ({node_file(p.id)})" if tool_mode else ""
        head = f"## Parent #{p.id}{where} [{p.mode}]"
        if p.note:
            head += f"\nWhat it changed: {p.note.strip()}"
        body = verdict_text(p, fit.message_chars)
        src = p.source or ""
        if src:
            src = clip(src, fit.source_caps.get(f"parent:{p.id}", len(src)))
            body += f"\n```python\n{src}\n```"
        out.append(f"{head}\n{body}")
    return out


def _history(task: Task, fit: _Fit) -> list[str]:
    if not fit.history:
        return []
    fitness = {n.id: n.fitness for n in [*task.history, *task.parents]}
    ancestors = set(_ancestor_ids(task))
    lineage = sorted((n for n in fit.history if n.id in ancestors), key=lambda n: n.id)
    others = sorted((n for n in fit.history if n.id not in ancestors), key=lambda n: (-n.fitness, n.id))
    out = []
    if lineage:
        out.append(
            "## Lineage of the parent, oldest first: what each step changed and what it gained\n"
            + "\n".join(node_line(n, fitness) for n in lineage)
        )
    if others:
        title = "## Other attempts from the same starting point (siblings), fastest first"
        if task.mode not in ("compare", "combine"):
            title = "## Related attempts, fastest first"
        out.append(title + "\n" + "\n".join(node_line(n, fitness) for n in others) + contrast(others))
    return out


def _knowledge(task: Task, fit: _Fit) -> list[str]:
    if not fit.knowledge:
        return []
    items = []
    for s in fit.knowledge:
        text = s.text.strip()
        if fit.snippet_chars is not None and len(text) > fit.snippet_chars:
            text = text[: fit.snippet_chars].rsplit(" ", 1)[0] + " ..."
        kind = f"{s.category}: " if s.category else ""
        items.append(f"### {s.title} ({kind}{s.doc})\n{text}")
    why = ", ".join(
        x for x in (task.platform_target, task.pattern, task.phase and f"{task.phase} phase") if x
    )
    return [f"## Retrieved knowledge ({why})\n" + "\n\n".join(items)]


def _reference_numbers(task: Task) -> list[str]:
    ref = task.reference
    if not ref or not ref.get("shapes"):
        return []
    lines = [
        "## The reference's own numbers (measured live; the roofline is the least time the work can take)"
    ]
    for s in ref["shapes"]:
        parts = [f"- {s['shape']}: {s.get('bound') or '?'}-bound"]
        if s.get("roofline_us") is not None:
            parts.append(f"roofline {s['roofline_us']} us")
        for b in ("eager", "compile"):
            if s.get(f"{b}_us") is not None:
                frac = s.get(f"{b}_roofline_fraction")
                parts.append(f"{b} {s[f'{b}_us']} us" + (f" ({100 * frac:.0f}% of roofline)" if frac else ""))
        lines.append(", ".join(parts))
    return ["\n".join(lines)]


def _lessons(task: Task) -> list[str]:
    if not task.lessons:
        return []
    body = "\n".join(f"- {x[:500]}" for x in task.lessons)
    return ["## Tried in this run and failed or slower than its parent (do not repeat these)\n" + body]


def _instructions(task: Task, tool_mode: bool) -> str:
    failed = [p for p in task.parents if p.status is not None and p.status != "ok"]
    if not task.parents:
        what = (
            "There is no parent: write a first candidate from the reference. Correct first, then fast: "
            "a simple kernel that passes beats a clever one that fails."
        )
    elif failed and len(task.parents) == 1:
        p = failed[0]
        what = (
            f"The parent #{p.id} failed ({p.status}). Find the cause in what the harness said and fix it "
            "with the smallest change that makes the kernel correct and legal; keep its optimizations."
        )
    elif len(task.parents) >= 2:
        ids = " and ".join(f"#{p.id}" for p in task.parents)
        what = (
            f"Combine the parents {ids}: keep what makes each fast (compare their per-shape numbers) in one "
            "kernel, correct at every shape."
        )
    else:
        p = task.parents[0]
        bound = bound_of(p)
        what = f"Make the parent #{p.id} faster at the declared shapes, weighted by their traffic."
        if bound:
            what += f" It is {bound}-bound: attack that limit."
        what += " A change within the measured noise is not an improvement; try one idea at a time."
    if task.tried:
        what += f" The tree already holds {len(task.tried)} kernels; an exact repeat is refused."
    if tool_mode:
        start = "it starts as the parent's source" if task.parents else "it starts empty"
        what += f" Edit `{CANDIDATE_FILE}` ({start}), check it, then submit."
    return "## Your task\n" + what


def _user(task: Task, fit: _Fit, tool_mode: bool) -> str:
    sections = [
        *_problem(task, fit),
        _platform(task),
        *_reference_numbers(task),
        *_parents(task, fit, tool_mode),
        *_history(task, fit),
        *_lessons(task),
        *_knowledge(task, fit),
        _instructions(task, tool_mode),
    ]
    return "\n\n".join(sections)


__all__ = [
    "CANDIDATE_FILE",
    "REFERENCE_FILE",
    "clip",
    "diagnosis_text",
    "estimate_tokens",
    "node_file",
    "rules",
    "select_history",
    "starting_source",
    "synthesize",
    "visible_files",
]
