"""The knowledge benchmark: does retrieval, diagnosis and warm starting make the search need fewer
candidates? Offline tuner, UCT, one workspace, in this order:

    1. rmsnorm, cold (knowledge and diagnosis on, no warm start): its verified skills are written back
    2. softmax, full            knowledge on,  diagnosis on,  no warm start
    3. softmax, no knowledge    knowledge off, diagnosis on,  no warm start
    4. softmax, no diagnosis    knowledge on,  diagnosis off, no warm start
    5. softmax, warm            as 2, with the warm start (seeded from run 2)
    6. rmsnorm, warm            as 1, with the warm start (seeded from run 1)

    python benchmarks/knowledge_gpu.py --budget 14 --out DIR

Per run: the best fitness (search-time, vs torch.compile) and the number of candidates evaluated
until the run first came within 2% of its own final best ("to best"); for the ablation also until it
reached the full run's best, and for the warm runs until they reached the cold run's best. Runs 3
and 4 see the same workspace as run 2 (the skills verified by run 1), so the only difference is the
switch. Each figure is one run on one device: differences of a candidate or two are within the
search's own randomness. Results go to DIR/knowledge.json and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPECS = {"softmax": ROOT / "examples/softmax/spec.py", "rmsnorm": ROOT / "examples/rmsnorm/spec.py"}


def run(spec: str, ws: Path, budget: int, platform: str, **switches: bool) -> dict[str, Any]:
    from kernelevolve.config import load_settings
    from kernelevolve.optimize import optimize
    from kernelevolve.search.limits import Limits
    from kernelevolve.search.policies import SearchConfig
    from kernelevolve.store import Workspace
    from kernelevolve.synth import SynthConfig

    settings = replace(load_settings(ws, {"platform": platform}), timing_budget_s=0.3, **switches)
    start = time.perf_counter()
    summary = optimize(SPECS[spec], settings, SearchConfig(policy="uct", seed=1), Limits(budget=budget),
                       SynthConfig("tuner"), lambda e, d: None)  # fmt: skip
    with Workspace.open(ws) as w:
        nodes = w.nodes(summary["run_id"])
        skills = [s for s in w.skills() if any(p["run"] == summary["run_id"] for p in s["provenance"])]
    curve, best = [], 0.0
    for n in nodes:
        if n["state"] == "evaluated":
            best = max(best, float(n["fitness"] or 0.0))
            curve.append(round(best, 4))
    return {
        "spec": spec, "switches": switches, "run_id": summary["run_id"], "wall_s": round(time.perf_counter() - start, 1),
        "curve": curve, "best": best, "to_best": reach(curve, best * 0.98),
        "warm_nodes": len(summary.get("warm_start") or []),
        "best_speedup_vs_eager": summary["best_speedup_vs_eager"],
        "best_speedup_vs_compile": summary["best_speedup_vs_compile"],
        "skills": [{"id": s["id"], "status": s["status"], "title": s["title"]} for s in skills],
        "device": summary["device"],
        "method": {k: (summary.get("method") or {}).get(k) for k in ("device", "driver", "torch", "triton", "timer")},
    }  # fmt: skip


def reach(curve: list[float], target: float) -> int | None:
    """Candidates evaluated until the best-so-far first reached `target` (None: never)."""
    return next((i + 1 for i, f in enumerate(curve) if f >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=14)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--platform", default="cuda")
    ap.add_argument(
        "--runs", default="1-6", help="which of the six runs (1-3, 4-6): the workspace carries over"
    )
    args = ap.parse_args()
    ws = args.out / "ws"
    plan = [
        ("rmsnorm cold", "rmsnorm", {"warm_start": False}),
        ("softmax full", "softmax", {"warm_start": False}),
        ("softmax no knowledge", "softmax", {"warm_start": False, "knowledge": False}),
        ("softmax no diagnosis", "softmax", {"warm_start": False, "diagnosis": False}),
        ("softmax warm", "softmax", {"warm_start": True}),
        ("rmsnorm warm", "rmsnorm", {"warm_start": True}),
    ]
    lo, hi = (int(x) for x in args.runs.split("-"))
    saved = args.out / "knowledge.json"
    results: dict[str, Any] = json.loads(saved.read_text())["results"] if saved.is_file() else {}
    for label, spec, switches in plan[lo - 1 : hi]:
        print(f"== {label}", file=sys.stderr, flush=True)
        results[label] = run(spec, ws, args.budget, args.platform, **switches)
        r = results[label]
        print(
            f"   best {r['best']:.3f} at candidate {r['to_best']}; curve {r['curve']}",
            file=sys.stderr,
            flush=True,
        )
    if len(results) < len(plan):
        args.out.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps({"results": results}, indent=1))
        print(f"runs {args.runs} done; run the rest with --runs {hi + 1}-{len(plan)} and the same --out")
        return
    full = results["softmax full"]["best"]
    for label in ("softmax no knowledge", "softmax no diagnosis"):
        results[label]["to_full_best"] = reach(results[label]["curve"], full * 0.98)
    results["softmax full"]["to_full_best"] = results["softmax full"]["to_best"]
    for spec in ("softmax", "rmsnorm"):
        cold = results[f"{spec} full" if spec == "softmax" else f"{spec} cold"]
        warm = results[f"{spec} warm"]
        warm["to_cold_best"] = reach(warm["curve"], cold["best"] * 0.98)
        cold["to_cold_best"] = reach(cold["curve"], cold["best"] * 0.98)
    first = next(iter(results.values()))
    doc = {"date": datetime.now(UTC).date().isoformat(), "budget": args.budget,
           "command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "method": first["method"],
           "results": results}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "knowledge.json").write_text(json.dumps(doc, indent=1))
    print(f"\n{first['method'].get('device')}, torch {first['method'].get('torch')}, triton "
          f"{first['method'].get('triton')}, budget {args.budget}, offline tuner, UCT, timing 0.3 s per shape\n")  # fmt: skip
    print(
        "| run | best fitness (vs compile) | candidates to own best | to reference best | warm nodes | skills written |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for label, r in results.items():
        ref = r.get("to_full_best", r.get("to_cold_best"))
        print(f"| {label} | {r['best']:.3f} | {r['to_best']} | {'-' if ref is None and 'warm' not in label and 'no ' not in label else ref} "
              f"| {r['warm_nodes']} | {len(r['skills'])} ({sum(s['status'] == 'verified' for s in r['skills'])} verified) |")  # fmt: skip


if __name__ == "__main__":
    main()
