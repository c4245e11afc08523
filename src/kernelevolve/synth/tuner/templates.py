"""What the offline tuner configures: its bases, the sources a draft starts from, each with its
declared tunables.

`bases_for` gathers them in the order the driver drafts them:
- the platform's templates for the spec's reference, the default first (`templates_for`): the
  reference is recognized once (`trace.recognize`), and the platform's generator (`GENERATORS`:
  `c_codegen` on the CPU; `triton_codegen` and each of its `variants` on CUDA and ROCm; imported
  lazily) writes each template. Cached per spec fingerprint: tracing takes a second, and several
  tuners may serve one run;
- the templates' presets (`Generated.drafts`: a GEMM's or convolution's known-good tiles and the
  precision's fast dot), each a base of its own, after every template's default, in turns (every
  template's first preset, then every second one);
- the knowledge base's code samples that compute the same reference in the platform's kernel kind
  (`knowledge/samples.py`): hand-written kernels with declared tunables, what the tuner has to work
  with where no template covers the reference (gathers, jagged ops, several GEMMs);
- the extra seeds (the user's kernels: `kernelevolve tune`'s, and `optimize --start-from`'s, which
  are also the run's first nodes).
A base whose source declares `TUNABLES`/`CONFIG` (`kernelevolve/tunables.py`) has its `CONFIG` line
rewritten as the tuner writes it, so that a configuration has one spelling and one hash; one that
declares none is offered once, as written. Where there is nothing, `bases_for` says why.

Deliberately not here: which base a task gets, and how a configuration changes (`driver.py`,
`moves.py`); the templates' code (the generator modules). A generator's failure costs its template,
never the run.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from kernelevolve import tunables as tn
from kernelevolve.errors import KernelevolveError
from kernelevolve.spec import Spec
from kernelevolve.synth.tuner.ir import Generated
from kernelevolve.synth.tuner.moves import Config, Space


@dataclass
class Base:
    """A tunable source the tuner can configure: a generated template, a sample or a user's seed."""

    label: str
    source: str
    space: Space | None  # None: the source declares no tunables and is offered once, as written
    config: Config
    kind: str = "seed"  # "template" | "sample" | "seed"
    # The source as its author wrote it, where `source` respells its CONFIG line: the same
    # configuration, so a tree holding the one has tried the other (a seed node, `--start-from`).
    written: str | None = None
    # How its config differs from its template's default ("" for the default itself or a seed).
    why: str = ""


# Platform -> (kernel kind, code generator module). A generator module has `generate(graph,
# config=None, precision=...)` and optionally `variants(graph)` (template names, the default first,
# passed back as `template=`). Imported on first use: the Triton one needs triton.
GENERATORS: dict[str, tuple[str, str]] = {
    "cpu": ("c", "kernelevolve.synth.tuner.c_codegen"),
    "cuda": ("triton", "kernelevolve.synth.tuner.triton_codegen"),
    "rocm": ("triton", "kernelevolve.synth.tuner.triton_codegen"),
}


_TEMPLATES: dict[tuple[str, ...], tuple[list[Generated], str]] = {}
_TEMPLATES_LOCKS: dict[tuple[str, ...], threading.Lock] = {}  # one per key: specs trace side by side
_TEMPLATES_GUARD = threading.Lock()


def templates_for(spec: Spec, platform: str, kinds: Sequence[str] = ()) -> tuple[list[Generated], str]:
    """The platform's templates for the spec's reference, default first, and why there are none
    (the reference is not recognized, no generator covers it). Cached per spec fingerprint: tracing
    takes a second, and several tuners may serve one run."""
    key = (str(spec.path), spec.fingerprint, spec.precision, platform, *kinds)
    with _TEMPLATES_GUARD:
        lock = _TEMPLATES_LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key not in _TEMPLATES:
            _TEMPLATES[key] = _generate_templates(spec, platform, kinds)
        return _TEMPLATES[key]


def _generate_templates(spec: Spec, platform: str, kinds: Sequence[str]) -> tuple[list[Generated], str]:
    from kernelevolve.synth.tuner.trace import recognize

    entry = GENERATORS.get(platform)
    if entry is None:
        return [], f"no template generator for platform {platform!r}"
    kind, module_name = entry
    if kinds and kind not in kinds:
        return [], f"the {platform} templates are {kind} kernels, which this platform does not run"
    graph, why = recognize(spec)
    if graph is None:
        return [], f"the reference is not templated: {why}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return [], f"the {kind} template generator is not available ({exc})"
    names: list[str | None] = list(module.variants(graph)) if hasattr(module, "variants") else [None]
    out: list[Generated] = []
    failures = []
    for name in names or [None]:
        extra = {"template": name} if name is not None else {}
        try:
            out.append(module.generate(graph, config=None, precision=spec.precision, **extra))
        except (NotImplementedError, ValueError, KernelevolveError) as exc:
            failures.append(f"no {kind} template for this {graph.pattern} graph: {exc}")
        except Exception as exc:  # a generator's bug costs its template, not the run
            failures.append(
                f"the {kind} generator failed on this {graph.pattern} graph: {type(exc).__name__}: {exc}"
            )
    return out, "" if out else "; ".join(failures)


def bases_for(
    spec: Spec,
    platform: str,
    kinds: Sequence[str] = (),
    extra_seeds: Sequence[tuple[str, str]] = (),
    templates: bool = True,
) -> tuple[list[Base], str]:
    """The bases in drafting order and why there is no template (empty where a sample stands in for
    one; a seed whose declaration is malformed adds its error): each template at its default, each
    template's first preset, the knowledge base's samples of this computation, the templates' further
    presets, the extra seeds. `templates=False` takes the extra seeds alone (`kernelevolve tune`: the
    user's kernel, not the tuner's own)."""
    generated, why = templates_for(spec, platform, kinds) if templates else ([], "")
    bases = [Base(t.template, t.source, dict(t.tunables), dict(t.config), "template") for t in generated]
    # the templates' presets in turns, each template's first before any second: a draft phase of a few
    # nodes tries the fast dot of every template (a transposed convolution's masked and phased ones)
    presets = [_draft_bases(t) for t in generated]
    turns = [[ps[i] for ps in presets if i < len(ps)] for i in range(max(map(len, presets), default=0))]
    bases += turns[0] if turns else []
    if templates:
        # A sample written for this computation before a template's second and third presets: the
        # draft phase is 4 nodes, and fm_interaction's template default and three presets took all 4
        # (each outside the TF32 tolerance), so its sample (both products fused per sample; 1.43x of
        # torch.compile when it was drafted) was never tried and the search stayed at 0.34x (H200).
        samples = _sample_bases(spec, platform, kinds)
        if samples:
            why = ""
        bases += samples
    bases += [b for turn in turns[1:] for b in turn]
    for label, source in extra_seeds:
        try:
            bases.append(_as_base(label, source, "seed"))
        except tn.TunablesError as exc:
            why += f"; seed {label}: {exc}"
            bases.append(Base(label, source, None, {}))
    return bases, why


def _draft_bases(t: Generated) -> list[Base]:
    """A template's further drafts (`Generated.drafts`) as bases of their own, each with its CONFIG
    written in: those whose tile fits the registers (`tunables.config_fits`)."""
    tile = tn.declared_tile(t.source)
    out = []
    for cfg in t.drafts:
        if tn.config_fits(cfg, tile):
            change = ", ".join(
                f"{k} {t.config.get(k)!r}->{v!r}" for k, v in cfg.items() if t.config.get(k) != v
            )
            out.append(
                Base(t.template, tn.write(t.source, cfg), dict(t.tunables), dict(cfg), "template", why=change)
            )
    return out


def _sample_bases(spec: Spec, platform: str, kinds: Sequence[str]) -> list[Base]:
    """The knowledge base's code samples that compute this spec's reference, in this platform's
    kernel kind (`knowledge/samples.py`). A sample whose declaration is malformed is offered as
    written."""
    from kernelevolve.knowledge.samples import applicable_samples

    entry = GENERATORS.get(platform)
    if entry is None or (kinds and entry[0] not in kinds):
        return []
    out = []
    for sample in applicable_samples(spec, entry[0]):
        try:
            out.append(_as_base(sample.doc_id, sample.source, "sample"))
        except tn.TunablesError:
            out.append(Base(sample.doc_id, sample.source, None, {}, "sample"))
    return out


def _as_base(label: str, source: str, kind: str) -> Base:
    """`source` as a base: with CONFIG as the tuner writes it, so that a configuration has one
    spelling; as written where it declares no tunables. Raises TunablesError on a malformed
    declaration."""
    found = tn.read(source)
    if found is None:
        return Base(label, source, None, {}, kind)
    canonical = tn.write(source, found[1])
    return Base(label, canonical, found[0], found[1], kind, None if canonical == source else source)


__all__ = ["GENERATORS", "Base", "bases_for", "templates_for"]
