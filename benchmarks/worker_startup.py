"""Worker start-up time, two versions of the harness side by side: what a sandbox change costs.

    python benchmarks/worker_startup.py --variant before=OLD/src --variant after=src \
        [--variant "spawn=src;KERNELEVOLVE_WORKER_START=spawn"] [--per-process 4] \
        [--platform cuda] [--rounds 8] [--spec tests/specs/softmax.py] [--compile] [--out FILE.json]

Each round starts one worker of every variant, in a shuffled order, and waits until it is ready
(spawned, sandboxed, torch imported, device initialized, the spec's reference outputs computed and,
with `--compile`, its torch.compile baseline built); what is timed is the handle's own `start_s`
(spawn to ready) and the worker's per-step seconds. A variant is a `src` folder: each worker is
started from a fresh interpreter that imports kernelevolve from there, so the old code runs as it
was (check out an old commit's `src` with `git archive COMMIT src | tar -x -C DIR`).

Prints one line per start, then a table: median start-up per variant and its ratio to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, sys, tempfile
from pathlib import Path
import kernelevolve
from kernelevolve.config import Settings
from kernelevolve.evaluate.handle import WorkerHandle
from kernelevolve.platforms import get_platform

platform, spec, compile_ = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
settings = Settings(workspace=Path(tempfile.mkdtemp()) / "ws", platform=platform,
                    baselines=["eager", "compile"] if compile_ else ["eager"],
                    fitness_baseline="compile" if compile_ else "eager",
                    **({"worker_start": os.environ["KERNELEVOLVE_WORKER_START"]}
                       if "KERNELEVOLVE_WORKER_START" in os.environ else {})).validate()
for k in range(int(sys.argv[4])):
    handle = WorkerHandle(platform=get_platform(platform), settings=settings,
                          spec_path=Path(spec) if spec else None, precision="strict_fp32").start()
    try:
        info = handle.wait_ready()
        print("RESULT " + json.dumps({"start_s": info["start_s"], "steps": info.get("prepare_steps", {}),
                                      "started_by": info.get("started_by", "spawn"), "nth": k + 1,
                                      "notes": handle.notes, "src": str(Path(kernelevolve.__file__).parent)}))
    finally:
        handle.close()
"""


def start_some(
    src: Path, own_env: dict[str, str], platform: str, spec: str, compile_: bool, count: int
) -> list[dict[str, Any]]:
    """`count` workers started one after the other by one engine process (a fork server, where the
    variant forks, is started by the first)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(src.resolve())
    env.update(own_env)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, platform, spec, "1" if compile_ else "0", str(count)],
        env=env, capture_output=True, text=True, timeout=900, check=False, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or len(lines) != count:
        raise SystemExit(f"a worker from {src} did not start:\n{done.stderr[-3000:]}")
    results = [json.loads(ln.removeprefix("RESULT ")) for ln in lines]
    if Path(results[0]["src"]).resolve() != (src / "kernelevolve").resolve():
        raise SystemExit(f"the worker imported kernelevolve from {results[0]['src']}, not from {src}")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="LABEL=SRC_DIR[;KEY=VALUE...] (repeat)")
    ap.add_argument("--per-process", type=int, default=1,
                    help="workers started one after another by each engine process (the first starts "
                    "a fork server, where the variant forks; the table counts the later ones)")  # fmt: skip
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--spec", default=str(ROOT / "tests" / "specs" / "softmax.py"), help="'' for none")
    ap.add_argument("--compile", action="store_true", help="build the torch.compile baseline too")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    variants = {}
    for v in args.variant:
        label, rest = v.split("=", 1)
        src, *pairs = rest.split(";")
        variants[label] = (src, dict(kv.split("=", 1) for kv in pairs))
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label in variants}
    rng = random.Random(0)
    for r in range(args.rounds):
        order = list(variants)
        rng.shuffle(order)
        for label in order:
            src, own_env = variants[label]
            for res in start_some(
                Path(src), own_env, args.platform, args.spec, args.compile, args.per_process
            ):
                rows[label].append(res)
                print(f"round {r + 1} {label:>8} #{res.get('nth', 1)} ({res.get('started_by', 'spawn')}): "
                      f"{res['start_s']:.3f} s  steps {res['steps']}", flush=True)  # fmt: skip
    skip = 1 if args.per_process > 1 else 0  # the first of each process also starts its fork server
    first = next(iter(variants))
    base = statistics.median(x["start_s"] for x in rows[first] if x.get("nth", 1) > skip)
    summary = {}
    for label, all_results in rows.items():
        results = [x for x in all_results if x.get("nth", 1) > skip]
        med = statistics.median(x["start_s"] for x in results)
        spread = (max(x["start_s"] for x in results) - min(x["start_s"] for x in results)) / med
        summary[label] = {"median_s": round(med, 3), "range_rel": round(spread, 3), "ratio": round(med / base, 3),
                          "notes": results[-1]["notes"], "started_by": sorted({x.get("started_by", "spawn") for x in results}),
                          "first_s": [x["start_s"] for x in all_results if x.get("nth", 1) == 1]}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "summary": summary,
                                        "rows": rows}, indent=1))  # fmt: skip
    print(f"\n{'variant':>10} {'median s':>9} {'range':>7} {'ratio':>6}")
    for label, s in summary.items():
        print(f"{label:>10} {s['median_s']:>9.3f} {s['range_rel']:>7.1%} {s['ratio']:>6.3f}")
    for label, s in summary.items():
        print(f"{label} notes: {s['notes']}")


if __name__ == "__main__":
    main()
