"""The record of a suites bench on one or more precision tracks: its report and every node it counts.

    kernelevolve benches show BID --workspace WS --report OUT          # per track, first
    python benchmarks/suites_record.py RECORD.json tf32=WS:OUT strict=WS2:OUT2 [--note TEXT]

Writes RECORD.json: the note and, per track, the bench's report (OUT/bench.json) and every node of
the runs the bench counts (template and move, status, the message where not ok, per-shape speedups vs
torch.compile, the digest of the harness files that judged it, the id of the key that sealed it, and
`ranked`: whether it was sealed under the key of its run's last segment, so that the op's result
could rank it). Prints the per-op table of the record page (dispatch vs eager and vs compile, the best
kernel vs compile, its roofline fraction, per track).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path
from typing import Any


def nodes(db: sqlite3.Connection, bench_id: str) -> list[dict[str, Any]]:
    out = []
    items = db.execute(
        "SELECT name, run_id FROM bench_items WHERE bench_id = ? ORDER BY position", (bench_id,)
    ).fetchall()
    for item in items:
        rows = db.execute(
            "SELECT n.id, n.status, n.note, n.message, e.seal, e.verdict_json FROM nodes n "
            "LEFT JOIN evaluations e ON e.id = n.evaluation_id WHERE n.run_id = ? ORDER BY n.id",
            (item["run_id"],),
        )
        for n in rows:
            v = json.loads(n["verdict_json"]) if n["verdict_json"] else {}
            status = v.get("status") or n["status"]
            harness = (v.get("method") or {}).get("harness") or ""
            out.append({
                "op": item["name"], "run": item["run_id"], "node": n["id"], "status": status,
                "fitness_vs_compile": v.get("speedup_vs_compile"), "note": n["note"],
                "message": (v.get("message") or n["message"] or None) if status != "ok" else None,
                "shapes": {s["name"]: s.get("speedup_vs_compile") for s in v.get("shapes") or []},
                "code": harness.rpartition("files sha256 ")[2] or None,
                "sealed_by": (n["seal"] or "").rpartition(":")[0] or None,
            })  # fmt: skip
    last = {n["op"]: n["sealed_by"] for n in out if n["sealed_by"]}  # each op's last segment's key
    for n in out:
        n["ranked"] = n["sealed_by"] is None or n["sealed_by"] == last[n["op"]]
    return out


def table(reports: dict[str, dict[str, Any]]) -> str:
    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    tracks = list(reports)
    head = ["op"] + [f"{t} {c}" for t in tracks for c in ("vs eager", "vs compile", "kernel", "roofline")]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    rows = {t: {r["name"]: r for r in reports[t]["results"]} for t in tracks}
    for name in rows[tracks[0]]:
        cells = [name]
        for t in tracks:
            r = rows[t][name]
            cells += [x(r["speedup_vs_eager"]), x(r["speedup_vs_compile"]),
                      x(r.get("kernel_speedup_vs_compile")), pct(r.get("roofline_fraction"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("tracks", nargs="+", help="TRACK=WORKSPACE:REPORT_DIR")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    record: dict[str, Any] = {"note": args.note, "tracks": {}}
    for spec in args.tracks:
        track, _, where = spec.partition("=")
        workspace, _, report_dir = where.partition(":")
        report = json.loads((Path(report_dir) / "bench.json").read_text())
        db = sqlite3.connect(Path(workspace) / "kernelevolve.db")
        db.row_factory = sqlite3.Row
        record["tracks"][track] = {"report": report, "nodes": nodes(db, report["bench_id"])}
    args.out.write_text(json.dumps(record, separators=(",", ":")))
    print(table({t: v["report"] for t, v in record["tracks"].items()}))


if __name__ == "__main__":
    main()
