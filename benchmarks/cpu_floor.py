"""The machine's own CPU timing floor, and what moves it: bare loops with no harness, varied one factor at a time.

    taskset -c 2,3 python benchmarks/cpu_floor.py [--rounds 10] [--seconds 0.7] [--out FILE.json]

`cpu_fidelity.py` found the ranges of ten medians of the same kernel, timed minutes apart in a bare
loop, at 20-53% on each machine it ran on (issue N), above the harness's own. This finds which factor
that floor comes from. Each variant is a fresh process that times one callee in a bare loop for
`--seconds` and reports its median; the variants take turns in a shuffled order, `--rounds` times,
so all of them meet the same moments of the machine. Per variant: the median of the medians and the
relative range of those medians ((max - min) / median), and the median spread within a process
((p75 - p25) / median).

The variants (the C kernel is cpu_fidelity.py's: a row-wise cumulative sum at [64, 8000] float32,
OpenMP over rows, about 300 us on two cores):
- `c, flush, omp 2`: as cpu_fidelity.py's bare loop: a 64 MiB buffer written before every call;
- `c, omp 2`: no flush (the 2 MB working set stays cached);
- `c, flush, omp 1` and `c, omp 1`: one OpenMP thread;
- `c, flush, omp 2 bound`: OMP_PROC_BIND=close, OMP_PLACES=cores (each thread on its own core);
- `matmul 256, 1 thread`: a compute-bound callee in cache (torch.mm, one intra-op thread): the clock alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LOOP = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
kind, flush_mb, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
if kind == "c":
    from kernelevolve.native import compile_c
    lib = compile_c(r'''
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
''')
    x = torch.rand(64, 8000)
    def call():
        y = torch.empty_like(x)
        lib.cumsum_rows(x, y, 64, 8000)
else:
    torch.set_num_threads(1)
    a, b = torch.rand(256, 256), torch.rand(256, 256)
    def call():
        torch.mm(a, b)
flush = torch.empty(flush_mb * 2**18) if flush_mb else None
for _ in range(20):
    call()
ts = []
end = time.perf_counter() + seconds
while time.perf_counter() < end:
    if flush is not None:
        flush.fill_(1.0)
    t = time.perf_counter()
    call()
    ts.append(time.perf_counter() - t)
ts.sort()
q = lambda f: ts[int(f * (len(ts) - 1))]
print("RESULT " + json.dumps({"median_us": statistics.median(ts) * 1e6, "iqr": (q(0.75) - q(0.25)) / statistics.median(ts), "n": len(ts)}))
"""

VARIANTS: dict[str, tuple[str, int, dict[str, str]]] = {
    "c, flush, omp 2": ("c", 64, {"OMP_NUM_THREADS": "2"}),
    "c, omp 2": ("c", 0, {"OMP_NUM_THREADS": "2"}),
    "c, flush, omp 1": ("c", 64, {"OMP_NUM_THREADS": "1"}),
    "c, omp 1": ("c", 0, {"OMP_NUM_THREADS": "1"}),
    "c, flush, omp 2 bound": (
        "c",
        64,
        {"OMP_NUM_THREADS": "2", "OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
    ),
    "matmul 256, 1 thread": ("mm", 0, {"OMP_NUM_THREADS": "1"}),
}


def run(name: str, seconds: float) -> dict:
    kind, flush_mb, env = VARIANTS[name]
    out = subprocess.run(
        [sys.executable, "-c", LOOP, str(ROOT / "src"), kind, str(flush_mb), str(seconds)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=True,
    ).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=0.7, help="each process's timed loop")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        order = list(VARIANTS)
        random.shuffle(order)
        for name in order:
            rows[name].append(run(name, args.seconds))
        print(
            f"round {r + 1}: " + "  ".join(f"{n}={rows[n][-1]['median_us']:.1f}" for n in VARIANTS),
            flush=True,
        )
    summary = {}
    print(f"\n{'variant':>24}  {'median us':>10}  {'range of medians':>16}  {'within (iqr)':>12}")
    for name, rs in rows.items():
        meds = [x["median_us"] for x in rs]
        m = statistics.median(meds)
        summary[name] = {
            "median_us": m,
            "range": (max(meds) - min(meds)) / m,
            "iqr": statistics.median(x["iqr"] for x in rs),
            "medians_us": meds,
        }
        print(f"{name:>24}  {m:10.1f}  {summary[name]['range']:16.1%}  {summary[name]['iqr']:12.1%}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "affinity": sorted(os.sched_getaffinity(0)),
                    "rounds": args.rounds,
                    "seconds": args.seconds,
                    "summary": summary,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
