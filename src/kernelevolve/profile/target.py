"""The process a profiler watches: one candidate, one shape, a few calls, nothing else of ours.

    python -m kernelevolve.profile.target SPEC CANDIDATE --shape NAME --device cuda:0 \
        --mode ncu|torch --out RESULT.json [--lease KEY [--warm-before-lease]]

The candidate is untrusted code, so this runs in its own process with the worker's scrubbed
environment and resource limits (`profile/run.py` starts it), never in the engine. Inputs and
weights are built exactly as the harness builds them (`evaluate.inputs`), before the candidate's
calls; the calls run inside the NVTX range `kernelevolve.candidate`, which is what `ncu` is told to
profile, so input generation and copies are not counted as the candidate's kernels.

With `--lease`, the device's lease (`evaluate/lease.py`) is taken once torch, the spec and the
candidate's module are imported, and given back as soon as the measured calls have finished on the
device: the host's part of a profile (python, imports, Nsight Compute's own start; torch.profiler's
trace, turned into events and summarized; the result written, the process's end) never keeps an
evaluation waiting. (Held to the process's end, as it was until 2026-11-27, a profile kept the lease
2.7 s under torch.profiler and 2.9 s under ncu on an H200, where its calls took a fraction of that;
1.7 s in all for both since, on an H100.) With `--warm-before-lease` (a GPU, where a worker's
preparation also runs beside timings: its reference outputs, the torch.compile baseline's warm-up)
CUDA's start, the inputs and weights, and the candidate's first call (which compiles and loads its
kernels) come before the lease too, so the lease covers only what is measured; that one
call runs beside whatever holds the lease, against timings that take medians over many rounds. On the
CPU nothing runs beside a timing, so the lease comes first. `device_s` in the result: how long the
lease was held. Under ncu the candidate is called twice (the first call, and one inside the range):
ncu intercepts every launch, so each extra call costs.

Mode `torch` records the calls with torch.profiler (kernel count, per-kernel time, launch overhead);
mode `ncu` only makes the calls (ncu, outside, collects the metrics). Profiling is diagnosis, not
fitness: a candidate that tampers with the profiler in its own process can only mislead its own
diagnosis, never its verdict.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

RANGE = "kernelevolve.candidate"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernelevolve.profile.target")
    ap.add_argument("spec")
    ap.add_argument("candidate")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--mode", choices=("ncu", "torch"), default="torch")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lease", default=None, help="take this device lease before touching the device")
    ap.add_argument("--warm-before-lease", action="store_true",
                    help="build the inputs and make the first call before taking the lease (a GPU)")  # fmt: skip
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"ok": False}
    try:
        out = _profile(args) | {"ok": True}
    except BaseException as exc:  # reported as a value: the caller records it in the diagnosis
        out["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    Path(args.out).write_text(json.dumps(out))
    return 0 if out["ok"] else 1


def _profile(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from kernelevolve.evaluate.inputs import make_inputs, make_model, share_weights
    from kernelevolve.spec import import_spec_module, load_spec

    spec = load_spec(args.spec)
    module = import_spec_module(spec.path)
    shape = spec.shape(args.shape)
    device = torch.device(args.device)
    if spec.precision != "strict_fp32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = "kernelevolve_profiled_candidate"
    loader = importlib.util.spec_from_file_location(name, args.candidate)
    assert loader is not None and loader.loader is not None
    cand_module = importlib.util.module_from_spec(loader)
    sys.modules[name] = cand_module
    loader.loader.exec_module(cand_module)
    lease: Lease | None = None
    if args.lease and not args.warm_before_lease:
        lease = Lease(args.lease)
    inputs = make_inputs(spec, module, shape, 4242, "spec", device)
    reference = make_model(spec, module, module.Model, shape, device)
    candidate = make_model(spec, module, cand_module.ModelNew, shape, device)
    share_weights(reference, candidate)
    cuda = device.type == "cuda"

    def call() -> Any:
        with torch.no_grad():
            return candidate(*inputs)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    call()  # compiles and loads the candidate's kernels
    sync()
    if lease is None and args.mode == "torch" and cuda:  # Kineto's and CUPTI's start: host work
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            pass
    if lease is None:
        lease = Lease(args.lease)
    if args.mode == "ncu":  # the first call compiled and loaded; one call in the range: every other
        torch.cuda.nvtx.range_push(RANGE)  # call would cost ncu's interception of its launches
        call()
        sync()  # ncu replays each kernel of the range during its launch: done on the device here
        torch.cuda.nvtx.range_pop()
        return {"shape": shape.name, "device_s": lease.release()}
    from kernelevolve.profile.torchprof import profile_calls

    # warms, times, records; the lease goes back once the recorded calls are done on the device
    summary = profile_calls(call, iters=args.iters, device="cuda" if cuda else "cpu", recorded=lease.release)
    return {"shape": shape.name, "iters": args.iters, "wall_us_per_call": summary.wall_us_per_call,
            "profiler": summary.to_dict(), "device_s": lease.release()}  # fmt: skip


class Lease:
    """The device's lease (`key`; None: no lease, only the clock), held from construction until
    `release`, which gives it back once and returns the seconds it was held."""

    def __init__(self, key: str | None):
        from kernelevolve.evaluate.lease import DeviceLease

        self._lease = DeviceLease(key).acquire() if key else None
        self._since = time.perf_counter()
        self._held: float | None = None

    def release(self) -> float:
        if self._held is None:
            if self._lease is not None:
                self._lease.release()
            self._held = round(time.perf_counter() - self._since, 3)
        return self._held


if __name__ == "__main__":
    raise SystemExit(main())
