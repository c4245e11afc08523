"""Benchmark of the harness itself on a GPU: fidelity, agreement with ncu, throughput, roofline.

    python benchmarks/harness_gpu.py --out DIR [--reps 10] [--skip-ncu]

1. Fidelity: one Triton softmax measured `reps` times (each a full evaluation in a fresh worker,
   interleaved with its eager baseline) at a >= 100 us size and at a 10-100 us size. Reported: the
   relative range (max - min) / median of the per-evaluation medians, of the candidate's time and of
   its speedup. Targets: <= 2% at >= 100 us, <= 5% at 10-100 us.
2. ncu: the same kernel at the large size under Nsight Compute (`--clock-control none`: clocks are
   left as found; caches flushed before each replay, like the harness's L2 flush); its
   gpu__time_duration against the harness's median. Target: within 5%.
3. Throughput: 20 softmax variants (`softmax_variants.py`) fully evaluated (static guards,
   correctness, timing against eager and torch.compile) through the default pool. Target: >= 10
   candidates per GPU-minute (wall time of the whole batch, first worker's start-up included).
4. Roofline: the fraction of measured copy bandwidth reached by the tutorial-style softmax and by an
   elementwise op (GELU), per shape.
Writes `harness_gpu.json` into --out and prints a short table last.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).parent))

import softmax_variants  # noqa: E402

from kernelevolve import jobs  # noqa: E402
from kernelevolve.config import Settings, load_settings  # noqa: E402
from kernelevolve.evaluate import EvaluatorPool, Verdict  # noqa: E402
from kernelevolve.platforms import get_platform  # noqa: E402
from kernelevolve.spec import load_spec  # noqa: E402
from kernelevolve.store import Workspace  # noqa: E402

CANDIDATE = ROOT / "examples" / "softmax" / "triton_rowsoftmax.py"
SPEC_TEMPLATE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn({rows}, {cols})]
"""
SIZES = {"large": (16384, 8192), "medium": (2048, 4096)}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fidelity(tmp: Path, settings: Settings, profile: dict[str, Any], reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    source = CANDIDATE.read_text()
    for label, (rows, cols) in SIZES.items():
        spec_path = tmp / f"softmax_{label}.py"
        spec_path.write_text(SPEC_TEMPLATE.format(rows=rows, cols=cols))
        s = replace(settings, baselines=["eager"], fitness_baseline="eager", spares=2, workers=1)
        t0 = time.perf_counter()
        with EvaluatorPool(load_spec(spec_path), get_platform("cuda"), s, profile=profile) as pool:
            verdicts = [pool.evaluate_one(source, f"{label}-{i}") for i in range(reps)]
        bad = [v.message for v in verdicts if not v.ok]
        if bad:
            raise SystemExit(f"fidelity {label}: not ok: {bad[0]}")
        cand = [v.shapes[0].candidate.median_s for v in verdicts]  # type: ignore[union-attr]
        eager = [v.shapes[0].eager.median_s for v in verdicts]  # type: ignore[union-attr]
        speed = [v.speedup_vs_eager for v in verdicts]
        out[label] = {
            "shape": [rows, cols],
            "candidate_median_us": [round(c * 1e6, 2) for c in cand],
            "eager_median_us": [round(e * 1e6, 2) for e in eager],
            "speedup_vs_eager": [round(x, 4) for x in speed],  # type: ignore[arg-type]
            "candidate_range": (max(cand) - min(cand)) / statistics.median(cand),
            "speedup_range": (max(speed) - min(speed)) / statistics.median(speed),  # type: ignore[type-var,arg-type,operator]
            "within_eval_spread": statistics.median(v.shapes[0].candidate.spread for v in verdicts),  # type: ignore[union-attr]
            "cuda_graphs": verdicts[0].shapes[0].cuda_graphs,
            "roofline_fraction": verdicts[0].shapes[0].roofline_fraction,
            "trials_per_eval": verdicts[0].shapes[0].candidate.n,  # type: ignore[union-attr]
            "wall_s": time.perf_counter() - t0,
        }
        log(
            f"fidelity {label}: median {statistics.median(cand) * 1e6:.1f} us, range {out[label]['candidate_range']:.2%}"
        )
    return out


NCU_TARGET = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("cand", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
model = mod.ModelNew()
for i in range(7):
    torch.manual_seed(i)
    x = torch.randn({rows}, {cols}, device="cuda")
    model(x)
torch.cuda.synchronize()
"""


def ncu(tmp: Path, harness_median_us: float) -> dict[str, Any]:
    exe = shutil.which("ncu") or next(iter(sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))), None)
    if exe is None:
        return {"error": "ncu not found"}
    rows, cols = SIZES["large"]
    target = tmp / "ncu_target.py"
    target.write_text(NCU_TARGET.format(rows=rows, cols=cols))
    cmd = [str(exe), "--clock-control", "none", "--cache-control", "all", "--kernel-name", "regex:softmax_kernel",
           "--metrics", "gpu__time_duration.sum", "--csv", "--page", "raw", sys.executable, str(target), str(CANDIDATE)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('"')]
    if len(lines) < 3:
        return {"error": "no ncu rows", "stdout": proc.stdout[-2000:], "stderr": proc.stderr[-2000:]}
    table = list(csv.reader(io.StringIO("\n".join(lines))))
    header, units, rows_ = table[0], table[1], table[2:]
    col = header.index("gpu__time_duration.sum")
    scales = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
    if units[col] not in scales:
        return {"error": f"unknown unit {units[col]!r} for gpu__time_duration.sum"}
    scale = scales[units[col]]
    durations = [float(r[col].replace(",", "")) * scale for r in rows_]
    med = statistics.median(durations)
    return {
        "kernel_durations_us": durations,
        "ncu_median_us": med,
        "harness_median_us": harness_median_us,
        "unit": units[col],
        "difference": (harness_median_us - med) / med,
        "command": " ".join(cmd[:-3]) + " python <target> <candidate>",
    }


def throughput(tmp: Path, settings: Settings, profile: dict[str, Any], ws: Workspace) -> dict[str, Any]:
    spec_path = ROOT / "examples" / "softmax" / "spec.py"
    paths = softmax_variants.write(tmp / "variants")
    spec = load_spec(spec_path)
    platform = get_platform("cuda")
    s = jobs.sized_for(settings, platform, len(paths))
    trusted = ws.cache_dir(f"compile-bench-{spec.fingerprint}") / "inductor"
    t0 = time.perf_counter()
    with EvaluatorPool(spec, platform, s, profile=profile, trusted_cache=trusted) as pool:
        verdicts = list(pool.evaluate_many([(p.read_text(), p.name) for p in paths]))
    wall = time.perf_counter() - t0
    statuses: dict[str, int] = {}
    for v in verdicts:
        statuses[str(v.status)] = statuses.get(str(v.status), 0) + 1
    best = max(verdicts, key=lambda v: v.fitness)
    return {
        "candidates": len(verdicts),
        "wall_s": wall,
        "per_gpu_minute": len(verdicts) / (wall / 60),
        "workers": s.workers,
        "spares": s.spares,
        "statuses": statuses,
        "best": {
            "name": best.candidate,
            "vs_eager": best.speedup_vs_eager,
            "vs_compile": best.speedup_vs_compile,
        },
        "verdicts": [summary(v) for v in verdicts],
    }


def summary(v: Verdict) -> dict[str, Any]:
    return {
        "name": Path(v.candidate).name,
        "status": str(v.status),
        "vs_eager": v.speedup_vs_eager,
        "vs_compile": v.speedup_vs_compile,
        "roofline": v.roofline_fraction,
        "phases": v.phases,
        "shapes": [
            {
                "name": s.name,
                "us": s.candidate.median_s * 1e6 if s.candidate else None,
                "roofline": s.roofline_fraction,
                "graphs": s.cuda_graphs,
                "vs_eager": s.speedup_vs_eager,
                "vs_compile": s.speedup_vs_compile,
            }
            for s in v.shapes
        ],
    }


def roofline(settings: Settings, profile: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, spec_path, cand in (
        ("softmax (tutorial)", ROOT / "examples/softmax/spec.py", CANDIDATE),
        ("gelu (elementwise)", ROOT / "examples/gelu/spec.py", ROOT / "examples/gelu/triton_gelu.py"),
    ):
        with EvaluatorPool(
            load_spec(spec_path),
            get_platform("cuda"),
            replace(settings, spares=0, workers=1),
            profile=profile,
        ) as pool:
            v = pool.evaluate_one(cand.read_text(), cand.name)
        out[name] = summary(v)
        log(f"roofline {name}: {v.status} {v.message}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--skip-ncu", action="store_true")
    ap.add_argument("--only", default="fidelity,ncu,throughput,roofline")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="kernelevolve-bench-"))
    settings = load_settings(tmp / "ws", {"platform": "cuda"})  # KERNELEVOLVE_* variables apply
    platform = get_platform("cuda")
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
    with Workspace.open(settings.workspace) as ws:
        t0 = time.perf_counter()
        profile, _ = jobs.hardware_profile(platform, settings, ws)
        report["profile"] = {**profile, "measure_s": time.perf_counter() - t0}
        log(f"profile: {profile['device']} copy {profile['bandwidth'] / 1e12:.2f} TB/s")
        only = set(args.only.split(","))

        def save() -> None:  # after every section: a run cut off at its time limit keeps what it measured
            (args.out / "harness_gpu.json").write_text(json.dumps(report, indent=2, default=str))

        save()
        if "fidelity" in only:
            report["fidelity"] = fidelity(tmp, settings, profile, args.reps)
            save()
        if "ncu" in only and not args.skip_ncu and "fidelity" in report:
            report["ncu"] = ncu(tmp, statistics.median(report["fidelity"]["large"]["candidate_median_us"]))
            log(f"ncu: {report['ncu']}")
            save()
        if "throughput" in only:
            report["throughput"] = throughput(tmp, settings, profile, ws)
            save()
        if "roofline" in only:
            report["roofline"] = roofline(settings, profile)
            save()
    print_table(report)


def print_table(r: dict[str, Any]) -> None:
    p = r["profile"]
    v = p.get("versions", {})
    print(f"\n## harness benchmark, {p['device']}, driver {v.get('driver')}, torch {v.get('torch')}, "
          f"triton {v.get('triton')}, {r['date']}")  # fmt: skip
    print(
        f"copy bandwidth {p['bandwidth'] / 1e12:.2f} TB/s; "
        + ", ".join(f"{k} {x / 1e12:.0f} TFLOP/s" for k, x in p["flops"].items())
    )
    for label, f in r.get("fidelity", {}).items():
        print(f"fidelity {label} {f['shape']}: median {statistics.median(f['candidate_median_us']):.1f} us, "
              f"range of {len(f['candidate_median_us'])} medians {f['candidate_range']:.2%} (time), "
              f"{f['speedup_range']:.2%} (speedup vs eager); graphs {f['cuda_graphs']}")  # fmt: skip
    if "ncu" in r and "ncu_median_us" in r["ncu"]:
        n = r["ncu"]
        print(
            f"ncu: {n['ncu_median_us']:.1f} us vs harness {n['harness_median_us']:.1f} us ({n['difference']:+.2%})"
        )
    elif "ncu" in r:
        print(f"ncu: {r['ncu'].get('error')}")
    if "throughput" in r:
        t = r["throughput"]
        print(f"throughput: {t['candidates']} candidates in {t['wall_s']:.0f} s = {t['per_gpu_minute']:.1f}/GPU-minute "
              f"(workers {t['workers']}, spares {t['spares']}); {t['statuses']}; best {t['best']}")  # fmt: skip
    for name, s in r.get("roofline", {}).items():
        shapes = ", ".join(
            f"{x['name']} {x['us']:.1f} us {x['roofline']:.0%}" for x in s["shapes"] if x["us"]
        )
        print(f"roofline {name}: {s['status']}; {shapes}")


if __name__ == "__main__":
    main()
