"""A `kernelevolve bench` on several GPUs: candidates per minute per GPU, and how busy the GPUs were.

Runs the command given after `--` (a bench writing into `--workspace`), samples every GPU's
utilization with nvidia-smi every 200 ms while it runs, and at the end reads the evaluations the
bench stored during this call (their `created_at` inside the call's wall, grouped by the device
index in their verdict's method). With `--limit SECONDS` the bench is sent SIGINT at the limit (a
bench stops cleanly on it and resumes on the next call), so a long bench can run in segments; each
segment's figures are its own. `--copy-db FILE` writes a consistent copy of the workspace's database
there when the bench has stopped (SQLite's backup: one file, no WAL), small enough to bring back from
a machine that is given back after the call (the bench's report can be written from it with
`kernelevolve benches show ID --workspace DIR --report OUT`, the copy named `kernelevolve.db` in DIR).

    python benchmarks/bench_busy_gpu.py --workspace WS --limit 520 --out seg1.json -- \\
        kernelevolve bench suites --budget 50 --track tf32 --devices all --workspace WS

Prints a short table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_gpu import Utilization

from kernelevolve.store.workspace import DB_NAME


def gpu_indices() -> list[int]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, check=True
    ).stdout  # fmt: skip
    return [int(line) for line in out.split()]


def run_limited(command: list[str], limit: float | None, grace: float) -> int:
    """The command's exit status; SIGINT at `limit` seconds, SIGKILL `grace` seconds after that."""
    proc = subprocess.Popen(command)
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        print(f"bench_busy_gpu: {limit:.0f} s reached, asking the bench to stop (SIGINT)", flush=True)
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def evaluations(workspace: Path, since: str, until: str) -> list[dict[str, Any]]:
    """The evaluations stored between `since` and `until` (ISO UTC, the store's own format)."""
    with sqlite3.connect(workspace / DB_NAME) as conn:
        rows = conn.execute(
            "SELECT created_at, status, verdict_json FROM evaluations WHERE created_at >= ? AND created_at <= ?",
            (since, until),
        ).fetchall()  # fmt: skip
    out = []
    for created, status, verdict_json in rows:
        method = json.loads(verdict_json).get("method") or {}
        out.append({"at": created, "status": status, "device_index": method.get("device_index")})
    return out


def summarize(evals: list[dict[str, Any]], busy: dict[int, float | None], wall: float) -> dict[str, Any]:
    per_device: dict[str, int] = {}
    statuses: dict[str, int] = {}
    for e in evals:
        key = str(e["device_index"])
        per_device[key] = per_device.get(key, 0) + 1
        statuses[e["status"]] = statuses.get(e["status"], 0) + 1
    gpus = max(1, sum(1 for d, b in busy.items() if b))  # the GPUs that ran anything
    return {
        "wall_s": round(wall, 1), "candidates": len(evals),
        "per_min": round(len(evals) / wall * 60, 1), "per_gpu_min": round(len(evals) / wall * 60 / gpus, 1),
        "per_device": per_device, "busy": {str(d): None if b is None else round(b, 3) for d, b in busy.items()},
        "statuses": statuses,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", type=Path, required=True, help="the bench's workspace (its --workspace)")
    ap.add_argument("--limit", type=float, default=None, help="seconds before the bench is asked to stop")
    ap.add_argument("--grace", type=float, default=60.0, help="seconds it has to stop after SIGINT")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--copy-db", type=Path, default=None, help="a copy of the database, once the bench stopped"
    )
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the bench command")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("give the bench command after --", file=sys.stderr)
        return 2
    devices = gpu_indices()
    since = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
    t0 = time.perf_counter()
    with Utilization(devices) as util:
        rc = run_limited(command, args.limit, args.grace)
    wall = time.perf_counter() - t0
    until = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
    record = {
        "command": command, "exit": rc, "since": since, "until": until,
        **summarize(evaluations(args.workspace, since, until), util.busy(), wall),
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    if args.copy_db:
        with sqlite3.connect(args.workspace / DB_NAME) as src, sqlite3.connect(args.copy_db) as dst:
            src.backup(dst)
    busy = ", ".join(f"{d}: {'-' if b is None else f'{b:.0%}'}" for d, b in record["busy"].items())
    print("| wall s | candidates | per min | per GPU-min | per device | GPU busy | exit |")
    print("| ---: | ---: | ---: | ---: | --- | --- | ---: |")
    print(f"| {record['wall_s']} | {record['candidates']} | {record['per_min']} | {record['per_gpu_min']} | "
          f"{record['per_device']} | {busy} | {rc} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
