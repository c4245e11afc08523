"""`ast.parse` behind one process-wide lock.

CPython 3.11 keeps the state of its AST converter (the recursion depth of turning the parser's tree
into `ast` objects) per interpreter, not per thread. The search parses candidates in many threads at
once (static guards, the tuner), and two conversions that interleave can fail with
`SystemError: AST constructor recursion depth mismatch` (seen in CI on Python 3.11.7, with twelve
expansions in flight). Parsing is fast; one lock costs nothing measurable.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename)


def parse_expression(source: str) -> ast.Expression:
    """`ast.parse(source, mode="eval")`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, mode="eval")


def literal_eval(text: str) -> object:
    """`ast.literal_eval(text)`, its parse one thread at a time."""
    return ast.literal_eval(parse_expression(text.lstrip(" \t")))
