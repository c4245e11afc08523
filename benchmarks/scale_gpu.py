"""Executor throughput on GPUs: candidates per minute with 1, 2, ... N GPUs, local and Ray executors,
and how busy the GPUs were while it ran.

Each configuration evaluates `--per-gpu` candidates per GPU it uses (the twenty Triton softmax
variants of `softmax_variants.py`, again and again, each repetition marked so each is a distinct
evaluation) through the product's executor (`open_evaluator`), with `workers` = 2 per GPU and as many
in flight. The GPU busy fraction is NVML's utilization (the share of time a kernel was running),
sampled by `nvidia-smi` every 200 ms on the GPUs in use. The ratios N GPUs / 1 GPU are measured in
one run, side by side.

    PYTHONPATH=src python benchmarks/scale_gpu.py --out /tmp/scale.json              # local, 1 and 2 GPUs
    PYTHONPATH=src python benchmarks/scale_gpu.py --gpus 1,2,4 --out /tmp/scale.json # 1, 2 and 4
    PYTHONPATH=src python benchmarks/scale_gpu.py --ray --out /tmp/scale.json        # and Ray (the extra)
    PYTHONPATH=src python benchmarks/scale_gpu.py --ray --no-local --gpus 1,2,4      # Ray alone

Prints a short table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import softmax_variants  # noqa: E402

from kernelevolve.config import Settings  # noqa: E402
from kernelevolve.evaluate.executors import Request, open_evaluator  # noqa: E402
from kernelevolve.jobs import hardware_profile  # noqa: E402
from kernelevolve.platforms import get_platform  # noqa: E402
from kernelevolve.spec import load_spec  # noqa: E402
from kernelevolve.store import Workspace  # noqa: E402

SPEC = ROOT / "examples" / "softmax" / "spec.py"


class Utilization:
    """nvidia-smi sampling the GPUs' utilization while the block runs."""

    def __init__(self, devices: list[int]):
        self.devices = devices
        self.samples: dict[int, list[int]] = {d: [] for d in devices}

    def __enter__(self) -> Utilization:
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                index, util = (int(v) for v in line.split(","))
            except ValueError:
                continue
            if index in self.samples:
                self.samples[index].append(util)

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait()

    def busy(self) -> dict[int, float | None]:
        return {d: (sum(s) / len(s) / 100 if s else None) for d, s in self.samples.items()}


def sources(tmp: Path, count: int) -> list[tuple[str, str]]:
    """`count` distinct candidates: the variants, then each again with a marker line per repetition."""
    paths = softmax_variants.write(tmp / "variants")
    first = [(p.read_text(), p.name) for p in paths]
    items = []
    for k in range(-(-count // len(first))):
        items += [(src if k == 0 else f"{src}\n# again {k}\n", name if k == 0 else f"again{k}-{name}")
                  for src, name in first]  # fmt: skip
    return items[:count]


def measure(executor: str, devices: list[int], settings: Settings, profile: dict[str, Any],
            items: list[tuple[str, str]]) -> dict[str, Any]:  # fmt: skip
    workers = 2 * len(devices)
    s = replace(settings, executor=executor, devices=",".join(map(str, devices)), workers=workers)
    if executor == "ray":  # Ray places the actors; it sees the GPUs named here
        import os

        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    spec = load_spec(SPEC)
    request = Request(spec, get_platform("cuda"), s, profile=profile)
    t_open = time.perf_counter()
    with open_evaluator(request) as evaluator, Utilization(devices) as util:
        ready = time.perf_counter() - t_open
        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers) as ex:
            verdicts = list(ex.map(lambda it: evaluator.evaluate_one(it[0], it[1]), items))
        wall = time.perf_counter() - t0
    statuses: dict[str, int] = {}
    for v in verdicts:
        statuses[str(v.status)] = statuses.get(str(v.status), 0) + 1
    return {
        "executor": executor, "devices": devices, "workers": workers, "candidates": len(verdicts),
        "wall_s": round(wall, 1), "start_s": round(ready, 1), "per_min": round(len(verdicts) / wall * 60, 1),
        "busy": util.busy(), "statuses": statuses,
        "device_index": sorted({v.method.device_index for v in verdicts if v.method.device_index is not None}),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ray", action="store_true", help="also the Ray executor (a local Ray instance)")
    ap.add_argument("--no-local", action="store_true", help="not the local executor (with --ray: Ray alone)")
    ap.add_argument("--gpus", default="1,2", help="GPU counts to measure, comma-separated (default 1,2)")
    ap.add_argument("--per-gpu", type=int, default=20, help="candidates per GPU used (default 20)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    count = torch.cuda.device_count()
    sizes = sorted({int(n) for n in args.gpus.split(",") if n.strip()})
    if not sizes or sizes[0] < 1 or sizes[-1] > count or 1 not in sizes:
        print(
            f"--gpus {args.gpus}: needs 1 among the counts and at most the {count} GPUs seen", file=sys.stderr
        )
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="kernelevolve-scale-"))
    settings = Settings(
        workspace=tmp / "ws", platform="cuda", baselines=["eager", "compile"], spares=1
    ).validate()
    with Workspace.open(settings.workspace) as ws:
        profile, _ = hardware_profile(get_platform("cuda"), settings, ws)
    items = sources(tmp, args.per_gpu * sizes[-1])
    rows = []
    executors = ([] if args.no_local else ["local"]) + (["ray"] if args.ray else [])
    if not executors:
        print("--no-local without --ray leaves nothing to measure", file=sys.stderr)
        return 2
    for executor in executors:
        for n in sizes:
            rows.append(measure(executor, list(range(n)), settings, profile, items[: args.per_gpu * n]))
            print("ROW " + json.dumps(rows[-1]), flush=True)  # kept if a time limit cuts the rest
    record = {
        "date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__, "command": "PYTHONPATH=src python benchmarks/scale_gpu.py " + " ".join(sys.argv[1:]),
        "rows": rows,
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    print("| executor | GPUs | workers | candidates/min | x vs 1 GPU | GPU busy | statuses |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        one = next(o for o in rows if o["executor"] == r["executor"] and len(o["devices"]) == 1)
        busy = ", ".join("-" if b is None else f"{b:.0%}" for b in r["busy"].values())
        print(f"| {r['executor']} | {len(r['devices'])} | {r['workers']} | {r['per_min']} | "
              f"{r['per_min'] / one['per_min']:.2f} | {busy} | {r['statuses']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
