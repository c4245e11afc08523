"""Number formatting and escaping for the reports: one spelling of every number, "-" for anything missing.

Escaping is the only guard between untrusted text (candidate sources, error messages, notes written by a
model) and the reader's browser. Every text that reaches HTML goes through `esc`, which passes through
only `Safe` strings: markup this package built from escaped parts. Markdown cells go through `md`, which
escapes both HTML and the Markdown punctuation that makes links, emphasis or table cells.
"""

from __future__ import annotations

import html
import math
import re
from datetime import datetime
from typing import Any


class Safe(str):
    """Markup built by this package from escaped parts; `esc` leaves it alone."""

    __slots__ = ()


def esc(value: Any) -> str:
    """HTML text (also safe inside double-quoted attributes). Safe strings pass through."""
    if isinstance(value, Safe):
        return value
    return html.escape("-" if value is None else str(value), quote=True)


_MD_PUNCT = re.compile(r"([\\`*\[\]|])")
_MD_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # intraword `_` is never emphasis


def md(value: Any, limit: int | None = None) -> str:
    """Text for one Markdown table cell: one line, HTML and Markdown punctuation escaped."""
    text = " ".join(("-" if value is None else str(value)).split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    text = html.escape(text, quote=False)
    return _MD_UNDERSCORE.sub(r"\\_", _MD_PUNCT.sub(r"\\\1", text))


def fence(text: str, lang: str = "") -> str:
    """A fenced Markdown code block that `text` cannot close: the fence outruns its longest backtick run."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def one_line(value: Any, limit: int = 160) -> str:
    text = " ".join(str(value or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def fmt_x(value: Any) -> str:
    v = finite(value)
    return "-" if v is None else f"{v:.2f}x"


def fmt_pct(value: Any) -> str:
    v = finite(value)
    return "-" if v is None else f"{v:.0%}" if v >= 0.1 else f"{v:.1%}"


def fmt_num(value: Any, digits: int = 3) -> str:
    v = finite(value)
    return "-" if v is None else f"{v:.{digits}g}"


def fmt_int(value: Any) -> str:
    v = finite(value)
    return "-" if v is None else f"{round(v):,}"


def fmt_usd(value: Any) -> str:
    v = finite(value)
    if v is None:
        return "-"
    return f"${v:.4f}" if abs(v) < 1 else f"${v:,.2f}"


def fmt_time(seconds: Any) -> str:
    """A kernel time: ns, us, ms or s with three significant digits."""
    v = finite(seconds)
    if v is None:
        return "-"
    for scale, unit in ((1e-6, "ns"), (1e-3, "us"), (1.0, "ms")):
        if abs(v) < scale:
            return f"{v / scale * 1e3:.3g} {unit}"
    return f"{v:.3g} s"


def fmt_duration(seconds: Any) -> str:
    """A wall-clock duration: 12.3 s, 4m 05s, 2h 03m."""
    v = finite(seconds)
    if v is None:
        return "-"
    if v < 60:
        return f"{v:.1f} s"
    m, s = divmod(round(v), 60)
    if m < 60:
        return f"{m}m {s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m"


def fmt_date(value: Any) -> str:
    if not value:
        return "-"
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    zone = when.strftime(" %Z") if when.tzinfo else ""
    return when.strftime("%Y-%m-%d %H:%M:%S") + zone


def fmt_yes(value: Any) -> str:
    return "-" if value is None else "yes" if value else "no"
