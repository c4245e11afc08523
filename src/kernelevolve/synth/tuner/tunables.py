"""Declared tunables: how a candidate says which knobs a tuner may turn, and how the tuner turns them.

A candidate declares two module-level literal dicts; its kernels read `CONFIG`:

    TUNABLES = {"BLOCK": [256, 512, 1024, 2048], "num_warps": [2, 4, 8]}
    CONFIG = {"BLOCK": 1024, "num_warps": 4}

Every value of CONFIG must be one of the choices in TUNABLES. The tuner reads both without running
the file (`ast.literal_eval`), and writes a new configuration by replacing the `CONFIG` assignment's
source text, leaving the rest of the file byte for byte unchanged. Generated kernels and a user's own
kernel (`kernelevolve tune`) use the same convention.
"""

from __future__ import annotations

import ast
from typing import Any

from kernelevolve import pyast

Config = dict[str, Any]


class TunablesError(ValueError):
    pass


def _assignment(tree: ast.Module, name: str) -> ast.Assign | None:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
        ):
            return node
    return None


def read(source: str) -> tuple[dict[str, list[Any]], Config] | None:
    """(TUNABLES, CONFIG) of a candidate, or None if it declares none. Raises TunablesError when the
    declaration is there but malformed (not literals, a CONFIG value outside its choices)."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return None
    t_node, c_node = _assignment(tree, "TUNABLES"), _assignment(tree, "CONFIG")
    if t_node is None or c_node is None:
        return None
    try:
        tunables = ast.literal_eval(t_node.value)
        config = ast.literal_eval(c_node.value)
    except ValueError as exc:
        raise TunablesError(f"TUNABLES and CONFIG must be literal dicts: {exc}") from None
    if not isinstance(tunables, dict) or not isinstance(config, dict):
        raise TunablesError("TUNABLES and CONFIG must be dicts")
    for key, choices in tunables.items():
        if not isinstance(choices, list | tuple) or not choices:
            raise TunablesError(f"TUNABLES[{key!r}] must be a non-empty list of choices")
        if key not in config:
            raise TunablesError(f"CONFIG has no value for tunable {key!r}")
        if config[key] not in choices:
            raise TunablesError(f"CONFIG[{key!r}] = {config[key]!r} is not one of {list(choices)}")
    return {k: list(v) for k, v in tunables.items()}, dict(config)


def write(source: str, config: Config) -> str:
    """The source with its CONFIG assignment replaced by `config` (keys in TUNABLES order)."""
    tree = pyast.parse(source)
    node = _assignment(tree, "CONFIG")
    if node is None or node.end_lineno is None or node.end_col_offset is None:
        raise TunablesError("the candidate declares no CONFIG")
    lines = source.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: node.lineno - 1]) + node.col_offset
    end = sum(len(line) for line in lines[: node.end_lineno - 1]) + node.end_col_offset
    return source[:start] + "CONFIG = " + format_config(config) + source[end:]


def format_config(config: Config) -> str:
    return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in config.items()) + "}"


__all__ = ["Config", "TunablesError", "format_config", "read", "write"]
