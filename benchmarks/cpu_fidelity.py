"""How still the CPU clock holds: one kernel evaluated again and again, each time in a fresh worker.

    python benchmarks/cpu_fidelity.py [--reps 10] [--variant before=OLD/src --variant after=src] [--out FILE.json]

The spec is a row-wise cumulative sum at [64, 8000] (float32), the candidate an honest C kernel
(OpenMP over rows, a sequential scan in each): about 300 us on a 2-core machine, the size of the
trial that showed the problem (issue N). Each evaluation is the harness's full one (correctness,
then timing interleaved with eager and torch.compile, default settings), in an engine process of its
own that imports kernelevolve from a variant's `src` (default: this checkout's); with two variants
(an old commit's `src`, from `git archive COMMIT src | tar -x -C DIR`, and this one) their
evaluations alternate, so both meet the same machine. Reported per variant and callee: the median of
each evaluation, the relative range of those medians ((max - min) / median); the fitness, its range
and the noise figure (`spread`) the verdicts reported for it. After every evaluation the same kernel
and eager's cumsum are also timed in a bare loop (a plain process, no harness) for as long: the range
of those medians is the machine's own noise at the time, the floor under any harness's figure.
Target (this machine, alone): the range of 10 candidate medians within 5%.

Prints one line per evaluation, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SPEC = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)


def get_inputs():
    return [torch.rand(64, 8000)]


def get_init_inputs():
    return []
"""

CANDIDATE = r'''
import torch
import torch.nn as nn
from kernelevolve.native import compile_c

_lib = compile_c(r"""
#include <stdint.h>

void cumsum_rows(const float *x, float *y, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float acc = 0.0f;
        for (int64_t c = 0; c < cols; ++c) { acc += xr[c]; yr[c] = acc; }
    }
}
""")


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.cumsum_rows(x, y, x.shape[0], x.shape[1])
        return y
'''


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


CHILD = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from kernelevolve.config import Settings
from kernelevolve.evaluate import EvaluatorPool
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec

spec_path, work, candidate = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]).read_text()
settings = Settings(workspace=work / "ws", platform="cpu", spares=0, timing_budget_s=float(sys.argv[5])).validate()
pool = EvaluatorPool(load_spec(spec_path), get_platform("cpu"), settings, trusted_cache=work / "inductor")
with pool:
    v = pool.evaluate_one(candidate, "cumsum.py")
s = v.shapes[0]
print("RESULT " + json.dumps({
    "ok": v.ok, "message": v.message, "fitness": v.fitness, "fitness_baseline": v.method.fitness_baseline,
    "speedup_vs_eager": v.speedup_vs_eager, "speedup_vs_compile": v.speedup_vs_compile,
    "candidate_us": s.candidate.median_s * 1e6, "eager_us": s.eager.median_s * 1e6,
    "compile_us": s.compile.median_s * 1e6, "candidate_p25_us": s.candidate.p25_s * 1e6,
    "candidate_min_us": s.candidate.min_s * 1e6, "eager_p25_us": s.eager.p25_s * 1e6,
    "candidate_spread": s.candidate.spread, "eager_spread": s.eager.spread, "spread": v.spread,
    "trials": s.candidate.n, "device": v.method.device, "torch": v.method.torch, "python": v.method.python,
}))
"""


BARE = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from kernelevolve.native import compile_c
exec(compile(open(sys.argv[2]).read().split("class ModelNew")[0], "candidate", "exec"))  # _lib
x, flush = torch.rand(64, 8000), torch.empty(16 * 2**20)
ts = {"candidate": [], "eager": []}
end = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end:
    for name in ts:
        flush.fill_(1.0)
        t = time.perf_counter()
        if name == "eager":
            torch.cumsum(x, dim=1)
        else:
            y = torch.empty_like(x)
            _lib.cumsum_rows(x, y, 64, 8000)
        ts[name].append(time.perf_counter() - t)
print("RESULT " + json.dumps({f"{k}_us": statistics.median(v) * 1e6 for k, v in ts.items()}))
"""


def bare(candidate: Path, budget: float) -> dict[str, Any]:
    """The machine's own noise: the same kernel and eager's cumsum, timed alternately in a plain
    process (no harness, no sandbox, no baselines compiled; malloc's thresholds fixed as in the CPU
    workers) for as long as an evaluation times them."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**34)}
    done = subprocess.run(
        [sys.executable, "-c", BARE, str(ROOT / "src"), str(candidate), str(budget)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"the bare loop failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[0].removeprefix("RESULT "))
    return result


def evaluate(src: Path, spec_path: Path, work: Path, candidate: Path, budget: float) -> dict[str, Any]:
    """One evaluation, in a fresh engine process that imports kernelevolve from `src`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(src.resolve()), str(spec_path), str(work), str(candidate), str(budget)],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"an evaluation from {src} failed:\n{done.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(lines[0].removeprefix("RESULT "))
    if not row["ok"]:
        raise SystemExit(f"the candidate was not ok under {src}: {row['message']}")
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        callee: {
            "median_us": round(statistics.median(r[f"{callee}_us"] for r in rows), 2),
            "range_of_medians": round(spread([r[f"{callee}_us"] for r in rows]), 4),
        }
        for callee in ("candidate", "eager", "compile")
    }
    for q in ("candidate_p25", "candidate_min", "eager_p25"):
        out[q] = {"range_of_values": round(spread([r[f"{q}_us"] for r in rows]), 4)}
    out["fitness"] = {
        "median": round(statistics.median(r["fitness"] for r in rows), 4),
        "range": round(spread([r["fitness"] for r in rows]), 4),
        "baseline": rows[0]["fitness_baseline"],
        "reported_spread_median": round(statistics.median(r["spread"] or 0.0 for r in rows), 4),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10, help="evaluations per variant")
    ap.add_argument(
        "--variant", action="append", default=[], help="LABEL=SRC_DIR (repeat; default: this src)"
    )
    ap.add_argument("--timing-budget", type=float, default=1.0, help="timing_budget_s (the default: 1.0)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant) or {"this": str(ROOT / "src")}
    tmp = Path(tempfile.mkdtemp(prefix="kernelevolve-cpu-fidelity-"))
    spec_path, candidate = tmp / "cumsum_rows.py", tmp / "candidate.py"
    spec_path.write_text(SPEC)
    candidate.write_text(CANDIDATE)
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label in variants}
    floor: list[dict[str, Any]] = []  # a bare loop after every evaluation: the machine's own noise
    t0 = time.perf_counter()
    for i in range(args.reps):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))  # alternate who goes first
        for label in order:
            work = tmp / label
            work.mkdir(exist_ok=True)
            row = evaluate(Path(variants[label]), spec_path, work, candidate, args.timing_budget)
            rows[label].append(row)
            floor.append(bare(candidate, args.timing_budget))
            print(f"eval {i + 1:>2} {label:>8}: candidate {row['candidate_us']:7.1f} us  eager {row['eager_us']:7.1f}"
                  f"  compile {row['compile_us']:7.1f}  fitness {row['fitness']:.3f} vs {row['fitness_baseline']}"
                  f" (spread {row['spread'] or 0:.1%})", flush=True)  # fmt: skip
    summary = {label: summarize(r) for label, r in rows.items()}
    summary["bare loop"] = {
        callee: {"median_us": round(statistics.median(r[f"{callee}_us"] for r in floor), 2),
                 "range_of_medians": round(spread([r[f"{callee}_us"] for r in floor]), 4)}
        for callee in ("candidate", "eager")
    }  # fmt: skip
    first = next(iter(rows.values()))[0]
    doc = {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cpus, {first['device']}",
        "torch": first["torch"], "python": first["python"], "reps": args.reps, "timing_budget_s": args.timing_budget,
        "variants": variants, "wall_s": round(time.perf_counter() - t0, 1), "summary": summary, "rows": rows,
        "bare_loop": floor,
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))
    print(f"\n{'variant':>8} {'callee':>10} {'median us':>10} {'range of medians':>17}")
    for label, summ in summary.items():
        for callee in ("candidate", "eager", "compile"):
            if callee not in summ:
                continue
            c = summ[callee]
            print(f"{label:>8} {callee:>10} {c['median_us']:>10.1f} {c['range_of_medians']:>17.1%}")
    for label, summ in summary.items():
        if "fitness" not in summ:
            continue
        f = summ["fitness"]
        print(f"{label}: fitness {f['median']:.3f} vs {f['baseline']}, range {f['range']:.1%}, reported spread "
              f"{f['reported_spread_median']:.1%}; ranges of p25 {summ['candidate_p25']['range_of_values']:.1%}, "
              f"min {summ['candidate_min']['range_of_values']:.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
