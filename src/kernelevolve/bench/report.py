"""A bench's report: one table (markdown, CSV, JSON), four charts (SVG) and one self-contained HTML page.

Beside its own rows, a bench's report shows what imported benches of the same folder report
(`bench.imported`): one table per source, our measured row beside the source's reported one, every
number of theirs labelled "reported"; they are in none of the metrics. An imported bench's own
report is `report_imported.py`'s.

    bench.json      the bench document, as `kernelevolve bench --json` prints it
    bench.md        header (device, versions, track, budget, synthesizer), summary metrics, the table
    bench.csv       the table, one row per spec, with every number unrounded
    speedup.svg     speedup per op vs eager and vs torch.compile (log scale, bars from 1.0)
    roofline.svg    fraction of the roofline per op (the best kernel, shape-weighted)
    progress.svg    best fitness so far against candidates evaluated, per op
    cost.svg        candidates, GPU-seconds, tokens and USD per op
    bench.html      all of the above in one file: the charts inline, no scripts

The charts are drawn by `kernelevolve.report.svg`, the module that draws the run report and the live
view (`kernelevolve serve`), with no plotting dependency. Text from specs and runs reaches HTML and SVG
only through `esc`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelevolve.bench.metrics import BASELINES, P_VALUES, p_name
from kernelevolve.bench.report_imported import (
    COMPARISON_HEADERS,
    REPORTED,
    comparison_markdown,
    comparison_rows,
)
from kernelevolve.report.fmt import Safe, esc, fmt_date, fmt_duration, fmt_int, fmt_pct, fmt_usd, fmt_x, md
from kernelevolve.report.render import CSP, CSS
from kernelevolve.report.svg import Series, bars_svg, lines_svg, row_svg

COLUMNS = (
    ("op", "name"),
    ("correct", "correct"),
    ("eager us", "eager_us"),
    ("compile us", "compile_us"),
    ("vs eager", "speedup_vs_eager"),
    ("vs compile", "speedup_vs_compile"),
    ("kernel vs eager", "kernel_speedup_vs_eager"),
    ("kernel vs compile", "kernel_speedup_vs_compile"),
    ("fitness (re-measured)", "fitness"),
    ("at search", "search_fitness"),
    ("roofline", "roofline_fraction"),
    ("shapes on kernel", "shapes_dispatched"),
    ("candidates", "candidates"),
    ("GPU s", "gpu_s"),
    ("tokens", "tokens"),
    ("USD", "cost_usd"),
)
PLOTS = ("speedup", "roofline", "progress", "cost")


def header(doc: dict[str, Any]) -> list[tuple[str, str]]:
    env = doc.get("environment") or {}
    return [
        ("bench", f"{doc['bench_id']} ({doc['dir']})"),
        ("device", str(env.get("device") or "-")),
        ("versions", ", ".join(f"{k} {env[k]}" for k in ("driver", "torch", "triton", "python") if env.get(k)) or "-"),
        ("precision track", str(doc.get("track"))),
        ("budget", f"{doc.get('budget')} candidates per op, policy {doc.get('policy')}, "
                   f"timing {doc.get('timing_budget_s')} s per shape"),
        ("synthesizer", str(doc.get("synthesizer"))),
        ("specs per device", str(doc.get("per_device") or 1)),
        ("fitness baseline", str(doc.get("fitness_baseline"))),
        ("date", fmt_date(doc.get("updated_at"))),
        ("status", str(doc.get("status"))),
    ]  # fmt: skip


def reference_us(row: dict[str, Any]) -> dict[str, float | None]:
    """The reference's eager and torch.compile times over the row's shapes (summed), from its timed
    candidate or, where none was timed, from the baselines the bench measured for it."""
    shapes = row.get("shapes") or row.get("baselines") or []
    out: dict[str, float | None] = {}
    for key in ("eager_us", "compile_us"):
        times = [s.get(key) for s in shapes]
        out[key] = sum(times) if times and all(t is not None for t in times) else None
    return out


def cell(key: str, value: Any) -> str:
    if key in ("eager_us", "compile_us"):
        return "-" if value is None else f"{value:,.1f}"
    if key == "correct":
        return "yes" if value else "no"
    if key.startswith(("speedup", "kernel_speedup")) or key in ("fitness", "search_fitness"):
        return fmt_x(value)
    if key == "roofline_fraction":
        return fmt_pct(value)
    if key == "cost_usd":
        return fmt_usd(value)
    if key == "gpu_s":
        return fmt_duration(value)
    if key in ("tokens", "candidates", "shapes_dispatched"):
        return fmt_int(value)
    return str(value if value is not None else "-")


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(metric, vs eager, vs compile) rows: fast_p, then the two geomeans."""

    def row(label: str, key: str, fmt: Any) -> tuple[str, str, str]:
        return (label, fmt(summary.get(key.format(b="eager"))), fmt(summary.get(key.format(b="compile"))))

    rows = [row(f"fast_{p:g}", p_name(p) + "_vs_{b}", fmt_pct) for p in P_VALUES]
    rows.append(row("geomean (failures as 1.0)", "geomean_vs_{b}", fmt_x))
    rows.append(row("geomean (correct only)", "geomean_vs_{b}_correct_only", fmt_x))
    return rows


def render_markdown(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    lines = [f"# Bench {doc['bench_id']}", ""]
    lines += [f"- **{k}:** {md(v)}" for k, v in header(doc)]
    lines += [
        "",
        f"{s['correct']} of {s['specs']} ops correct ({fmt_pct(s['correctness_rate'])}); "
        f"{s['load_errors']} failed to load; {s['flagged']} results flagged for review; "
        f"{s.get('suspicious_candidates', 0)} candidates flagged `suspicious` and not ranked.",
        "",
        "| metric | vs eager | vs compile |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in summary_rows(s)]
    lines += [
        "",
        "| " + " | ".join(h for h, _ in COLUMNS) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + " |",
    ]
    for r in doc["results"]:
        row = {**r, **reference_us(r)}
        lines.append("| " + " | ".join(md(cell(k, row.get(k))) for _, k in COLUMNS) + " |")
    lines += [
        "",
        "Speedups are those of the exported per-shape dispatch module (the winning kernel where it beats "
        "eager beyond the noise, the reference elsewhere), shape-weighted; `kernel` columns are the best "
        "single kernel's. Roofline: the best kernel's time-weighted fraction of the measured roofline.",
    ]
    failed = [r for r in doc["results"] if not r.get("correct")]
    if failed:
        lines += ["", "## Without a correct kernel", ""]
        lines += [f"- {md(r['name'])}: {md(r.get('message'), 300)}{_baselines_said(r)}" for r in failed]
    if doc.get("load_errors"):
        lines += ["", "## Specs that failed to load", ""]
        lines += [f"- {md(e['path'])}: {md(e['error'], 300)}" for e in doc["load_errors"]]
    flagged = [r for r in doc["results"] if r.get("flags")]
    if flagged:
        lines += ["", "## Flagged for review", ""]
        lines += [f"- {md(r['name'])}: {md('; '.join(r['flags']), 300)}" for r in flagged]
    disagree = [r for r in doc["results"] if r.get("remeasure_disagrees")]
    if disagree:
        lines += ["", "## Re-measured apart from the search (the figures above are the re-measure's)", ""]
        lines += [f"- {md(r['name'])}: {md(r['remeasure_disagrees'], 300)}" for r in disagree]
    held = [r for r in doc["results"] if r.get("suspicious")]
    if held:
        lines += ["", "## Candidates flagged suspicious (not ranked; they need review)", ""]
        lines += [
            f"- {md(r['name'])}: {r['suspicious']}, e.g. {md(r.get('suspicious_example'), 300)}" for r in held
        ]
    if doc.get("pending"):
        lines += ["", f"Not yet run: {md(', '.join(doc['pending']))} (run the same command again to resume)."]
    lines += comparison_markdown(doc)
    return "\n".join(lines) + "\n"


def _baselines_said(row: dict[str, Any]) -> str:
    if row.get("baselines_error"):
        return f" (its baselines could not be measured: {md(row['baselines_error'], 200)})"
    missing = row.get("baselines_missing") or {}
    return "".join(f" (no {md(k)} baseline: {md(v, 200)})" for k, v in missing.items())


def write_csv(doc: dict[str, Any], path: Path) -> None:
    keys = [k for _, k in COLUMNS] + [
        "path",
        "run_id",
        "precision",
        "best_node",
        "best_from",
        "wall_s",
        "message",
    ]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(keys)
        for r in doc["results"]:
            row = {**r, **reference_us(r)}
            w.writerow(["" if row.get(k) is None else row.get(k) for k in keys])


# -- charts -----------------------------------------------------------------------------------------


def plots(doc: dict[str, Any]) -> dict[str, str]:
    """SVG text per chart name (`PLOTS`); empty where there is no result to plot yet."""
    results = doc["results"]
    if not results:
        return {}
    names = [str(r["name"]) for r in results]
    speedups = [
        Series(
            f"vs {b}", [r.get(f"speedup_vs_{b}") or (1.0 if not r.get("correct") else None) for r in results]
        )
        for b in BASELINES
    ]
    costs = (
        ("candidates", "candidates"),
        ("gpu_s", "GPU-seconds"),
        ("tokens", "tokens"),
        ("cost_usd", "USD"),
    )
    cost_width = max(260, 40 + 22 * len(names))
    panels = [
        (bars_svg(title, names, [Series(title, [float(r.get(key) or 0) for r in results], "#8172b3")],
                  title, height=260, width=cost_width), float(cost_width), 260.0)
        for key, title in costs
    ]  # fmt: skip
    return {
        "speedup": bars_svg(
            "speedup per op (failures at 1.0: the reference)",
            names,
            speedups,
            "speedup (log)",
            log=True,
            unit="x",
        ),
        "roofline": bars_svg(
            "best kernel's fraction of the roofline",
            names,
            [Series("roofline", [r.get("roofline_fraction") or 0.0 for r in results], "#55a868")],
            "fraction of roofline",
            y_max=1.05,
        ),
        "progress": lines_svg(
            "best so far",
            [Series(str(r["name"]), r.get("curve") or []) for r in results],
            "candidates evaluated",
            f"best fitness (vs {doc.get('fitness_baseline')})",
        ),
        "cost": row_svg("candidates, GPU-seconds, tokens and USD per op", panels),
    }


# -- HTML -------------------------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(doc: dict[str, Any], charts: dict[str, str]) -> str:
    title = f"Bench {doc['bench_id']}"
    kv = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in header(doc))
    rows = [[cell(k, {**r, **reference_us(r)}.get(k)) for _, k in COLUMNS] for r in doc["results"]]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<table class="kv">{kv}</table>',
        "<h2>Summary</h2>",
        _table(("metric", "vs eager", "vs compile"), summary_rows(doc["summary"])),
        "<h2>Per op</h2>",
        _table([h for h, _ in COLUMNS], rows),
    ]
    for name in PLOTS:
        if name in charts:
            parts.append(f'<h2>{esc(name)}</h2><div class="chart">{Safe(charts[name])}</div>')
    failed = [r for r in doc["results"] if not r.get("correct")]
    if failed:
        parts.append("<h2>Without a correct kernel</h2><ul>")
        parts += [f"<li>{esc(r['name'])}: {esc(r.get('message'))}</li>" for r in failed]
        parts.append("</ul>")
    if doc.get("load_errors"):
        parts.append("<h2>Specs that failed to load</h2><ul>")
        parts += [f"<li>{esc(e['path'])}: {esc(e['error'])}</li>" for e in doc["load_errors"]]
        parts.append("</ul>")
    for other in doc.get("other_sources") or []:
        parts.append(f"<h2>Beside {esc(other.get('source'))} (imported bench {esc(other['bench_id'])})</h2>")
        parts.append(f'<p class="muted">{esc(REPORTED)}.</p>')
        parts.append(_table(COMPARISON_HEADERS, comparison_rows(doc, other)))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_bench_report(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write every format into `out_dir`; returns name -> path of what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if doc.get("imported") is True:
        from kernelevolve.bench.report_imported import write_imported_report

        return write_imported_report(doc, out_dir)
    paths = {"json": out_dir / "bench.json", "md": out_dir / "bench.md", "csv": out_dir / "bench.csv"}
    paths["json"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths["md"].write_text(render_markdown(doc))
    write_csv(doc, paths["csv"])
    charts = plots(doc)
    for name, svg in charts.items():
        paths[name] = out_dir / f"{name}.svg"
        paths[name].write_text(svg)
    paths["html"] = out_dir / "bench.html"
    paths["html"].write_text(render_html(doc, charts))
    return paths


__all__ = [
    "COLUMNS",
    "PLOTS",
    "cell",
    "header",
    "plots",
    "reference_us",
    "render_html",
    "render_markdown",
    "write_bench_report",
]
