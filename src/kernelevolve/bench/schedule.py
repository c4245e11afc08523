"""Which spec of a bench runs where and when: one device or several, one spec per device at a time or
`per_device` of them, and, on a GPU, each run's part of the device's memory.

`schedule(one, count, settings, devices, per_device)` calls `one(i, run_settings)` once for every
spec index, from `per_device` threads per device, each taking the next spec when its run ends.

Memory (a GPU, `per_device` > 1): the device's memory is handed out, not split evenly. When the bench
starts, each device's usable memory is 90% of what is free (`DeviceMemory`). Before a spec runs, its
memory plan's inputs are asked (`demand(i)`: what one of its workers needs, and what its pool's
workers and spares would like), each with half again to spare (the need is an estimate,
`evaluate.memory`); its run is granted what it would like or the even split 1/K, whichever is more,
or what is left if that is less but still holds one worker's need. A spec that one worker of it
cannot fit beside the runs in progress waits for them to end, and the specs behind it wait too
(first come, first served: a large spec is never starved by small ones); a spec that does not fit
even on the idle device runs alone, and its memory plan refuses it with the numbers. A run granted
the whole device first waits (`SETTLE_S` at most) for the device's free memory to come back to what
the bench started with: the runs before it have ended, but their workers' memory is freed by the
driver once they have exited, and the run plans on what is free. A spec whose
tensors the probe could not count asks for the even split. A run learns its part through
`Settings.device_share`: 90% of the device's memory over the grant (`evaluate.memory.plan` sizes its
workers from it, `evaluate.pool.gpu_shares` caps each worker by it). On the CPU, or where the
device's memory is unknown, each of the `per_device` runs gets an even 1/K, as before.

Ctrl-C: no new spec starts, and `interrupt` is set, so the runs in the threads stop as the run in
the main thread would (their evaluations in flight are dropped, their nodes left for the resume). A
second Ctrl-C does not wait for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kernelevolve.config import Settings
from kernelevolve.spec import Spec

USABLE = 0.9  # of the free memory of a device when the bench starts, as for a run alone (memory.plan)
# A run is granted this times what its memory plan estimates, and starts beside others only where that
# is free: the estimate is not a measurement (at --per-device 8 on an H200, level 1's
# 7_Matmul_with_small_K failed to prepare at 18.0 GiB, its estimate, with 1.25 times it to spare).
MARGIN = 1.5
# A run granted the whole device plans on its free memory then (`memory.plan`): it first waits up to
# this long for that to come back to what the bench started with, as the runs before it end (their
# workers' memory is the driver's to free once they have exited: on 4 H100s, level 1's norms of 16
# GiB were refused "this worker has 62.1 GiB" right after the runs before them ended).
SETTLE_S = 30.0

One = Callable[[int, Settings], None]
Demand = Callable[[int], tuple[int, int] | None]  # spec index -> (one worker's need, the pool's wish)
Memory = Callable[[int], tuple[int, int] | None]  # device index -> (free, total) bytes


def pinned(settings: Settings, device: int, share: float) -> Settings:
    """A spec's run settings: pinned to one device (a search's own `devices = auto` would spread it),
    its pool holding 1/`share` of the device's memory."""
    return replace(settings, device=device, devices=str(device), device_share=settings.device_share * share)


@dataclass
class DeviceMemory:
    """One device's memory, granted to the runs on it in the order they asked."""

    usable: int  # bytes: 90% of what was free when the bench started
    total: int
    fair: int = 0  # the even split over the runs that may share the device
    granted: int = 0
    running: int = 0
    waiting: list[int] = field(default_factory=list)  # tickets, first come first served
    tickets: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)

    def acquire(self, need: int, wish: int, stop: threading.Event) -> int | None:
        """Block until one worker's `need` (with its margin) fits beside the runs in progress, or
        none is left, then grant up to `wish` (with its margin); None if `stop` was set meanwhile."""
        need, wish = int(need * MARGIN), int(wish * MARGIN)
        with self.cond:
            ticket = self.tickets
            self.tickets += 1
            self.waiting.append(ticket)
            try:
                while not stop.is_set():
                    left = self.usable - self.granted
                    if self.waiting[0] == ticket and (self.running == 0 or need <= left):
                        # At least the even split where it is free (the plan's estimate is not a
                        # measurement: spare room keeps a worker that needs more from failing); alone
                        # on the device, a spec too large for it gets all of it (its plan refuses).
                        grant = min(max(wish, need, self.fair), left)
                        self.granted += grant
                        self.running += 1
                        return grant
                    self.cond.wait(0.5)
                return None
            finally:
                self.waiting.remove(ticket)
                self.cond.notify_all()

    def try_acquire(self, need: int, wish: int) -> int | None:
        """`acquire` without waiting: the grant if one worker's `need` fits now (or the device is
        idle), else None (an agent session refuses the run rather than block a tool call)."""
        need, wish = int(need * MARGIN), int(wish * MARGIN)
        with self.cond:
            left = self.usable - self.granted
            if self.waiting or (self.running and need > left):
                return None
            grant = min(max(wish, need, self.fair), left)
            self.granted += grant
            self.running += 1
            return grant

    def release(self, grant: int) -> None:
        with self.cond:
            self.granted -= grant
            self.running -= 1
            self.cond.notify_all()

    def share(self, grant: int) -> float:
        """`Settings.device_share` for a run granted `grant` bytes: 1 for the whole usable memory (the
        run then plans on the device's free memory, as alone); else 90% of the device over the grant,
        which is how `memory.plan` and `pool.gpu_shares` turn a share back into bytes."""
        return 1.0 if grant >= self.usable else USABLE * self.total / max(1, grant)


def run_demand(spec: Spec, platform: Any, settings: Settings) -> tuple[int, int] | None:
    """What a run of `spec` asks of its device's memory: one worker's need (`memory.worker_need`), and
    its pool's wish (that times its workers and spares, sized as `optimize.build_engine` sizes them);
    None on the CPU or where the probe could not count the tensors. A bench asks it of every spec,
    an agent session (`agent_jobs.Session`) of every run it attaches."""
    from kernelevolve.evaluate import memory
    from kernelevolve.evaluate.executors import executor_slots
    from kernelevolve.jobs import sized_for

    if platform.name not in ("cuda", "rocm"):
        return None
    tensors, need = memory.worker_need(spec, platform.name)
    if not tensors:
        return None
    sized = sized_for(settings, platform, 10**6, executor_slots(settings, platform))
    return need, need * (max(1, sized.workers) + max(0, sized.spares))


def schedule(
    one: One,
    count: int,
    settings: Settings,
    devices: Sequence[int] | None,
    per_device: int = 1,
    interrupt: threading.Event | None = None,
    demand: Demand | None = None,
    memory: Memory | None = None,
    stage: Callable[[int], bool] | None = None,
    order: Sequence[int] | None = None,
) -> None:
    """Call `one(i, settings)` for every spec: in order on one device, or `per_device` specs per device
    at a time; with `demand` and `memory` (a GPU), by each device's memory (see the module docstring).
    `stage(i)`, where given, is asked first, before any memory is granted: False for a spec that needs
    no run (its cached result, or its load error, already reported). `order`: the indices in the
    order they start (0, 1, .. by default)."""
    devices = list(devices) if devices else [settings.device]
    queue = list(order) if order is not None else list(range(count))
    if sorted(queue) != list(range(count)):
        raise ValueError(f"order {queue} is not an ordering of the {count} specs")
    if len(devices) == 1 and per_device == 1:
        one_settings = pinned(settings, devices[0], 1)
        for i in queue:
            if stage is None or stage(i):
                one(i, one_settings)
        return
    ledgers: dict[int, DeviceMemory] = {}
    if per_device > 1 and demand is not None and memory is not None:
        for d in devices:
            reading = memory(d)
            if reading is not None:
                free, total = reading
                usable = int(USABLE * min(free, total))
                ledgers[d] = DeviceMemory(usable=usable, total=total, fair=usable // per_device)
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(i: int, device: int) -> None:
        if stage is not None and not stage(i):
            return
        ledger = ledgers.get(device)
        if ledger is None or demand is None:  # an even split: the CPU, or the memory unknown
            one(i, pinned(settings, device, per_device))
            return
        # nothing to plan on (the probe could not count the tensors): the even split, granted
        need, wish = demand(i) or (int(ledger.fair / MARGIN),) * 2
        grant = ledger.acquire(need, wish, stop)
        if grant is None:
            return
        try:
            share = ledger.share(grant)
            if share == 1.0 and memory is not None:
                _settle(lambda: memory(device), ledger.usable, stop)
            one(i, pinned(settings, device, share))
        finally:
            ledger.release(grant)

    def worker(device: int, done: threading.Event) -> None:
        try:
            while not stop.is_set():
                with lock:
                    if not queue:
                        return
                    i = queue.pop(0)
                try:
                    run(i, device)
                except BaseException as exc:  # re-raised in the calling thread
                    errors.append(exc)
                    stop.set()
        finally:
            done.set()

    threads = [
        (threading.Thread(target=worker, args=(d, done), name=f"bench-device-{d}-{k}", daemon=True), done)
        for d in devices for k in range(per_device) for done in [threading.Event()]
    ]  # fmt: skip
    try:
        for t, _ in threads:
            t.start()
        _join([done for _, done in threads])
    except KeyboardInterrupt:
        stop.set()
        if interrupt is not None:
            interrupt.set()
        _join([done for t, done in threads if t.ident is not None])  # those started
        raise
    if errors:
        raise errors[0]


def _settle(reading: Callable[[], tuple[int, int] | None], usable: int, stop: threading.Event) -> None:
    """Wait, up to `SETTLE_S`, until 90% of the device's free memory is back to `usable` (within 2%)."""
    deadline = time.monotonic() + SETTLE_S
    while not stop.is_set() and time.monotonic() < deadline:
        now = reading()
        if now is None or USABLE * min(now) >= 0.98 * usable:
            return
        stop.wait(0.5)


def _join(done: list[threading.Event]) -> None:
    """Wait until every thread has said it is done, waking twice a second: a signal sent to the
    process may be delivered to another thread, and Python raises KeyboardInterrupt only once the main
    thread runs again. Not `Thread.join`: on Python 3.11 a KeyboardInterrupt that lands inside it can
    leave a running thread marked as stopped, and the second wait (for the runs to store their stop)
    would then skip it."""
    for event in done:
        while not event.wait(0.5):
            pass


__all__ = ["DeviceMemory", "pinned", "schedule"]
