"""The search benchmark: the offline tuner on the project's own specs, and policies side by side.

    python benchmarks/search_gpu.py tuner --budget 50 --specs rmsnorm,softmax --out DIR
    python benchmarks/search_gpu.py policies --budget 20 --specs softmax,rmsnorm --out DIR

`tuner`: per spec, one `optimize` run (offline tuner, UCT) at the budget; the re-measured best speedup
vs eager and vs torch.compile, the roofline fraction, the wall time; geomean over specs.
`policies`: per spec, one run per policy (greedy, uct, evolutionary) at the same budget and seed;
best-so-far fitness against candidates evaluated.

Each run uses the default harness settings (live eager and torch.compile baselines, interleaved,
CUDA graphs below 50 us) with a timing budget of 0.5 s per shape. Results go to DIR/<mode>.json and a
markdown table on stdout, with the device, versions and the command.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPECS = {
    "softmax": ROOT / "examples/softmax/spec.py",
    "gelu": ROOT / "examples/gelu/spec.py",
    "rmsnorm": ROOT / "examples/rmsnorm/spec.py",
    "bias_gelu_residual": ROOT / "examples/bias_gelu_residual/spec.py",
    "linear_gelu": ROOT / "examples/linear_gelu/spec.py",
}


def run_one(spec: Path, workspace: Path, budget: int, policy: str, platform: str) -> dict[str, Any]:
    from kernelevolve.config import load_settings
    from kernelevolve.optimize import optimize
    from kernelevolve.search.limits import Limits
    from kernelevolve.search.policies import SearchConfig
    from kernelevolve.store import Workspace
    from kernelevolve.synth import SynthConfig

    settings = replace(load_settings(workspace, {"platform": platform}), timing_budget_s=0.5)
    start = time.perf_counter()

    def progress(event: str, data: dict[str, Any]) -> None:
        if event == "evaluated":
            v = data["verdict"]
            print(f"  node {data['node']}: {v.status} {v.fitness:.3f}", file=sys.stderr, flush=True)

    summary = optimize(
        spec,
        settings,
        SearchConfig(policy=policy, seed=1),
        Limits(budget=budget),
        SynthConfig("tuner"),
        progress,
    )
    wall = time.perf_counter() - start
    with Workspace.open(workspace) as ws:
        nodes = ws.nodes(summary["run_id"])
    curve, best = [], 0.0
    for n in nodes:
        if n["state"] == "evaluated":
            best = max(best, float(n["fitness"] or 0.0))
            curve.append(round(best, 4))
    return {
        "spec": summary["spec"], "policy": policy, "run_id": summary["run_id"], "wall_s": round(wall, 1),
        "nodes_evaluated": summary["nodes_evaluated"], "nodes_ok": summary["nodes_ok"],
        "best_speedup_vs_eager": summary["best_speedup_vs_eager"],
        "best_speedup_vs_compile": summary["best_speedup_vs_compile"],
        "roofline": {s["shape"]: s["roofline_fraction"] for s in summary["shapes"]},
        "dispatch": {k: ("kernel" if v.get("node") else "reference") for k, v in summary["dispatch"].items()},
        "curve": curve, "stop_reason": summary["stop_reason"], "device": summary["device"],
        "method": {k: (summary.get("method") or {}).get(k) for k in ("device", "driver", "torch", "triton", "timer", "l2")},
    }  # fmt: skip


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["tuner", "policies"])
    ap.add_argument("--specs", default="softmax,gelu,rmsnorm,bias_gelu_residual,linear_gelu")
    ap.add_argument("--budget", type=int, default=50)
    ap.add_argument("--platform", default="auto")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--workspace", type=Path, default=Path("/tmp/kernelevolve-bench-ws"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    policies = ["greedy", "uct", "evolutionary"] if args.mode == "policies" else ["uct"]
    results = []
    for name in args.specs.split(","):
        for policy in policies:
            print(f"{name} / {policy}", file=sys.stderr, flush=True)
            results.append(run_one(SPECS[name], args.workspace, args.budget, policy, args.platform))
            (args.out / f"{args.mode}.json").write_text(json.dumps(results, indent=2))
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "method": results[0]["method"] if results else {},
    }
    (args.out / f"{args.mode}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"\n{meta['date']}; {meta['method']}; `{meta['command']}`\n")
    if args.mode == "tuner":
        print("| spec | vs eager | vs compile | roofline per shape | export | evaluated | wall |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in results:
            roof = ", ".join(f"{k} {v:.0%}" for k, v in r["roofline"].items() if v is not None)
            disp = ", ".join(f"{k}: {v}" for k, v in r["dispatch"].items())
            print(f"| {r['spec']} | {_x(r['best_speedup_vs_eager'])} | {_x(r['best_speedup_vs_compile'])} | {roof} | "
                  f"{disp} | {r['nodes_evaluated']} | {r['wall_s']:.0f} s |")  # fmt: skip
        ge = geomean([r["best_speedup_vs_eager"] or 1.0 for r in results])
        gc = geomean([r["best_speedup_vs_compile"] or 1.0 for r in results])
        print(f"| geomean | {_x(ge)} | {_x(gc)} | | | | |")
    else:
        print("| spec | policy | best fitness after 5 / 10 / 20 / all | re-measured vs compile | wall |")
        print("| --- | --- | --- | --- | --- |")
        for r in results:
            c = r["curve"]
            at = " / ".join(f"{c[min(i, len(c)) - 1]:.2f}" if c else "-" for i in (5, 10, 20, len(c)))
            print(
                f"| {r['spec']} | {r['policy']} | {at} | {_x(r['best_speedup_vs_compile'])} | {r['wall_s']:.0f} s |"
            )


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


if __name__ == "__main__":
    main()
