"""Soak: a long search in which one candidate in ten is faulty, on whatever device is present.

The offline tuner writes the honest candidates for the softmax example (and, once it has nothing new
to try, its best one is replayed with a marker so every candidate is a distinct evaluation); one
candidate in ten, drawn per node, is instead a fault from this platform's list:

    hang    a kernel that never ends (C: a spin loop; Triton: a program spinning on a flag that stays 0)
    crash   C: a null write (SIGSEGV); Triton: a store far out of bounds (an illegal address, which
            poisons the CUDA context)
    oom     host memory (C) or device memory (Triton) asked for until the limit says no

The engine, the executor and the pool are the product's, unchanged; only the synthesizer is wrapped.
At the end the script checks what the issue asks: the run ended by itself (no stuck run), nodes
1..N all evaluated (no lost node), every fault got a failing verdict and every honest candidate a
correct one, and no worker process outlived the run. It prints a short table last and writes a JSON
record (`--out`). Interrupted (SIGINT, a time limit), it says how to go on: `--resume RUN` with the
same `--workspace` continues the run through the product's resume (no node lost, none evaluated
twice, which the checks then cover across both segments); faults are told apart by their nodes'
notes, so the plan survives the restart.

    PYTHONPATH=src python benchmarks/soak.py --candidates 500 --out benchmarks/results/soak.json
    PYTHONPATH=src python benchmarks/soak.py --spec tests/specs/softmax.py    # small shapes (a CPU soak)
    PYTHONPATH=src python benchmarks/soak.py --candidates 500 --devices 0,1 --executor ray
    PYTHONPATH=src python benchmarks/soak.py --candidates 500 --workspace WS --resume RUN   # go on
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from kernelevolve.config import Settings  # noqa: E402
from kernelevolve.evaluate.sandbox import descendants  # noqa: E402
from kernelevolve.optimize import build_engine, start  # noqa: E402
from kernelevolve.platforms import select  # noqa: E402
from kernelevolve.search.limits import Limits  # noqa: E402
from kernelevolve.search.policies import SearchConfig  # noqa: E402
from kernelevolve.store import Workspace  # noqa: E402
from kernelevolve.synth import SynthConfig  # noqa: E402
from kernelevolve.synth.base import Proposal, Task, Tools  # noqa: E402

SPEC = ROOT / "examples/softmax/spec.py"
FAULT_RATE = 0.1

C_FAULTS = r'''
import torch
import torch.nn as nn

from kernelevolve.native import compile_c

_lib = compile_c(r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
void spin(void) { volatile int64_t i = 0; for (;;) i++; }
void null_write(void) { volatile int *p = 0; *p = 1; }
void hoard(void) { for (;;) { char *p = malloc(1 << 28); if (!p) abort(); memset(p, 1, 1 << 28); } }
""")


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        _lib.FAULT()
        return y
'''

TRITON_FAULTS = r"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def spin(flag_ptr, y_ptr):
    i = 0
    while tl.load(flag_ptr + i * 0) == 0:  # the flag stays 0: the program never ends
        i += 1
    tl.store(y_ptr, i)


@triton.jit
def far_store(y_ptr):
    tl.store(y_ptr + (1 << 40), 1.0)  # a terabyte past the allocation: an illegal address


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        kind = "FAULT"
        if kind == "hang":
            spin[(1,)](torch.zeros(1, device=x.device, dtype=torch.int32), y)
        elif kind == "crash":
            far_store[(1,)](y)
        else:
            hoard = [torch.empty(2**34, device=x.device, dtype=torch.uint8) for _ in range(1 << 12)]
            del hoard
        torch.cuda.synchronize()
        return y
"""

C_CALLS = {"hang": "spin", "crash": "null_write", "oom": "hoard"}
FAULT_NOTE = "soak fault: "


def fault_source(kind: str, gpu: bool, node: int) -> str:
    if gpu:
        source = TRITON_FAULTS.replace('"FAULT"', repr(kind))
    else:
        source = C_FAULTS.replace("_lib.FAULT()", f"_lib.{C_CALLS[kind]}()")
    return f"{source}\n# soak node {node}: {kind}\n"


class Soak:
    """The offline tuner, with one proposal in ten replaced by a fault (drawn per node, reproducibly)."""

    def __init__(self, inner: Any, gpu: bool, seed: int = 0):
        self.inner, self.gpu, self.seed = inner, gpu, seed
        self.name = "soak"
        self.last_honest: str | None = None

    def propose(self, task: Task, tools: Tools) -> Proposal:
        rng = random.Random(f"{self.seed}:{task.node_id}")
        if rng.random() < FAULT_RATE:
            kind = rng.choice(sorted(C_CALLS))
            return Proposal(source=fault_source(kind, self.gpu, task.node_id), note=FAULT_NOTE + kind)
        proposal = self.inner.propose(task, tools)
        if proposal.source is None:  # nothing new from the tuner: replay its last kernel, marked
            source = self.last_honest or _example(self.gpu)
            return Proposal(source=f"{source}\n# soak node {task.node_id}: replayed\n", note="soak: replayed")
        self.last_honest = proposal.source
        return proposal


def _example(gpu: bool) -> str:
    return (SPEC.parent / ("triton_rowsoftmax.py" if gpu else "c_rowsoftmax.py")).read_text()


def planned_kind(node: dict[str, Any]) -> str:
    """What the soak put at this node: a fault's kind, or "honest" (from the node's stored note)."""
    note = node.get("note") or ""
    return note[len(FAULT_NOTE) :] if note.startswith(FAULT_NOTE) else "honest"


def _segments(ws_root: Path, add: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    path = ws_root / "soak-segments.json"
    segments = json.loads(path.read_text()) if path.exists() else []
    if add is not None:
        segments.append(add)
        path.write_text(json.dumps(segments, indent=1) + "\n")
    return segments


def _workers_alive() -> int:
    count = 0
    for pid in descendants(os.getpid(), include_zombies=False):
        try:
            if b"kernelevolve.evaluate.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                count += 1
        except OSError:
            pass
    return count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=500)
    ap.add_argument("--spec", type=Path, default=SPEC, help="a softmax spec (the example's by default)")
    ap.add_argument("--workers", type=int, default=0, help="candidates evaluated at once (0: auto)")
    ap.add_argument("--spares", type=int, default=1, help="workers kept preparing ahead of need")
    ap.add_argument("--devices", default="auto")
    ap.add_argument("--executor", default="local")
    ap.add_argument(
        "--run-timeout", type=float, default=20.0, help="seconds before a hanging kernel is killed"
    )
    ap.add_argument("--workspace", type=Path, default=None)
    ap.add_argument("--resume", default=None, metavar="RUN", help="go on with this run (same --workspace)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.resume and not args.workspace:
        ap.error("--resume needs the --workspace the run was started in")

    ws_root = args.workspace or Path(tempfile.mkdtemp(prefix="kernelevolve-soak-"))
    plat = select("auto")
    gpu = plat.name in ("cuda", "rocm")
    settings = Settings(
        workspace=ws_root, devices=args.devices, executor=args.executor, workers=args.workers, spares=args.spares,
        baselines=["eager"], fitness_baseline="eager", timing_budget_s=0.1, min_trials=10, max_trials=60,
        run_timeout_s=args.run_timeout, compile_timeout_s=120, memory_limit_gb=4 if not gpu else 16,
        suspicious_speedup=1000.0, skills=False, warm_start=False, profile="off",
    ).validate()  # fmt: skip
    search = SearchConfig(draft=4)
    run_id = args.resume or start(
        args.spec, settings, search, Limits(budget=args.candidates), SynthConfig("tuner")
    )
    events: Counter[str] = Counter()
    t0 = time.monotonic()
    with Workspace.open(ws_root) as ws:
        engine = build_engine(ws, run_id, on_event=lambda e, d: events.update([e]))
        engine.synth = Soak(engine.synth, gpu)
        try:
            summary = engine.run()
        except KeyboardInterrupt:
            summary = None
        so_far = ws.nodes(run_id)
        done = sum(n["state"] == "evaluated" for n in so_far)
    _segments(
        ws_root, {"wall_s": round(time.monotonic() - t0, 1), "nodes": done, "retries": events.get("retry", 0)}
    )
    if summary is None:
        seen = Counter(f"{planned_kind(n)}:{n['status']}" for n in so_far if n["state"] == "evaluated")
        print(json.dumps({"evaluated": done, "statuses": dict(sorted(seen.items()))}))
        print(f"interrupted with {done} nodes evaluated; go on with: python benchmarks/soak.py --candidates "
              f"{args.candidates} --workspace {ws_root} --resume {run_id} --out ...")  # fmt: skip
        return 3
    segments = _segments(ws_root)
    wall = sum(x["wall_s"] for x in segments)
    leftover = _workers_alive()

    with Workspace.open(ws_root) as ws:
        nodes = ws.nodes(run_id)
    ids = [n["id"] for n in nodes]
    planned = {n["id"]: planned_kind(n) for n in nodes}
    status = Counter(f"{planned[n['id']]}:{n['status']}" for n in nodes)
    faults = [n for n in nodes if planned[n["id"]] in C_CALLS]
    honest = [n for n in nodes if planned[n["id"]] == "honest"]
    checks = {
        "ended by itself": summary["stop_reason"].startswith("candidate budget reached"),
        "nodes 1..N, none lost or duplicated": ids == list(range(1, len(nodes) + 1)) and len(nodes) == args.candidates,
        "every node evaluated": all(n["state"] == "evaluated" for n in nodes),
        "every fault failed": all(n["status"] not in ("ok", "suspicious") for n in faults),
        "every honest candidate correct": all(n["status"] in ("ok", "suspicious") for n in honest),
        "no worker left behind": leftover == 0,
    }  # fmt: skip
    info = next((n for n in nodes if n["status"] == "ok"), None)
    record = {
        "date": datetime.date.today().isoformat(),
        "command": "PYTHONPATH=src python benchmarks/soak.py " + " ".join(sys.argv[1:]),
        "platform": plat.name, "spec": str(args.spec), "host": host.node(), "cpu_count": os.cpu_count(),
        "device": summary.get("method", {}).get("device") if isinstance(summary.get("method"), dict) else None,
        "executor": args.executor, "devices": args.devices, "workers": engine.ctx.settings.workers,
        "candidates": len(nodes), "faults": dict(Counter(planned[n["id"]] for n in faults)),
        "statuses": dict(sorted(status.items())), "wall_s": round(wall, 1),
        "candidates_per_min": round(len(nodes) / wall * 60, 1), "segments": segments,
        "retries": sum(x["retries"] for x in segments),
        "stop_reason": summary["stop_reason"], "checks": checks, "run_id": run_id, "workspace": str(ws_root),
        "best_speedup_vs_eager": summary.get("best_speedup_vs_eager"), "example_ok_node": info and info["id"],
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: record[k] for k in ("statuses", "faults", "stop_reason")}, indent=1))
    print(f"\n| soak | {plat.name}, executor {args.executor}, {record['workers']} workers |")
    print("| --- | --- |")
    print(f"| candidates | {len(nodes)} ({len(faults)} faulty: {record['faults']}) |")
    print(
        f"| wall | {wall:.0f} s in {len(segments)} segment(s) ({record['candidates_per_min']} candidates/min) |"
    )
    for name, ok in checks.items():
        print(f"| {name} | {'yes' if ok else 'NO'} |")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
