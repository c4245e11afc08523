"""Data out of the workspace for training: trajectories (every step of a search) and winners.

`trajectories(ws, run_ids)` yields one JSON-able record per node of each run, in creation order
(nodes the model never answered, its endpoint down, left out):
the problem (spec name, source, platform, device), the step (node, parents, memory mode, the
synthesizer's prompt and response, its tool calls for a model, the candidate's source), and the
harness's answer (status, correctness, speedups, diagnosis, the node's analysis) with a `reward`.

The reward is a documented function of the verdict, so a record is usable for RL as written:

    reward = 0                                          the candidate failed (any status but ok) or was
                                                        never evaluated; also `suspicious`: a speedup
                                                        flagged for review is not paid
    reward = clamp(1 + log2(fitness), 0.1, 1 + log2(10))  otherwise: fitness is the run's shape-weighted
                                                        speedup over its baseline, so a correct kernel
                                                        as fast as the baseline earns 1, twice as fast
                                                        2, half as fast 0.1 (correct still beats wrong)

`winners(ws, run_ids)` yields one record per finished run with a correct kernel: the spec, the best
kernel's source and its re-measured speedups per shape, and the device and versions they were measured
on. Both are plain dicts; the CLI writes them as JSONL.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from kernelevolve.evaluate.verdict import best_baseline_label
from kernelevolve.store import Workspace

REWARD_CAP = 1 + math.log2(10)
REWARD_FLOOR = 0.1


def reward(status: str | None, fitness: float | None) -> float:
    """The reward of one step (see the module's docstring)."""
    if status != "ok":
        return 0.0
    if not fitness or fitness <= 0 or not math.isfinite(fitness):  # correct, not timed on this platform
        return REWARD_FLOOR
    return round(min(REWARD_CAP, max(REWARD_FLOOR, 1 + math.log2(fitness))), 6)


def _spec(ws: Workspace, run: dict[str, Any]) -> dict[str, Any]:
    row = ws.spec(run["spec_fingerprint"]) or {}
    return {"name": row.get("name"), "fingerprint": run["spec_fingerprint"], "source": row.get("source")}


def trajectories(ws: Workspace, run_ids: Iterable[str]) -> Iterator[dict[str, Any]]:
    for rid in run_ids:
        run = ws.run(rid)
        spec = _spec(ws, run)
        summary = run.get("summary") or {}
        baseline = summary.get("baseline") or run["config"].get("settings", {}).get("fitness_baseline")
        for n in ws.nodes(run["run_id"], text=True):
            if n["status"] == "unavailable":  # the model endpoint was down: no step the model took
                continue
            verdict = n.get("verdict") or {}
            yield {
                "run_id": run["run_id"], "spec": spec["name"], "spec_fingerprint": spec["fingerprint"],
                "spec_source": spec["source"], "platform": run["platform"],
                "device": (verdict.get("method") or {}).get("device") or summary.get("device"),
                "synthesizer": run["synthesizer"], "policy": run["policy"], "baseline": baseline,
                "node": n["id"], "parent": n["parent"], "parent2": n["parent2"], "mode": n["mode"],
                "state": n["state"], "prompt": n.get("prompt"), "response": n.get("response"),
                "actions": n.get("actions") or [], "source": n.get("source"), "status": n["status"],
                "correct": bool(verdict.get("correct")), "fitness": n["fitness"],
                "speedup_vs_eager": n["speedup_vs_eager"], "speedup_vs_compile": n["speedup_vs_compile"],
                "speedup_vs_best": verdict.get("speedup_vs_best"),
                "best_baseline": best_baseline_label(s.get("best_baseline") for s in verdict.get("shapes", [])),
                "reward": reward(n["status"], n["fitness"]) if n["state"] == "evaluated" else 0.0,
                "message": (n.get("message") or "")[:2000], "diagnosis": n.get("diagnosis"),
                "analysis": n.get("analysis") or "", "tokens_in": n["tokens_in"], "tokens_out": n["tokens_out"],
                "cost_usd": n["cost_usd"],
            }  # fmt: skip


def winners(ws: Workspace, run_ids: Iterable[str]) -> Iterator[dict[str, Any]]:
    for rid in run_ids:
        run = ws.run(rid)
        summary = run.get("summary") or {}
        if run["status"] != "done" or summary.get("best_node") is None or not summary.get("shapes"):
            continue
        best = next((n for n in ws.nodes(run["run_id"]) if n["id"] == summary["best_node"]), None)
        if best is None or not best.get("source"):
            continue
        method = summary.get("method") or {}
        yield {
            "run_id": run["run_id"], "spec": _spec(ws, run), "platform": run["platform"],
            "device": method.get("device") or summary.get("device"),
            "versions": {k: method.get(k) for k in ("driver", "torch", "triton", "python", "kernelevolve")},
            "kernel": best["source"], "node": best["id"], "kind": (best.get("verdict") or {}).get("candidate_kind"),
            "speedup_vs_eager": summary.get("best_speedup_vs_eager"),
            "speedup_vs_compile": summary.get("best_speedup_vs_compile"),
            "speedup_vs_best": summary.get("best_speedup_vs_best"), "best_baseline": summary.get("best_baseline"),
            "precision": method.get("precision_policy"), "timer": method.get("timer"),
            "shapes": summary["shapes"], "flags": summary.get("flags") or [],
        }  # fmt: skip


FORMATS = {"trajectories": trajectories, "winners": winners}

__all__ = ["FORMATS", "REWARD_CAP", "REWARD_FLOOR", "reward", "trajectories", "winners"]
