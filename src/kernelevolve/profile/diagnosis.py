"""The diagnosis: why a candidate is as fast as it is, with the numbers, and what to do about it.

Inputs: the verdict (per shape: time, bytes, FLOPs, the roofline and its bound, measured live) and,
when a profiler ran (`profile/run.py`), its metrics: torch.profiler's kernel count and launch
overhead, and ncu's throughputs, occupancy, registers, spills, L2 hit rate and stall reasons for the
candidate's own kernels. Output, a plain dict:

    class              memory-bound | compute-bound | launch-bound | occupancy-limited | latency-bound
    summary            one sentence: the class and how close to the roofline
    bound              the roofline's bound at the heaviest shape (memory, compute, launch)
    roofline_fraction  the heaviest shape's fraction of its roofline (None when not timed)
    at_roofline        True at or above NEAR of the roofline: gains must come from doing less work
    evidence           per shape: time, bound, fraction; plus the profiler's numbers used
    directives         what a synthesizer should try, each naming the number that motivates it
    metrics            the profiler summaries the diagnosis was made from (when any)

The class is the retrieval query's diagnosis signal and goes into the operator's prompt. Rules, in
order: a launch-bound shape (under the launch floor, or host overhead above the kernels' own time
where the shape is timed without CUDA graphs) is `launch-bound`; with ncu, achieved occupancy under 35% limited by registers or shared memory is
`occupancy-limited`, and DRAM under 50% with long-scoreboard stalls dominant is `latency-bound`;
otherwise the roofline's bound (`memory-bound` or `compute-bound`).
"""

from __future__ import annotations

from typing import Any

NEAR = 0.7  # at or above this fraction of the roofline, a shape is "at its bound"
LOW_OCCUPANCY_PCT = 35.0
LOW_DRAM_PCT = 50.0
CLASSES = ("memory-bound", "compute-bound", "launch-bound", "occupancy-limited", "latency-bound")


def diagnose(verdict: dict[str, Any], metrics: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """None for a verdict without timings."""
    shapes = [s for s in verdict.get("shapes", []) if s.get("candidate")]
    if not shapes:
        return None
    evidence: list[dict[str, Any]] = []
    directives: list[str] = []
    heaviest = max(shapes, key=lambda s: s.get("weight", 1.0) * s["candidate"]["median_s"])
    for s in shapes:
        evidence.append(_shape_evidence(s))
        directives.extend(_shape_directives(s))
    frac = heaviest.get("roofline_fraction")
    bound = heaviest.get("bound") or "unknown"
    klass = (
        "launch-bound" if bound == "launch" else f"{bound}-bound" if bound in ("memory", "compute") else ""
    )
    prof = (metrics or {}).get("profiler") or {}
    ncu = ((metrics or {}).get("ncu") or {}).get("summary") or {}
    profiled = next((s for s in shapes if s["name"] == (metrics or {}).get("shape")), None)
    graphed = bool(profiled and profiled.get("cuda_graphs"))
    klass = _refine(klass, frac, prof, ncu, evidence, directives, graphed)
    at = frac is not None and frac >= NEAR
    where = f"{100 * frac:.0f}% of the roofline" if frac is not None else "roofline unknown"
    summary = f"{klass or 'undiagnosed'}, {'at' if at else 'far from'} the bound ({where}, {bound} roofline)"
    out: dict[str, Any] = {
        "class": klass or "undiagnosed", "summary": summary, "bound": bound, "roofline_fraction": frac,
        "at_roofline": at, "evidence": evidence, "directives": directives,
    }  # fmt: skip
    if metrics and (prof or ncu):
        out["metrics"] = {"profiler": _brief_profiler(prof) if prof else None, "ncu": ncu or None,
                          "tools": metrics.get("tools", []), "errors": metrics.get("errors", []),
                          "device_s": metrics.get("device_s") or {}}  # fmt: skip
    return out


def _shape_evidence(s: dict[str, Any]) -> dict[str, Any]:
    frac = s.get("roofline_fraction")
    return {"shape": s["name"], "time_us": round(s["candidate"]["median_s"] * 1e6, 2), "bound": s.get("bound"),
            "roofline_fraction": None if frac is None else round(frac, 3)}  # fmt: skip


def _shape_directives(s: dict[str, Any]) -> list[str]:
    frac, bound = s.get("roofline_fraction"), s.get("bound")
    t_us = s["candidate"]["median_s"] * 1e6
    if frac is None or bound is None:
        return []
    pct = f"{100 * frac:.0f}%"
    if bound == "launch":
        return [f"{s['name']}: launch-bound ({t_us:.1f} us): one kernel launch, fewer, larger programs; "
                "avoid extra allocations and host work in forward"]  # fmt: skip
    if frac < NEAR and bound == "memory":
        return [f"{s['name']}: memory-bound at {pct} of measured bandwidth: read each input once, fuse passes, "
                "coalesce and vectorize loads, keep enough rows/blocks in flight to fill the device"]  # fmt: skip
    if frac < NEAR and bound == "compute":
        return [f"{s['name']}: compute-bound at {pct} of peak: larger tiles, more stages, the matrix units "
                "(tl.dot) where the precision policy allows"]  # fmt: skip
    return []


def _refine(klass: str, frac: float | None, prof: dict[str, Any], ncu: dict[str, Any], evidence: list[dict[str, Any]],
            directives: list[str], graphed: bool = False) -> str:  # fmt: skip
    """Sharpen the roofline's class with profiler numbers, and add their directives. Host-side
    overhead only counts where the profiled shape was timed without CUDA graphs (`graphed` False):
    a graph replay does not pay it."""
    kpc = prof.get("kernels_per_call")
    overhead, device = prof.get("launch_overhead_us_per_call"), prof.get("device_us_per_call")
    if kpc is not None:
        evidence.append({"profiler": "kernels per call", "value": kpc})
        if kpc > 1.5:
            directives.append(f"{kpc:.0f} kernels per call where 1 would do: fuse them into one kernel")
    if overhead is not None and device:
        evidence.append(
            {
                "profiler": "launch overhead us/call",
                "value": round(overhead, 2),
                "device_us": round(device, 2),
            }
        )
        if overhead > device and not graphed:
            klass = "launch-bound"
            directives.append(f"host-side overhead {overhead:.1f} us exceeds the kernels' {device:.1f} us: "
                              "fewer launches and allocations, no Python work per call")  # fmt: skip
    if not ncu:
        return klass
    occ, regs = ncu.get("achieved_occupancy_pct"), ncu.get("max_registers_per_thread")
    dram, spills = ncu.get("dram_throughput_pct"), ncu.get("max_spill_bytes")
    stalls = ncu.get("top_stalls") or []
    for key in (
        "dram_throughput_pct",
        "sm_throughput_pct",
        "achieved_occupancy_pct",
        "theoretical_occupancy_pct",
        "l2_hit_rate_pct",
        "max_registers_per_thread",
        "max_spill_bytes",
    ):
        if ncu.get(key) is not None:
            evidence.append({"ncu": key, "value": round(float(ncu[key]), 2)})
    if stalls:
        evidence.append({"ncu": "top stalls", "value": [f"{s['reason']} {s['ratio']:.1f}" for s in stalls]})
    if spills:
        directives.append(f"registers spill ({spills:.0f} bytes of local memory traffic): smaller tiles or fewer "
                          "live values per thread, or more warps per program")  # fmt: skip
    if regs is not None and regs > 128:
        directives.append(
            f"{regs:.0f} registers per thread caps occupancy: smaller BLOCK or num_warps tuning"
        )
    theo = ncu.get("theoretical_occupancy_pct")
    if (
        klass != "launch-bound"
        and occ is not None
        and occ < LOW_OCCUPANCY_PCT
        and (frac is None or frac < NEAR)
    ):
        klass = "occupancy-limited"
        limiter = "registers" if regs and regs > 64 else "shared memory or block size"
        directives.append(f"achieved occupancy {occ:.0f}% (theoretical {theo or 0:.0f}%), limited by {limiter}: "
                          "more programs in flight, fewer registers or less shared memory per program")  # fmt: skip
    elif (klass == "memory-bound" and dram is not None and dram < LOW_DRAM_PCT and stalls
          and stalls[0]["reason"] == "long_scoreboard"):  # fmt: skip
        klass = "latency-bound"
        directives.append(f"DRAM at {dram:.0f}% of peak with warps waiting on memory (long scoreboard): "
                          "more loads in flight: larger or vectorized loads, more programs, software pipelining")  # fmt: skip
    elif klass == "memory-bound" and dram is not None and dram < 100 * NEAR:
        directives.append(
            f"DRAM throughput {dram:.0f}% of peak: coalesce and vectorize, fewer passes over memory"
        )
    l2 = ncu.get("l2_hit_rate_pct")
    if l2 is not None and klass in ("memory-bound", "latency-bound") and l2 < 30 and (kpc or 1) > 1.5:
        directives.append(
            f"L2 hit rate {l2:.0f}%: intermediate tensors go through DRAM between kernels; fuse"
        )
    return klass


def _brief_profiler(prof: dict[str, Any]) -> dict[str, Any]:
    keep = ("kernels_per_call", "device_us_per_call", "wall_us_per_call", "launch_overhead_us_per_call")
    out = {k: prof.get(k) for k in keep if prof.get(k) is not None}
    kernels = prof.get("kernels") or []
    if kernels:
        out["kernels"] = kernels[:5]
    return out


def reference_analysis(tree: Any) -> dict[str, Any] | None:
    """What the harness knows about the reference from any timed node: per shape the bytes, FLOPs,
    roofline time and bound, and the baselines' times (which do not depend on the candidate)."""
    for n in sorted(tree.nodes.values(), key=lambda n: n.id):
        shapes = (n.verdict or {}).get("shapes") or []
        if not any(s.get("eager") for s in shapes):
            continue
        return {"shapes": [
            reference_shape(s["name"], s.get("bytes"), s.get("flops"), s.get("roofline_s"), s.get("bound"),
                            {b: s[b]["median_s"] for b in ("eager", "compile") if s.get(b)})
            for s in shapes
        ]}  # fmt: skip
    return None


def reference_shape(
    name: str, nbytes: Any, flops: Any, roofline_s: float | None, bound: str | None, medians: dict[str, float]
) -> dict[str, Any]:
    """One shape of the reference's analysis (`reference_analysis`; a draft's task before anything
    was timed, `agent_jobs`): bytes, FLOPs, bound, roofline time, and each baseline's median time and
    its fraction of the roofline, in microseconds."""
    row: dict[str, Any] = {"shape": name, "bound": bound, "bytes": nbytes, "flops": flops}
    if roofline_s:
        row["roofline_us"] = round(roofline_s * 1e6, 2)
    for b, median in medians.items():
        row[f"{b}_us"] = round(median * 1e6, 2)
        if roofline_s:
            row[f"{b}_roofline_fraction"] = round(roofline_s / median, 3)
    return row


__all__ = ["CLASSES", "NEAR", "diagnose", "reference_analysis", "reference_shape"]
