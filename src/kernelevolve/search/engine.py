"""The search loop: select, synthesize, evaluate, record; until a limit; then the finish step.

One `Engine` drives one run. Each expansion is one thread's work:

    select (policy, under the engine's lock) -> create the node in the store (state `created`)
    -> gather its context (memory mode) -> the synthesizer proposes (state `proposed`, or `failed`)
    -> the evaluator pool's verdict, timed at the search's precision (state `evaluated`; the finish
       step re-measures winners at the settings') -> the best is updated under the noise rule
    -> what the run learns from it (the node's analysis, a candidate skill, a profile of a new best)

Up to `parallel` expansions are in flight, so model calls overlap evaluations. Every state change is
one store transaction, so a run killed at any point resumes with nothing lost and nothing paid twice:
`created` nodes are synthesized again under the same id (a model call that was in flight when the
process died is not recorded, and is the only cost that can be lost), `proposed` nodes are evaluated
from their stored source. A lock file keeps two processes from driving one run. Before every decision
the tree is rebuilt from the store (`tree.py`): concurrent expansions write between any two of them.

The engine owns the run's lifetime: its status, the evaluator pool (`attached`), the limits, the model
endpoint's outages, interrupts. What a node is given is `tasks.py` (its parents, memory mode and
task); what happens once the loop stops is `finish.py` (the winners re-measured, skills verified, the
dispatch, the export and the report).

Deliberately not here: how candidates are written (`kernelevolve.synth`), how they are judged
(`kernelevolve.evaluate`), how the report looks (`kernelevolve.report`).
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any

from kernelevolve.errors import WorkspaceError
from kernelevolve.evaluate.executors import Evaluator, Request, open_evaluator
from kernelevolve.evaluate.guards import check_source
from kernelevolve.evaluate.reuse import reuse_key, stored_verdict
from kernelevolve.evaluate.verdict import Verdict
from kernelevolve.knowledge.index import KnowledgeBase
from kernelevolve.profile.diagnosis import diagnose
from kernelevolve.search import learning
from kernelevolve.search.context import EngineContext, Event
from kernelevolve.search.finish import FinishStep
from kernelevolve.search.limits import Limits, stop_reason
from kernelevolve.search.policies import SearchConfig
from kernelevolve.search.profiling import NewBestProfiler
from kernelevolve.search.tasks import TaskBuilder
from kernelevolve.search.tools import EngineTools, RunLock
from kernelevolve.search.tree import Tree
from kernelevolve.store import storage_failed
from kernelevolve.synth.base import Proposal, Synthesizer, Task

# Statuses of nodes that cost no candidate: the synthesizer declined, or the model endpoint was down.
FREE = ("exhausted", "unavailable")
OUTAGE_WAIT_S = (5.0, 15.0, 30.0, 60.0)  # pauses after consecutive unavailable nodes, the last repeated


def _spent(tree: Tree) -> int:
    """Candidates the budget has paid for: every node but the free ones."""
    return sum(1 for n in tree.nodes.values() if n.status not in FREE)


class Engine:
    def __init__(
        self,
        ctx: EngineContext,
        run_id: str,
        synthesizer: Synthesizer,
        search: SearchConfig,
        limits: Limits,
        on_event: Event | None = None,
        meter: Any = None,
        interrupt: threading.Event | None = None,
    ):
        self.ctx, self.ws, self.spec = ctx, ctx.ws, ctx.spec
        self.run_id = run_id
        self.synth = synthesizer
        self.search = search
        self.limits = limits
        self.meter = meter  # providers.meter.Meter or None: its cap also stops the run
        self.emit = on_event or (lambda event, data: None)
        self._lock = threading.Lock()
        self._stop = threading.Event()  # a limit was reached: start nothing new, finish what runs
        self._abort = threading.Event()  # interrupted: leave unstarted work for `resume`
        # Set from another thread (a bench's Ctrl-C, which reaches only the main thread): this run
        # stops as if Ctrl-C had reached it.
        self.interrupt = interrupt or threading.Event()
        self._exhausted_streak = 0
        # While the model endpoint is down: (since, unavailable nodes, the last error)
        self._outage: tuple[float, int, str] | None = None
        self._best: int | None = None
        self._prior_wall = float(self.ws.run(run_id)["wall_s"] or 0.0)
        self._t0 = time.monotonic()
        self.pool: Evaluator | None = None
        self.target = str(ctx.profile.get("target") or ctx.platform.name)
        self.pattern = self.ws.run(run_id).get("pattern") or ""
        self.kb = KnowledgeBase.for_settings(self.ws, ctx.settings)
        self.tools = EngineTools(None, ctx.spec, ctx.platform, self._tool_kb(), self.target)
        parallel = self.parallel(ctx.settings.workers)
        self.profiler = NewBestProfiler(
            ctx, run_id, parallel, limits.budget, lambda: _spent(self.tree()), self.emit
        )
        self.tasks = TaskBuilder(ctx, run_id, search, limits.budget, self.target, self.pattern, self.kb)
        # What a verdict stands for here besides the kernel and the spec (`evaluate/reuse.py`): a stored
        # verdict under the same key is reused instead of evaluating the same kernel again.
        self.reuse_key = reuse_key(
            ctx.settings.to_dict(), ctx.platform.identity(ctx.settings.device), ctx.shapes
        )

    def _tool_kb(self) -> KnowledgeBase | None:
        """The knowledge base a synthesizer's `search_knowledge` tool reaches (none with knowledge off)."""
        return self.kb if self.ctx.settings.knowledge else None

    # -- the loop -----------------------------------------------------------------------------------

    def parallel(self, pool_workers: int) -> int:
        if self.search.parallel > 0:
            return self.search.parallel
        return max(1, pool_workers) + (0 if self.synth.name == "tuner" else 1)

    def wall_s(self) -> float:
        return self._prior_wall + time.monotonic() - self._t0

    def run(self) -> dict[str, Any]:
        """Drive the run to a limit; returns the summary (also stored with the run)."""
        with RunLock(self.ctx.out_dir / "lock"):
            self.ws.update_run(self.run_id, status="running")
            try:
                summary = self._drive()
            except KeyboardInterrupt:
                self.ws.update_run(self.run_id, status="stopped", wall_s=self.wall_s())
                raise
            except BaseException as exc:
                storage = storage_failed(exc)
                try:
                    self.ws.update_run(
                        self.run_id, status="stopped" if storage else "failed", wall_s=self.wall_s()
                    )
                except sqlite3.Error:
                    pass  # the disk still refuses: the run keeps its last status, and resumes from any
                if storage:
                    raise WorkspaceError(
                        f"the disk refused a write ({exc}; is it full?): run {self.run_id} stopped, and "
                        "every node stored before it is kept",
                        hint=f"free space under {self.ws.root} and the temporary directory "
                        f"({tempfile.gettempdir()}), then `kernelevolve resume {self.run_id}`",
                    ) from exc
                raise
        return summary

    def _drive(self) -> dict[str, Any]:
        with self.attached():
            reason = self._loop(self.parallel(self.ctx.settings.workers))
            self.emit("stop", {"reason": reason})
            return self.finish(reason)

    @contextmanager
    def attached(self) -> Iterator[None]:
        """The evaluator pool (and the tools that use it) for the duration of the block."""
        ctx = self.ctx
        request = Request(
            ctx.spec, ctx.platform, ctx.settings, profile=ctx.profile, trusted_cache=ctx.trusted_cache,
            on_event=lambda event, label, detail: self._pool_event(event, label, detail),
        )  # fmt: skip
        with open_evaluator(request) as pool:
            self.pool = pool
            self.tools = EngineTools(pool, ctx.spec, ctx.platform, self._tool_kb(), self.target)
            try:
                yield
            finally:
                self.pool = None
                self.tools = EngineTools(None, ctx.spec, ctx.platform, self._tool_kb(), self.target)

    def _loop(self, parallel: int) -> str:
        tree = self.tree()
        self._best = b.id if (b := tree.best(self.search.min_gain)) else None
        pending = [n.id for n in tree.nodes.values() if n.state in ("created", "proposed")]
        if any(tree[n].mode not in ("warm", "seed") for n in pending):  # those are proposed at `start`
            self.emit("resume", {"pending": pending, "nodes": len(tree)})
        reason = ""
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="kernelevolve-expand") as ex:
            inflight: dict[Future[None], int] = {ex.submit(self._expand, nid): nid for nid in pending}
            try:
                while True:
                    while len(inflight) < parallel and not self._stop.is_set():
                        why = self.stop_reason()
                        if why:
                            reason = reason or why
                            self._stop.set()
                            break
                        node_id = self.new_node()
                        inflight[ex.submit(self._expand, node_id)] = node_id
                    if not inflight:
                        break
                    done, _ = wait(inflight, timeout=0.5, return_when=FIRST_COMPLETED)
                    if self.interrupt.is_set():
                        raise KeyboardInterrupt
                    for f in done:
                        inflight.pop(f)
                        f.result()  # an expansion raises only for what fails every candidate
                    if done:
                        self.ws.update_run(self.run_id, wall_s=self.wall_s())
            except BaseException:
                self._stop.set()
                self._abort.set()
                for f in inflight:
                    f.cancel()
                self._abort_evaluations()  # their nodes left `proposed`
                raise
        return reason or "stopped"

    def stop_reason(self) -> str | None:
        tree = self.tree()
        run = self.ws.run(self.run_id)
        spent = _spent(tree)
        best = tree.best(self.search.min_gain)
        why = stop_reason(
            self.limits, spent=spent, wall_s=self.wall_s(), tokens=run["tokens_in"] + run["tokens_out"],
            usd=run["cost_usd"], stall=tree.stall(self.search.min_gain),
            best_fitness=best.fitness if best else 0.0,
        )  # fmt: skip
        if why:
            return why
        if self.meter is not None and (cap := self.meter.exceeded()):
            return cap
        outage = self._outage
        if outage is not None and time.monotonic() - outage[0] >= self.ctx.settings.provider_outage_s:
            return (f"the model endpoint has failed for {time.monotonic() - outage[0]:.0f} s ({outage[1]} tries; "
                    f"last: {outage[2][:200]}); `kernelevolve resume {self.run_id}` continues once it answers")  # fmt: skip
        if self._exhausted_streak >= max(4, 2 * self.search.parallel):
            return f"{self.synth.name} has nothing new to try ({self._exhausted_streak} declined expansions in a row)"
        return None

    # -- one expansion ------------------------------------------------------------------------------

    def tree(self) -> Tree:
        return Tree.from_rows(self.ws.nodes(self.run_id))

    def new_node(self) -> int:
        with self._lock:
            parents, mode = self.tasks.plan(self.tree())
            parent = parents[0] if parents else None
            parent2 = parents[1] if len(parents) > 1 else None
            node_id = self.ws.create_node(self.run_id, parent, parent2, mode)
        self.emit("node", {"node": node_id, "parents": parents, "mode": mode})
        return node_id

    def task(self, node_id: int) -> Task:
        return self.tasks.task(self.tree(), node_id)

    def _expand(self, node_id: int) -> None:
        if self._abort.is_set():
            return  # interrupted: the node stays as it is (`created` or `proposed`); resume picks it up
        if self._state(node_id) == "created":
            proposal = self._propose(node_id)
            if proposal is None:
                return
        self.evaluate(node_id)

    def _state(self, node_id: int) -> str:
        return str(self.tree()[node_id].state)

    def _propose(self, node_id: int) -> Proposal | None:
        task = self.task(node_id)
        self.emit("synthesize", {"node": node_id, "mode": task.mode, "parents": [p.id for p in task.parents]})
        start = time.perf_counter()
        try:
            proposal = self.synth.propose(task, self.tools)
        except Exception as exc:  # a synthesizer bug must not end the run: the node records it
            proposal = Proposal(source=None, error=f"{self.synth.name} failed: {type(exc).__name__}: {exc}")
        synth_s = time.perf_counter() - start
        status = None
        if proposal.source is None and proposal.exhausted:
            status = "exhausted"
        elif proposal.source is None and proposal.unavailable:
            status = "unavailable"
        elif proposal.source is None:
            status = "synth_error"
        kind = None
        if proposal.source is not None:
            kinds = check_source(proposal.source, accepted_kinds=()).kinds
            kind = sorted(kinds)[0] if kinds else None
        self.ws.propose_node(
            self.run_id, node_id, source=proposal.source, kind=kind, note=proposal.note,
            error=proposal.error, prompt=proposal.prompt, response=proposal.response,
            actions=proposal.actions, tokens_in=proposal.tokens_in, tokens_out=proposal.tokens_out,
            cost_usd=proposal.cost_usd, synth_s=synth_s, status=status,
        )  # fmt: skip
        wait = 0.0
        with self._lock:
            self._exhausted_streak = self._exhausted_streak + 1 if status == "exhausted" else 0
            if status != "unavailable":
                self._outage = None
            else:  # the endpoint is down: no budget spent; wait longer each time, up to a limit (stop_reason)
                since, tries = self._outage[:2] if self._outage else (time.monotonic(), 0)
                self._outage = (since, tries + 1, proposal.error or "")
                wait = OUTAGE_WAIT_S[min(tries, len(OUTAGE_WAIT_S) - 1)]
        if status == "unavailable":
            self.emit("outage", {"node": node_id, "error": proposal.error or "", "wait_s": wait})
            self._abort.wait(wait)  # an interrupt ends the pause at once
        if proposal.source is None:
            self.emit("failed", {"node": node_id, "status": status, "error": proposal.error or ""})
            return None
        return proposal

    def evaluate(self, node_id: int) -> Verdict:
        """Evaluate a `proposed` node's candidate and record the verdict (inside `attached`)."""
        node = self.tree()[node_id]
        assert node.source is not None and self.pool is not None
        start = time.perf_counter()
        reused = stored_verdict(self.ws, node.source, self.spec.fingerprint, self.reuse_key)
        if reused is not None:
            evaluation_id, verdict = reused
        else:
            # EvaluationAborted (the run interrupted) passes through: nothing recorded, the node stays
            # `proposed` and a resumed run evaluates it.
            evaluation_id = None
            precision = self.ctx.platform.search_precision(self.ctx.settings)  # ranks; finish re-measures
            verdict = self.pool.evaluate_one(node.source, f"node-{node_id}.py", shapes=self.ctx.shapes,
                                             timing_precision=precision)  # fmt: skip
            verdict.method.key = self.reuse_key
        eval_s = time.perf_counter() - start
        data = verdict.to_dict()
        self.ws.finish_node(self.run_id, node_id, data, eval_s, diagnose(data), reused=evaluation_id)
        with self._lock:
            best = self.tree().best(self.search.min_gain)
            improved = best is not None and best.id != self._best
            if improved:
                assert best is not None
                self._best = best.id
                self.ws.update_run(self.run_id, best_node=best.id)
        self.emit("evaluated", {"node": node_id, "verdict": verdict, "best": self.best_info(),
                                "new_best": improved})  # fmt: skip
        self._learn(node_id, profile=improved and verdict.ok)
        return verdict

    def _learn(self, node_id: int, profile: bool) -> None:
        """Context memory, skills and profiling for a node just evaluated. Derived data: a failure
        here is reported as an event and never costs the node its verdict."""
        try:
            tree = self.tree()
            node = tree[node_id]
            if profile:  # beside the search, while enough of the budget is left (search/profiling.py)
                self.profiler.offer(node)
            parent = tree.nodes.get(node.parent) if node.parent is not None else None
            self.ws.set_node_analysis(self.run_id, node_id, learning.analyze(node, parent))
            if (
                self.ctx.settings.skills
                and parent is not None
                and learning.beats_parent(node, parent, self.search.min_gain)
            ):
                with self._lock:  # a read-merge-write of the skill: one expansion at a time
                    skill = learning.skill_candidate(
                        self.ws, self.run_id, self.spec, self.ctx.platform.name, self.target, self.pattern,
                        node, parent, device=str(self.ctx.profile.get("device") or ""),
                    )  # fmt: skip
                self.emit("skill", {"node": node_id, "skill": skill["id"], "title": skill["title"]})
        except Exception as exc:
            self.emit("learn_failed", {"node": node_id, "error": f"{type(exc).__name__}: {exc}"})

    def best_info(self) -> dict[str, Any]:
        tree = self.tree()
        best = tree.best(self.search.min_gain)
        spent = _spent(tree)
        info = {"evaluated": len(tree.evaluated()), "spent": spent, "budget": self.limits.budget}
        if best is None:
            return info | {"node": None}
        return info | {"node": best.id, "fitness": best.fitness, "speedup_vs_eager": best.speedup_vs_eager,
                       "speedup_vs_compile": best.speedup_vs_compile}  # fmt: skip

    def _pool_event(self, event: str, label: str, detail: Any) -> None:
        if event == "phase":
            self.emit("phase", {"label": label, "phase": detail})
        elif event == "retry":  # the label names what was retried (a node, a final re-measurement)
            self.emit("retry", {"label": label, "reason": detail})
        elif event == "remeasured" and self.ctx.store_profile:  # the hardware profile, measured again
            self.ctx.store_profile(detail)

    # -- the end ------------------------------------------------------------------------------------

    def finish(self, reason: str) -> dict[str, Any]:
        """The finish step (`finish.py`): re-measure the winners; write the best kernel, the export
        and the report; returns the summary (inside `attached`)."""
        assert self.pool is not None
        step = FinishStep(
            self.ctx, self.run_id, self.search, self.limits, self.synth.name, self.emit,
            measure_all=self._measure_all, wall_s=self.wall_s, join_profiles=self.profiler.join,
            index_docs=self.kb.index_docs,
        )  # fmt: skip
        return step.run(self.tree(), reason)

    def remeasure(self, node_id: int) -> tuple[int, Verdict]:
        """Measure an evaluated node's kernel again, live, in a fresh worker (inside `attached`), and
        store it as an evaluation of its own: (its id, the verdict). The node keeps the verdict it was
        ranked by; the finish step measures the winners again in any case."""
        node = self.tree()[node_id]
        if node.source is None or node.state != "evaluated":
            raise WorkspaceError(
                f"node {node_id} of run {self.run_id} has no evaluated kernel ({node.state})",
                hint="re-measure a node that was submitted and evaluated",
            )
        self.emit("remeasure", {"node": node_id})
        (verdict,) = self._measure_all([(node.source, f"node-{node_id}-remeasure.py")])
        if isinstance(verdict, Exception):
            raise verdict
        verdict.method.key = self.reuse_key
        return self.ws.record_evaluation(verdict.to_dict()), verdict

    def _measure_all(self, jobs: list[tuple[str, str]]) -> list[Verdict | Exception]:
        """Live evaluations, (source, label) each, as many at once as the search evaluated: a verdict
        per job, in order, or the exception its evaluation raised. Given up at once on an interrupt
        (Ctrl-C, or a bench's `interrupt`): the pool aborted and KeyboardInterrupt raised, nothing
        stored, so `resume` finds the run stopped at its limit and finishes it again."""
        pool = self.pool
        assert pool is not None
        at_once = max(1, min(len(jobs), self.parallel(self.ctx.settings.workers)))
        with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="kernelevolve-finish") as ex:
            futures = [
                ex.submit(pool.evaluate_one, source, label, shapes=self.ctx.shapes) for source, label in jobs
            ]
            try:
                while wait(futures, timeout=0.5).not_done:
                    if self.interrupt.is_set():
                        raise KeyboardInterrupt
            except KeyboardInterrupt:
                for f in futures:
                    f.cancel()
                self._abort_evaluations()
                raise
        out: list[Verdict | Exception] = []
        for f in futures:
            exc = f.exception()
            if exc is not None and not isinstance(exc, Exception):
                raise exc  # KeyboardInterrupt and the like: not a verdict
            out.append(f.result() if exc is None else exc)
        return out

    def _abort_evaluations(self) -> None:
        """End the evaluations in flight now (the run interrupted): they record nothing. An executor
        of a plugin without `abort` is waited for."""
        abort = getattr(self.pool, "abort", None)
        if abort is not None:
            abort()


__all__ = ["Engine"]
