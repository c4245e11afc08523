"""Inline SVG charts for every report: the run's best-so-far curve and search tree, the bench's bar
and line charts. The static run report, the bench report and the live view (`serve.py`) all draw with
this module, so a chart looks the same wherever it is read.

Both are plain strings of SVG with presentation attributes (no CSS classes, no scripts, no external
references), so the same markup works inline in the HTML report and as a standalone `.svg` file that
the Markdown report links. Hover text is SVG `<title>`, which browsers show without JavaScript.

The tree is laid out by depth (columns, root at the left) and creation order (rows): each leaf gets
its own row, in depth-first order with children in creation order, and an inner node sits midway
between its first and last child. That keeps about 200 nodes legible: the picture grows with the
number of leaves, and scrolls.

Why one module (over 450 lines): every chart shares its axes, ticks, legend and escaping with the
others here, so a change of look is made once for the run report, the bench report and the live view.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernelevolve.report.fmt import esc, finite, fmt_x, one_line

STATUS_COLORS = {
    "ok": "#2e9e44",
    "incorrect": "#e08a00",
    "compile_error": "#d62728",
    "runtime_error": "#b5179e",
    "timeout": "#8c564b",
    "crash": "#7f0000",
    "oom": "#9467bd",
    "guard_violation": "#222222",
    "suspicious": "#e377c2",
    "failed": "#777777",
    "pending": "#bbbbbb",
}
BEST = "#1f5fbf"
CROSSOVER = "#8e44ad"
FONT = 'font-family="ui-sans-serif, system-ui, sans-serif"'


def node_status(node: dict[str, Any]) -> str:
    """The status a node is drawn and counted as: the verdict's, else its search state."""
    if node.get("status"):
        return str(node["status"])
    state = node.get("state")
    if state in ("created", "proposed"):
        return "pending"
    return "failed" if state == "failed" else "unknown"


def color(status: str) -> str:
    return STATUS_COLORS.get(status, "#555555")


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _svg_open(width: float, height: float, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_f(width)}" height="{_f(height)}" '
        f'viewBox="0 0 {_f(width)} {_f(height)}" role="img" aria-label="{esc(label)}" {FONT}>'
    )


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks


@dataclass
class CurvePoint:
    index: int  # 1-based count of evaluated nodes
    node: int
    fitness: float
    best: float
    status: str
    at_s: float | None = None  # seconds from the run's start to this evaluation's record


def curve_svg(
    points: Sequence[CurvePoint], baseline: str, width: int = 720, height: int = 280, by_time: bool = False
) -> str:
    """Best fitness so far (a step line) and each evaluation's fitness (dots) against evaluations,
    or, `by_time`, against the time since the run started (points without a time are left out)."""
    left, right, top, bottom = 56, 16, 16, 40
    what = "time" if by_time else "nodes evaluated"
    out = [_svg_open(width, height, f"best fitness so far against {what}")]
    out.append(f'<rect width="{width}" height="{height}" fill="#ffffff"/>')
    if by_time:  # in time order (evaluations finish out of creation order), best so far recounted
        timed, best = (
            sorted((p for p in points if finite(p.at_s) is not None), key=lambda p: p.at_s or 0.0),
            0.0,
        )
        points = []
        for p in timed:
            best = max(best, p.fitness)
            points.append(CurvePoint(p.index, p.node, p.fitness, best, p.status, p.at_s))
    if not points:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#666" font-size="13">')
        out.append("no node was evaluated</text></svg>")
        return "".join(out)
    n = len(points)
    y_hi = max(1.0, max(p.fitness for p in points)) * 1.08
    pw, ph = width - left - right, height - top - bottom
    t_hi = max(float(p.at_s or 0.0) for p in points)
    minutes = t_hi >= 180
    t_unit = 60.0 if minutes else 1.0
    t_span = max(t_hi / t_unit, 1e-9)

    def xval(p: CurvePoint) -> float:
        return float(p.at_s or 0.0) / t_unit if by_time else float(p.index)

    def sx(i: float) -> float:
        if by_time:
            return left + pw * i / t_span
        return left + (pw * (i - 1) / (n - 1) if n > 1 else pw / 2)

    def sy(v: float) -> float:
        return top + ph * (1 - v / y_hi)

    axis = 'stroke="#999" stroke-width="1"'
    for t in nice_ticks(0.0, y_hi):
        if t > y_hi:
            continue
        y = sy(t)
        out.append(f'<line x1="{left}" y1="{_f(y)}" x2="{width - right}" y2="{_f(y)}" stroke="#eee"/>')
        out.append(
            f'<text x="{left - 6}" y="{_f(y + 4)}" text-anchor="end" font-size="11" fill="#444">{t:g}x</text>'
        )
    x_ticks = nice_ticks(0.0, t_span, 6) if by_time else nice_ticks(1.0, float(n), min(n, 8))
    for t in x_ticks:
        if by_time and (t < 0 or t > t_span * (1 + 1e-9)):
            continue
        if not by_time and (t < 1 or t > n or t != int(t)):
            continue
        x = sx(t)
        out.append(f'<line x1="{_f(x)}" y1="{top + ph}" x2="{_f(x)}" y2="{top + ph + 4}" {axis}/>')
        out.append(
            f'<text x="{_f(x)}" y="{top + ph + 16}" text-anchor="middle" font-size="11" fill="#444">{t:g}</text>'
        )
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{width - right}" y2="{top + ph}" {axis}/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" {axis}/>')
    x_label = ("minutes" if minutes else "seconds") + " since the run started" if by_time else what
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle" font-size="12" fill="#333">'
        f"{x_label}</text>"
    )
    out.append(
        f'<text transform="translate(14 {top + ph / 2}) rotate(-90)" text-anchor="middle" font-size="12" '
        f'fill="#333">fitness (speedup vs {esc(baseline)})</text>'
    )
    y1 = sy(1.0)
    out.append(
        f'<line x1="{left}" y1="{_f(y1)}" x2="{width - right}" y2="{_f(y1)}" stroke="#888" '
        'stroke-dasharray="4 3"/>'
    )
    for p in points:
        out.append(
            f'<circle cx="{_f(sx(xval(p)))}" cy="{_f(sy(p.fitness))}" r="2.5" fill="{color(p.status)}" '
            f'fill-opacity="0.55"><title>node {p.node}: {esc(p.status)}, fitness {fmt_x(p.fitness)}</title>'
            "</circle>"
        )
    d = [f"M{_f(sx(xval(points[0])))},{_f(sy(points[0].best))}"]
    for p in points[1:]:
        d.append(f"H{_f(sx(xval(p)))}V{_f(sy(p.best))}")
    out.append(f'<path d="{"".join(d)}" fill="none" stroke="{BEST}" stroke-width="2"/>')
    last = points[-1]
    out.append(
        f'<text x="{_f(sx(xval(last)) - 4)}" y="{_f(sy(last.best) - 6)}" text-anchor="end" font-size="11" '
        f'fill="{BEST}">best {fmt_x(last.best)}</text>'
    )
    out.append("</svg>")
    return "".join(out)


@dataclass
class _Placed:
    node: dict[str, Any]
    depth: int
    row: float
    x: float = 0.0
    y: float = 0.0


def tree_layout(nodes: Sequence[dict[str, Any]]) -> tuple[dict[int, _Placed], list[int], int]:
    """Positions in (depth, row) units, root ids, and the number of leaf rows.

    A parent that is unknown or created later than its child (never in a sane store) makes the
    child a root, so any input lays out without cycles.
    """
    order = {n["id"]: i for i, n in enumerate(nodes)}
    children: dict[int, list[int]] = {n["id"]: [] for n in nodes}
    roots: list[int] = []
    depth: dict[int, int] = {}
    for n in nodes:
        parent = n.get("parent")
        if isinstance(parent, int) and parent in order and order[parent] < order[n["id"]]:
            children[parent].append(n["id"])
            depth[n["id"]] = depth[parent] + 1
        else:
            roots.append(n["id"])
            depth[n["id"]] = 0
    by_id = {n["id"]: n for n in nodes}
    placed: dict[int, _Placed] = {}
    leaf_rows = 0
    for root in roots:  # iterative post-order: deep chains must not hit the recursion limit
        stack: list[tuple[int, bool]] = [(root, False)]
        while stack:
            nid, done = stack.pop()
            kids = children[nid]
            if not kids:
                placed[nid] = _Placed(by_id[nid], depth[nid], float(leaf_rows))
                leaf_rows += 1
            elif done:
                row = (placed[kids[0]].row + placed[kids[-1]].row) / 2
                placed[nid] = _Placed(by_id[nid], depth[nid], row)
            else:
                stack.append((nid, True))
                stack.extend((k, False) for k in reversed(kids))
    return placed, roots, leaf_rows


def tree_svg(
    nodes: Sequence[dict[str, Any]], best: int | None, best_path: set[int], href: str = "#node-{id}"
) -> str:
    """The search tree: color = status, radius = fitness, blue = the best node's ancestry,
    dashed purple = crossover (second parent). Each node links to `href` with its id filled in (the
    report's node table, or the live view's node page)."""
    if not nodes:
        return _svg_open(320, 40, "empty search tree") + (
            '<text x="10" y="25" font-size="13" fill="#666">no nodes</text></svg>'
        )
    placed, _, rows = tree_layout(nodes)
    max_depth = max(p.depth for p in placed.values())
    col = max(34.0, min(110.0, 1000.0 / max(max_depth, 1)))
    row_h = 18.0 if rows <= 60 else 14.0
    long_labels = col >= 70
    legend_h = 28.0
    pad_l, pad_t = 16.0, 12.0 + legend_h
    width = pad_l + max_depth * col + (90 if long_labels else 50)
    height = pad_t + max(rows, 1) * row_h + 8
    for p in placed.values():
        p.x, p.y = pad_l + p.depth * col, pad_t + p.row * row_h + row_h / 2
    fits = [float(p.node.get("fitness") or 0.0) for p in placed.values() if node_status(p.node) == "ok"]
    top_fit = max([f for f in fits if math.isfinite(f)] + [1e-9])

    def radius(n: dict[str, Any]) -> float:
        f = n.get("fitness") or 0.0
        if node_status(n) != "ok" or not isinstance(f, int | float) or not math.isfinite(f) or f <= 0:
            return 3.0
        return 3.0 + 4.5 * math.sqrt(min(f / top_fit, 1.0))

    legend, legend_w = _tree_legend(nodes)
    width = max(width, legend_w)
    out = [
        _svg_open(width, height, "search tree"),
        f'<rect width="{_f(width)}" height="{_f(height)}" fill="#fff"/>',
    ]
    out.append(legend)
    edges, extra, on_path = [], [], []
    for nid, p in placed.items():
        parent = p.node.get("parent")
        if parent in placed and placed[parent].depth < p.depth:
            q = placed[parent]
            mid = (q.x + p.x) / 2
            d = f"M{_f(q.x)},{_f(q.y)}C{_f(mid)},{_f(q.y)} {_f(mid)},{_f(p.y)} {_f(p.x)},{_f(p.y)}"
            if nid in best_path and parent in best_path:
                on_path.append(f'<path d="{d}" fill="none" stroke="{BEST}" stroke-width="2.5"/>')
            else:
                edges.append(f'<path d="{d}" fill="none" stroke="#b8b8b8" stroke-width="1"/>')
        parent2 = p.node.get("parent2")
        if parent2 in placed and parent2 != nid:
            q = placed[parent2]
            mid = (q.x + p.x) / 2
            d = f"M{_f(q.x)},{_f(q.y)}C{_f(mid)},{_f(q.y)} {_f(mid)},{_f(p.y)} {_f(p.x)},{_f(p.y)}"
            extra.append(
                f'<path d="{d}" fill="none" stroke="{CROSSOVER}" stroke-width="1.2" '
                'stroke-dasharray="4 3" stroke-opacity="0.8"/>'
            )
    out += edges + extra + on_path
    for nid, p in placed.items():
        n = p.node
        status = node_status(n)
        r = radius(n)
        fill = "#ffffff" if status == "pending" else color(status)
        stroke = BEST if nid in best_path else "#333333" if status == "pending" else "none"
        title = (
            f"node {nid} ({n.get('mode') or '-'}): {status}, fitness {fmt_x(n.get('fitness'))}"
            f"{'  [best]' if nid == best else ''}\n{one_line(n.get('note'), 200)}"
        )
        out.append(f'<a href="{esc(href.replace("{id}", str(nid)))}">')
        if nid == best:
            out.append(
                f'<circle cx="{_f(p.x)}" cy="{_f(p.y)}" r="{_f(r + 3.5)}" fill="none" stroke="{BEST}" '
                'stroke-width="2"/>'
            )
        out.append(
            f'<circle cx="{_f(p.x)}" cy="{_f(p.y)}" r="{_f(r)}" fill="{fill}" stroke="{stroke}" '
            f'stroke-width="1.2"><title>{esc(title)}</title></circle>'
        )
        label = str(nid)
        if long_labels and status == "ok":
            label += " " + fmt_x(n.get("fitness"))
        weight = ' font-weight="bold"' if nid == best else ""
        out.append(
            f'<text x="{_f(p.x + r + 2.5)}" y="{_f(p.y + 3.5)}" font-size="9" fill="#333"{weight} '
            'stroke="#fff" stroke-width="2.5" paint-order="stroke">'
            f"{esc(label)}</text></a>"
        )
    out.append("</svg>")
    return "".join(out)


def _tree_legend(nodes: Sequence[dict[str, Any]]) -> tuple[str, float]:
    present = []
    for n in nodes:
        s = node_status(n)
        if s not in present:
            present.append(s)
    present.sort(key=lambda s: list(STATUS_COLORS).index(s) if s in STATUS_COLORS else len(STATUS_COLORS))
    out, x = [], 16.0
    for s in present:
        fill = "#ffffff" if s == "pending" else color(s)
        out.append(f'<circle cx="{_f(x)}" cy="16" r="4.5" fill="{fill}" stroke="#333" stroke-width="0.6"/>')
        out.append(f'<text x="{_f(x + 8)}" y="20" font-size="11" fill="#333">{esc(s)}</text>')
        x += 16 + 6.5 * len(s)
    out.append(f'<line x1="{_f(x)}" y1="16" x2="{_f(x + 22)}" y2="16" stroke="{BEST}" stroke-width="2.5"/>')
    out.append(f'<text x="{_f(x + 27)}" y="20" font-size="11" fill="#333">best path</text>')
    x += 95
    out.append(
        f'<line x1="{_f(x)}" y1="16" x2="{_f(x + 22)}" y2="16" stroke="{CROSSOVER}" stroke-width="1.2" '
        'stroke-dasharray="4 3"/>'
    )
    out.append(f'<text x="{_f(x + 27)}" y="20" font-size="11" fill="#333">crossover</text>')
    return "".join(out), x + 100


# --- bench charts: bars per op and best-so-far lines ---------------------------------------------

SERIES = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


@dataclass
class Series:
    name: str
    values: Sequence[float | None]  # one per label (bars) or per x step (lines); None: no value
    color: str = ""


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks covering [lo, hi] on a log axis."""
    out: list[float] = []
    exp = math.floor(math.log10(lo))
    while True:
        for m in (1, 2, 5):
            t = m * 10.0**exp
            if t > hi * 1.0001:
                return out
            if t >= lo * 0.9999:
                out.append(t)
        exp += 1


def bars_svg(
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    y_label: str,
    log: bool = False,
    y_max: float | None = None,
    unit: str = "",
    height: int = 300,
    width: int | None = None,
) -> str:
    """Grouped bars, one group per label. With `log`, bars grow from 1 (up for a speedup, down for a
    slowdown) on a log axis; otherwise from 0. `unit` follows each tick ("x" for speedups)."""
    labels = [one_line(lb, 28) for lb in labels]
    longest = max((len(lb) for lb in labels), default=0)
    left, right, top = 60, 16, 44
    bottom = 20 + min(longest, 28) * 5.2
    group = max(22.0, 12.0 * max(len(series), 1) + 8)
    width = width or int(max(360, left + right + group * max(len(labels), 1), left + 7.2 * len(title)))
    pw, ph = width - left - right, height - top - bottom
    out = [_svg_open(width, height, title), f'<rect width="{width}" height="{height}" fill="#fff"/>']
    out.append(f'<text x="{left}" y="16" font-size="13" font-weight="600" fill="#222">{esc(title)}</text>')
    values = [f for s in series for v in s.values if (f := finite(v)) is not None and (not log or f > 0)]
    if not labels or not values:
        out.append(
            f'<text x="{left}" y="{top + 20}" font-size="12" fill="#666">nothing to plot yet</text></svg>'
        )
        return "".join(out)
    if log:
        lo, hi = min([*values, 1.0]) / 1.4, max([*values, 1.0]) * 1.4
        ticks = _log_ticks(lo, hi)

        def sy(v: float) -> float:
            return top + ph * (1 - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))

        base = 1.0
    else:
        lo, hi = 0.0, y_max if y_max is not None else max(values) * 1.08 or 1.0
        ticks = [t for t in nice_ticks(lo, hi) if t <= hi * 1.0001]

        def sy(v: float) -> float:
            return top + ph * (1 - (v - lo) / (hi - lo))

        base = 0.0
    for t in ticks:
        y = sy(t)
        out.append(f'<line x1="{left}" y1="{_f(y)}" x2="{width - right}" y2="{_f(y)}" stroke="#eee"/>')
        out.append(
            f'<text x="{left - 6}" y="{_f(y + 4)}" text-anchor="end" font-size="10" fill="#444">'
            f"{t:g}{esc(unit)}</text>"
        )
    out.append(
        f'<text transform="translate(14 {_f(top + ph / 2)}) rotate(-90)" text-anchor="middle" '
        f'font-size="11" fill="#333">{esc(y_label)}</text>'
    )
    step = pw / len(labels)
    bar = min(18.0, (step - 6) / max(len(series), 1))
    for i, label in enumerate(labels):
        cx = left + step * (i + 0.5)
        for j, s in enumerate(series):
            v = finite(s.values[i]) if i < len(s.values) else None
            if v is None or (log and v <= 0):
                continue
            x = cx + (j - len(series) / 2) * bar
            y0, y1 = sorted((sy(base), sy(min(max(v, lo), hi))))
            fill = s.color or SERIES[j % len(SERIES)]
            out.append(
                f'<rect x="{_f(x)}" y="{_f(y0)}" width="{_f(bar - 1)}" height="{_f(max(y1 - y0, 0.5))}" '
                f'fill="{fill}"><title>{esc(label)} {esc(s.name)}: {v:.4g}{esc(unit)}</title></rect>'
            )
        out.append(
            f'<text transform="translate({_f(cx + 3)} {_f(top + ph + 10)}) rotate(-45)" text-anchor="end" '
            f'font-size="10" fill="#333">{esc(label)}</text>'
        )
    out.append(
        f'<line x1="{left}" y1="{_f(sy(base))}" x2="{width - right}" y2="{_f(sy(base))}" stroke="#333"/>'
    )
    if len(series) > 1:
        out.append(_legend([s.name for s in series], [s.color for s in series], left + 4, 32))
    out.append("</svg>")
    return "".join(out)


def lines_svg(
    title: str, series: Sequence[Series], x_label: str, y_label: str, width: int = 720, height: int = 320
) -> str:
    """One line per series against its 1-based step (best so far per op, against candidates)."""
    left, right, top, bottom = 56, 16, 44, 40
    pw, ph = width - left - right, height - top - bottom
    out = [_svg_open(width, height, title), f'<rect width="{width}" height="{height}" fill="#fff"/>']
    out.append(f'<text x="{left}" y="16" font-size="13" font-weight="600" fill="#222">{esc(title)}</text>')
    drawn = [s for s in series if any(finite(v) is not None for v in s.values)]
    if not drawn:
        out.append(
            f'<text x="{left}" y="{top + 20}" font-size="12" fill="#666">nothing to plot yet</text></svg>'
        )
        return "".join(out)
    n = max(len(s.values) for s in drawn)
    y_hi = max(1.0, *(finite(v) or 0.0 for s in drawn for v in s.values)) * 1.08

    def sx(i: float) -> float:
        return left + (pw * (i - 1) / (n - 1) if n > 1 else pw / 2)

    def sy(v: float) -> float:
        return top + ph * (1 - v / y_hi)

    for t in nice_ticks(0.0, y_hi):
        if t <= y_hi:
            out.append(
                f'<line x1="{left}" y1="{_f(sy(t))}" x2="{width - right}" y2="{_f(sy(t))}" stroke="#eee"/>'
            )
            out.append(
                f'<text x="{left - 6}" y="{_f(sy(t) + 4)}" text-anchor="end" font-size="10" fill="#444">{t:g}x</text>'
            )
    for t in nice_ticks(1.0, float(n), min(n, 8)):
        if 1 <= t <= n and t == int(t):
            out.append(
                f'<text x="{_f(sx(t))}" y="{top + ph + 14}" text-anchor="middle" font-size="10" fill="#444">'
                f"{int(t)}</text>"
            )
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{width - right}" y2="{top + ph}" stroke="#999"/>')
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle" font-size="11" fill="#333">'
        f"{esc(x_label)}</text>"
    )
    out.append(
        f'<text transform="translate(14 {_f(top + ph / 2)}) rotate(-90)" text-anchor="middle" '
        f'font-size="11" fill="#333">{esc(y_label)}</text>'
    )
    for j, s in enumerate(drawn):
        pts = [(i + 1, finite(v)) for i, v in enumerate(s.values)]
        d = " ".join(f"{_f(sx(i))},{_f(sy(v))}" for i, v in pts if v is not None)
        colour = s.color or SERIES[j % len(SERIES)]
        out.append(
            f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="1.6">'
            f"<title>{esc(s.name)}</title></polyline>"
        )
    if len(drawn) <= 6:
        out.append(_legend([s.name for s in drawn], [s.color for s in drawn], left + 4, 32))
    else:  # too many for one legend row: each line is named at its end (and on hover)
        for j, s in enumerate(drawn):
            i, v = [(i + 1, fv) for i, raw in enumerate(s.values) if (fv := finite(raw)) is not None][-1]
            colour = s.color or SERIES[j % len(SERIES)]
            out.append(
                f'<text x="{_f(sx(i) - 2)}" y="{_f(sy(v) - 3)}" text-anchor="end" font-size="9" '
                f'fill="{colour}">{esc(one_line(s.name, 24))}</text>'
            )
    out.append("</svg>")
    return "".join(out)


def row_svg(label: str, charts: Sequence[tuple[str, float, float]]) -> str:
    """Charts given as (svg, width, height) side by side in one SVG (nested `<svg>` elements), so
    that a group of panels is still one standalone file."""
    width, height = sum(w for _, w, _ in charts), max((h for _, _, h in charts), default=0.0)
    out, x = [_svg_open(width, height, label)], 0.0
    for svg, w, _ in charts:
        out.append(svg.replace("<svg ", f'<svg x="{_f(x)}" ', 1))
        x += w
    out.append("</svg>")
    return "".join(out)


def _legend(names: Sequence[str], colors: Sequence[str], x: float, y: float) -> str:
    out = []
    for j, (name, colour) in enumerate(zip(names, colors, strict=True)):
        label = one_line(name, 24)
        fill = colour or SERIES[j % len(SERIES)]
        out.append(f'<rect x="{_f(x)}" y="{_f(y - 8)}" width="10" height="10" fill="{fill}"/>')
        out.append(f'<text x="{_f(x + 14)}" y="{_f(y + 1)}" font-size="10" fill="#333">{esc(label)}</text>')
        x += 24 + 5.6 * len(label)
    return "".join(out)
