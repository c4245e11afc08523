"""A first diagnosis from the verdict alone: which bound each shape is against, and how close.

The harness already measures each shape's time against its roofline (bytes and FLOPs over the
device's measured peaks). This turns those numbers into the value the search feeds forward: a class
(memory-bound, compute-bound, launch-bound, or far from any bound), the evidence per shape, and
directives a synthesizer can act on. Profiler metrics (ncu, torch.profiler) refine it in
`kernelevolve.profile` later; without them this is what a node carries.
"""

from __future__ import annotations

from typing import Any

NEAR = 0.7  # at or above this fraction of the roofline, a shape is "at its bound"


def diagnose(verdict: dict[str, Any]) -> dict[str, Any] | None:
    """None for a verdict without timings."""
    shapes = [s for s in verdict.get("shapes", []) if s.get("candidate")]
    if not shapes:
        return None
    evidence, directives = [], []
    heaviest = max(shapes, key=lambda s: s.get("weight", 1.0) * s["candidate"]["median_s"])
    for s in shapes:
        frac, bound = s.get("roofline_fraction"), s.get("bound")
        t_us = s["candidate"]["median_s"] * 1e6
        evidence.append({"shape": s["name"], "time_us": round(t_us, 2), "bound": bound,
                         "roofline_fraction": None if frac is None else round(frac, 3)})  # fmt: skip
        if frac is None or bound is None:
            continue
        pct = f"{100 * frac:.0f}%"
        if bound == "launch":
            directives.append(
                f"{s['name']}: launch-bound ({t_us:.1f} us): one kernel launch, fewer, larger programs; "
                "avoid extra allocations and host work in forward"
            )
        elif frac < NEAR and bound == "memory":
            directives.append(
                f"{s['name']}: memory-bound at {pct} of measured bandwidth: read each input once, fuse passes, "
                "coalesce and vectorize loads, keep enough rows/blocks in flight to fill the device"
            )
        elif frac < NEAR and bound == "compute":
            directives.append(
                f"{s['name']}: compute-bound at {pct} of peak: larger tiles, more stages, the matrix units "
                "(tl.dot) where the precision policy allows"
            )
    frac = heaviest.get("roofline_fraction")
    bound = heaviest.get("bound") or "unknown"
    if frac is not None and frac >= NEAR:
        klass = f"{bound}-bound, at {100 * frac:.0f}% of the roofline"
    elif frac is not None:
        klass = f"{bound}-bound, far from it ({100 * frac:.0f}% of the roofline)"
    else:
        klass = f"{bound}-bound"
    return {"class": klass, "bound": bound, "roofline_fraction": frac, "evidence": evidence,
            "directives": directives}  # fmt: skip


__all__ = ["diagnose"]
