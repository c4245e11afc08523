"""Candidates per device-minute, and where a candidate's time goes: `kernelevolve bench` over a few
spec files, one or more versions of the harness side by side, on one device.

    python benchmarks/throughput_gpu.py SPEC.py [SPEC.py ...] [--variant before=OLD/src]
        [--variant "spawn=src;KERNELEVOLVE_WORKER_START=spawn"] [--variant after=src] [--budget 4]
        [--per-device K] [--env KEY=VALUE] [--out FILE.json] [--sample-gpu]

Each variant runs the same bench (a fresh workspace, the offline tuner, the same budget and
`--per-device`, unless a variant sets its own) from a fresh interpreter that imports kernelevolve
from its `src` folder, so an old commit's code runs as it was (`git archive COMMIT src | tar -x -C
DIR`). The variants run in turn, in the order given, each with the machine to itself, and each from a workspace that already holds the
device's hardware profile (measured once, first), so that what is timed is the search. A bench cut
off by `--timeout` still reports what it evaluated until then.

Measured per variant: the bench's wall time; candidates evaluated (every evaluation the workspace
recorded, the finish step's re-measurements included); candidates per minute of that wall time (the
device is the bench's alone, so this is per device-minute); and, over the evaluations, the median of
each start-up step a worker took before its candidate (`worker_start`, spawn to ready, and the steps
`start:device`, `start:spec`, `start:compile_baseline`, `start:reference_outputs`, `start:timer`),
of how long an evaluation waited for a prepared worker (`worker_wait`) and of its own phases; their
sums; how many evaluations' workers loaded their pool's shared reference outputs rather than
computing them (`references_loaded`); the timeline (`timeline`: the first and last verdict from the bench's start, the steady rate
between them, the time the device's lease was held per candidate and as a share of the wall time);
the profiles of new bests the runs took (`profiles`) and the lease their processes held
(`profiles_lease_s`, recorded by code since 2026-11-27; not in `lease_held_s`, which counts the
evaluations'); with `--sample-gpu`, the device's utilization as `nvidia-smi` samples it.

Prints one line per variant, then a table; `--out` writes everything as JSON, and beside it each
variant's workspace database (OUT-VARIANT.db).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("worker_wait", "worker_start", "start:device", "start:spec", "start:compile_baseline",
         "start:reference_outputs", "start:reference_outputs_wait", "start:timer", "lease", "compile", "first-run", "correctness", "timing",
         "timing:warmup", "timing:gc", "timing:inputs", "timing:calls", "timing:checks", "timing:audits")  # fmt: skip

ROW_KEYS = ("name", "correct", "candidates", "speedup_vs_eager", "speedup_vs_compile", "wall_s", "message")


def run_variant(
    name: str, src: Path, specs: list[Path], args: argparse.Namespace, own_env: dict[str, str]
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"throughput-{name}-"))
    folder = work / "specs"
    folder.mkdir()
    for spec in specs:
        shutil.copy(spec, folder / spec.name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(src.resolve())
    env.update(dict(kv.split("=", 1) for kv in args.env))
    env.update({k: v for k, v in own_env.items() if k != "per-device"})
    per_device = own_env.get("per-device") or args.per_device  # a variant's own, else the flag's
    cmd = [sys.executable, "-c", "from kernelevolve.cli import main; main()", "bench", str(folder), "--budget", str(args.budget),
           "--workspace", str(work / "ws"), "--json"]  # fmt: skip
    if per_device is not None:  # else the bench's default
        cmd += ["--per-device", str(per_device)]
    if args.profile_from:  # the device's hardware profile, measured once for every variant
        shutil.copytree(args.profile_from, work / "ws")
    sampler = GpuSampler() if args.sample_gpu else None
    started_at = datetime.now(UTC)
    t0 = time.monotonic()
    rc, stdout, progress = _run_timed(cmd, env, args.timeout, t0)
    stderr = "\n".join(line for _, line in progress)
    wall = time.monotonic() - t0
    busy = sampler.stop() if sampler else None
    doc: dict[str, Any] = {}
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError:
        pass
    phases: dict[str, list[float]] = {}
    statuses: dict[str, int] = {}
    db = work / "ws" / "kernelevolve.db"
    evaluations = 0
    at: list[float] = []  # seconds from the bench's start to each verdict's record
    refs_held: list[float] = []  # per evaluation, its worker's reference outputs under the lease
    loaded = 0  # evaluations whose worker loaded its pool's shared reference outputs (no lease wait)
    # per profile of a new best (a diagnosis with a profile's metrics), the seconds its processes held
    # the lease: recorded in the diagnosis since 2026-11-27 (None for code before that)
    profiles: list[float | None] = []
    if db.exists():
        with sqlite3.connect(db) as conn:
            rows_db = conn.execute("SELECT status, verdict_json, created_at FROM evaluations").fetchall()
            for status, verdict_json, created in rows_db:
                evaluations += 1
                at.append((datetime.fromisoformat(created) - started_at).total_seconds())
                statuses[status] = statuses.get(status, 0) + 1
                steps = json.loads(verdict_json).get("phases") or {}
                loaded += "start:reference_outputs" in steps and "start:reference_outputs_wait" not in steps
                refs_held.append(
                    float(steps.get("start:reference_outputs", 0))
                    - float(steps.get("start:reference_outputs_wait", 0))
                )
                for step, seconds in steps.items():
                    if isinstance(seconds, int | float):
                        phases.setdefault(step, []).append(float(seconds))
            for (diagnosis,) in conn.execute(
                "SELECT diagnosis_json FROM nodes WHERE diagnosis_json IS NOT NULL"
            ):
                metrics = (json.loads(diagnosis) or {}).get("metrics")
                if metrics:
                    held = metrics.get("device_s")
                    profiles.append(sum(float(x) for x in held.values() if x is not None) if held else None)
    profiles_held = [x for x in profiles if x is not None]
    rows = doc.get("results") or []
    if args.out and db.exists():  # every evaluation's phases and time, for a timeline
        shutil.copy(db, args.out.parent / f"{args.out.stem}-{name}.db")
    return {
        "variant": name,
        "src": str(src),
        "rc": rc,
        "wall_s": round(wall, 1),
        "specs": len(specs),
        "rows": [{k: r.get(k) for k in ROW_KEYS} for r in rows],
        "evaluations": evaluations,
        "statuses": statuses,
        "references_loaded": loaded,
        "per_minute": round(evaluations / (wall / 60), 1) if wall > 0 else None,
        "medians": {k: round(statistics.median(v), 2) for k, v in sorted(phases.items())},
        "sums": {k: round(sum(v), 1) for k, v in sorted(phases.items())},
        **timeline(sorted(at), phases, sum(refs_held), wall),
        "profiles": len(profiles),
        "profiles_lease_s": round(sum(profiles_held), 1) if profiles_held else None,
        "profiles_lease_share": round(sum(profiles_held) / wall, 2) if profiles_held and wall > 0 else None,
        "gpu_busy": busy,
        # the bench's progress lines, seconds from its start: where its start-up went
        "progress": [[round(t, 1), line[:160]] for t, line in progress[:400]],
        "stderr_tail": stderr[-3000:] if rc else "",
    }


def timeline(at: list[float], phases: dict[str, list[float]], refs: float, wall: float) -> dict[str, Any]:
    """When the verdicts came, and how much of the wall time the device's lease was held for them.

    `first_verdict_s`, `last_verdict_s`: from the bench's start. `steady_per_minute`: verdicts
    between the first and the last, per minute of that span (the bench's start-up and its last
    search's tail left out). `lease_held_s`: the sum over evaluations of the phases run under the
    lease (first run, correctness, timing) and `refs`, their workers' reference outputs' time under it
    (`start:reference_outputs` less its wait, per evaluation), per candidate and as a share of the wall."""
    if not at:
        return {}
    under = sum(sum(phases.get(k, [])) for k in ("first-run", "correctness", "timing"))
    span = at[-1] - at[0]
    return {
        "first_verdict_s": round(at[0], 1),
        "last_verdict_s": round(at[-1], 1),
        "steady_per_minute": round((len(at) - 1) / (span / 60), 1) if span > 0 else None,
        "lease_held_s": round(under + refs, 1),
        "lease_held_per_candidate_s": round((under + refs) / len(at), 2),
        "lease_held_share": round((under + refs) / wall, 2) if wall > 0 else None,
    }


class GpuSampler:
    """The device's utilization (`nvidia-smi`, every 200 ms) while a variant's bench runs: the mean,
    and the share of samples in which a kernel ran."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip

    def stop(self) -> dict[str, float] | None:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        samples = [float(x) for line in out.splitlines() for x in line.split(",")[:1] if x.strip().isdigit()]
        if not samples:
            return None
        return {
            "mean_utilization": round(statistics.mean(samples), 1),
            "share_busy": round(sum(1 for x in samples if x > 0) / len(samples), 2),
            "samples": len(samples),
        }


def _run_timed(
    cmd: list[str], env: dict[str, str], timeout: float, t0: float
) -> tuple[int, str, list[tuple[float, str]]]:
    """Run the bench; its stdout, and each line of its stderr (progress) with the seconds since `t0`
    it came at. Cut off at `timeout`: rc 124 and what was printed until then."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    progress: list[tuple[float, str]] = []
    out: list[str] = []

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            progress.append((time.monotonic() - t0, line.rstrip()))

    def read_out() -> None:
        assert proc.stdout is not None
        out.append(proc.stdout.read())

    readers = [threading.Thread(target=f, daemon=True) for f in (read_err, read_out)]
    for r in readers:
        r.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:  # what was evaluated until then still counts
        proc.kill()
        proc.wait()
        rc = 124
    for r in readers:
        r.join(timeout=10)
    return rc, "".join(out) if rc != 124 else "", progress


def measure_profile(src: Path, extra_env: dict[str, str]) -> Path:
    """A workspace holding this device's hardware profile, measured once."""
    ws = Path(tempfile.mkdtemp(prefix="throughput-profile-")) / "ws"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({**extra_env, "PYTHONPATH": str(src.resolve())})
    code = (
        "import sys; from pathlib import Path; from kernelevolve.config import Settings; "
        "from kernelevolve.jobs import hardware_profile; from kernelevolve.platforms import select; "
        "from kernelevolve.store import Workspace; s = Settings(workspace=Path(sys.argv[1])).validate(); "
        "ws = Workspace.open(s.workspace); hardware_profile(select(s.platform), s, ws); ws.close()"
    )
    subprocess.run([sys.executable, "-c", code, str(ws)], env=env, check=True, timeout=600)
    return ws


def _variant(text: str) -> tuple[str, str, dict[str, str]]:
    name, rest = text.split("=", 1)
    src, *pairs = rest.split(";")
    return name, src, dict(kv.split("=", 1) for kv in pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="+", type=Path)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=SRC_FOLDER[;KEY=VALUE...] (default: now=src); KEY=VALUE for this variant alone "
                         "(an environment variable, or per-device=N for its bench's --per-device)")  # fmt: skip
    ap.add_argument("--budget", type=int, default=4)
    ap.add_argument(
        "--per-device", type=int, default=None, help="the bench's --per-device (default: its own)"
    )
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every variant's bench")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per variant's bench")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--sample-gpu", action="store_true", help="sample the GPU's utilization (nvidia-smi)")
    args = ap.parse_args()
    variants = [_variant(v) for v in args.variant] or [("now", str(ROOT / "src"), {})]
    # Measured by the oldest version given: a newer one reads its workspace (its migrations run
    # forward), an older one refuses a workspace a newer one wrote.
    args.profile_from = measure_profile(Path(variants[0][1]), dict(kv.split("=", 1) for kv in args.env))
    results = []
    for name, src, own_env in variants:
        r = run_variant(name, Path(src), args.specs, args, own_env)
        r["variant_env"] = own_env
        results.append(r)
        print(json.dumps({k: r.get(k) for k in ("variant", "rc", "wall_s", "evaluations", "per_minute",
                                                "statuses", "references_loaded", "medians", "first_verdict_s", "steady_per_minute",
                                                "lease_held_per_candidate_s", "lease_held_share", "profiles",
                                                "profiles_lease_s", "gpu_busy")}),
              flush=True)  # fmt: skip
        if r["rc"]:
            print(r["stderr_tail"], file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps({"budget": args.budget, "per_device": args.per_device,
                                        "env": args.env, "results": results}, indent=1))  # fmt: skip
    print(
        f"\n{'variant':<10} {'wall s':>7} {'cands':>6} {'per min':>8}  " + " ".join(f"{s:>10}" for s in STEPS)
    )
    for r in results:
        med = r["medians"]
        cells = " ".join(f"{med.get(s, float('nan')):>10.2f}" for s in STEPS)
        print(
            f"{r['variant']:<10} {r['wall_s']:>7.1f} {r['evaluations']:>6} {r['per_minute'] or 0:>8.1f}  {cells}"
        )


if __name__ == "__main__":
    main()
