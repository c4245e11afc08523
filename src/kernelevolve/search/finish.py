"""The end of a run: re-measure the winners, verify skills, choose the dispatch, export, report.

Taken once the loop has stopped (or by `kernelevolve agent finish`), with the evaluator pool still
attached, in this order:

1. One batch of live measurements in fresh workers, as many at once as the search evaluated
   (`measure_all`; each distinct kernel once):
   - the winners: the best node overall, and per shape the node fastest there beyond the noise
     (`shape_winners`); up to `MAX_REMEASURE` distinct winners, each measurement stored as an
     evaluation: the number reported is never the lucky one found during the search;
   - the run's candidate skills: the parent and child of the largest (`learning.skill_checks`).
     A kernel that is both (the best node is often a skill's child) is measured once.
   Measured one after the other, a run's end took three to five fresh workers in a row (36 s of a
   117 s run of KernelBench's 30_Softsign at official size on an H100).
2. The profile in flight is waited for: its diagnosis belongs in the report.
3. `best.py` (the best node's source) and the dispatch (`tools.dispatch_table`): per shape, the
   re-measured winner where it beats eager beyond the noise, else the reference.
4. The skills whose gain reproduced are indexed (`learning.record_skill_checks`). Derived data: a
   failure is an event, never the run's end.
5. The summary, stored with the run (status `done`); the export module (a failure to export, e.g.
   two shapes the inputs cannot tell apart, is an event and no export); the report, whose paths are
   stored with the summary last.

An interrupt during any of its measurements ends the step at once (the engine's `measure` aborts
the pool): the run is not marked done, and `resume` finishes it again.

Deliberately not here: how an evaluation is made or given up (`engine.py`), the export module's code
(`kernelevolve.export`), the report's look (`kernelevolve.report`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from kernelevolve.errors import KernelevolveError
from kernelevolve.evaluate.verdict import Verdict, best_baseline_label
from kernelevolve.search import learning
from kernelevolve.search.context import EngineContext, Event
from kernelevolve.search.limits import Limits
from kernelevolve.search.policies import SearchConfig
from kernelevolve.search.tools import dispatch_table
from kernelevolve.search.tree import Tree

MAX_REMEASURE = 4  # distinct winners re-measured at the end


@dataclass
class FinishStep:
    """One run's finish step, with what it takes from the engine that drove the run."""

    ctx: EngineContext
    run_id: str
    search: SearchConfig
    limits: Limits
    synthesizer: str  # its name, for the summary
    emit: Event
    # Evaluations in fresh workers, several at once: a verdict per (source, label), in order, or the
    # exception its evaluation raised; KeyboardInterrupt, nothing stored, on an interrupt
    measure_all: Callable[[list[tuple[str, str]]], list[Verdict | Exception]]
    wall_s: Callable[[], float]  # the run's wall time so far, over all its sessions
    join_profiles: Callable[[], None]  # wait for the profile in flight
    index_docs: Callable[[list[Any]], None]  # the knowledge base's, for skills that became verified

    def run(self, tree: Tree, reason: str) -> dict[str, Any]:
        """Re-measure the winners; write the best kernel, the export and the report; the summary."""
        ws, ctx = self.ctx.ws, self.ctx
        best = tree.best(self.search.min_gain)
        baseline = ctx.settings.fitness_baseline
        winners = shape_winners(tree, best, self.search.min_gain)
        finals, skills = self._measure(tree, best, winners)
        self.join_profiles()  # its diagnosis belongs in the report
        out = ctx.out_dir
        out.mkdir(parents=True, exist_ok=True)
        best_path = None
        if best is not None and best.source is not None:
            best_path = out / "best.py"
            best_path.write_text(best.source)
        dispatch = dispatch_table(ctx.shapes or ctx.spec.names, winners, finals, self.search.min_gain)
        final = finals.get(best.id) if best else None
        verified = self._record_skills(*skills)
        summary = self._summary(tree, best, final, reason, best_path, dispatch, baseline)
        summary["warm_start"] = [{"node": n.id, "note": n.note, "fitness": n.fitness}
                                 for n in tree.nodes.values() if n.mode == "warm"]  # fmt: skip
        summary["seeds"] = self._seeds(tree)
        summary["skills"] = {"candidates": sum(1 for s in ws.skills() if any(p["run"] == self.run_id for p in s["provenance"])),
                             "verified": [s["id"] for s in verified]}  # fmt: skip
        summary["export"] = self._export(tree, dispatch)
        ws.update_run(self.run_id, status="done", summary=summary, wall_s=self.wall_s(),
                      best_node=best.id if best else None)  # fmt: skip
        summary["report"] = self._report(summary)
        ws.update_run(self.run_id, summary=summary)
        return summary

    def _seeds(self, tree: Tree) -> list[dict[str, Any]]:
        """The user's kernels (`--start-from`), each with its verdict at search time: a seed that
        failed says how, a correct one how fast it was."""
        files = {e.get("node"): e["path"] for e in self.ctx.ws.run(self.run_id)["config"].get("seeds") or []
                 if isinstance(e, dict)}  # fmt: skip
        out = []
        for n in tree.nodes.values():
            if n.mode != "seed":
                continue
            out.append({
                "node": n.id, "file": files.get(n.id), "state": n.state, "status": n.status,
                "fitness": n.fitness if n.ok else None, "speedup_vs_eager": n.speedup_vs_eager if n.ok else None,
                "speedup_vs_compile": n.speedup_vs_compile if n.ok else None,
                "message": None if n.ok else (n.message or "").strip()[:500],
            })  # fmt: skip
        return out

    def _measure(
        self, tree: Tree, best: Any, winners: dict[str, int]
    ) -> tuple[dict[int, Verdict], tuple[list[learning.SkillCheck], list[tuple[Verdict | Exception, ...]]]]:
        """Step 1: the winners' and the skills' kernels measured in one batch, each distinct kernel
        once; the winners' measurements stored. Returns the winners' verdicts by node, and the skill
        checks with their (parent, child) verdicts."""
        to_measure = ([best.id] if best else []) + [
            n for n in dict.fromkeys(winners.values()) if not best or n != best.id
        ]
        to_measure = to_measure[:MAX_REMEASURE]
        checks = self._skill_checks(tree)
        jobs: list[tuple[str, str]] = []
        job_of: dict[str, int] = {}  # source -> its job

        def job(source: str | None, label: str) -> int:
            assert source is not None
            if source not in job_of:
                job_of[source] = len(jobs)
                jobs.append((source, label))
            return job_of[source]

        for node_id in to_measure:
            self.emit("remeasure", {"node": node_id})
        node_jobs = {n: job(tree[n].source, f"node-{n}-final.py") for n in to_measure}
        for check in checks:
            self.emit("verify_skill", {"label": f"skill-{check.skill_id}"})
        check_jobs = [(job(c.parent_source, f"skill-{c.skill_id}-parent.py"),
                       job(c.child_source, f"skill-{c.skill_id}-child.py")) for c in checks]  # fmt: skip
        measured = self.measure_all(jobs) if jobs else []
        finals: dict[int, Verdict] = {}
        for node_id, j in node_jobs.items():
            v = measured[j]
            if isinstance(v, Exception):  # the run fails, as when the winners were measured one by one
                raise v
            finals[node_id] = v
        for j in dict.fromkeys(node_jobs.values()):  # one stored evaluation per measurement
            self.ctx.ws.record_evaluation(cast(Verdict, measured[j]).to_dict())
        return finals, (checks, [(measured[p], measured[c]) for p, c in check_jobs])

    def _skill_checks(self, tree: Tree) -> list[learning.SkillCheck]:
        settings = self.ctx.settings
        if not settings.skills or settings.skills_verify <= 0:
            return []
        try:
            return learning.skill_checks(self.ctx.ws, self.run_id, tree, settings.skills_verify)
        except Exception as exc:  # derived data: never costs the run its result
            self.emit(
                "learn_failed", {"node": None, "error": f"verifying skills: {type(exc).__name__}: {exc}"}
            )
            return []

    def _record_skills(
        self, checks: list[learning.SkillCheck], measured: list[tuple[Verdict | Exception, ...]]
    ) -> list[dict[str, Any]]:
        try:
            pairs = []
            for pv, cv in measured:
                for v in (pv, cv):
                    if isinstance(v, Exception):
                        raise v
                pairs.append((cast(Verdict, pv).to_dict(), cast(Verdict, cv).to_dict()))
            return learning.record_skill_checks(self.ctx.ws, self.run_id, checks, pairs, self.search.min_gain,
                                                self.index_docs)  # fmt: skip
        except Exception as exc:  # derived data: never costs the run its result
            self.emit(
                "learn_failed", {"node": None, "error": f"verifying skills: {type(exc).__name__}: {exc}"}
            )
            return []

    def _summary(
        self, tree: Tree, best: Any, final: Verdict | None, reason: str, best_path: Path | None,
        dispatch: dict[str, dict[str, Any]], baseline: str,
    ) -> dict[str, Any]:  # fmt: skip
        ctx = self.ctx
        run = ctx.ws.run(self.run_id)
        evaluated = tree.evaluated()
        measured = final if final is not None and final.ok else None
        # Per shape, what the export runs there and the re-measurement it was chosen on: the dispatch's
        # kernel (or the reference, eager or compiled, where no kernel beat it beyond the noise) with its figures.
        shapes = []
        for name, entry in dispatch.items():
            if entry.get("candidate_node") is None:
                continue
            shapes.append({
                "shape": name, "node": entry.get("node"), "candidate_node": entry["candidate_node"],
                **{k: entry.get(k) for k in ("weight", "correct", "time_us", "eager_us", "compile_us",
                                             "best_baseline", "speedup_vs_best", "speedup_vs_eager",
                                             "speedup_vs_compile", "roofline_fraction", "bound")},
                "dispatch": "kernel" if entry.get("node") else
                            "reference (compiled)" if entry.get("fallback") == "compile" else "reference",
            })  # fmt: skip
        shown = measured or final
        method = shown.method if shown is not None else None
        return {
            "run_id": self.run_id,
            "status": "done",
            "stop_reason": reason,
            "spec": ctx.spec.name,
            "spec_path": str(ctx.spec.path),
            "platform": ctx.platform.name,
            "device": method.device if method else ctx.profile.get("device"),
            "synthesizer": self.synthesizer,
            "policy": self.search.policy,
            "baseline": baseline,
            "nodes": len(tree),
            "nodes_evaluated": len(evaluated),
            "nodes_ok": len(tree.ok()),
            "nodes_failed": sum(
                1 for n in tree.nodes.values() if n.state == "failed" or (n.state == "evaluated" and not n.ok)
            ),
            "best_node": best.id if best else None,
            "best_fitness": measured.fitness if measured else None,
            "best_speedup_vs_eager": measured.speedup_vs_eager if measured else None,
            "best_speedup_vs_compile": measured.speedup_vs_compile if measured else None,
            "best_speedup_vs_best": measured.speedup_vs_best if measured else None,
            "best_baseline": best_baseline_label(s.best_baseline for s in measured.shapes)
            if measured
            else None,
            "best_search_fitness": best.fitness if best else None,
            "remeasure_disagrees": remeasure_disagreement(best, measured),
            "final_status": str(final.status) if final is not None else None,
            "final_message": final.message if final is not None and not final.ok else None,
            "best_candidate": str(best_path) if best_path else None,
            "shapes": shapes,
            "dispatch": dispatch,
            "flags": list(measured.flags) if measured else [],
            "method": asdict(method) if method else None,
            "final": final.to_dict() if final is not None else None,
            "tokens_in": run["tokens_in"],
            "tokens_out": run["tokens_out"],
            "cost_usd": run["cost_usd"],
            # the evaluations' time on the device: GPU-seconds on a GPU (None elsewhere, not a GPU's)
            "gpu_s": round(sum(n.eval_s for n in evaluated), 2)
            if ctx.platform.name in ("cuda", "rocm")
            else None,
            "eval_s": round(sum(n.eval_s for n in evaluated), 2),
            "wall_s": round(self.wall_s(), 2),
            "limits": dataclasses.asdict(self.limits),
            "out_dir": str(ctx.out_dir),
        }

    def _export(self, tree: Tree, dispatch: dict[str, dict[str, Any]]) -> str | None:
        from kernelevolve.export import compiled_from_dispatch, export_dispatch, variants_from_dispatch

        # Each winner runs where its guards (derived from the shapes it was verified correct on) allow.
        variants, speedups, verified = variants_from_dispatch(
            dispatch, lambda i: tree[i].source, lambda i: tree[i].verdict
        )
        device_type = "cuda" if self.ctx.platform.name in ("cuda", "rocm") else "cpu"
        try:
            path = export_dispatch(self.ctx.spec, variants, self.ctx.out_dir, speedups=speedups,
                                   device_type=device_type, verified=verified,
                                   compiled=compiled_from_dispatch(dispatch))  # fmt: skip
        except KernelevolveError as exc:  # e.g. two shapes the inputs cannot tell apart
            self.emit("export_failed", {"error": exc.message})
            return None
        return str(path)

    def _report(self, summary: dict[str, Any]) -> dict[str, str] | None:
        from kernelevolve.report import write_report

        ws, spec = self.ctx.ws, self.ctx.spec
        run = ws.run(self.run_id)
        report_run = {
            **run, "spec_name": spec.name, "spec_path": str(spec.path),
            "device": summary.get("device") or "", "method": summary.get("method") or {},
            "final": summary.get("final"), "baseline": summary["baseline"],
            "best_node": summary.get("best_node"),
        }  # fmt: skip
        paths = write_report(report_run, ws.nodes(self.run_id), self.ctx.out_dir)
        return {k: str(v) for k, v in paths.items()}


def remeasure_disagreement(best: Any, measured: Verdict | None) -> str | None:
    """Where the best node's final re-measurement (fresh workers) and its search-time verdict differ
    beyond both measurements' spreads (at least `learning.SLOWER`): what was said, for the summary and
    the report; None where they agree or either is missing. A number from the search that the
    re-measure does not bear out is the one a report must not repeat."""
    if best is None or measured is None or not best.fitness or not measured.fitness:
        return None
    noise = max(learning.SLOWER, (best.spread or 0.0) + (measured.spread or 0.0))
    ratio = measured.fitness / best.fitness
    if abs(ratio - 1) <= noise:
        return None
    return (
        f"re-measured {measured.fitness:.3f}x against {best.fitness:.3f}x at search time ({ratio - 1:+.1%}), "
        f"beyond both measurements' spreads ({noise:.1%}); the report's figures are the re-measure's"
    )


def shape_winners(tree: Tree, best: Any, min_gain: float) -> dict[str, int]:
    """Per shape, the node the export considers there: the run's best, unless another ok node is
    faster at that shape beyond the noise (by its speedup over the best baseline, as fitness
    ranks). One choice, so that a one-shape spec's export, summary and best node agree."""
    winners: dict[str, tuple[float, float, int]] = {}  # shape -> (speedup, spread, node)
    nodes = [best] if best is not None else []
    nodes += [n for n in tree.ok() if best is None or n.id != best.id]
    for n in nodes:
        for s in (n.verdict or {}).get("shapes", []):
            sp = s.get("speedup_vs_best") or s.get("speedup_vs_eager")
            if sp is None:
                continue
            spread = float(s.get("speedup_spread") or 0.0)
            held = winners.get(s["name"])
            noise = max(spread, held[1] if held else 0.0, min_gain)
            if held is None or sp > held[0] * (1 + noise):
                winners[s["name"]] = (sp, spread, n.id)
    return {name: node for name, (_, _, node) in winners.items()}


__all__ = ["MAX_REMEASURE", "FinishStep", "shape_winners"]
