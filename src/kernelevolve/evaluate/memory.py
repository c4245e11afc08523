"""A spec's memory plan: how many workers fit, and whether one does at all, from the spec's own size
and the device's memory, before any worker starts.

The meta probe counts each shape's inputs, outputs and parameters (`Spec.footprint_bytes`); call the
largest T (of the shape whose need is largest). A worker holds about `WORKER_FACTOR` x T at its peak
(4 on a GPU; 8 on the CPU, whose workers keep glibc's heap rather than return it, for timings that
hold still: freed blocks there are reused but not given back, and how they fragment varies from
one run to the next: a 640 MiB softmax peaked at 8.8-9.3 T with torch's own memory on a 2-core box,
run after run, and ran out of a cap 0.5 GiB above the old estimate of 6 T; on an H100, KernelBench level 1's 19_ReLU, T = 12 GiB, took more than 3.3 T
preparing and 7_Matmul_with_small_K 4 T, each failing at a cap the estimate of 3 T had set in a bench
of several specs); on a GPU its outputs `OUTPUT_FACTOR` (2) times again, which matters where outputs
dominate, as in a matmul with a small inner dimension; plus the reference forward's working memory
beyond its outputs, once (the meta probe counts the tensors it makes and holds at once:
`Spec.intermediate_bytes`); plus its runtime's own memory (a CUDA context, torch.compile's
workspace, torch itself on the CPU):
- preparing: the inputs, the reference's outputs, and two trials' reference outputs kept whole (the
  other trials keep a sample of a large output: `references._kept`);
- checking a candidate: its inputs, its outputs, those two reference outputs (digests stand in for
  copies of large inputs and outputs: `trials._keepsake`);
- timing: the baselines' buffers (shared by eager and torch.compile) and the candidate's, a round's
  fresh inputs, and one output at a time (a baseline's large outputs are poisoned in place after its
  call, not kept: `timing._poison_large`); the reference outputs are gone by then.
On a GPU the plan keeps workers + spares of a pool within 90% of the device's free memory (or within
the part a bench granted the run, `device_share`: `bench.schedule`), lowering their number for a
large spec; a spec one worker cannot hold by the estimate but can by the floor (`FLOOR_FACTOR`: about
3 T and the outputs again, what a timing round keeps) gets one worker with all of the usable memory, and
only a spec above the floor is refused; on the CPU it refuses a spec that the
worker's memory limit (`memory_limit_gb`) cannot hold. The refusal says how much was needed, how much there was, and what to change.

Deliberately an estimate, not a measurement: what a worker really took is measured (the worker's
`prepare_peak_bytes`) and a worker out of memory under its cap is still retried with all of the
run's part of the device, one evaluation at a time (`pool.gpu_shares`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kernelevolve.errors import SpecError

WORKER_FACTOR = {"cpu": 8, "cuda": 4, "rocm": 4}
# Outputs held again on top of that on a GPU: where they dominate, a timing round holds a callee's
# output while the caching allocator keeps the last one's block (KernelBench level 1's
# 7_Matmul_with_small_K, 4 GiB of output in T = 4.02 GiB, ran out at 4 T + 1.8 outputs on an H200).
OUTPUT_FACTOR = {"cpu": 0, "cuda": 2, "rocm": 2}
# A GPU worker's least at its peak, in T: the two sets of input buffers a timing round keeps (the
# baselines' and the candidate's) and a round's fresh inputs, one output at a time (issue G's target
# of about 3 T). Below the estimate: the numbers above were measured in benches of several specs.
FLOOR_FACTOR = 3
RUNTIME_BYTES = {"cpu": 3 * 2**29, "cuda": 2 * 2**30, "rocm": 2 * 2**30}  # a worker's own, before the spec
GIB = 2**30


@dataclass(frozen=True)
class MemoryPlan:
    tensors_bytes: int  # T: the largest shape's inputs, outputs and parameters
    need_bytes: int  # one worker's estimated peak
    budget_bytes: int | None  # what a worker may have (CPU), or the device's usable memory (GPU)
    workers: int
    spares: int
    note: str  # "" unless the plan changed the settings


def worker_need(spec: Any, platform: str) -> tuple[int, int]:
    """(T, one worker's estimated peak) for `spec`, at its most demanding shape; T is 0 where the
    probe could not count it."""
    outputs = getattr(spec, "output_bytes", None)
    tensors, peak = 0, 0
    for shape in spec.shapes:
        size = spec.footprint_bytes(shape.name)
        if size is None:
            continue
        held = (
            factor(platform) * size
            + OUTPUT_FACTOR.get(platform, 2) * ((outputs and outputs(shape.name)) or 0)
            + _intermediates(spec, shape.name)
        )
        if held > peak or (held == peak and size > tensors):
            tensors, peak = size, held
    return tensors, peak + RUNTIME_BYTES.get(platform, RUNTIME_BYTES["cuda"])


def worker_floor(spec: Any, platform: str) -> int:
    """The least a worker could do with at the most demanding shape (`FLOOR_FACTOR` x T, the outputs
    again and its runtime): a GPU spec whose estimate does not fit but whose floor does is tried with
    one worker and all of the device's usable memory; one whose floor does not fit is refused."""
    outputs = getattr(spec, "output_bytes", None)
    floor = 0
    for shape in spec.shapes:
        size = spec.footprint_bytes(shape.name)
        if size is not None:
            extra = OUTPUT_FACTOR.get(platform, 2) * ((outputs and outputs(shape.name)) or 0)
            floor = max(floor, FLOOR_FACTOR * size + extra + _intermediates(spec, shape.name))
    return floor + RUNTIME_BYTES.get(platform, RUNTIME_BYTES["cuda"])


def _intermediates(spec: Any, shape: str) -> int:
    """The reference forward's working memory beyond its outputs (the meta probe's count), held
    once while it runs: level 2's 32_Conv2d_Scaling_Min holds T = 1 GiB and makes 3.9 GiB more (a
    convolution's output and the scaled product of it), and ran out of a 9.6 GiB cap without it."""
    counted = getattr(spec, "intermediate_bytes", None)
    return int(counted(shape)) if counted else 0


def breakdown(spec: Any, platform: str) -> str:
    """How `worker_need` came to its figure, for a message."""
    extra = OUTPUT_FACTOR.get(platform, 2)
    outputs = " and its outputs again" + (f" x {extra}" if extra != 1 else "") if extra else ""
    largest = max((_intermediates(spec, shape.name) for shape in spec.shapes), default=0)
    work = f", the reference's working memory ({largest / GIB:.1f} GiB)" if largest else ""
    return (
        f"{factor(platform)} x that{outputs}{work}, and "
        f"{RUNTIME_BYTES.get(platform, RUNTIME_BYTES['cuda']) / GIB:.1f} GiB of its own"
    )


def factor(platform: str) -> int:
    return WORKER_FACTOR.get(platform, WORKER_FACTOR["cuda"])


def plan(spec: Any, platform: Any, settings: Any, memory: tuple[int, int] | None) -> MemoryPlan:
    """The plan for `spec` under `settings` (workers, spares, device_share resolved), given the device's
    (free, total) bytes (None: unknown, the settings stand). Raises SpecError where one worker cannot
    hold the spec."""
    tensors, need = worker_need(spec, platform.name)
    workers, spares = max(1, settings.workers), max(0, settings.spares)
    if not tensors:  # the probe could not count the tensors: nothing to plan on
        return MemoryPlan(0, need, None, workers, spares, "")
    shape_word = (
        f"{spec.name}'s largest shape holds {tensors / GIB:.2f} GiB of inputs, outputs and parameters"
    )
    if platform.name == "cpu":
        cap = int(settings.memory_limit_gb * GIB)
        if memory is not None:
            cap = min(cap, int(0.9 * memory[1]))  # the worker's limit is capped so too (handle.py)
        if need > cap:
            raise SpecError(
                f"{shape_word}; a worker needs about {need / GIB:.1f} GiB ({breakdown(spec, 'cpu')}), "
                f"over its memory limit of {cap / GIB:.1f} GiB",
                hint=f"raise memory_limit_gb to {need / GIB + 0.5:.0f} (the machine has "
                f"{(memory[1] if memory else 0) / GIB:.0f} GiB), or use smaller shapes in KERNELEVOLVE['shapes']",
            )
        return MemoryPlan(tensors, need, cap, workers, spares, "")
    if memory is None:  # the device's memory is unknown: the settings stand
        return MemoryPlan(tensors, need, None, workers, spares, "")
    free, total = memory
    share = max(1, settings.device_share)
    if settings.gpu_memory_fraction is not None:
        cap = int(settings.gpu_memory_fraction * total)
        if need > cap:
            raise SpecError(
                f"{shape_word}; a worker needs about {need / GIB:.1f} GiB, over the {cap / GIB:.1f} GiB "
                f"that gpu_memory_fraction = {settings.gpu_memory_fraction:g} gives it",
                hint=f"raise gpu_memory_fraction to {need / total + 0.01:.2f} or more, or unset it",
            )
        return MemoryPlan(tensors, need, cap, workers, spares, "")
    # Alone: 90% of what is free. Sharing the device (a bench's run): the part granted to it, which
    # the bench's scheduler keeps clear of the other runs' parts (`bench.schedule`).
    usable = int(0.9 * (min(free, total) if share <= 1 else total / share))
    fits = usable // need
    floor = worker_floor(spec, platform.name)
    if fits < 1 and floor <= usable:  # the estimate is not a measurement: one worker, all of it, tried
        return MemoryPlan(tensors, need, usable, 1, 0, (
            f"memory plan: 1 worker and no spare with all {usable / GIB:.1f} GiB usable: {shape_word}, a "
            f"worker may need about {need / GIB:.1f} GiB (the estimate) and at least {floor / GIB:.1f} GiB; "
            "out of memory there is its verdict, with the numbers"
        ))  # fmt: skip
    if fits < 1:
        where = (
            f"{usable / GIB:.1f} GiB of the device is this run's beside the other runs on it"
            if share > 1
            else f"{usable / GIB:.1f} GiB of the device's {free / GIB:.1f} GiB free ({total / GIB:.0f} GiB in all) "
            "is usable"
        )
        raise SpecError(
            f"{shape_word}; a worker needs about {need / GIB:.1f} GiB ({breakdown(spec, platform.name)}), "
            f"and at least {floor / GIB:.1f} GiB ({FLOOR_FACTOR} x that, its outputs again x "
            f"{OUTPUT_FACTOR.get(platform.name, 2)} and its own), and {where}",
            hint="use smaller shapes in KERNELEVOLVE['shapes']"
            + (", fewer specs per device (--per-device)" if share > 1 else "")
            + ", or a device with more memory",
        )
    planned_workers = min(workers, fits)
    planned_spares = min(spares, fits - planned_workers)
    note = ""
    if (planned_workers, planned_spares) != (workers, spares):
        note = (
            f"memory plan: {planned_workers} worker(s) and {planned_spares} spare(s), not {workers} and "
            f"{spares}: each needs about {need / GIB:.1f} GiB ({shape_word}) and {usable / GIB:.1f} GiB "
            "of the device is this spec's"
        )
    return MemoryPlan(tensors, need, usable, planned_workers, planned_spares, note)


def fit(spec: Any, platform: Any, settings: Any, memory: tuple[int, int] | None) -> tuple[Any, MemoryPlan]:
    """`settings` with the plan's workers and spares, and the plan."""
    p = plan(spec, platform, settings, memory)
    return replace(settings, workers=p.workers, spares=p.spares), p


# A worker whose share holds its spec but whose device's free memory does not yet waits this long for
# it, asking every FREE_POLL_S: a worker that has just exited on the device (the last candidate's, or
# a run's that ended) holds its memory until the driver frees it (on 4 H100s, level 1's norms of
# 14-16 GiB were refused mid-run, "this worker has 49.9 GiB" of the 56 GiB they need).
FREE_WAIT_S = 30.0
FREE_POLL_S = 0.25


def available_bytes(read_free: Callable[[], int], share: int | None, need: int, wait: bool = True) -> int:
    """What a worker may allocate: the device's free memory (`read_free`), within its `share` (None:
    no cap). Where the share holds `need` bytes but the free memory does not, the free memory is read
    again (FREE_WAIT_S at most, where `wait`) until it does; the last reading stands."""
    deadline = time.monotonic() + FREE_WAIT_S
    while True:
        free = read_free()
        available = free if share is None else min(free, share)
        short = available < need and (share is None or share >= need)
        if not short or not wait or time.monotonic() >= deadline:
            return int(available)
        time.sleep(FREE_POLL_S)


SETTLE_S = 30.0  # how long a run alone on its device waits for memory that is being given back


def settled_memory(
    spec: Any, platform: Any, settings: Any, read: Callable[[], tuple[int, int] | None] | None = None,
    wait_s: float = SETTLE_S,
) -> tuple[int, int] | None:  # fmt: skip
    """The device's (free, total) for a plan (`read`: the platform's reading of `settings.device`),
    read again for up to `wait_s` while the spec's floor does not fit in what is free but would in the
    device's total, for a run that has the device to itself (`device_share` <= 1): the processes of
    the run before it (a bench's) may still be giving their memory back, and a plan on that moment's
    reading would refuse the spec for nothing."""
    if read is None:
        read = lambda: platform.device_memory(settings.device)  # noqa: E731
    reading = read()
    if reading is None or platform.name not in ("cuda", "rocm") or settings.device_share > 1:
        return reading
    floor = worker_floor(spec, platform.name)
    deadline = time.monotonic() + wait_s
    while (
        reading is not None and 0.9 * reading[0] < floor <= 0.9 * reading[1] and time.monotonic() < deadline
    ):
        time.sleep(1.0)
        reading = read() or reading
    return reading


__all__ = [
    "FLOOR_FACTOR",
    "OUTPUT_FACTOR",
    "RUNTIME_BYTES",
    "WORKER_FACTOR",
    "MemoryPlan",
    "breakdown",
    "factor",
    "fit",
    "plan",
    "settled_memory",
    "worker_floor",
    "worker_need",
]
