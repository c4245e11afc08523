"""Issue I's record from `agent_drive.py`'s outputs: per problem, what the coding agent submitted and
what the harness made of it, with the finish step's re-measured best.

    python benchmarks/agent_record.py DRIVE_DIR [DRIVE_DIR ...] --small SMALL_DIR --out OUT.json

Each DRIVE_DIR holds a `drive.json` (every MCP call: problem, tool, node, wall seconds, status or
error) and, for a finish, `finish-<problem>.json` (the run's summary) and `trajectories.jsonl`. The
calls of one problem may be spread over several directories (one per round); they are joined in the
order given; where a later directory's `runs` names another run for a problem (the problem started
again), the earlier run's calls are kept apart as `superseded`. Per problem: submissions, correct ones, the submission that was first correct, the
median wall time of a submit, and the re-measured best (fitness, speedup vs eager and vs
torch.compile, the faster baseline, whether the re-measure disagreed with the search). SMALL_DIR is
the small-problem run whose submits give the submit-time figure (median of its submits).

Prints a markdown table; `--out` writes everything as JSON; `--trajectories FILE` the runs'
trajectories (every directory's `trajectories.jsonl`, one record per node) joined, with the problem's
own text left out: KernelBench's files are not the project's to copy, so each record's `spec_source`
and the reference's code in its prompt are replaced by the file's name (the trajectories name the
problem, and `../shared/kernelbench` or KernelBench itself has the text).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

OK = ("ok", "suspicious")
SUPERSEDED: dict[str, list[dict[str, Any]]] = {}  # a problem's calls in a run that a later one replaced


def load(dirs: list[Path]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]], int]:
    calls: dict[str, list[dict[str, Any]]] = {}
    finished: dict[str, dict[str, Any]] = {}
    run_of: dict[str, str] = {}
    trajectories = 0
    for d in dirs:
        drive = json.loads((d / "drive.json").read_text())
        for problem, run_id in drive.get("runs", {}).items():
            if run_of.get(problem, run_id) != run_id and problem in calls:  # a new run replaced it
                SUPERSEDED.setdefault(problem, []).extend(calls.pop(problem))
            run_of[problem] = run_id
        for call in drive["calls"]:
            if call["problem"] in run_of or call["tool"] == "start_run":
                calls.setdefault(call["problem"], []).append(call)
        for f in sorted(d.glob("finish-*.json")):
            finished[f.stem.removeprefix("finish-")] = json.loads(f.read_text())
        if (d / "trajectories.jsonl").is_file():
            trajectories += sum(1 for line in (d / "trajectories.jsonl").open() if line.strip())
    return calls, finished, trajectories


def row(problem: str, calls: list[dict[str, Any]], summary: dict[str, Any] | None) -> dict[str, Any]:
    submits = [c for c in calls if c["tool"] == "submit"]
    correct = [c for c in submits if c.get("status") in OK]
    first = next((i + 1 for i, c in enumerate(submits) if c.get("status") in OK), None)
    s = summary if isinstance(summary, dict) else {}
    return {
        "problem": problem,
        "submits": len(submits),
        "correct": len(correct),
        "first_correct": first,
        "statuses": [c.get("status") or ("error: " + str(c.get("error"))[:160]) for c in submits],
        "median_submit_s": round(statistics.median(c["seconds"] for c in submits), 1) if submits else None,
        "best_search_fitness": max((c.get("fitness") or 0.0 for c in correct), default=None),
        "best_node": s.get("best_node"),
        "remeasured_fitness": s.get("best_fitness"),
        "remeasured_vs_eager": s.get("best_speedup_vs_eager"),
        "remeasured_vs_compile": s.get("best_speedup_vs_compile"),
        "best_baseline": s.get("best_baseline"),
        "remeasure_disagrees": s.get("remeasure_disagrees"),
        "flags": s.get("flags"),
        "finish_error": s.get("error") if s and "error" in s else (None if s else "not finished"),
        "device": s.get("device"),
    }


REFERENCE_BLOCK = re.compile(r"(## Reference [^\n]*\n```python\n).*?(\n```)", re.DOTALL)


def redacted(record: dict[str, Any], level: str) -> dict[str, Any]:
    """A trajectory record without the problem's text: its source and the prompt's reference code
    become the KernelBench file's name."""
    where = f"[KernelBench {level}/{record.get('spec')}.py at its official size: not copied here]"
    out = dict(record, spec_source=where)
    if isinstance(out.get("prompt"), str):
        out["prompt"] = REFERENCE_BLOCK.sub(lambda m: m.group(1) + where + m.group(2), out["prompt"])
    return out


def fmt(x: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| problem | submits | correct | first correct | median submit | best node | re-measured vs eager "
        "| vs torch.compile | fitness (vs faster) | search fitness |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['problem']} | {r['submits']} | {r['correct']} | {fmt(r['first_correct'], 'd')} "
            f"| {fmt(r['median_submit_s'], '.1f', ' s')} | {fmt(r['best_node'], 'd')} "
            f"| {fmt(r['remeasured_vs_eager'], '.2f', 'x')} | {fmt(r['remeasured_vs_compile'], '.2f', 'x')} "
            f"| {fmt(r['remeasured_fitness'], '.2f', 'x')} | {fmt(r['best_search_fitness'], '.2f', 'x')} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--small", type=Path, help="the small-problem run (submit time)")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--trajectories", type=Path, help="the runs' trajectories joined, the problems' text left out"
    )
    args = ap.parse_args()
    calls, finished, trajectories = load(args.dirs)
    rows = [row(p, calls[p], finished.get(p)) for p in sorted(calls) if not p.startswith("level0")]
    doc: dict[str, Any] = {"problems": rows, "trajectories": trajectories,
                           "superseded": {p: row(p, c, None) for p, c in SUPERSEDED.items()}}  # fmt: skip
    if args.small:
        small = [
            c for c in json.loads((args.small / "drive.json").read_text())["calls"] if c["tool"] == "submit"
        ]
        doc["small_submit_s"] = [c["seconds"] for c in small]
        doc["small_submit_median_s"] = statistics.median(c["seconds"] for c in small) if small else None
    print(table(rows))
    if args.small:
        print(
            f"\nsmall-problem submit: median {doc['small_submit_median_s']:.1f} s of {doc['small_submit_s']}"
        )
    print(f"trajectories exported: {trajectories}")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1, default=str))
    if args.trajectories:
        levels = {p.split("__", 1)[1]: p.split("__", 1)[0] for p in calls}
        with args.trajectories.open("w") as sink:
            for d in args.dirs:
                if (d / "trajectories.jsonl").is_file():
                    for line in (d / "trajectories.jsonl").open():
                        if line.strip():
                            record = json.loads(line)
                            level = levels.get(str(record.get("spec")))  # None: not a KernelBench file
                            sink.write(json.dumps(redacted(record, level) if level else record) + "\n")


if __name__ == "__main__":
    main()
