"""One bench result row from a finished run: correct or not, speedups, roofline fraction, cost.

The speedups a row reports are what the run's export delivers: its per-shape dispatch module runs the
re-measured winner at the shapes where it beats eager beyond the noise and the reference (eager)
elsewhere, so it is never slower than the reference. Per shape, the speedup comes from one
measurement (the winner's re-measurement, in which eager and torch.compile were timed interleaved
with it); a spec's speedup is shape-weighted like fitness: sum(w * t_baseline) / sum(w * t_delivered).
Where the dispatch uses the reference, t_delivered is eager's time. The best single kernel's own
re-measured speedups are kept beside as `kernel_speedup_vs_*`.

A spec without a correct kernel has `correct: false`, `speedup_vs_eager: 1.0` (the module is the
reference) and `speedup_vs_compile: null` (the metrics count it 1.0, see `bench.metrics`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from kernelevolve.bench.metrics import BASELINES


def delivered(summary: dict[str, Any], baseline: str) -> float | None:
    """The dispatch module's shape-weighted speedup over `baseline` ("eager" or "compile"): at a shape
    without a winning kernel, what runs there is the reference's faster form (`fallback`)."""
    dispatch = summary.get("dispatch") or {}
    weights = {s["shape"]: s["weight"] for s in summary.get("shapes") or []}
    base_total = cand_total = 0.0
    for shape, weight in weights.items():
        entry = dispatch.get(shape) or {}
        eager, base = entry.get("eager_us"), entry.get(f"{baseline}_us")
        if not eager or not base:
            return None
        t = (
            entry["time_us"]
            if entry.get("node") is not None
            else entry.get(f"{entry.get('fallback') or 'eager'}_us")
        )
        t = t or eager
        base_total += weight * base
        cand_total += weight * t
    return base_total / cand_total if cand_total > 0 else None


def curve(nodes: Sequence[dict[str, Any]]) -> list[float]:
    """Best fitness so far after each evaluated candidate, in evaluation order (0 until a correct one)."""
    out: list[float] = []
    best = 0.0
    for n in nodes:
        if n.get("state") != "evaluated":
            continue
        if n.get("status") == "ok":
            best = max(best, float(n.get("fitness") or 0.0))
        out.append(round(best, 4))
    return out


def held_back(nodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Correct candidates flagged `suspicious` (above 10x, or past the datasheet roofline): never
    ranked, so an op's figures leave them out until someone reviews them. Their count, and one's
    message."""
    flagged = [n for n in nodes if n.get("status") == "suspicious"]
    example = str(flagged[0].get("message") or "")[:300] if flagged else None
    return {"suspicious": len(flagged), "suspicious_example": example}


def result_row(
    name: str, path: str, summary: dict[str, Any], nodes: Sequence[dict[str, Any]], precision: str
) -> dict[str, Any]:
    shapes = summary.get("shapes") or []
    correct = summary.get("best_node") is not None and bool(shapes) and all(s["correct"] for s in shapes)
    weight = sum(s["weight"] for s in shapes if s.get("roofline_fraction") is not None)
    roofline = (
        sum(s["weight"] * s["roofline_fraction"] for s in shapes if s.get("roofline_fraction") is not None)
        / weight
        if correct and weight > 0
        else None
    )
    best = next((n for n in nodes if n["id"] == summary.get("best_node")), None)
    dispatch = summary.get("dispatch") or {}
    return {
        "name": name,
        "path": path,
        "run_id": summary.get("run_id"),
        "correct": correct,
        "speedup_vs_eager": delivered(summary, "eager") if correct else 1.0,
        "speedup_vs_compile": delivered(summary, "compile") if correct else None,
        "kernel_speedup_vs_eager": summary.get("best_speedup_vs_eager") if correct else None,
        "kernel_speedup_vs_compile": summary.get("best_speedup_vs_compile") if correct else None,
        # the best kernel's fitness re-measured in fresh workers, beside its verdict at search time
        "fitness": summary.get("best_fitness") if correct else None,
        "search_fitness": summary.get("best_search_fitness") if correct else None,
        "remeasure_disagrees": summary.get("remeasure_disagrees"),
        "roofline_fraction": roofline,
        "shapes_dispatched": sum(1 for e in dispatch.values() if e.get("node") is not None),
        "shapes": [{**s, "dispatch_node": (dispatch.get(s["shape"]) or {}).get("node")} for s in shapes],
        "best_node": summary.get("best_node"),
        "best_from": (best or {}).get("note", "")[:200],
        "precision": precision,
        "device": summary.get("device"),
        "candidates": summary.get("nodes_evaluated", 0),
        "candidates_ok": summary.get("nodes_ok", 0),
        "tokens": int(summary.get("tokens_in", 0)) + int(summary.get("tokens_out", 0)),
        "cost_usd": summary.get("cost_usd", 0.0),
        "gpu_s": summary.get("gpu_s", 0.0),
        "wall_s": summary.get("wall_s", 0.0),
        "flags": summary.get("flags") or [],
        **held_back(nodes),
        "stop_reason": summary.get("stop_reason"),
        "message": None if correct else why_no_kernel(summary, nodes),
        "curve": curve(nodes),
        "method": summary.get("method"),
    }


DELIVERED = "x vs {baseline} delivered, above"  # in a baseline's flag (`baseline_flags`, `held_baselines`)


def held_baselines(row: dict[str, Any], limit: float) -> list[str]:
    """The baselines whose figures count 1.0 for this row until it is reviewed (`bench.metrics`): every
    one where the row carries a flag of its own (its kernel past the roofline, say); else each one it
    delivers more than `limit` times over. A baseline that is itself far slower than the other holds
    back only its own figure: bucketized_dense_features at 96.7x vs eager (a [N, F, B] bool tensor
    eager writes and reads back) and 4.8x vs torch.compile (H200) counts 1.0 vs eager and 4.8x vs
    compile, as a candidate's plausibility is judged against the faster baseline (`scoring.score`)."""
    own = [f for f in row.get("flags") or [] if not any(DELIVERED.format(baseline=b) in f for b in BASELINES)]
    if own:
        return list(BASELINES)
    if not row.get("correct"):
        return []
    return [b for b in BASELINES if isinstance(v := row.get(f"speedup_vs_{b}"), int | float) and v > limit]


def baseline_flags(row: dict[str, Any], limit: float) -> list[str]:
    """The row's flags, with one more for each baseline it delivers more than `limit` times over
    (`Settings.suspicious_speedup`): a kernel's speedup above it is held back before it gets here
    (`held_back`), so what remains is a baseline that is itself far slower than the other, as
    torch.compile at 1.86 s against eager's 28 ms on level 1's 57_conv_transposed_2D (an H100).
    The figure is real, the dispatch module runs the faster reference there, but it is no kernel's
    speedup: flagged, and counted 1.0 in that baseline's figures until reviewed (`held_baselines`)."""
    flags = list(row.get("flags") or [])
    if not row.get("correct"):
        return flags
    kernel = any(s.get("dispatch_node") is not None for s in row.get("shapes") or [])
    for baseline in BASELINES:
        value = row.get(f"speedup_vs_{baseline}")
        if not isinstance(value, int | float) or value <= limit:
            continue
        why = (
            "a winning kernel runs at some shapes; review it before quoting the figure"
            if kernel
            else f"the reference runs here (no kernel beat it): {baseline} itself is that much slower "
            "than the faster baseline, not a kernel's speedup"
        )
        flag = f"{value:.1f}{DELIVERED.format(baseline=baseline)} {limit:g}x: {why}"
        if flag not in flags:
            flags.append(flag)
    return flags


def why_no_kernel(summary: dict[str, Any], nodes: Sequence[dict[str, Any]]) -> str:
    """Why a run ended without a correct kernel, from what its nodes say: no candidate at all (the
    synthesizer's reason, such as the tuner's "aten.convolution is not templated"), or candidates
    that all failed (how, and the latest failure's message), or the re-measurement's failure."""
    if summary.get("final_message"):
        return f"the best kernel failed its re-measurement: {summary['final_message']}"
    evaluated = [n for n in nodes if n.get("state") == "evaluated"]
    if not evaluated:
        reasons = Counter(str(n.get("message") or "").strip() for n in nodes if n.get("state") == "failed")
        reasons.pop("", None)
        stop = f" (stopped: {summary['stop_reason']})" if summary.get("stop_reason") else ""
        if reasons:
            return f"no candidate: {reasons.most_common(1)[0][0]}{stop}"
        return f"no candidate{stop}"
    statuses = Counter(str(n.get("status")) for n in evaluated)
    counts = ", ".join(f"{k} {v}" for k, v in statuses.most_common())
    latest = next((n for n in reversed(evaluated) if n.get("message")), None)
    tail = f"; the latest: {str(latest['message']).strip().splitlines()[0][:300]}" if latest else ""
    return f"no correct kernel in {len(evaluated)} candidate(s) ({counts}){tail}"


__all__ = [
    "baseline_flags",
    "curve",
    "delivered",
    "held_back",
    "held_baselines",
    "result_row",
    "why_no_kernel",
]
