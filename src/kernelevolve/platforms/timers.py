"""The platforms' timers: how one call's device time is read, and how caches are flushed before it.

`evaluate/timing.py` runs the rounds (its module docstring says what a round is and why the flush on
CUDA lasts as long as it does); a timer is what a platform gives it (`Platform.make_timer`), satisfying
`timing.Timer`: `flush()`, `time_call(fn, snapshot)` -> (seconds, tail seconds, outputs, snapshot),
`sync()`, and the `name`, `l2` and `note` a verdict's method records.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

Outputs = list[Any]


class CudaTimer:
    """CUDA (and ROCm through torch.cuda) events on the current stream, device-wide idle check."""

    name = "cuda_events"
    note = (
        "the cache flush before each timed call lasts about twice the host's recent enqueue time, so "
        "host launch overhead is not timed as device time"
    )
    BASE_BYTES = 256 * 2**20

    def __init__(self, device: Any, l2_bytes: int, total_bytes: int = 0):
        import torch

        self.torch = torch
        self.device = device
        self.base_bytes = max(self.BASE_BYTES, 4 * l2_bytes)
        # A longer flush writes more: up to 2 GiB, or a 40th of the device's memory if that is less.
        self.max_bytes = max(self.base_bytes, min(2 * 2**30, total_bytes // 40))
        self.buf = torch.empty(self.base_bytes // 4, dtype=torch.int32, device=device)
        mib = self.base_bytes // 2**20
        self.l2 = f"flushed before every call (write of at least {mib} MiB, L2 {l2_bytes // 2**20} MiB)"
        self.enqueue_s: collections.deque[float] = collections.deque([50e-6], maxlen=16)
        self.bytes_per_s = self._flush_rate()

    def _flush_rate(self) -> float:
        """Bytes per second the flush writes, measured once."""
        cuda = self.torch.cuda
        with cuda.device(self.device):
            self.buf.zero_()
            start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            start.record()
            self.buf.zero_()
            end.record()
            end.synchronize()
        return self.base_bytes / max(start.elapsed_time(end) / 1e3, 1e-7)

    def flush(self) -> None:
        """Overwrite the L2, for at least twice the host's recent enqueue time (module docstring)."""
        want = int(2 * max(self.enqueue_s) * self.bytes_per_s)
        size = min(self.max_bytes, max(self.base_bytes, want)) // 4
        if size > self.buf.numel():
            size = min(size, self.buf.numel() + self._room() // 4)
        if size > self.buf.numel():
            self.buf = self.torch.empty(0, dtype=self.torch.int32, device=self.device)  # the old one first
            self.buf = self.torch.empty(size, dtype=self.torch.int32, device=self.device)
        self.buf[:size].zero_()

    def _room(self) -> int:
        """Bytes the flush may grow by: a quarter of what this process may still reserve under its
        memory cap (the worker's share of the device). A flush that took all of it, up to 2 GiB, left
        level 1's 17_ out of memory at a re-measure. The cap counts reserved memory, the allocator's
        cached blocks too (a freed block inside a segment still in use cannot be given back), so
        the room is counted from what is reserved, not from what is allocated."""
        cuda = self.torch.cuda
        total = cuda.get_device_properties(self.device).total_memory
        fraction = getattr(cuda.memory, "get_per_process_memory_fraction", lambda _d: 1.0)(self.device)
        left = int(fraction * total) - cuda.memory_reserved(self.device)
        return max(0, min(left, cuda.mem_get_info(self.device)[0]) // 4)

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def time_call(
        self, fn: Callable[[], Outputs], snapshot: bool
    ) -> tuple[float, float, Outputs, Outputs | None]:
        cuda = self.torch.cuda
        start, end, idle = (
            cuda.Event(enable_timing=True),
            cuda.Event(enable_timing=True),
            cuda.Event(enable_timing=True),
        )
        t0 = time.perf_counter()
        start.record()
        outs = fn()
        end.record()
        self.enqueue_s.append(time.perf_counter() - t0)
        snap, snap_s = None, 0.0
        if snapshot:  # the outputs as the timed stream left them: a side stream still writing shows
            before, after = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            before.record()
            snap = [o.detach().clone() for o in outs]
            after.record()
        cuda.synchronize(self.device)
        idle.record()
        idle.synchronize()
        if snapshot:
            # The copy's own time (and its allocation's, which the stream waits for) is not the
            # candidate's tail: with a 64 MiB output it made an honest GEMM's tail 284 us against the
            # baselines' 30 us, where most of its 6 rounds were checked (a side-stream false alarm).
            snap_s = before.elapsed_time(after) / 1e3
        tail = max(0.0, end.elapsed_time(idle) / 1e3 - snap_s)
        return start.elapsed_time(end) / 1e3, tail, outs, snap


class CpuTimer:
    """perf_counter around the call; the last-level cache is flushed by writing a larger buffer."""

    name = "perf_counter"
    note = ""

    def __init__(self, llc_bytes: int):
        import torch

        self.torch = torch
        size = max(64 * 2**20, 2 * llc_bytes)
        self.buf = torch.empty(size // 4, dtype=torch.int32)
        self.l2 = f"last-level cache flushed before every call (write of {size // 2**20} MiB)"

    def flush(self) -> None:
        self.buf.fill_(1)

    def sync(self) -> None:
        pass

    def time_call(
        self, fn: Callable[[], Outputs], snapshot: bool
    ) -> tuple[float, float, Outputs, Outputs | None]:
        t0 = time.perf_counter_ns()
        outs = fn()
        t1 = time.perf_counter_ns()
        snap = [o.detach().clone() for o in outs] if snapshot else None
        return (t1 - t0) / 1e9, 0.0, outs, snap
