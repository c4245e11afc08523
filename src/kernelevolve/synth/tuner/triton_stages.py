"""Triton code for `pipeline` graphs: each stage's template, composed into one candidate file.

Each stage (an `OpGraph` of another pattern, see `stages.py`) is built by its own template
(`triton_codegen.TEMPLATES`) into `Parts`; the composition renames them apart:
- the stage's kernels `_name` become `_s<k>_name` (where they are defined and launched);
- its tunables `X` become `s<k>_X` in TUNABLES, CONFIG and TILE, and its forward reads
  `CONFIG["s<k>_X"]` (the union is one flat, valid declaration; `tunables.per_thread` checks each
  stage's tile against its own `s<k>_num_warps`);
- its forward becomes a module-level function `_stage<k>(self, <forward args>, _mid0, ..)` that
  returns the stage's output; ModelNew.forward calls them in order, each intermediate (fp32, as the
  stage allocates it) passed to the later stages as the extra argument `_mid<j>` that their graphs read.
Helpers (`_tanh`, `_sm_count`) are shared. The template of a pipeline is named after its stages'
(`triton-conv+triton-pool`); `variants` offers the default of every stage first, then each stage's
other templates one at a time.

Three fusions (`_FUSIONS`), each of `SPAN` stages written as one kernel: a GEMM stage whose rows are
short and the row stage after it (`triton_gemm_row`, the pair named `triton-gemm-row+fused`); a GEMM
stage and the mean cross-entropy of its output, the logits never stored (`triton_gemm_ce`,
`triton-gemm-ce+fused`); attention's scores GEMM, their softmax and the GEMM with V, the scores never
stored (`triton_flash`, `triton-flash+fused+fused`). The span's function `_stage<k>` returns its last
stage's output, and the stages after its first have no function of their own. The variant with
every fusable span fused is the second, after the stage-by-stage one; the first where a span is
attention (`FIRST`: on an H200 its stage-by-stage variants failed the TF32 tolerance or ran
0.12-0.42x of torch.compile where the flash kernel ran 0.94-1.10x,
`benchmarks/results/2026-11-28-h200-attention-flash.md`), so the search drafts it first.

Not here: other fusions (the intermediate makes one round trip through memory), running stages
concurrently.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelevolve.synth.tuner import triton_chain, triton_flash, triton_gemm_ce, triton_gemm_row
from kernelevolve.synth.tuner.ir import Generated, OpGraph
from kernelevolve.synth.tuner.triton_common import CodegenError, Parts, forward_args, jit_function
from kernelevolve.tunables import TunablesError

MAX_VARIANTS = 4
SEPARATOR = "+"
FUSED = "fused"  # a stage's template name where a stage before it writes its output too
# Spans of stages written as one: the fusion's name (the first stage's template) -> its module
# (`NAME`, `SPAN` stages, `fusable(*stages, k)`, `build_fused(*stages, k, precision) -> Parts`).
# Tried in this order at each stage: the longer span first (`_fused`).
_FUSIONS = {m.NAME: m for m in (triton_chain, triton_gemm_row, triton_gemm_ce, triton_flash)}
FIRST = {triton_flash.NAME}  # fusions whose variant is offered before the stage-by-stage one


@dataclass(frozen=True)
class Codegen:
    """What a pipeline needs of `triton_codegen` (which passes it, so neither module imports the
    other): the templates that apply to a graph, the template table, and the file assembly."""

    variants: Callable[[OpGraph], list[str]]
    templates: dict[str, Any]
    assemble: Callable[..., str]


def _stage_variants(graph: OpGraph, codegen: Codegen) -> list[list[str]]:
    if graph.pattern != "pipeline" or not graph.stages:
        raise CodegenError("a pipeline template given a graph without stages")
    options = []
    for k, stage in enumerate(graph.stages):
        names = codegen.variants(stage)
        if not names:
            raise CodegenError(f"stage {k + 1} ({stage.pattern}) has no Triton template")
        options.append(names)
    return options


def variants(graph: OpGraph, codegen: Codegen) -> list[str]:
    """The pipeline's templates: every stage's default, then the defaults with every span of stages
    that fuses written as one (`_fused`; before the defaults where a span is a `FIRST` fusion), then
    each stage's others, one at a time."""
    options = _stage_variants(graph, codegen)
    default = [names[0] for names in options]
    out = [SEPARATOR.join(default)]
    fused = _fused(graph, default)
    if fused != default:
        out.insert(0 if FIRST & set(fused) else 1, SEPARATOR.join(fused))
        pairs = _fused(graph, default, skip={triton_chain.NAME})  # the chain's stages fused in pairs
        if pairs not in (default, fused):
            out.insert(out.index(SEPARATOR.join(fused)) + 1, SEPARATOR.join(pairs))
    for k, names in enumerate(options):
        for other in names[1:]:
            out.append(SEPARATOR.join([*default[:k], other, *default[k + 1 :]]))
    return out[:MAX_VARIANTS]


def _fused(graph: OpGraph, names: list[str], skip: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """`names` with every stage that starts a span that fuses (a `_FUSIONS` module's `fusable`, the
    span's intermediates read by no later stage; none of the fusions named in `skip`) named after
    that fusion, and the span's other stages `FUSED` (written by its first)."""
    out = list(names)
    k = 0
    while k < len(graph.stages) - 1:
        fusions = [f for name, f in _FUSIONS.items() if name not in skip]
        fusion = next((f for f in fusions if _fuses(graph, f, k)), None)
        if fusion is not None:
            out[k : k + fusion.SPAN] = [fusion.NAME] + [FUSED] * (fusion.SPAN - 1)
            k += fusion.SPAN
        else:
            k += 1
    return out


def _fuses(graph: OpGraph, fusion: Any, k: int) -> bool:
    span = graph.stages[k : k + fusion.SPAN]
    if len(span) < fusion.SPAN or not fusion.fusable(*span, k):
        return False
    later = {t.name for stage in graph.stages[k + fusion.SPAN :] for t in stage.tensors}
    return not later & {f"_mid{j}" for j in range(k, k + fusion.SPAN - 1)}


def generate(
    graph: OpGraph, config: dict[str, Any] | None, precision: str, template: str | None, codegen: Codegen
) -> Generated:
    options = variants(graph, codegen)
    name = template or options[0]
    if name not in options:
        raise CodegenError(
            f"template {name!r} does not apply to this pipeline; choose one of {', '.join(options)}"
        )
    parts = compose(graph, name.split(SEPARATOR), precision, codegen)
    chosen = dict(parts.defaults)
    for key, value in (config or {}).items():
        if key not in parts.tunables:
            raise TunablesError(f"{name} has no tunable {key!r}; its tunables: {', '.join(parts.tunables)}")
        if value not in parts.tunables[key]:
            raise TunablesError(f"{key} = {value!r} is not one of {parts.tunables[key]}")
        chosen[key] = value
    source = codegen.assemble(graph, name, parts, chosen)
    return Generated(source, name, parts.tunables, chosen, [] if config else list(parts.drafts))


def compose(graph: OpGraph, templates: list[str], precision: str, codegen: Codegen) -> Parts:
    """One file's Parts from each stage's template `templates[k]`, renamed apart."""
    kernels: list[str] = []
    functions: list[str] = []
    tunables: dict[str, list[int | str]] = {}
    defaults: dict[str, int | str] = {}
    helpers: set[str] = set()
    tile: list[str] = []
    smem: list[tuple[int | str, ...]] = []
    stage_drafts: list[dict[str, int | str]] = []  # each stage's presets, its keys prefixed
    firsts: list[dict[str, int | str]] = []  # each stage's first preset, where it has one
    reference_args = forward_args(graph)
    calls = []
    last = len(graph.stages) - 1
    covered = -1  # the last stage a fused span written so far covers
    for k, (stage, template) in enumerate(zip(graph.stages, templates, strict=True)):
        writes = k  # the stage whose output this function returns
        if template == FUSED:
            if k > covered:
                raise CodegenError(f"stage {k + 1} is {FUSED!r} without a fused stage before it")
            continue
        if template in _FUSIONS:
            fusion = _FUSIONS[template]
            span = graph.stages[k : k + fusion.SPAN]
            if len(span) < fusion.SPAN or templates[k + 1 : k + fusion.SPAN] != [FUSED] * (fusion.SPAN - 1):
                raise CodegenError(
                    f"{template} at stage {k + 1} needs {FUSED!r} at the {fusion.SPAN - 1} stage(s) after it"
                )
            parts = fusion.build_fused(*span, k, precision)
            writes = covered = k + fusion.SPAN - 1
            if writes < last:  # the later stages' functions take every intermediate; none reads these
                calls += [f"_mid{j} = None  # fused: _stage{k} writes stage {writes + 1}'s output"
                          for j in range(k, writes)]  # fmt: skip
        elif template not in codegen.variants(stage):
            raise CodegenError(f"template {template!r} does not apply to stage {k + 1} ({stage.pattern})")
        else:
            parts = codegen.templates[template][1](stage, precision)
        prefix = f"s{k}_"
        renamed = {}
        for source in parts.kernels:
            found = re.search(r"^def (\w+)\(", source, re.M)
            if found is None:
                raise CodegenError(f"a kernel of {template} has no name")
            renamed[found.group(1)] = f"_s{k}{found.group(1)}"

        def rename(text: str, renamed: dict[str, str] = renamed, prefix: str = prefix) -> str:
            for old, new in renamed.items():
                text = re.sub(rf"\b{re.escape(old)}\b", new, text)
            return re.sub(r'CONFIG\["(\w+)"\]', rf'CONFIG["{prefix}\1"]', text)

        kernels += [rename(source) for source in parts.kernels]
        args = forward_args(stage)  # (a fused span's: its first stage's)
        if args[: len(reference_args)] != reference_args:
            raise CodegenError(f"stage {k + 1} reads forward arguments {args}, not the reference's first")
        functions.append(_function(f"_stage{k}", ["self", *args], [rename(line) for line in parts.forward]))
        result = "return " if writes == last else f"_mid{writes} = "
        calls.append(f"{result}_stage{k}({', '.join(['self', *args])})")
        tunables.update({prefix + key: list(choices) for key, choices in parts.tunables.items()})
        defaults.update({prefix + key: value for key, value in parts.defaults.items()})
        helpers |= parts.helpers
        tile += [prefix + key for key in parts.tile]
        smem += [tuple(prefix + x if isinstance(x, str) else x for x in term) for term in parts.smem]
        stage_drafts += [{prefix + key: value for key, value in d.items()} for d in parts.drafts]
        firsts += [{prefix + key: value for key, value in d.items()} for d in parts.drafts[:1]]
    # A pipeline drafts every stage at its first preset together, then each stage's presets (a GEMM's
    # or convolution's) with the other stages at their defaults. At strict fp32 a GEMM's first preset
    # is its fast dot (3xTF32): the suites' sdpa_mlp_block (four GEMM stages) drafted one stage's at a
    # time and its search, left to change the others one mutation at a time, ended at 0.60x of
    # torch.compile with three of its four GEMMs at IEEE (H200).
    combined = [{**defaults, **{k: v for d in firsts for k, v in d.items()}}] if len(firsts) > 1 else []
    drafts = [*combined, *({**defaults, **d} for d in stage_drafts)]
    return Parts(kernels + functions, calls, tunables, defaults, helpers, tuple(tile), drafts, tuple(smem))


def _function(name: str, params: list[str], body: list[str]) -> str:
    text = jit_function(name, params, body)
    return text.removeprefix("@triton.jit\n")


__all__ = ["SEPARATOR", "compose", "generate", "variants"]
