"""torch.profiler for one candidate call: how many kernels, how long each, how much time is launches.

ncu says how well each kernel uses the device; this says what a call is made of. A candidate that
launches eight small kernels where one would do, or whose call spends most of its wall time on the
host between kernels, is launch-bound whatever its kernels' ncu metrics say. The numbers, per call:

- kernels_per_call: device activities (kernels, and any memcpy/memset the call issues) / iters;
- device_us_per_call: their summed device time;
- wall_us_per_call: the call's wall time, measured in a loop of its own without the profiler (the
  profiler's per-op bookkeeping would otherwise count as overhead);
- launch_overhead_us_per_call: wall time minus the time the device was busy (the union of the kernel
  intervals, so kernels overlapping on two streams count once), floored at 0; None without device
  activities, where there is nothing to launch;
- kernels: per kernel name, launches over all iterations, total device time and share of it;
- cpu_ops: on the CPU (no device activities), the aten ops by inclusive CPU time.

`summarize_events` is pure and works on plain dicts, so it is tested on a recorded H100 event list;
`events_from_profiler` converts torch's FunctionEvents into that form (handling the torch versions
that name device time `self_cuda_time_total`), and `profile_calls` runs and records the calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

TOP_CPU_OPS = 10


@dataclass(frozen=True)
class KernelStat:
    """One kernel name over all profiled iterations."""

    name: str
    calls: int
    total_us: float
    share: float  # of the device time of all kernels


@dataclass(frozen=True)
class CpuOp:
    """One aten op over all profiled iterations (times in us, inclusive of the ops it calls)."""

    name: str
    calls: int
    cpu_us: float
    self_cpu_us: float | None = None


@dataclass
class ProfilerSummary:
    iters: int
    kernels_per_call: float
    device_us_per_call: float
    device_busy_us_per_call: float
    wall_us_per_call: float
    launch_overhead_us_per_call: float | None
    kernels: list[KernelStat] = field(default_factory=list)
    cpu_ops: list[CpuOp] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_kind(device_type: Any) -> str:
    """ "cuda" / "cpu" from torch's DeviceType, its str ("DeviceType.CUDA") or a plain name."""
    return str(getattr(device_type, "name", device_type)).rsplit(".", 1)[-1].lower()


def events_from_profiler(prof: Any) -> list[dict[str, Any]]:
    """torch.profiler's events as dicts: name, device_type ("cuda" or "cpu"), self_device_us,
    cpu_us, self_cpu_us, start_us, end_us."""
    out = []
    for ev in prof.events():
        kind = device_kind(ev.device_type)
        self_device = getattr(ev, "self_device_time_total", None)
        if self_device is None:  # torch before the device-generic names
            self_device = getattr(ev, "self_cuda_time_total", 0.0)
        out.append({
            "name": ev.name,
            "device_type": kind,
            "self_device_us": float(self_device or 0.0),
            "cpu_us": float(ev.cpu_time_total or 0.0),
            "self_cpu_us": float(ev.self_cpu_time_total or 0.0),
            "start_us": float(ev.time_range.start),
            "end_us": float(ev.time_range.end),
        })  # fmt: skip
    return out


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def summarize_events(events: list[dict[str, Any]], iters: int, wall_s: float) -> ProfilerSummary:
    """The per-call summary of `iters` calls recorded as `events`, which took `wall_s` seconds."""
    if iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    device = [e for e in events if device_kind(e["device_type"]) != "cpu"]
    device_us = sum(float(e.get("self_device_us") or 0.0) for e in device)
    if device and all("start_us" in e and "end_us" in e for e in device):
        busy = busy_us([(float(e["start_us"]), float(e["end_us"])) for e in device])
    else:
        busy = device_us
    wall_us = wall_s * 1e6 / iters
    overhead = max(0.0, wall_us - busy / iters) if device else None
    return ProfilerSummary(
        iters=iters,
        kernels_per_call=len(device) / iters,
        device_us_per_call=device_us / iters,
        device_busy_us_per_call=busy / iters,
        wall_us_per_call=wall_us,
        launch_overhead_us_per_call=overhead,
        kernels=_kernel_table(device, device_us),
        cpu_ops=[] if device else _cpu_ops(events),
    )


def _kernel_table(device: list[dict[str, Any]], device_us: float) -> list[KernelStat]:
    calls: dict[str, int] = {}
    total: dict[str, float] = {}
    for e in device:
        calls[e["name"]] = calls.get(e["name"], 0) + 1
        total[e["name"]] = total.get(e["name"], 0.0) + float(e.get("self_device_us") or 0.0)
    return sorted(
        (KernelStat(n, calls[n], total[n], total[n] / device_us if device_us else 0.0) for n in calls),
        key=lambda k: -k.total_us,
    )


def _cpu_ops(events: list[dict[str, Any]]) -> list[CpuOp]:
    calls: dict[str, int] = {}
    cpu: dict[str, float] = {}
    self_cpu: dict[str, float | None] = {}
    for e in events:
        name = e["name"]
        if not name.startswith("aten::"):
            continue
        calls[name] = calls.get(name, 0) + 1
        cpu[name] = cpu.get(name, 0.0) + float(e.get("cpu_us") or 0.0)
        s = e.get("self_cpu_us")
        prev = self_cpu.get(name, 0.0)
        self_cpu[name] = None if s is None or prev is None else prev + float(s)
    ops = [CpuOp(n, calls[n], cpu[n], self_cpu[n]) for n in calls]
    return sorted(ops, key=lambda o: -o.cpu_us)[:TOP_CPU_OPS]


def profile_calls(
    fn: Callable[[], Any], iters: int = 5, device: str = "cuda", recorded: Callable[[], object] | None = None
) -> ProfilerSummary:
    """Warm `fn` up once, time `iters` calls, then record `iters` more with torch.profiler (CPU and
    CUDA activities on a CUDA device, CPU alone otherwise). `recorded` is called once the recorded
    calls have finished on the device, before the profiler stops and its trace becomes events (host
    work, seconds of it): where the device's lease is held for the calls, it goes back there."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    wall_s = time.perf_counter() - start
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(iters):
            fn()
        sync()
        if recorded is not None:
            recorded()
    return summarize_events(events_from_profiler(prof), iters, wall_s)


__all__ = [
    "CpuOp",
    "KernelStat",
    "ProfilerSummary",
    "busy_us",
    "device_kind",
    "events_from_profiler",
    "profile_calls",
    "summarize_events",
]
