"""The worker process: one per candidate, spawned fresh, prepared before the candidate exists.

Life of a worker (`python -m kernelevolve.evaluate.worker`):
1. confine itself (namespaces of its own: no network, no other processes in sight; reads and writes
   confined; see `sandbox.py`) and limit itself (memory, CPU time, file size), then import torch and
   take its device;
2. on `prepare`: load the spec, build the reference per shape, compile the torch.compile baseline
   and warm it, compute the reference's outputs (and gradients) for every correctness trial and
   count FLOPs and bytes for the roofline, or load them from the file an earlier worker of the pool
   shared (`references.py`), install the launch counter. All of this happens before any candidate
   code exists in the process, and it is what keeps start-up off the critical path: the pool keeps
   prepared workers waiting;
3. on `evaluate`: run one candidate (`evaluation.py`) and report one verdict; on `baselines`: time the
   baselines alone; on `profile`: measure the hardware profile;
4. exit without running the candidate's atexit handlers or destructors (`os._exit`).

A watcher thread ends the worker and its process group the moment the engine's end of the command
pipe closes (the engine killed or crashed), so no orphan outlives the run that started it.

A worker never evaluates a second candidate: whatever the first did to the process dies with it.
Threat model: see `sandbox.py` (namespaces, reads and writes, process limits), `guards.py` and `runtime.py` (what a
candidate may do).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import os
import select
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from kernelevolve.errors import SpecError
from kernelevolve.evaluate import references
from kernelevolve.evaluate.messages import BaselinesMsg, EvaluateMsg, PrepareMsg, ProfileMsg, job_from_dict
from kernelevolve.evaluate.prepared import (
    Prepared,
    ShapeState,
    forward_backward,
    memory_mark,
    memory_peak,
    trainable_inputs,
)
from kernelevolve.evaluate.protocol import Channel


def prepare(msg: PrepareMsg, notes: list[str]) -> Prepared:
    import torch

    from kernelevolve.evaluate.runtime import LaunchCounter
    from kernelevolve.platforms import get_platform

    t0 = time.perf_counter()
    from kernelevolve.integrity import check

    harness = check(git=False, expected_digest=msg.harness_digest)  # before any spec or candidate
    platform = get_platform(msg.platform)
    device = torch.device(platform.device_string(msg.device_index))
    platform.setup(device, msg.precision)
    if device.type == "cuda" and msg.gpu_memory_fraction:
        torch.cuda.set_per_process_memory_fraction(float(msg.gpu_memory_fraction), device)
    versions = platform.versions()
    import kernelevolve

    state = Prepared(
        platform=platform,
        device=device,
        settings=msg.settings,
        notes=list(notes),
        info={
            "device": platform.device_name(device),
            "target": platform.target(device),
            "versions": versions,
            "kernelevolve": kernelevolve.__version__,
            "harness_digest": harness.digest,
        },
        lease_key=msg.lease_key,
    )
    state.info["gpu_memory_fraction"] = msg.gpu_memory_fraction
    launches = LaunchCounter()
    launches.install()
    state.launches = launches
    steps = state.steps
    steps["device"] = time.perf_counter() - t0
    if msg.spec_path:
        t = time.perf_counter()
        start = memory_mark(state, torch)
        _prepare_spec(state, msg, torch)
        state.info["prepare_peak_bytes"] = memory_peak(state, torch, start)
        inner = steps.get("compile_baseline", 0.0) + steps.get("reference_outputs", 0.0)
        steps["spec"] = time.perf_counter() - t - inner  # loading it, models and probe inputs
    t = time.perf_counter()
    state.timer = platform.make_timer(device)
    steps["timer"] = time.perf_counter() - t
    state.info["prepare_s"] = time.perf_counter() - t0
    if msg.report_modules:  # for the engine's bytecode (bytecode.py): no candidate has run here
        from kernelevolve.evaluate.bytecode import module_files

        state.info["module_files"] = module_files()
    state.info["prepare_steps"] = {k: round(v, 3) for k, v in steps.items()}
    return state


def _prepare_spec(state: Prepared, msg: PrepareMsg, torch: Any) -> None:
    from kernelevolve.spec import load_spec, raised_by_spec

    assert msg.spec_path is not None
    path = Path(msg.spec_path)
    spec = load_spec(path, probe=True)
    given = references.Given(Path(msg.references), msg.references_sha256 or "") if msg.references else None
    try:
        _prepare_shapes(state, spec, path, torch, given, msg.share_references)
    except SpecError:
        raise
    except Exception as exc:  # the spec's own code raised it (its reference at a real shape): say where
        said = raised_by_spec(exc, path)
        if said is None:
            raise
        raise said from exc


def _prepare_shapes(
    state: Prepared, spec: Any, path: Path, torch: Any, given: references.Given | None, share_to: str | None
) -> None:
    from kernelevolve.evaluate.inputs import (
        PROBE_SEED,
        check_footprint,
        correctness_cases,
        footprint_need,
        make_inputs,
        make_model,
    )
    from kernelevolve.spec import flatten_outputs, import_spec_module

    module = import_spec_module(path)
    state.spec, state.module = spec, module
    check_footprint(
        spec, _available(state, torch, footprint_need(spec, str(state.device))), str(state.device)
    )
    cases = correctness_cases(spec, state.settings.seeds)
    want_compile = "compile" in state.settings.baselines
    if want_compile:
        _static_compiles(torch, len(spec.shapes))
    probes = {}
    for shape in spec.shapes:
        ref = make_model(spec, module, module.Model, shape, state.device)
        st = ShapeState(shape=shape, reference=ref)
        probe = make_inputs(spec, module, shape, seed=PROBE_SEED, distribution="spec", device=state.device)
        probes[shape.name] = probe
        if spec.backward:
            with torch.no_grad():
                outs = flatten_outputs(spec, ref(*probe))
            gen = torch.Generator(device=state.device).manual_seed(4242)
            st.grad_outputs = [
                torch.randn(o.shape, dtype=o.dtype, device=o.device, generator=gen)
                if o.is_floating_point()
                else None
                for o in outs
            ]
        if want_compile:  # CPU-bound: overlaps other workers' timings on a GPU
            t = time.perf_counter()
            _prepare_compiled(state, st, probe, torch)
            state.steps["compile_baseline"] = (
                state.steps.get("compile_baseline", 0.0) + time.perf_counter() - t
            )
        state.shapes.append(st)
    # The reference's outputs for every trial: from the pool's shared file, or computed here (device
    # work, under the lease where timings could feel it) and, where the pool asks, shared.
    references.prepare(
        state, probes, cases, torch, lambda: _gpu_lease(state), given, Path(share_to) if share_to else None
    )
    state.info["spec"] = spec.name
    state.info["spec_fingerprint"] = spec.fingerprint


def _available(state: Prepared, torch: Any, need: int = 0) -> int:
    """What this worker may still allocate: the device's free memory, within its share of it; where
    the share holds `need` bytes and the free memory does not yet, after waiting for it
    (`memory.available_bytes`)."""
    from kernelevolve.evaluate.memory import available_bytes

    share = None
    fraction = state.info.get("gpu_memory_fraction")
    if state.device.type == "cuda" and fraction:
        total = torch.cuda.get_device_properties(state.device).total_memory
        share = int(float(fraction) * total) - torch.cuda.memory_allocated(state.device)
    read = lambda: state.platform.free_memory(state.device)  # noqa: E731
    return available_bytes(read, share, need, wait=state.device.type == "cuda")


def _gpu_lease(state: Prepared) -> Any:
    if state.platform.exclusive:  # the whole start-up already holds it
        return contextlib.nullcontext()
    from kernelevolve.evaluate.lease import DeviceLease

    return DeviceLease(state.lease_key)


# Recompiles of one frame a static baseline may take beyond its spec's shapes: a module whose forward
# graph-breaks in a layer called at many sizes (a DenseNet's dense layers, one size each) recompiles
# that layer's frame once per size, where a shape-generic compile took one graph for all of them.
RECOMPILES_PER_SHAPE = 64


def _static_compiles(torch: Any, shapes: int) -> None:
    """Let every shape's reference compile for its own sizes: each shape is a recompile of the same
    forward (and of any frame a graph break leaves), so dynamo's recompile limits (8 per frame, 256
    in all, by default) rise to cover a spec's shapes, and a limit hit raises (a baseline error, said
    in the verdict) instead of running eager under compile's name."""
    config = torch._dynamo.config
    per_frame = RECOMPILES_PER_SHAPE * shapes
    if hasattr(config, "recompile_limit"):
        config.recompile_limit = max(int(config.recompile_limit), per_frame)
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(int(config.accumulated_recompile_limit), 4 * per_frame)
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


def _prepare_compiled(state: Prepared, st: ShapeState, probe: list[Any], torch: Any) -> None:
    """torch.compile the reference (default mode, static shapes) and warm it at this shape, before
    any candidate.

    `dynamic=False`: the baseline is compile's kernel for this shape, as a user who runs that shape
    gets it. By default a recompile for a second size marks the changed dimensions dynamic
    ("automatic dynamic shapes"), so every shape after a spec's first was timed against a
    shape-generic kernel (and the third reused it): a slower baseline than compile gives, and a
    speedup over it that the kernel had not earned."""
    if "compile" in state.baseline_errors:
        return
    try:
        from torch._dynamo.utils import counters

        before = dict(counters["inductor"])
        compiled = torch.compile(st.reference, dynamic=False)
        forward_backward(
            compiled, trainable_inputs(probe, torch, st.grad_outputs is not None), st.grad_outputs, torch
        )
        if state.device.type == "cuda":
            torch.cuda.synchronize(state.device)
        st.compiled = compiled
        # Whether the trusted cache served it: the ready info's `compile_cache` says (a miss costs several
        # times a hit; benchmarks/results/2026-11-25-h100-throughput.md).
        cache = state.info.setdefault("compile_cache", {"hit": 0, "miss": 0})
        for word in ("hit", "miss"):
            cache[word] += counters["inductor"].get(f"fxgraph_cache_{word}", 0) - before.get(
                f"fxgraph_cache_{word}", 0
            )
    except Exception as exc:
        traceback.print_exc()  # the whole story, in the worker's log
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        state.baseline_errors["compile"] = f"torch.compile failed in this worker ({msg[:300]})"
        for other in state.shapes:
            other.compiled = None


def _memory_share(state: Prepared, fraction: float | None) -> None:
    """The device memory share the engine gives this evaluation (the pool may have raised it since
    this worker was prepared), set before any candidate code runs."""
    if fraction and state.device.type == "cuda":
        import torch

        torch.cuda.set_per_process_memory_fraction(float(fraction), state.device)


def _end_with_engine(cmd_fd: int) -> None:
    """Watch the engine's end of the command pipe; once it is closed (the engine was killed or
    crashed), end this worker and everything in its process group at once. Otherwise an orphan running
    a kernel that never ends would keep the CPU, a device and its lease until its CPU-time limit, and
    the resumed run would wait behind it."""
    poller = select.poll()
    poller.register(cmd_fd, 0)  # hang-ups and errors are reported whatever is asked for
    while True:
        for _, events in poller.poll():
            if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                with contextlib.suppress(OSError):  # outside its Landlock domain, the stub refuses it
                    os.killpg(0, signal.SIGKILL)
                os._exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kernelevolve-worker")
    parser.add_argument("--cmd-fd", type=int, required=True)
    parser.add_argument("--res-fd", type=int, required=True)
    parser.add_argument("--memory-bytes", type=int, required=True)
    parser.add_argument("--cpu-seconds", type=int, required=True)
    parser.add_argument("--file-bytes", type=int, default=4 * 2**30)
    parser.add_argument("--lease", default=None, help="take this device lease before anything else")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="the worker's own directory: it may write there"
    )
    parser.add_argument("--no-netns", action="store_true", help="keep the network (sandbox_network = false)")
    parser.add_argument(
        "--no-pidns", action="store_true", help="see other processes (sandbox_processes = false)"
    )
    parser.add_argument(
        "--no-landlock", action="store_true", help="read and write anywhere (sandbox_filesystem = false)"
    )
    parser.add_argument("--read", type=Path, action="append", default=[], help="also readable (the spec)")
    parser.add_argument(
        "--protect", type=Path, action="append", default=[], help="never readable, nor a folder above it"
    )
    args = parser.parse_args(argv)
    lease = None
    if args.lease:  # first: even importing torch would disturb a timing running beside us
        from kernelevolve.evaluate.lease import DeviceLease

        lease = DeviceLease(args.lease).acquire()
    from kernelevolve.evaluate.sandbox import apply_limits, confine

    # Next, while this process is one thread and before torch is imported: the namespaces need a
    # single-threaded fork, and Landlock binds only the calling thread and what it starts afterwards.
    notes = confine(
        args.workdir,
        network=not args.no_netns,
        filesystem=not args.no_landlock,
        processes=not args.no_pidns,
        reads=args.read,
        protect=args.protect,
    )
    notes += apply_limits(args.memory_bytes, args.cpu_seconds, args.file_bytes)
    faulthandler.enable(all_threads=True)
    for fd in (args.cmd_fd, args.res_fd):  # programs a candidate might exec never hold our channel
        os.set_inheritable(fd, False)
    threading.Thread(target=_end_with_engine, args=(args.cmd_fd,), daemon=True, name="engine-watch").start()
    chan = Channel(args.cmd_fd, args.res_fd)
    msg = chan.recv()
    if msg is None or msg.get("op") != "prepare":
        os._exit(2)
    try:
        state = prepare(PrepareMsg.from_dict(msg), notes)
    except SpecError as exc:
        chan.send("prep_error", kind="spec", message=str(exc))
        os._exit(0)
    except Exception as exc:
        chan.send(
            "prep_error",
            kind="harness",
            message=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )
        os._exit(0)
    if lease is not None:
        lease.release()
    # What preparation made (torch's modules, the compiled baseline, the reference outputs) lives as
    # long as the worker: frozen, it is out of the collector's reach, so the collection before each
    # timed shape (`timing._no_gc`), under the device lease, walks only what came since. A full one
    # took about 0.2 s per shape on the GPU machine, a third of an evaluation's timing.
    gc.collect()
    gc.freeze()
    chan.send("ready", info=state.info, notes=state.notes, references=state.shared)
    msg = chan.recv()
    if msg is None or msg.get("op") == "stop":
        os._exit(0)
    try:
        job = job_from_dict(msg)
        if isinstance(job, EvaluateMsg):
            from kernelevolve.evaluate.evaluation import evaluate

            _memory_share(state, job.gpu_memory_fraction)

            chan.send("result", verdict=evaluate(state, job, chan).to_dict())
        elif isinstance(job, BaselinesMsg):
            from kernelevolve.evaluate.baselines import time_baselines

            chan.send("result", baselines=time_baselines(state, job, chan), errors=state.baseline_errors)
        elif isinstance(job, ProfileMsg):
            with _gpu_lease(state):  # no other worker's timing beside the measurement
                profile = state.platform.measure_profile(state.device).to_dict()
            chan.send("result", profile=profile)
        else:
            chan.send("error", message=f"unknown op {msg['op']!r}")
    except Exception as exc:  # a harness failure, reported as such, never as the candidate's verdict
        chan.send("error", message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    sys.stdout.flush()
    sys.stderr.flush()
    # Wait to be killed: while this process lives, whatever the candidate started is its descendant,
    # and the engine's kill finds it.
    chan.recv()
    os._exit(0)


if __name__ == "__main__":
    main()
