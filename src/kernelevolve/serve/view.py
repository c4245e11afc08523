"""What the live view shows, as JSON-able dicts: the runs list, one run (progress, charts, node
rows), one node (source and diff), one bench, and the stamps that tell a poll whether anything
changed. Read from one workspace opened read-only; the package docstring has the threat model.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from kernelevolve.errors import WorkspaceError
from kernelevolve.report.fmt import finite, fmt_duration, fmt_x, one_line
from kernelevolve.report.render import (
    NODE_COLUMNS,
    SHAPE_COLUMNS,
    find_best,
    gather,
    node_row,
    render_html,
    shape_row,
)
from kernelevolve.report.svg import curve_svg, node_status, tree_svg
from kernelevolve.store import Workspace

_JSON_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _finite_only(value: Any) -> Any:
    """NaN and infinities (which a verdict may hold) as null: JSON has no spelling for them."""
    if isinstance(value, float):
        return value if finite(value) is not None else None
    if isinstance(value, dict):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_only(v) for v in value]
    return value


def to_json(doc: Any) -> bytes:
    """JSON whose text holds no `<`, `>` or `&`: inert wherever it ends up."""
    text = json.dumps(_finite_only(doc), default=str, allow_nan=False)
    return re.sub("[<>&\u2028\u2029]", lambda m: _JSON_UNSAFE[m.group()], text).encode()


def _seconds_between(start: Any, end: Any) -> float | None:
    try:
        return (datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds()
    except ValueError:
        return None


class LiveView:
    """What the endpoints answer, as JSON-able dicts, read from one workspace opened read-only."""

    def __init__(self, root: Path):
        self.root = root
        self.ws = Workspace.open_readonly(root)

    def close(self) -> None:
        self.ws.close()

    # -- change detection -------------------------------------------------------------------------

    @staticmethod
    def _stamp(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()[:16]  # a hash: short, and safe in a URL as it is

    def run_stamp(self, run_id: str) -> str:
        """Changes whenever the run or any of its nodes is written (every write sets `updated_at`)."""
        return self._stamp(self.ws.change_token(run_id))

    def list_stamp(self) -> str:
        return self._stamp(self.ws.change_token())

    # -- the runs list ----------------------------------------------------------------------------

    def runs(self) -> dict[str, Any]:
        best = self.ws.best_fitness_by_run()
        names = self.ws.spec_names()
        runs = []
        for r in self.ws.runs(limit=500):
            counts = r.get("nodes") or {}
            runs.append(
                {
                    "run_id": r["run_id"],
                    "spec": names.get(r["spec_fingerprint"]) or Path(str(r["spec_path"])).stem,
                    "platform": r["platform"],
                    "synthesizer": r["synthesizer"],
                    "policy": r["policy"],
                    "status": r["status"],
                    "nodes": sum(counts.values()),
                    "evaluated": counts.get("evaluated", 0) + counts.get("failed", 0),
                    "budget": (r.get("limits") or {}).get("budget"),
                    "best": fmt_x(best.get(r["run_id"])),
                    "created_at": r["created_at"],
                    "updated_at": r["updated_at"],
                }
            )
        benches = [
            {k: b.get(k) for k in ("bench_id", "dir", "status", "items", "done", "created_at", "updated_at")}
            for b in self.ws.benches(limit=200)
        ]
        return {"runs": runs, "benches": benches}

    # -- one run ----------------------------------------------------------------------------------

    def report_inputs(self, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The run's row and nodes as `write_report` takes them: what the end of a search writes,
        from what the store holds now (a running search has no summary yet)."""
        run = self.ws.run(run_id)
        name = self.ws.spec_names().get(run["spec_fingerprint"])
        summary = run.get("summary") or {}
        report_run = {
            **run,
            "spec_name": name or Path(str(run["spec_path"])).stem,
            "device": summary.get("device") or "",
            "method": summary.get("method") or {},
            "final": summary.get("final"),
            "baseline": summary.get("baseline") or (run.get("config") or {}).get("fitness_baseline"),
            "best_node": summary.get("best_node", run.get("best_node")),
        }
        return report_run, self.ws.nodes(run["run_id"])

    def run(self, run_id: str) -> dict[str, Any]:
        run_id = self.ws.resolve_run(run_id)
        stamp = self.run_stamp(run_id)
        run, nodes = self.report_inputs(run_id)
        facts = gather(run, nodes)
        started = run.get("created_at")
        at = {n["id"]: _seconds_between(started, n.get("updated_at")) for n in nodes}
        for p in facts.curve:
            p.at_s = at.get(p.node)
        best = facts.best["id"] if facts.best else None
        link = f"#/run/{run['run_id']}/node/{{id}}"
        evaluated = len(facts.curve)
        budget = finite((run.get("limits") or {}).get("budget"))
        counts: dict[str, int] = {}
        for n in nodes:
            counts[n.get("state") or "-"] = counts.get(n.get("state") or "-", 0) + 1
        return {
            "stamp": stamp,
            "run_id": run["run_id"],
            "title": facts.title,
            "status": run.get("status"),
            "header": facts.header,
            "headline": facts.headline,
            "progress": {
                "evaluated": evaluated,
                "budget": budget,
                "states": counts,
                "statuses": facts.counts,
                "best": fmt_x(facts.curve[-1].best) if facts.curve else "-",
                "elapsed": fmt_duration(_seconds_between(started, run.get("updated_at"))),
            },
            "best": best,
            "best_path": facts.best_path,
            "charts": {
                "tree": tree_svg(nodes, best, set(facts.best_path), href=link),
                "curve": curve_svg(facts.curve, facts.baseline),
                "time": curve_svg(facts.curve, facts.baseline, by_time=True),
            },
            "columns": list(NODE_COLUMNS[:9]),  # the report's, without the message
            "nodes": [
                {"id": n["id"], "state": n.get("state"), "status": node_status(n), "cells": node_row(n)[:9]}
                for n in nodes
            ],
        }

    def node(self, run_id: str, node_id: int) -> dict[str, Any]:
        run_id = self.ws.resolve_run(run_id)
        nodes = {n["id"]: n for n in self.ws.nodes(run_id)}
        if node_id not in nodes:
            raise WorkspaceError(f"run {run_id} has no node {node_id}", hint="pick a node in the tree")
        n = nodes[node_id]
        parent = nodes.get(n.get("parent"))
        diff, diff_note = None, ""
        if parent is None:
            diff_note = "a seed: it has no parent"
        elif not parent.get("source") or not n.get("source"):
            diff_note = "a source was not recorded"
        else:
            lines = difflib.unified_diff(
                str(parent["source"]).splitlines(),
                str(n["source"]).splitlines(),
                f"node {parent['id']} (parent)",
                f"node {node_id}",
                lineterm="",
            )
            diff = "\n".join(lines) or None
            diff_note = "" if diff else "identical to its parent's"
        verdict = n.get("verdict") or {}
        return {
            "run_id": run_id,
            "id": node_id,
            "facts": [
                ("parent", "-" if n.get("parent") is None else str(n["parent"])),
                ("second parent", "-" if n.get("parent2") is None else str(n["parent2"])),
                ("mode", str(n.get("mode") or "-")),
                ("state", str(n.get("state") or "-")),
                ("status", node_status(n)),
                ("fitness", fmt_x(n.get("fitness")) if node_status(n) == "ok" else "-"),
                ("vs eager", fmt_x(n.get("speedup_vs_eager"))),
                ("vs compile", fmt_x(n.get("speedup_vs_compile"))),
                ("evaluation", fmt_duration(n.get("eval_s")) if finite(n.get("eval_s")) else "-"),
                ("note", one_line(n.get("note"), 2000) or "-"),
                ("message", str(n.get("message") or "-")),
            ],
            "shape_columns": SHAPE_COLUMNS,
            "shapes": [shape_row(s) for s in verdict.get("shapes") or [] if isinstance(s, dict)],
            "source": n.get("source"),
            "diff": diff,
            "diff_note": diff_note,
        }

    def report_html(self, run_id: str) -> str:
        run, nodes = self.report_inputs(self.ws.resolve_run(run_id))
        facts = gather(run, nodes)
        best = find_best(run, nodes)
        tree = tree_svg(nodes, best["id"] if best else None, set(facts.best_path))
        return render_html(facts, curve_svg(facts.curve, facts.baseline), tree)

    # -- one bench --------------------------------------------------------------------------------

    def bench(self, bench_id: str) -> dict[str, Any]:
        from kernelevolve.bench.report import COLUMNS, cell, header, plots, reference_us, summary_rows
        from kernelevolve.bench.runner import bench_document

        bench_id = self.ws.resolve_bench(bench_id)
        stamp = self._stamp(self.ws.bench_change_token(bench_id))
        doc = bench_document(self.ws, bench_id)
        return {
            "stamp": stamp,
            "bench_id": bench_id,
            "header": header(doc),
            "summary": summary_rows(doc["summary"]),
            "columns": [h for h, _ in COLUMNS],
            "rows": [
                {
                    "run_id": r.get("run_id"),
                    "cells": [cell(k, {**r, **reference_us(r)}.get(k)) for _, k in COLUMNS],
                }
                for r in doc["results"]
            ],
            "pending": doc.get("pending") or [],
            "load_errors": doc.get("load_errors") or [],
            "charts": plots(doc),
        }


__all__ = ["LiveView", "to_json"]
