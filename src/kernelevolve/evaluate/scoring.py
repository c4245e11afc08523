"""The verdict of one candidate's evaluation: how it starts, how a failure sets it, and its score.

- `start_verdict`: the verdict before any phase ran: what is evaluated, where, and how it will be
  measured (`Method`: versions, baselines, seeds, distributions, the worker's notes).
- `fail`: a failed evaluation's verdict (not correct, not timed, fitness 0).
- `score`: after timing (each shape's speedups are set there, `ShapeResult.speedups`), the overall
  speedups and the fitness against the selected baseline, the roofline per shape against the
  measured hardware profile, and the suspicious checks: a candidate above the measured roofline
  or faster than the datasheet's allows, or faster than `suspicious_speedup` times the faster of the
  two baselines at a shape, is flagged, its status `suspicious` and its fitness 0: never silently
  accepted.

Deliberately not here: measuring anything (`timing.py`, `trials.py`), and the weighting of shapes
and the choice of the best baseline (`verdict.py`, which the store and reports share).
"""

from __future__ import annotations

from kernelevolve.evaluate.inputs import DISTRIBUTIONS
from kernelevolve.evaluate.messages import Ceilings
from kernelevolve.evaluate.prepared import Prepared
from kernelevolve.evaluate.verdict import Method, Status, Verdict, Violation
from kernelevolve.roofline import ceiling_flops, flop_class, roofline


def start_verdict(state: Prepared, kind: str) -> Verdict:
    """The verdict of a `kind` candidate at `state`'s spec, before any phase ran."""
    spec, settings = state.spec, state.settings
    v = state.info["versions"]
    return Verdict(
        status=Status.OK,
        spec=spec.name,
        spec_fingerprint=spec.fingerprint,
        candidate_kind=kind,
        platform=state.platform.name,
        method=Method(
            platform=state.info["target"],
            device=state.info["device"],
            driver=v.get("driver"),
            torch=v.get("torch"),
            triton=v.get("triton"),
            python=v.get("python"),
            kernelevolve=state.info.get("kernelevolve"),
            baselines=[b for b in settings.baselines if b not in state.baseline_errors],
            baseline_errors=dict(state.baseline_errors),
            fitness_baseline=settings.fitness_baseline,
            precision_policy=spec.precision,
            seeds=settings.seeds,
            distributions=list(DISTRIBUTIONS),
            notes=list(state.notes),
        ),
    )


def fail(verdict: Verdict, status: Status, message: str, violations: list[Violation]) -> None:
    verdict.status, verdict.message = status, message
    verdict.violations.extend(violations)
    verdict.correct = False
    verdict.timed = False
    verdict.fitness = 0.0


def score(v: Verdict, state: Prepared, profile: Ceilings | None) -> None:
    """Score a timed verdict: fitness, the roofline (where `profile` is known), flags, the message."""
    settings = state.settings
    v.timed = True
    # A torch.compile that failed here leaves eager as the best baseline (or, asked for by name, as
    # the fitness baseline), and the message says why; the pool decides whether that is the spec's
    # failure (every worker) or this worker's (a retry).
    wanted = settings.fitness_baseline
    fallback_reason = state.baseline_errors.get("compile" if wanted == "best" else wanted)
    against = v.score("eager" if fallback_reason and wanted == "compile" else wanted)
    flags = _roofline(v, state, profile) if profile else []
    limit = settings.suspicious_speedup
    for s in v.shapes:
        # Against the faster baseline of that shape: where one baseline is itself pathologically slow
        # (level 1's 57_conv_transposed_2D on an H100: torch.compile 1.86 s, eager 28 ms), a kernel
        # merely as fast as the other is 45x "faster than compile" and implausible it is not.
        value = s.speedup_vs_best
        if value is not None and value > limit:
            flags.append(
                f"shape {s.name}: {value:.1f}x faster than {s.best_baseline}, the faster baseline there "
                f"(above {limit:g}x)"
            )
    v.flags = flags
    if flags:
        v.status = Status.SUSPICIOUS
        v.fitness = 0.0
        v.message = "correct, but the speedup is implausible and needs review: " + "; ".join(flags)
    else:
        v.message = f"correct; {v.fitness:.2f}x vs {against}" + (
            f" (spread {v.spread:.1%})" if v.spread is not None else ""
        )
    if fallback_reason:
        v.message += f" (fitness vs eager: {fallback_reason})"


MEASURED_ROOFLINE = "of the measured roofline"  # in the flag of a shape above it (`EvaluatorPool` reads it)


def above_measured_roofline(shape: str, fraction: float, profile: Ceilings) -> str:
    return (
        f"shape {shape}: {fraction:.0%} {MEASURED_ROOFLINE} ({profile.bandwidth / 1e9:.0f} GB/s measured): "
        "it moves fewer bytes or does fewer FLOPs than the reference needs, or the measured peak is low"
    )


def _roofline(v: Verdict, state: Prepared, profile: Ceilings) -> list[str]:
    """Each shape's roofline time, bound and fraction, and the verdict's weighted fraction, against
    the measured ceilings; returns the flags of shapes above the measured roofline (by more than
    `roofline_margin`: on every platform, the CPU's too, which has no datasheet) or faster than the
    datasheet's roofline allows. The pool re-measures the ceilings once where a verdict's only flags
    are the measured roofline's (a peak measured low is not believed, `EvaluatorPool`)."""
    spec = state.spec
    cls = flop_class(spec.dtype, spec.precision)
    margin = state.settings.roofline_margin
    flags: list[str] = []
    fractions = []
    # The ceilings: what an honest kernel of this precision can reach (`ceiling_flops`: strict fp32 as
    # 3xTF32 on tensor cores too), for the fraction as for the flags: a strict GEMM at 78 TFLOP/s on an
    # H100 read "116% of roofline" against fp32's own peak, unflagged and rightly so.
    peak = ceiling_flops(profile.flops, cls)
    for s in v.shapes:
        t_roof, bound = roofline(s.bytes or 0, s.flops or 0, profile.bandwidth, peak)
        s.roofline_s, s.bound = t_roof, bound
        if not s.candidate:
            continue
        t = s.candidate.median_s
        s.roofline_fraction = t_roof / t
        fractions.append((s.weight, t_roof, t))
        if t_roof / t > margin:
            flags.append(above_measured_roofline(s.name, t_roof / t, profile))
        if profile.datasheet_bandwidth:
            sheet = ceiling_flops(profile.datasheet_flops, cls)
            t_sheet, _ = roofline(s.bytes or 0, s.flops or 0, profile.datasheet_bandwidth, sheet)
            if t * margin < t_sheet:
                flags.append(
                    f"shape {s.name}: {t * 1e6:.1f} us is faster than the datasheet roofline "
                    f"allows ({t_sheet * 1e6:.1f} us for {s.bytes} bytes, {s.flops} FLOPs)"
                )
    if fractions:
        v.roofline_fraction = sum(w * t for w, t, _ in fractions) / sum(w * c for w, _, c in fractions)
    return flags
