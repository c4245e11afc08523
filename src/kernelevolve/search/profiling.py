"""Profiles of a run's new bests, taken beside the search rather than in its way.

A profile (torch.profiler, then Nsight Compute where it is installed: `profile/run.py`) refines a new
best's diagnosis, which the proposals that expand it read (the tuner's moves, a model's prompt). It
costs about 15 s of wall time, most of it a profiled process's start, and a few seconds of the
device's lease. Three rules keep it worth that:
- **Only while enough of the budget is left to read it.** When a new best is found, the run's next
  `parallel` expansions are already being proposed; a profile is taken only if at least two such rounds
  of the budget remain (`2 * parallel` candidates), and at most `settings.profile_budget` per run.
- **Beside the search, not in its way.** Profiles run one at a time on a thread of their own, and the
  expansion that found the new best goes on to its next candidate. A proposal made before a profile
  ends reads the verdict's own diagnosis (the roofline's); later ones read the refined one. Not where
  nothing may run beside a timing (`Platform.exclusive`: the CPU, where `profile = "torch"` asks
  for profiles): there the profile is taken in the expansion that found the new best, as before,
  since its process's start would disturb another candidate's timing.
- **The newest best first.** A new best found while another is being profiled waits in a single slot;
  a newer one replaces it, and it is taken up only if the rules still hold when the thread is free.

What it does not do: profile on the CPU unless asked (`profile = "torch"`: torch.profiler sees nothing
inside a C kernel), or keep a run from ending: `join` waits for the profile in flight, bounded by the
profiler's own timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kernelevolve.profile.diagnosis import diagnose
from kernelevolve.profile.run import profile_candidate
from kernelevolve.search.context import EngineContext, Event
from kernelevolve.search.tree import Node


class NewBestProfiler:
    def __init__(
        self,
        ctx: EngineContext,
        run_id: str,
        parallel: int,
        budget: int,
        spent: Callable[[], int],
        emit: Event,
    ):
        self.ctx, self.run_id = ctx, run_id
        self.parallel, self.budget, self.spent = parallel, budget, spent
        self.emit = emit
        mode = ctx.settings.profile
        gpu = ctx.platform.name in ("cuda", "rocm")
        self.enabled = mode in ("torch", "ncu") or (mode == "auto" and gpu)
        self.beside = not ctx.platform.exclusive
        self._lock = threading.Lock()
        self._taken = 0  # profiles started by this run in this process
        self._waiting: Node | None = None
        self._thread: threading.Thread | None = None

    def worth_it(self, spent: int) -> bool:
        return (
            self.enabled
            and self._taken < self.ctx.settings.profile_budget
            and spent + 2 * max(1, self.parallel) <= self.budget
        )

    def offer(self, node: Node) -> None:
        """A new best was found: profile it now, after the profile in flight, or not at all."""
        if not node.source:
            return
        with self._lock:
            if self._thread is not None:
                self._waiting = node
                return
            if not self.worth_it(self.spent()):
                return
            self._taken += 1
            if self.beside:
                self._thread = threading.Thread(
                    target=self._work, args=(node,), daemon=True, name="kernelevolve-profile"
                )
                self._thread.start()
                return
        self._profile(node)  # exclusive: in the caller's expansion, which waits for it

    def _work(self, node: Node | None) -> None:
        while node is not None:
            self._profile(node)
            with self._lock:
                node, self._waiting = self._waiting, None
                if node is not None and self.worth_it(self.spent()):
                    self._taken += 1
                else:
                    node = None
                    self._thread = None

    def _profile(self, node: Node) -> None:
        """Derived data: a failure is reported as an event and never costs the node anything."""
        try:
            self.emit("profile", {"node": node.id})
            assert node.source is not None
            metrics = profile_candidate(self.ctx.spec, self.ctx.platform, node.source, self.ctx.settings)
            diagnosis = diagnose(node.verdict or {}, metrics)
            if diagnosis is not None:
                self.ctx.ws.set_node_diagnosis(self.run_id, node.id, diagnosis)
        except Exception as exc:
            self.emit("learn_failed", {"node": node.id, "error": f"profile: {type(exc).__name__}: {exc}"})

    def join(self) -> None:
        """Wait for the profile in flight (and none after it): the run is ending."""
        with self._lock:
            self._waiting = None
            thread = self._thread
        if thread is not None:
            thread.join()


__all__ = ["NewBestProfiler"]
