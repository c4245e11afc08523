"""Render one optimization run as `report.md` and a self-contained `report.html`.

Input is what the store holds: the run's row and its nodes as plain dicts, in creation order (the
shapes are described in `kernelevolve.report.write_report`). Both files are rendered from the same
gathered facts, so they say the same thing: a header (spec, device, versions, search settings), the
best candidate's per-shape results (the final re-measure where there is one, else the search's
verdict), a best-so-far curve, the search tree, a table of every node, the winning diff against the
root it descends from and against its parent, and the cost of the run.

The HTML file has inline CSS and inline SVG and nothing else: no scripts, no fonts, no external
references, and a Content-Security-Policy that forbids them should a bug ever let markup through. The
Markdown file links the two charts as `best_so_far.svg` and `tree.svg`, written beside it.

Threat model: node sources, notes and messages are written by a model or by generated code, and
spec names and config come from users; all of it is untrusted text. Every value reaches HTML through
`fmt.esc` and Markdown tables through `fmt.md`; sources in Markdown sit in fences they cannot close.
What it does not do: it reads nothing from disk or the store and measures nothing; missing or
malformed fields render as "-".

Why one module (over 450 lines): the Markdown and the HTML are rendered here side by side from
one `Facts`, so the two files cannot drift apart; the charts are `svg.py`'s, the formatting `fmt.py`'s.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelevolve.report.fmt import (
    Safe,
    esc,
    fence,
    finite,
    fmt_date,
    fmt_duration,
    fmt_int,
    fmt_num,
    fmt_pct,
    fmt_time,
    fmt_usd,
    fmt_x,
    fmt_yes,
    md,
    one_line,
)
from kernelevolve.report.svg import CurvePoint, color, curve_svg, node_status, tree_svg

SHAPE_COLUMNS = (
    "shape",
    "weight",
    "correct",
    "candidate",
    "eager",
    "compile",
    "vs eager",
    "vs compile",
    "vs best",
    "roofline",
    "bound",
)
NODE_COLUMNS = (
    "id",
    "parent",
    "mode",
    "status",
    "fitness",
    "vs eager",
    "vs compile",
    "eval",
    "note",
    "message",
)


@dataclass
class Diff:
    title: str
    text: str | None  # a unified diff, or None with `note` saying why there is none
    note: str = ""


@dataclass
class Facts:
    """Everything both renderers show, already formatted as plain (unescaped) text."""

    title: str
    header: list[tuple[str, str]]
    headline: list[tuple[str, str]]
    final_from: str
    shape_rows: list[list[str]]
    baseline: str
    curve: list[CurvePoint]
    improvements: list[tuple[int, int, float]]  # (evaluation index, node, new best fitness)
    best: dict[str, Any] | None
    best_path: list[int]  # root .. best
    node_rows: list[tuple[int, list[str]]]
    diffs: list[Diff]
    costs: list[tuple[str, str]]
    counts: list[tuple[str, int]]
    config: str


def write_report(run: dict[str, Any], nodes: list[dict[str, Any]], out_dir: Path) -> dict[str, Path]:
    """Write report.md, report.html and the two charts into `out_dir`; returns their paths by kind."""
    facts = gather(run, nodes)
    curve = curve_svg(facts.curve, facts.baseline)
    tree = tree_svg(nodes, facts.best["id"] if facts.best else None, set(facts.best_path))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "markdown": out_dir / "report.md",
        "html": out_dir / "report.html",
        "curve_svg": out_dir / "best_so_far.svg",
        "tree_svg": out_dir / "tree.svg",
    }
    paths["markdown"].write_text(render_markdown(facts), encoding="utf-8")
    paths["html"].write_text(render_html(facts, curve, tree), encoding="utf-8")
    paths["curve_svg"].write_text(curve, encoding="utf-8")
    paths["tree_svg"].write_text(tree, encoding="utf-8")
    return paths


# --- gathering -----------------------------------------------------------------------------------


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _median(stats: Any) -> float | None:
    return finite(_dict(stats).get("median_s"))


def find_best(run: dict[str, Any], nodes: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's recorded best node, else the fittest `ok` node."""
    by_id = {n.get("id"): n for n in nodes}
    if run.get("best_node") in by_id:
        return by_id[run["best_node"]]
    ok = [n for n in nodes if node_status(n) == "ok" and finite(n.get("fitness")) is not None]
    return max(ok, key=lambda n: n["fitness"], default=None)


def ancestry(node: dict[str, Any] | None, nodes: Sequence[dict[str, Any]]) -> list[int]:
    """Ids from the root to `node` along first parents (a cycle or unknown parent ends the walk)."""
    if node is None:
        return []
    by_id = {n.get("id"): n for n in nodes}
    path: list[int] = []
    seen: set[Any] = set()
    cur: dict[str, Any] | None = node
    while cur is not None and cur.get("id") not in seen:
        seen.add(cur.get("id"))
        path.append(cur["id"])
        cur = by_id.get(cur.get("parent"))
    return path[::-1]


def gather(run: dict[str, Any], nodes: Sequence[dict[str, Any]]) -> Facts:
    best = find_best(run, nodes)
    path = ancestry(best, nodes)
    final, final_from = _dict(run.get("final")), "final re-measure of the best node"
    if not final and best is not None:
        final, final_from = _dict(best.get("verdict")), "the best node's verdict from the search"
    if not final:
        final_from = "no verdict recorded"
    method = _dict(run.get("method")) or _dict(final.get("method"))
    baseline = str(run.get("baseline") or method.get("fitness_baseline") or "best")
    curve = _curve(nodes)
    return Facts(
        title=f"kernelevolve run {run.get('run_id') or '-'}: {run.get('spec_name') or '-'}",
        header=_header(run, method, baseline),
        headline=_headline(best, final, baseline, run if run.get("final") else None),
        final_from=final_from,
        shape_rows=[shape_row(_dict(s)) for s in final.get("shapes") or []],
        baseline=baseline,
        curve=curve,
        improvements=_improvements(curve),
        best=best,
        best_path=path,
        node_rows=[(n.get("id", -1), node_row(n)) for n in nodes],
        diffs=_diffs(best, path, nodes),
        costs=_costs(run, nodes),
        counts=sorted(Counter(node_status(n) for n in nodes).items(), key=lambda kv: (-kv[1], kv[0])),
        config=json.dumps(
            {"limits": run.get("limits") or {}, "config": run.get("config") or {}},
            indent=2,
            sort_keys=True,
            default=repr,
        ),
    )


def _header(run: dict[str, Any], method: dict[str, Any], baseline: str) -> list[tuple[str, str]]:
    versions = ", ".join(
        f"{k} {method[k]}" for k in ("torch", "triton", "python", "kernelevolve", "driver") if method.get(k)
    )
    timing = "; ".join(str(method[k]) for k in ("timer", "l2") if method.get(k))
    limits = _dict(run.get("limits"))
    spec = str(run.get("spec_name") or "-")
    if run.get("spec_path"):
        spec += f" ({run['spec_path']})"
    device = " / ".join(str(v) for v in (run.get("platform"), run.get("device")) if v) or "-"
    return [
        ("run", str(run.get("run_id") or "-")),
        ("spec", spec),
        ("platform / device", device),
        ("versions", versions or "-"),
        ("harness", str(method.get("harness") or "-")),  # installed and intact, or a working tree at a commit
        ("timing", timing or "-"),
        ("precision", str(method.get("precision_policy") or "-")),
        ("synthesizer", str(run.get("synthesizer") or "-")),
        ("policy", str(run.get("policy") or "-")),
        ("fitness baseline", baseline),
        ("limits", ", ".join(f"{k}={v}" for k, v in limits.items()) or "-"),
        ("status", str(run.get("status") or "-")),
        ("started", fmt_date(run.get("created_at"))),
        *_times(run),
    ]


def _times(run: dict[str, Any]) -> list[tuple[str, str]]:
    """The run's time as it was. A search: its wall time (the engine's sessions). An agent-driven run:
    the time from its start to its last record, the agent's own between submits included (the
    engine's sessions there are its calls, or a server's whole life, neither the run's time); the
    evaluations' seconds are in the cost rows."""
    if run.get("synthesizer") == "agent":
        return [("elapsed (start to last record)", fmt_duration(_elapsed(run)))]
    return [("wall time", fmt_duration(run.get("wall_s")))]


def _elapsed(run: dict[str, Any]) -> float | None:
    from datetime import datetime

    try:
        start, end = (datetime.fromisoformat(str(run[k])) for k in ("created_at", "updated_at"))
    except (KeyError, ValueError):
        return None
    return (end - start).total_seconds()


def _headline(
    best: dict[str, Any] | None, final: dict[str, Any], baseline: str, remeasured: dict[str, Any] | None
) -> list[tuple[str, str]]:
    """The best node's figures; `remeasured` (the run's summary, where they come from its final
    re-measure) adds the search-time fitness beside them, and their disagreement where it is beyond
    the noise (`finish.remeasure_disagreement`)."""
    if best is None:
        return [("best node", "none: no candidate was correct")]
    search = []
    if remeasured is not None:
        search = [("fitness at search time (its verdict then)", fmt_x(best.get("fitness")))]
        if remeasured.get("remeasure_disagrees"):
            search.append(("re-measure against search", f"flagged: {remeasured['remeasure_disagrees']}"))
    return [
        ("best node", f"{best.get('id')} ({best.get('mode') or '-'})"),
        ("status", str(final.get("status") or node_status(best))),
        (f"fitness (vs {baseline})", fmt_x(final.get("fitness", best.get("fitness")))),
        *search,
        ("speedup vs the best baseline", fmt_x(final.get("speedup_vs_best", best.get("speedup_vs_best")))),
        ("speedup vs eager", fmt_x(final.get("speedup_vs_eager", best.get("speedup_vs_eager")))),
        ("speedup vs compile", fmt_x(final.get("speedup_vs_compile", best.get("speedup_vs_compile")))),
        ("roofline fraction", fmt_pct(final.get("roofline_fraction"))),
        ("spread", fmt_pct(final.get("spread"))),
    ]


def shape_row(s: dict[str, Any]) -> list[str]:
    """One verdict shape's cells under `SHAPE_COLUMNS` (the report's table; the live view's too)."""
    return [
        str(s.get("name") or "-"),
        fmt_num(s.get("weight"), 2),
        fmt_yes(s.get("correct")),
        fmt_time(_median(s.get("candidate"))),
        fmt_time(_median(s.get("eager"))),
        fmt_time(_median(s.get("compile"))),
        fmt_x(s.get("speedup_vs_eager")),
        fmt_x(s.get("speedup_vs_compile")),
        f"{fmt_x(s.get('speedup_vs_best'))} ({s['best_baseline']})" if s.get("best_baseline") else "-",
        fmt_pct(s.get("roofline_fraction")),
        str(s.get("bound") or "-"),
    ]


def _curve(nodes: Sequence[dict[str, Any]]) -> list[CurvePoint]:
    points: list[CurvePoint] = []
    best = 0.0
    for n in nodes:
        if n.get("state") not in ("evaluated", "failed"):
            continue
        status = node_status(n)
        fit = finite(n.get("fitness")) if status == "ok" else 0.0
        fit = max(fit or 0.0, 0.0)
        best = max(best, fit)
        points.append(CurvePoint(len(points) + 1, n.get("id", -1), fit, best, status))
    return points


def _improvements(points: list[CurvePoint]) -> list[tuple[int, int, float]]:
    out, best = [], 0.0
    for p in points:
        if p.fitness > best:
            best = p.fitness
            out.append((p.index, p.node, p.fitness))
    return out


def node_row(n: dict[str, Any]) -> list[str]:
    """One node's cells under `NODE_COLUMNS` (the report's table; the live view's too)."""
    parent = "-" if n.get("parent") is None else str(n["parent"])
    if n.get("parent2") is not None:
        parent += f" + {n['parent2']}"
    status = node_status(n)
    return [
        str(n.get("id", "-")),
        parent,
        str(n.get("mode") or "-"),
        status,
        fmt_x(n.get("fitness")) if status == "ok" else "-",
        fmt_x(n.get("speedup_vs_eager")),
        fmt_x(n.get("speedup_vs_compile")),
        fmt_duration(n.get("eval_s")) if finite(n.get("eval_s")) else "-",
        one_line(n.get("note"), 120) or "-",
        one_line(n.get("message"), 160) or "-",
    ]


def _unified(a: str, b: str, a_name: str, b_name: str) -> str:
    lines = difflib.unified_diff(a.splitlines(), b.splitlines(), a_name, b_name, lineterm="", n=3)
    return "\n".join(lines)


def _diffs(best: dict[str, Any] | None, path: list[int], nodes: Sequence[dict[str, Any]]) -> list[Diff]:
    if best is None:
        return []
    by_id = {n.get("id"): n for n in nodes}
    root, parent = by_id.get(path[0]), by_id.get(best.get("parent"))
    target = f"node {best['id']} (best)"
    if not best.get("source"):
        return [Diff("winning diff", None, "the best node's source was not recorded")]
    out = []
    pairs = [("vs its root ancestor", root, "root"), ("vs its parent", parent, "parent")]
    for title, other, role in pairs:
        if other is None or other is best:
            out.append(Diff(title, None, f"node {best['id']} has no {role}: it is a seed"))
        elif role == "parent" and root is parent:
            out.append(Diff(title, None, "its parent is the root: the diff above"))
        elif not other.get("source"):
            out.append(Diff(title, None, f"the source of node {other.get('id')} was not recorded"))
        else:
            text = _unified(other["source"], best["source"], f"node {other.get('id')} ({role})", target)
            out.append(Diff(title, text, "" if text else "identical sources"))
    return out


def _costs(run: dict[str, Any], nodes: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    def total(key: str) -> float:
        return sum(finite(n.get(key)) or 0.0 for n in nodes)

    def run_or_nodes(key: str) -> float:
        value = finite(run.get(key))
        return value if value is not None else total(key)

    evaluated = sum(1 for n in nodes if n.get("state") in ("evaluated", "failed"))
    return [
        ("nodes", f"{len(nodes)} ({evaluated} evaluated)"),
        ("tokens in", fmt_int(run_or_nodes("tokens_in"))),
        ("tokens out", fmt_int(run_or_nodes("tokens_out"))),
        ("model cost", fmt_usd(run_or_nodes("cost_usd"))),
        (f"{_device_word(run)}-seconds (sum of evaluation time)", f"{total('eval_s'):,.1f}"),
        ("synthesis seconds", f"{total('synth_s'):,.1f}"),
        *_times(run),
    ]


def _device_word(run: dict[str, Any]) -> str:
    return (
        "GPU"
        if run.get("platform") in ("cuda", "rocm")
        else "CPU"
        if run.get("platform") == "cpu"
        else "device"
    )


# --- Markdown ------------------------------------------------------------------------------------


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(md(h) for h in headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(f: Facts) -> str:
    out = [f"# {md(f.title)}", "", _md_table(("", ""), f.header), ""]
    out += ["## Best candidate", "", _md_table(("", ""), f.headline), ""]
    out += [f"### Per shape ({md(f.final_from)})", ""]
    out += [_md_table(SHAPE_COLUMNS, f.shape_rows) if f.shape_rows else "No per-shape results.", ""]
    out += ["## Best so far", "", "![best fitness so far](best_so_far.svg)", ""]
    if f.improvements:
        rows = [[str(i), str(node), fmt_x(fit)] for i, node, fit in f.improvements]
        out += [_md_table(("evaluation", "node", "new best"), rows), ""]
    out += ["## Search tree", "", "![search tree](tree.svg)", ""]
    if f.best_path:
        out += ["Best path: " + md(" → ".join(str(i) for i in f.best_path)), ""]
    out += ["Statuses: " + md(", ".join(f"{s} {c}" for s, c in f.counts) or "-"), ""]
    out += ["## Nodes", "", _md_table(NODE_COLUMNS, [r for _, r in f.node_rows]), ""]
    out += ["## Winning diff", ""]
    if not f.diffs:
        out += ["No best node.", ""]
    for d in f.diffs:
        out += [f"### {md(d.title)}", ""]
        out += [fence(d.text, "diff") if d.text else md(d.note), ""]
    if f.best and f.best.get("source"):
        out += [f"### Source of node {md(f.best.get('id'))}", "", fence(str(f.best["source"]), "python"), ""]
    out += ["## Cost", "", _md_table(("", ""), f.costs), ""]
    out += ["## Configuration", "", fence(f.config, "json"), ""]
    return "\n".join(out)


# --- HTML ----------------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.45 ui-sans-serif, system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       max-width: 1200px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px;
     border-bottom: 1px solid #ddd; padding-bottom: 4px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0; } th, td { padding: 3px 10px; text-align: left;
        border-bottom: 1px solid #eee; vertical-align: top; }
th { background: #f6f6f6; font-weight: 600; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { background: none; color: #555; font-weight: 500; }
table.nodes td { font-size: 12.5px; } table.nodes td.text { max-width: 360px; overflow-wrap: anywhere; }
tr.best td { background: #e8f0fd; font-weight: 600; } tr.path td { background: #f3f7fe; }
.dot { display: inline-block; width: 9px; height: 9px; border-radius: 50%; margin-right: 5px; }
.chart { overflow: auto; border: 1px solid #eee; max-height: 80vh; }
pre { background: #fafafa; border: 1px solid #eee; padding: 8px; overflow: auto; font-size: 12.5px; }
pre .add { color: #116329; background: #e6ffec; }
pre .del { color: #82071e; background: #ffebe9; }
pre .hunk { color: #6639ba; } pre .file { color: #555; font-weight: 600; }
.muted { color: #666; }
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _html_kv(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _html_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    numeric: set[int],
    cls: str = "",
    row_attrs: Sequence[str] | None = None,
    text_cols: set[int] | None = None,
) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cells = []
        for j, c in enumerate(row):
            klass = "num" if j in numeric else "text" if text_cols and j in text_cols else ""
            cells.append(f'<td class="{klass}">{esc(c)}</td>' if klass else f"<td>{esc(c)}</td>")
        attrs = row_attrs[i] if row_attrs else ""
        body.append(f"<tr{attrs}>{''.join(cells)}</tr>")
    return f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _html_diff(text: str) -> str:
    lines = []
    for line in text.splitlines():
        klass = (
            "file"
            if line.startswith(("+++", "---"))
            else "hunk"
            if line.startswith("@@")
            else "add"
            if line.startswith("+")
            else "del"
            if line.startswith("-")
            else ""
        )
        lines.append((f'<span class="{klass}">{esc(line)}</span>' if klass else esc(line)) + "\n")
    return "<pre>" + "".join(lines) + "</pre>"


def _node_table(f: Facts) -> str:
    best_id = f.best["id"] if f.best else None
    rows, attrs = [], []
    for nid, row in f.node_rows:
        status = row[3]
        cells: list[str] = list(row)
        cells[0] = Safe(f'<a id="node-{esc(nid)}"></a>{esc(row[0])}' + (" ★" if nid == best_id else ""))
        cells[3] = Safe(f'<span class="dot" style="background:{color(status)}"></span>{esc(status)}')
        rows.append(cells)
        attrs.append(' class="best"' if nid == best_id else ' class="path"' if nid in f.best_path else "")
    return _html_table(NODE_COLUMNS, rows, {4, 5, 6, 7}, "nodes", attrs, {8, 9})


def render_html(f: Facts, curve: str, tree: str) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(f.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(f.title)}</h1>",
        _html_kv(f.header),
        "<h2>Best candidate</h2>",
        _html_kv(f.headline),
        f'<h3>Per shape <span class="muted">({esc(f.final_from)})</span></h3>',
        _html_table(SHAPE_COLUMNS, f.shape_rows, {1, 3, 4, 5, 6, 7, 8, 9})
        if f.shape_rows
        else '<p class="muted">No per-shape results.</p>',
        "<h2>Best so far</h2>",
        f'<div class="chart">{Safe(curve)}</div>',
        "<h2>Search tree</h2>",
    ]
    if f.best_path:
        parts.append(f"<p>Best path: {esc(' → '.join(str(i) for i in f.best_path))}</p>")
    parts.append(f'<p class="muted">{esc(", ".join(f"{s} {c}" for s, c in f.counts) or "no nodes")}</p>')
    parts += [f'<div class="chart">{Safe(tree)}</div>', "<h2>Nodes</h2>", _node_table(f)]
    parts.append("<h2>Winning diff</h2>")
    if not f.diffs:
        parts.append('<p class="muted">No best node.</p>')
    for d in f.diffs:
        parts.append(f"<h3>{esc(d.title)}</h3>")
        parts.append(_html_diff(d.text) if d.text else f'<p class="muted">{esc(d.note)}</p>')
    if f.best and f.best.get("source"):
        parts.append(
            f"<details><summary>Source of node {esc(f.best['id'])}</summary>"
            f"<pre>{esc(f.best['source'])}</pre></details>"
        )
    parts += ["<h2>Cost</h2>", _html_kv(f.costs)]
    parts += [
        "<h2>Configuration</h2>",
        f"<details><summary>limits and config</summary><pre>{esc(f.config)}</pre></details>",
    ]
    parts.append("</body></html>")
    return "\n".join(parts)
