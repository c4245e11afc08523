"""A bench's metrics: the field's standard `fast_p`, geomean speedups and the correctness rate.

Over the specs a bench attempted (specs that failed to load are reported apart and count nowhere):

- `correct`: the search found a kernel that passed every correctness check and its re-measurement.
- `fast_p` (KernelBench's metric): the fraction of specs that are correct *and* faster than the
  baseline by more than a factor p: `#{correct and speedup > p} / #specs`. `fast_0` is the
  correctness rate; `fast_1` the share that beat the baseline at all.
- `geomean` with failures as 1.0: the geometric mean of the speedups, a spec without a correct kernel
  counting as 1.0, because the exported module falls back to the reference there (its speedup vs
  eager is 1.0 by construction; vs compile it is counted 1.0 too, by the same convention).
- `geomean` over correct results only: the same over the correct specs alone (None if there are none).

The speedups are the ones each result reports: what the exported per-shape dispatch module delivers
(see `bench.results`), measured live against eager and torch.compile in the harness. A flagged result
(a delivered speedup above `suspicious_speedup`, 10x, over a baseline: `results.baseline_flags`)
counts 1.0 in that baseline's figures above fast_0 and in its geomeans until it is reviewed: flagged,
not celebrated (level 1's 57_ delivers 66x over a torch.compile that takes 1.86 s where eager takes
28 ms); a row with a flag of its own counts 1.0 against every baseline (`results.held_baselines`,
the row's `held`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

P_VALUES = (0.0, 1.0, 1.2, 2.0)
BASELINES = ("eager", "compile")


def p_name(p: float) -> str:
    """`fast_1_2` for p = 1.2, `fast_0` for 0: names that are valid keys in every format."""
    text = f"{p:g}".replace(".", "_")
    return f"fast_{text}"


def speedup(result: dict[str, Any], baseline: str) -> float | None:
    value = result.get(f"speedup_vs_{baseline}")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value > 0 else None


def counted(result: dict[str, Any], baseline: str) -> float | None:
    """The speedup the bench's figures count: 1.0 where the result is held back against `baseline`
    (flagged: it awaits review). A row without `held` (an older document) is held against every
    baseline where it has any flag."""
    value = speedup(result, baseline)
    held = result.get("held")
    if held is None:
        held = list(BASELINES) if result.get("flags") else []
    return 1.0 if value is not None and baseline in held else value


def fast_p(results: Sequence[dict[str, Any]], p: float, baseline: str) -> float | None:
    """Fraction of results that are correct with a speedup over `baseline` above `p`."""
    if not results:
        return None
    hits = 0
    for r in results:
        s = counted(r, baseline)
        if r.get("correct") and s is not None and s > p:
            hits += 1
    return hits / len(results)


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def geomean_speedup(results: Sequence[dict[str, Any]], baseline: str, *, correct_only: bool) -> float | None:
    """Geomean speedup over `baseline`: a failure counts 1.0 (fallback), or is left out (`correct_only`)."""
    values: list[float] = []
    for r in results:
        s = counted(r, baseline)
        if r.get("correct") and s is not None:
            values.append(s)
        elif not correct_only:
            values.append(1.0)
    return geomean(values)


def summarize(results: Sequence[dict[str, Any]], load_errors: int = 0) -> dict[str, Any]:
    """The summary object of a bench: counts, correctness rate, fast_p and geomeans per baseline,
    and the costs added up."""
    n = len(results)
    correct = sum(1 for r in results if r.get("correct"))
    out: dict[str, Any] = {
        "specs": n,
        "correct": correct,
        "load_errors": load_errors,
        "correctness_rate": correct / n if n else None,
    }
    for baseline in BASELINES:
        correct_results = [r for r in results if r.get("correct")]
        if correct_results and not any(speedup(r, baseline) for r in correct_results):
            # The baseline was not measured (eager-only settings): no numbers at all, rather than a
            # table of fallbacks that reads like a measurement.
            out.update({f"{p_name(p)}_vs_{baseline}": None for p in P_VALUES})
            out.update({f"geomean_vs_{baseline}": None, f"geomean_vs_{baseline}_correct_only": None})
            continue
        for p in P_VALUES:
            out[f"{p_name(p)}_vs_{baseline}"] = fast_p(results, p, baseline)
        out[f"geomean_vs_{baseline}"] = geomean_speedup(results, baseline, correct_only=False)
        out[f"geomean_vs_{baseline}_correct_only"] = geomean_speedup(results, baseline, correct_only=True)
    rf = [r["roofline_fraction"] for r in results if r.get("correct") and r.get("roofline_fraction")]
    out["median_roofline_fraction"] = sorted(rf)[len(rf) // 2] if rf else None
    for key in ("candidates", "tokens", "cost_usd", "gpu_s", "wall_s"):
        out[key] = round(sum(float(r.get(key) or 0) for r in results), 4)
    out["flagged"] = sum(1 for r in results if r.get("flags"))
    out["suspicious_candidates"] = sum(int(r.get("suspicious") or 0) for r in results)
    return out


__all__ = [
    "BASELINES",
    "P_VALUES",
    "counted",
    "fast_p",
    "geomean",
    "geomean_speedup",
    "p_name",
    "speedup",
    "summarize",
]
