"""Inline SVG charts for the run report: the best-so-far curve and the search tree.

Both are plain strings of SVG with presentation attributes (no CSS classes, no scripts, no external
references), so the same markup works inline in the HTML report and as a standalone `.svg` file that
the Markdown report links. Hover text is SVG `<title>`, which browsers show without JavaScript.

The tree is laid out by depth (columns, root at the left) and creation order (rows): each leaf gets
its own row, in depth-first order with children in creation order, and an inner node sits midway
between its first and last child. That keeps about 200 nodes legible: the picture grows with the
number of leaves, and scrolls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernelevolve.report.fmt import esc, fmt_x, one_line

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


def curve_svg(points: Sequence[CurvePoint], baseline: str, width: int = 720, height: int = 280) -> str:
    """Best fitness so far (a step line) and each evaluation's fitness (dots) against evaluations."""
    left, right, top, bottom = 56, 16, 16, 40
    out = [_svg_open(width, height, "best fitness so far against nodes evaluated")]
    out.append(f'<rect width="{width}" height="{height}" fill="#ffffff"/>')
    if not points:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#666" font-size="13">')
        out.append("no node was evaluated</text></svg>")
        return "".join(out)
    n = len(points)
    y_hi = max(1.0, max(p.fitness for p in points)) * 1.08
    pw, ph = width - left - right, height - top - bottom

    def sx(i: float) -> float:
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
    for t in nice_ticks(1.0, float(n), min(n, 8)):
        if t < 1 or t > n or t != int(t):
            continue
        x = sx(t)
        out.append(f'<line x1="{_f(x)}" y1="{top + ph}" x2="{_f(x)}" y2="{top + ph + 4}" {axis}/>')
        out.append(
            f'<text x="{_f(x)}" y="{top + ph + 16}" text-anchor="middle" font-size="11" fill="#444">{int(t)}</text>'
        )
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{width - right}" y2="{top + ph}" {axis}/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" {axis}/>')
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle" font-size="12" fill="#333">'
        "nodes evaluated</text>"
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
            f'<circle cx="{_f(sx(p.index))}" cy="{_f(sy(p.fitness))}" r="2.5" fill="{color(p.status)}" '
            f'fill-opacity="0.55"><title>node {p.node}: {esc(p.status)}, fitness {fmt_x(p.fitness)}</title>'
            "</circle>"
        )
    d = [f"M{_f(sx(1))},{_f(sy(points[0].best))}"]
    for p in points[1:]:
        d.append(f"H{_f(sx(p.index))}V{_f(sy(p.best))}")
    out.append(f'<path d="{"".join(d)}" fill="none" stroke="{BEST}" stroke-width="2"/>')
    last = points[-1]
    out.append(
        f'<text x="{_f(sx(last.index) - 4)}" y="{_f(sy(last.best) - 6)}" text-anchor="end" font-size="11" '
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


def tree_svg(nodes: Sequence[dict[str, Any]], best: int | None, best_path: set[int]) -> str:
    """The search tree: color = status, radius = fitness, blue = the best node's ancestry,
    dashed purple = crossover (second parent)."""
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
        out.append(f'<a href="#node-{nid}">')
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
