"""The report of imported results (`bench.imported`): the source's numbers, labelled as its own.

- `write_imported_report`: an imported bench's own report (`bench.json`, `bench.md`, `bench.csv`,
  `bench.html`): where the results came from, the counts the source reports, one row per problem.
- `comparison_rows` / `comparison_markdown`: for a bench of the same folder (`bench.report`), one
  table per source, our measured row beside the source's reported one, each column saying whose.
Nothing here computes a metric over the source's numbers: they stay the source's.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelevolve.report.fmt import esc, fmt_x, md
from kernelevolve.report.render import CSP, CSS

# An imported bench's table (`bench.imported`): the source's numbers, and this harness's re-verification
IMPORTED_COLUMNS = (
    ("op", "name"),
    ("compiled", "compiled"),
    ("correct (reported)", "correct"),
    ("runtime ms (reported)", "reported_runtime_ms"),
    ("vs eager (reported)", "reported_speedup_vs_eager"),
    ("vs compile (reported)", "reported_speedup_vs_compile"),
    ("re-verified here", "reverified"),
    ("message", "message"),
)
REPORTED = (
    "reported by the source: measured on its machine by its method, not re-measured here, and in none "
    "of this bench's metrics"
)


def imported_cell(key: str, value: Any) -> str:
    """A cell of an imported bench's table (the source's numbers, and the re-verification's)."""
    if key == "reverified":
        return reverified_cell(value)
    if key == "reported_runtime_ms":
        return "-" if value is None else f"{value:,.3g}"
    if key == "message":
        return "-" if not value else str(value)[:120]
    if key == "compiled":
        return "yes" if value else "no"
    if key.startswith("reported_speedup"):
        return fmt_x(value)
    if key == "correct":
        return "yes" if value else "no"
    return str(value if value is not None else "-")


def reverified_cell(v: dict[str, Any] | None) -> str:
    """This harness's verdict on an imported kernel: its status and, where correct, its speedups."""
    if not v:
        return "-"
    if not v.get("correct"):
        return str(v.get("status"))
    return f"{v.get('status')}: {fmt_x(v.get('speedup_vs_eager'))} vs eager, {fmt_x(v.get('speedup_vs_compile'))} vs compile"


def imported_header(doc: dict[str, Any]) -> list[tuple[str, str]]:
    s = doc["summary"]
    devices = sorted({str(r["reported_hardware"]) for r in doc["results"] if r.get("reported_hardware")})
    return [
        ("imported bench", f"{doc['bench_id']} ({doc.get('format')} run {doc.get('source')})"),
        ("from", str(doc.get("results_dir"))),
        ("problems", f"{doc['dir']} (level {doc.get('level') if doc.get('level') is not None else '?'})"),
        ("device (reported)", ", ".join(devices) or "-"),
        ("reference times (reported)", ", ".join(doc.get("baselines") or []) or "the samples' own ref_runtime, if any"),
        ("counts (reported)", f"{s['correct']} of {s['specs']} correct, {s['compiled']} compiled, "
                              f"{s['missing']} without a result"),
        ("re-verified here", f"{s['reverified_correct']} of {s['reverified']} correct" if s["reverified"] else "no"),
    ]  # fmt: skip


def comparison_rows(doc: dict[str, Any], other: dict[str, Any]) -> list[list[str]]:
    """Per problem, our row beside the source's (joined on the spec's path in the folder)."""
    ours = {r["path"]: r for r in doc["results"]}
    theirs = {r["path"]: r for r in other["results"]}
    rows = []
    for path in list(ours) + [p for p in theirs if p not in ours]:
        o, t = ours.get(path) or {}, theirs.get(path) or {}
        rows.append([
            str(o.get("name") or t.get("name") or path),
            ("yes" if o.get("correct") else "no") if o else "not run",
            fmt_x(o.get("speedup_vs_eager")) if o else "-",
            fmt_x(o.get("speedup_vs_compile")) if o else "-",
            ("yes" if t.get("correct") else "no") if t else "no result",
            fmt_x(t.get("reported_speedup_vs_eager")),
            fmt_x(t.get("reported_speedup_vs_compile")),
            reverified_cell(t.get("reverified")),
        ])  # fmt: skip
    return rows


COMPARISON_HEADERS = ("op", "ours: correct", "ours: vs eager", "ours: vs compile", "theirs: correct (reported)",
                      "theirs: vs eager (reported)", "theirs: vs compile (reported)", "their kernel re-verified here")  # fmt: skip


def render_imported_markdown(doc: dict[str, Any]) -> str:
    lines = [f"# Imported results: {doc.get('source')}", "", f"Every number below is {REPORTED}.", ""]
    lines += [f"- **{k}:** {md(v)}" for k, v in imported_header(doc)]
    lines += ["", "| " + " | ".join(h for h, _ in IMPORTED_COLUMNS) + " |",
              "| " + " | ".join(["---"] * len(IMPORTED_COLUMNS)) + " |"]  # fmt: skip
    for r in doc["results"]:
        lines.append("| " + " | ".join(md(imported_cell(k, r.get(k))) for _, k in IMPORTED_COLUMNS) + " |")
    if doc.get("unmatched"):
        lines += ["", "## Results without a problem file", ""]
        lines += [f"- {md(u['error'], 300)}" for u in doc["unmatched"]]
    return "\n".join(lines) + "\n"


def comparison_markdown(doc: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for other in doc.get("other_sources") or []:
        lines += [
            "",
            f"## Beside {md(other.get('source'))} (imported bench {other['bench_id']}, {REPORTED})",
            "",
        ]
        lines += [f"- {md(k)}: {md(v)}" for k, v in imported_header(other)[2:]]
        lines += [
            "",
            "| " + " | ".join(COMPARISON_HEADERS) + " |",
            "| " + " | ".join(["---"] * len(COMPARISON_HEADERS)) + " |",
        ]
        lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in comparison_rows(doc, other)]
    return lines


def html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_imported_report(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """An imported bench's report: JSON, markdown, CSV and one HTML page, no plots."""
    paths = {"json": out_dir / "bench.json", "md": out_dir / "bench.md", "csv": out_dir / "bench.csv",
             "html": out_dir / "bench.html"}  # fmt: skip
    paths["json"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths["md"].write_text(render_imported_markdown(doc))
    keys = ["path", "problem_id", "compiled", "correct", "reported_runtime_ms", "reported_eager_ms",
            "reported_compile_ms", "reported_speedup_vs_eager", "reported_speedup_vs_compile",
            "reported_hardware", "message"]  # fmt: skip
    with paths["csv"].open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [*keys, "reverified_status", "reverified_speedup_vs_eager", "reverified_speedup_vs_compile"]
        )
        for r in doc["results"]:
            v = r.get("reverified") or {}
            w.writerow(["" if r.get(k) is None else r.get(k) for k in keys]
                       + [v.get("status", ""), v.get("speedup_vs_eager", ""), v.get("speedup_vs_compile", "")])  # fmt: skip
    title = f"Imported results: {doc.get('source')}"
    kv = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in imported_header(doc))
    rows = [[imported_cell(k, r.get(k)) for _, k in IMPORTED_COLUMNS] for r in doc["results"]]
    paths["html"].write_text("\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>", f"<h1>{esc(title)}</h1>",
        f'<p class="muted">Every number here is {esc(REPORTED)}.</p>', f'<table class="kv">{kv}</table>',
        html_table([h for h, _ in IMPORTED_COLUMNS], rows), "</body></html>",
    ]))  # fmt: skip
    return paths


__all__ = ["COMPARISON_HEADERS", "IMPORTED_COLUMNS", "REPORTED", "comparison_markdown", "comparison_rows",
           "imported_cell", "imported_header", "render_imported_markdown", "reverified_cell",
           "write_imported_report"]  # fmt: skip
