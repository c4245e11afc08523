"""The project's KernelBench record from `kernelevolve bench --json` documents, one per level.

    python benchmarks/kernelbench_record.py level1=L1.json level2=L2.json level3=L3.json \
        --title "..." --out benchmarks/results/DATE-DEVICE-kernelbench.md

Writes a markdown page (per level: the summary metrics, how the problems ended, and one row per
problem: loaded, the reference's eager and torch.compile times, tuner coverage, the best kernel's
speedups, and the row's reason where there is no correct kernel) and, beside it, a JSON file with the
documents' results and summaries as they were. What each column means:

- loaded: the spec loaded and a run was set up for it (a load error names the reason);
- eager us / compile us: the reference's times over the problem's shapes, from the best kernel's
  re-measurement or, where no candidate was timed, from the baselines the bench measured for it;
- coverage: `templated` (the tuner wrote at least one candidate), `not templated` (the row gives the
  reason), or `not templated (a warm start only)`: the run's one candidate was an earlier run's kernel
  and the tuner had nothing of its own to try;
- vs eager / vs compile: what the exported module delivers (the kernel where it beats eager beyond
  the noise, the reference elsewhere), as `kernelevolve bench` reports it; a row flagged for review
  (above 10x over a baseline) shows its figure and counts 1.0 in the summary.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any


def _us(row: dict[str, Any], key: str) -> float | None:
    shapes = row.get("shapes") or row.get("baselines") or []
    times = [s.get(key) for s in shapes]
    return sum(times) if times and all(t is not None for t in times) else None


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if kind == "x" else f"{value:,.1f}"


def outcome(row: dict[str, Any]) -> str:
    """How a problem ended, in a few words (the row's message says the rest)."""
    if row.get("correct"):
        return "correct, flagged for review" if row.get("flags") else "correct"
    message = str(row.get("message") or "")
    if message.startswith("no candidate"):
        return "not templated"
    if "runtime_error" in message:
        return "no correct kernel (runtime error)"
    if "incorrect" in message:
        return "no correct kernel (incorrect)"
    if "oom" in message.lower() or "OutOfMemory" in message:
        return "out of memory"
    if "re-measurement" in message:
        return "failed its re-measurement"
    return "no correct kernel (other)"


def _coverage(row: dict[str, Any]) -> str:
    """Whether the tuner wrote a candidate: not where the row says "no candidate", nor where the only
    candidate was a warm start and the tuner then declined (it had nothing of its own to try)."""
    if str(row.get("message") or "").startswith("no candidate"):
        return "not templated"
    declined = "nothing new to try" in str(row.get("stop_reason") or "")
    if declined and int(row.get("candidates") or 0) <= 1 and not row.get("correct"):
        return "not templated (a warm start only)"
    return "templated"


def level_section(name: str, doc: dict[str, Any]) -> list[str]:
    s = doc["summary"]
    results = doc["results"]
    lines = [f"## {name}", ""]
    lines.append(
        f"{s['specs']} problems run, {len(doc.get('load_errors') or [])} failed to load, "
        f"{len(doc.get('pending') or [])} not run. Correct: {s['correct']} ({100 * s['correctness_rate']:.0f}%)."
    )
    lines += ["", "| metric | vs eager | vs compile |", "| --- | ---: | ---: |"]
    for label, key in (("fast_0 (correct)", "fast_0"), ("fast_1", "fast_1"), ("fast_1.2", "fast_1_2"),
                       ("fast_2", "fast_2"), ("geomean (failures as 1.0)", "geomean"),
                       ("geomean (correct only)", "geomean_correct_only")):  # fmt: skip
        cells = []
        for base in ("eager", "compile"):
            value = (
                s.get(f"{key}_vs_{base}")
                if not key.startswith("geomean")
                else s.get(f"geomean_vs_{base}" + ("_correct_only" if key.endswith("only") else ""))
            )
            cells.append(
                "-"
                if value is None
                else (f"{value:.3f}" if key.startswith("geomean") else f"{100 * value:.0f}%")
            )
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    counts = Counter(outcome(r) for r in results)
    lines += ["", "How they ended: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()) + "."]
    coverage = Counter(_coverage(r) for r in results)
    lines += ["Tuner coverage: " + ", ".join(f"{k} {v}" for k, v in coverage.most_common()) + "."]
    with_times = sum(1 for r in results if _us(r, "eager_us") is not None)
    lines += [f"The reference's eager time is in {with_times} of {len(results)} rows."]
    lines += ["", "| problem | loaded | eager us | compile us | coverage | vs eager | vs compile | outcome |",
              "| --- | --- | ---: | ---: | --- | ---: | ---: | --- |"]  # fmt: skip
    for r in sorted(results, key=lambda r: _order(r["path"])):
        coverage = _coverage(r)
        lines.append(
            f"| {r['name']} | yes | {_fmt(_us(r, 'eager_us'), 'us')} | {_fmt(_us(r, 'compile_us'), 'us')} | "
            f"{coverage} | {_fmt(r.get('speedup_vs_eager') if r.get('correct') else None, 'x')} | "
            f"{_fmt(r.get('speedup_vs_compile') if r.get('correct') else None, 'x')} | {outcome(r)} |"
        )
    for path in sorted(doc.get("pending") or [], key=_order):
        lines.append(f"| {Path(path).stem} | not run | - | - | - | - | - | not reached |")
    for e in doc.get("load_errors") or []:
        lines.append(f"| {Path(e['path']).stem} | no: {e['error'][:160]} | - | - | - | - | - | load error |")
    flagged = [r for r in results if r.get("flags")]
    if flagged:  # counted 1.0 in the figures above until reviewed (`bench.metrics`)
        lines += ["", "Flagged for review (counted 1.0 in the figures above):", ""]
        lines += [f"- {r['name']}: {'; '.join(r['flags'])[:300]}" for r in flagged]
    reasons = [r for r in results if not r.get("correct")]
    if reasons:
        lines += ["", "<details><summary>Each row's reason, where there is no correct kernel</summary>", ""]
        lines += [
            f"- {r['name']}: {str(r.get('message'))[:300]}"
            for r in sorted(reasons, key=lambda r: _order(r["path"]))
        ]
        lines += ["", "</details>"]
    return [*lines, ""]


def _order(path: str) -> tuple[int, str]:
    head = Path(path).stem.split("_", 1)[0]
    return (int(head), path) if head.isdigit() else (10**6, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("levels", nargs="+", help="NAME=BENCH.json (as `kernelevolve bench --json` printed it)")
    ap.add_argument("--title", required=True)
    ap.add_argument("--preamble", type=Path, help="markdown to put under the title (the method, the device)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    docs = {}
    for item in args.levels:
        name, path = item.split("=", 1)
        docs[name] = json.loads(Path(path).read_text())
    lines = [f"# {args.title}", ""]
    if args.preamble:
        lines += [args.preamble.read_text().strip(), ""]
    total = sum(d["summary"]["specs"] + len(d.get("load_errors") or []) for d in docs.values())
    correct = sum(d["summary"]["correct"] for d in docs.values())
    lines += [f"{total} problems in all; {correct} with a correct kernel.", ""]
    for name, doc in docs.items():
        lines += level_section(name, doc)
    args.out.write_text("\n".join(lines))
    keep = {name: {k: doc.get(k) for k in ("bench_id", "environment", "summary", "results", "load_errors", "pending",
                                           "budget", "per_device", "track", "synthesizer")}
            for name, doc in docs.items()}  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps(keep, indent=1, default=str))
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
