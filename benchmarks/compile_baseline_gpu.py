"""torch.compile's baseline per shape, compiled as the harness did before `dynamic=False` against
compiled for each shape's own sizes (what it does now). How much slower was the old baseline?

    python benchmarks/compile_baseline_gpu.py suites/ [--track tf32] [--jobs 6] [--rounds 30] [--out F.json]

A worker compiles one reference per shape, shapes in the spec's order. By torch's default a recompile
for new sizes marks them dynamic, and dynamo keeps that record (by file, line and function name) for
the process and, through its local profile, for later processes: the first worker of a spec on a
machine compiled its first shape static and the others shape-generic ("first"); a later worker
compiled every shape shape-generic from the start ("later"). Each way here compiles its own copy of
the model's forward, "later" after "first" under the same name (so it starts from first's record),
"static" under another with `dynamic=False`; each spec runs in a subprocess with an empty inductor
cache (no record from earlier runs). The references are built as a worker builds them
(`evaluate.inputs`). The timing takes a lock on the GPU (other specs compile meanwhile): per shape,
eager and the three ways in turn, `--rounds` rounds, L2 flushed (a 256 MiB write) before each call,
CUDA events around a CUDA graph's replay of one call (a call where it cannot be captured: training
specs, host work); the median. Prints a table last.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# How each way compiles, and the name its copy of forward takes: "first" and "later" share a name, so
# "later" (compiled after "first") starts from the sizes "first" saw change, as a later worker did.
WAYS: dict[str, tuple[str, dict[str, Any]]] = {
    "first": ("forward_auto", {}),
    "later": ("forward_auto", {}),
    "static": ("forward_static", {"dynamic": False}),
}
LOCK = Path("/tmp/kernelevolve-compile-baseline.lock")


def _own_forward(cls: type, way: str) -> type:
    """`cls` with its forward copied into a code object of this way's name: dynamo keeps compiled graphs
    on the code object and its record of sizes seen by (file, line, name), so "first" and "later" share
    the record, not the graphs, and "static" shares neither."""
    fwd = cls.forward  # type: ignore[attr-defined]
    name = WAYS[way][0]
    code = fwd.__code__.replace(co_name=name, co_qualname=name)
    copy = types.FunctionType(code, fwd.__globals__, name, fwd.__defaults__, fwd.__closure__)
    return type(f"{cls.__name__}_{way}", (cls,), {"forward": copy})


def one(path: Path, track: str, rounds: int) -> dict[str, Any]:
    import torch

    from kernelevolve.bench.runner import track_precision
    from kernelevolve.evaluate.inputs import make_inputs, make_model
    from kernelevolve.evaluate.prepared import forward_backward, trainable_inputs
    from kernelevolve.platforms import get_platform
    from kernelevolve.spec import flatten_outputs, import_spec_module, load_spec

    spec = load_spec(path)
    module = import_spec_module(path)
    device = torch.device("cuda", 0)
    get_platform("cuda").setup(device, track_precision(spec, track))  # as `kernelevolve bench --track`
    classes = {way: _own_forward(module.Model, way) for way in WAYS}
    shapes: list[dict[str, Any]] = []
    for shape in spec.shapes:
        inputs = make_inputs(spec, module, shape, seed=0, distribution="spec", device=device)
        models = {way: make_model(spec, module, classes[way], shape, device) for way in WAYS}
        grads = None
        if spec.backward:
            with torch.no_grad():
                outs = flatten_outputs(spec, models["static"](*inputs))
            grads = [torch.randn_like(o) if o.is_floating_point() else None for o in outs]
        shapes.append({"shape": shape.name, "inputs": inputs, "models": models, "grads": grads})
    compiled: dict[str, list[Any]] = {}
    compile_s: dict[str, float] = {}
    for way in WAYS:  # shapes in the spec's order, as a worker compiles them
        t = time.perf_counter()
        compiled[way] = []
        for s in shapes:
            fn = torch.compile(s["models"][way], **WAYS[way][1])
            forward_backward(
                fn, trainable_inputs(s["inputs"], torch, s["grads"] is not None), s["grads"], torch
            )
            compiled[way].append(fn)
        torch.cuda.synchronize()
        compile_s[way] = round(time.perf_counter() - t, 1)
    flush = torch.empty(256 * 2**20 // 4, device=device)
    rows = []
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for i, s in enumerate(shapes):
            calls = {"eager": s["models"]["static"], **{way: compiled[way][i] for way in WAYS}}
            args = trainable_inputs(s["inputs"], torch, s["grads"] is not None)
            times: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(3):  # warm
                for fn in calls.values():
                    forward_backward(fn, args, s["grads"], torch)
            runs = {name: _replayable(fn, args, s["grads"], torch) for name, fn in calls.items()}
            graphed = {name: run is not None for name, run in runs.items()}
            for _ in range(rounds):
                for name, fn in calls.items():
                    run = runs[name] or functools.partial(forward_backward, fn, args, s["grads"], torch)
                    flush.zero_()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    run()
                    end.record()
                    end.synchronize()
                    times[name].append(start.elapsed_time(end) * 1e3)
            us = {name: statistics.median(v) for name, v in times.items()}
            rows.append({"shape": s["shape"], "us": {k: round(v, 2) for k, v in us.items()}, "graphed": graphed,
                         **{f"{way}_over_static": round(us[way] / us["static"], 3) for way in ("first", "later")}})  # fmt: skip
    return {"spec": spec.name, "track": track, "compile_s": compile_s, "shapes": rows}


def _replayable(fn: Any, args: list[Any], grads: list[Any] | None, torch: Any) -> Any:
    """One call of `fn` captured in a CUDA graph, its replay (device time only, as the harness times
    where it can); None where the call cannot be captured (it is then timed as a call, host included)."""
    from kernelevolve.evaluate.prepared import forward_backward

    if grads is not None:
        return None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward_backward(fn, args, grads, torch)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward_backward(fn, args, grads, torch)
        graph.replay()
        torch.cuda.synchronize()
        return graph.replay
    except Exception:
        torch.cuda.synchronize()
        return None


def _run(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", str(path), "--track", args.track, "--rounds", str(args.rounds)]
    with tempfile.TemporaryDirectory() as cache:  # no record of sizes from an earlier process
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    if proc.returncode != 0:
        return {
            "spec": path.stem,
            "error": proc.stderr.strip().splitlines()[-1:] or ["exit " + str(proc.returncode)],
        }
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--one", type=Path, help="(internal) measure this one spec and print its JSON")
    parser.add_argument("--track", choices=["strict", "tf32"], default="strict")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=6, help="specs compiling at once (timing takes turns)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.track, args.rounds)))
        return
    files = sorted(p for d in args.paths for p in ([d] if d.is_file() else d.rglob("*.py")))
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda p: _run(p, args), files))
    import torch

    doc = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "track": args.track, "rounds": args.rounds, "results": results}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))
    print(f"{'spec':28} {'shape':14} {'eager us':>9} {'first us':>9} {'later us':>9} {'static us':>9} "
          f"{'first/st':>8} {'later/st':>8}")  # fmt: skip
    ratios: dict[str, list[float]] = {"first": [], "later": []}
    for r in results:
        if "error" in r:
            print(f"{r['spec']:28} error: {r['error']}")
            continue
        for s in r["shapes"]:
            us = s["us"]
            for way in ratios:
                ratios[way].append(s[f"{way}_over_static"])
            print(f"{r['spec']:28} {s['shape']:14} {us['eager']:9.1f} {us['first']:9.1f} {us['later']:9.1f} "
                  f"{us['static']:9.1f} {s['first_over_static']:8.3f} {s['later_over_static']:8.3f}")  # fmt: skip
    for way, values in ratios.items():
        if values:
            print(f"{way} worker's baseline / static, {len(values)} shapes: geomean "
                  f"{statistics.geometric_mean(values):.3f}, max {max(values):.2f}, {sum(v > 1.05 for v in values)} above 1.05")  # fmt: skip


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
