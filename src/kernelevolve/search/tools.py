"""What the engine hands out and writes down besides the loop itself.

- `EngineTools`: the `Tools` a synthesizer may use: lint in this process (the AST only), quick runs in
  the evaluator pool's isolated workers, and the workspace's knowledge base.
- `describe_verdict`: a verdict as the few lines a person or a model needs.
- `RunLock`: one driver per run.
- `dispatch_table`: the export's per-shape choice of kernel or reference.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelevolve.errors import WorkspaceError
from kernelevolve.evaluate.pool import static_report
from kernelevolve.evaluate.verdict import Verdict
from kernelevolve.platforms import Platform
from kernelevolve.spec import Spec
from kernelevolve.synth.base import Snippet

if TYPE_CHECKING:
    from kernelevolve.evaluate.executors import Evaluator


class EngineTools:
    """The `Tools` a synthesizer may use: lint in this process (the AST only), quick runs in the
    evaluator pool's isolated workers, search in the knowledge base (`kb`: a KnowledgeBase)."""

    def __init__(self, pool: Evaluator | None, spec: Spec, platform: Platform, kb: Any = None,
                 target: str = ""):  # fmt: skip
        self.pool, self.spec, self.platform, self.kb, self.target = pool, spec, platform, kb, target
        sizes = [(spec.footprint_bytes(s.name) or 0, s.name) for s in spec.shapes]
        self.smallest = min(sizes)[1]

    def lint(self, source: str) -> str:
        report = static_report(source, self.spec, self.platform)
        if report.syntax_error:
            return f"syntax error: {report.syntax_error}"
        return "\n".join(str(v) for v in report.violations) or "ok"

    def quick_run(self, source: str) -> str:
        if self.pool is None:
            return "quick runs are not available here: submit the candidate to have it evaluated"
        v = self.pool.evaluate_one(source, "quick_run.py", shapes=[self.smallest], timing_budget_s=0.2)
        return describe_verdict(v.to_dict())

    def search_knowledge(self, query: str, limit: int = 5) -> list[Snippet]:
        if self.kb is None:
            return []
        from kernelevolve.knowledge.index import Signals

        hits = self.kb.retrieve(
            Signals(platform=self.platform.name, target=self.target, text=query), limit=limit
        )
        return [snippet(h) for h in hits]


def snippet(hit: Any) -> Snippet:
    """A retrieval hit as the synthesizer's `Snippet`."""
    d = hit.doc
    data = {"change": d.meta["change"]} if "change" in d.meta else {}
    return Snippet(
        doc=d.id, title=d.title, text=d.body, score=round(hit.score, 3), category=d.category, data=data
    )


def describe_verdict(v: dict[str, Any]) -> str:
    """A verdict as the few lines a person or a model needs."""
    lines = [f"status: {v.get('status')}; {v.get('message') or ''}".rstrip("; ")]
    for s in v.get("shapes", []):
        parts = [f"shape {s.get('name')}: correct={s.get('correct')}"]
        if s.get("failed_check"):
            parts.append(f"failed: {s['failed_check']}")
        if s.get("max_abs_err") is not None:
            parts.append(f"max abs err {s['max_abs_err']:.3g}, max rel err {s.get('max_rel_err') or 0:.3g}")
        if s.get("candidate"):
            parts.append(f"{s['candidate']['median_s'] * 1e6:.1f} us")
        if s.get("speedup_vs_best") is not None:  # what fitness ranks by, first
            parts.append(f"{s['speedup_vs_best']:.2f}x vs {s.get('best_baseline')} (the faster baseline)")
        for b in ("eager", "compile"):
            if s.get(f"speedup_vs_{b}") is not None:
                parts.append(f"{s[f'speedup_vs_{b}']:.2f}x vs {b}")
        if s.get("roofline_fraction") is not None:
            parts.append(f"{100 * s['roofline_fraction']:.0f}% of roofline ({s.get('bound')}-bound)")
        lines.append("; ".join(parts))
    return "\n".join(lines)


class RunLock:
    """An exclusive, non-blocking lock on a run: one driver at a time, released when the process dies."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise WorkspaceError(
                f"run {self.path.parent.name} is being driven by another process",
                hint="wait for it to finish, or stop it (Ctrl-C) and `kernelevolve resume` the run",
            ) from None
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def dispatch_table(
    shapes: list[str], winners: dict[str, int], finals: dict[int, Verdict], min_gain: float
) -> dict[str, dict[str, Any]]:
    """Per shape: the re-measured winner where it beats the reference's faster form beyond the noise,
    else that form (`fallback`): the spec's Model run eagerly, or compiled by torch.compile where that
    was faster beyond the noise in the same measurement (the export then runs the reference through
    torch.compile at that shape): its median faster by more than both spreads, or by the minimum gain
    with the two interquartile ranges apart (one disturbed block of trials inflates a spread, a
    half-range: swiglu's compiled reference ran 1.68x faster than eager with a spread of 2.8, and the
    export ran eager there, H200). The choice is made against the fallback whatever the run's fitness
    baseline. Each entry: node (or None), the winner considered, the fallback, its speedups (vs
    eager, compile and the best baseline, named), its and the baselines' times (in the same
    measurement), roofline fraction."""
    out: dict[str, dict[str, Any]] = {}
    for shape in shapes:
        entry: dict[str, Any] = {"node": None}
        node_id = winners.get(shape)
        v = finals.get(node_id) if node_id is not None else None
        s = next((x for x in v.shapes if x.name == shape), None) if v is not None and v.ok else None
        if s is not None and s.candidate is not None:
            fallback, base = "eager", s.eager
            if s.compile is not None and s.eager is not None:
                apart = max(s.compile.spread, s.eager.spread, min_gain)
                quartiles_apart = (
                    s.compile.p75_s < s.eager.p25_s and s.compile.median_s * (1 + min_gain) < s.eager.median_s
                )
                if s.compile.median_s * (1 + apart) < s.eager.median_s or quartiles_apart:
                    fallback, base = "compile", s.compile
            sp = (
                base.median_s / s.candidate.median_s
                if base is not None and s.candidate.median_s > 0
                else None
            )
            noise = max(s.candidate.spread, base.spread if base else 0.0, min_gain)
            entry = {
                "node": node_id if sp is not None and sp > 1 + noise else None,
                "candidate_node": node_id,
                "fallback": fallback,
                "weight": s.weight,
                "correct": s.correct,
                "time_us": s.candidate.median_s * 1e6,
                "eager_us": s.eager.median_s * 1e6 if s.eager else None,
                "compile_us": s.compile.median_s * 1e6 if s.compile else None,
                "speedup_vs_eager": s.speedup_vs_eager,
                "speedup_vs_compile": s.speedup_vs_compile,
                "best_baseline": s.best_baseline,
                "speedup_vs_best": s.speedup_vs_best,
                "roofline_fraction": s.roofline_fraction,
                "bound": s.bound,
                "noise": noise,
            }
        out[shape] = entry
    return out


__all__ = ["EngineTools", "RunLock", "describe_verdict", "dispatch_table", "snippet"]
