"""Declared tunables: how a candidate says which knobs a tuner may turn, and how the tuner turns them.

A candidate declares two module-level literal dicts; its kernels read `CONFIG`:

    TUNABLES = {"BLOCK": [256, 512, 1024, 2048], "num_warps": [2, 4, 8]}
    CONFIG = {"BLOCK": 1024, "num_warps": 4}

Every value of CONFIG must be one of the choices in TUNABLES. The tuner reads both without running
the file (`ast.literal_eval`), and writes a new configuration by replacing the `CONFIG` assignment's
source text, leaving the rest of the file byte for byte unchanged. Generated kernels and a user's own
kernel (`kernelevolve tune`) use the same convention.

A Triton candidate may also declare which knobs size the tile one program holds live in registers,
as a third literal next to CONFIG:

    TILE = ("ROWS", "CHUNK")

The product of those CONFIG values, over the program's threads (32 * CONFIG["num_warps"]), is the
tile's elements per thread, and a configuration above THREAD_TILE_LIMIT (256) does not fit (`fits`):
the tuner never proposes one (a seed or sample is still offered once as written). Why: a thread has
at most 255 32-bit registers, so a larger fp32 tile spills and is never fast; and Triton's compiler
(LLVM/ptxas) takes minutes on it. Measured with
Triton 3.6 for sm_90 on a [ROWS, CHUNK] fp32 tile: 32 per thread compiled in 1.9 s, 256 in 3.5 s,
512 in 8-9 s, 1024 in 40 s, 2048 in over 200 s (killed); in a GPU soak, ROWS 8 x CHUNK 8192 (or
16384) at num_warps 1 timed out after 120 s in compilation. The limit does not apply without a
TILE, without a num_warps in CONFIG, or where a value of the product is not an int (e.g. "auto": the
forward sizes it per shape). A file of several kernels, each with its own knobs, prefixes them
`s<k>_` (a generated pipeline's stages): each prefix's TILE knobs are one tile over its own
`s<k>_num_warps`.

A candidate may declare, likewise, a lower bound of the shared memory one program of a kernel needs,
in bytes, as a sum of products of CONFIG values and int constants:

    SMEM = ((4, "num_stages", "BLOCK_M", "BLOCK_K"), (4, "num_stages", "BLOCK_K", "BLOCK_N"))

(a pipelined GEMM's fp32 operand buffers: what Triton 3.6 asked for exactly in each of 5 compile
failures seen on an H200). A configuration whose bound is above the device's limit per block
(SMEM_PER_BLOCK, by the platform target: 227 KiB on sm_90) fails to compile with `OutOfResources`,
so the tuner never proposes one (`smem_fits`); 5-15% of a GEMM or attention search's candidates
died so. Terms of `s<k>_` knobs are summed per prefix (each stage's kernel is its own launch); a
term with a value that is not an int (or a key CONFIG lacks) counts as 0, which keeps the sum a
lower bound.
"""

from __future__ import annotations

import ast
import functools
import math
import re
from collections.abc import Callable
from typing import Any

from kernelevolve import pyast

Config = dict[str, Any]
THREAD_TILE_LIMIT = 256  # tile elements per thread; a thread has at most 255 32-bit registers
WARP_SIZE = 32
# The most shared memory one block may take (the opt-in maximum), by platform target (`Platform.target`);
# CUDA's programming guide's table of compute capabilities. Targets not here are not checked.
SMEM_PER_BLOCK = {
    "cuda:sm70": 98304, "cuda:sm75": 65536, "cuda:sm80": 166912, "cuda:sm86": 101376, "cuda:sm87": 166912,
    "cuda:sm89": 101376, "cuda:sm90": 232448, "cuda:sm100": 232448, "cuda:sm120": 101376,
}  # fmt: skip
Term = tuple[int | str, ...]


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
    _tile(tree, config)  # a malformed TILE or SMEM makes the declaration malformed
    _smem(tree, config)
    return {k: list(v) for k, v in tunables.items()}, dict(config)


def _tile(tree: ast.Module, config: Config) -> tuple[str, ...] | None:
    """The TILE declaration's knob names, or None if there is none. Raises TunablesError when it is
    not a literal tuple or list of names that CONFIG has."""
    node = _assignment(tree, "TILE")
    if node is None:
        return None
    try:
        tile = ast.literal_eval(node.value)
    except ValueError as exc:
        raise TunablesError(
            f"TILE must be a literal tuple of CONFIG keys, e.g. ('ROWS', 'CHUNK'): {exc}"
        ) from None
    if not isinstance(tile, tuple | list) or not tile or not all(isinstance(k, str) for k in tile):
        raise TunablesError(
            f"TILE must be a non-empty tuple of CONFIG keys, e.g. ('ROWS', 'CHUNK'); got {tile!r}"
        )
    missing = [k for k in tile if k not in config]
    if missing:
        raise TunablesError(f"TILE names {', '.join(map(repr, missing))}, which CONFIG does not have")
    return tuple(tile)


def declared_tile(source: str) -> tuple[str, ...] | None:
    """The candidate's TILE (the knob names), or None where it declares none (or no CONFIG, or does
    not parse). Raises TunablesError for a malformed TILE or CONFIG. Cached: the tuner asks it of the
    same parent for every configuration it considers."""
    return _declared_tile(source)


@functools.lru_cache(maxsize=256)
def _declared_tile(source: str) -> tuple[str, ...] | None:
    return _declared(source, "TILE", _tile)


def _declared(source: str, name: str, read: Callable[[ast.Module, Config], Any]) -> Any:
    """`read(tree, CONFIG)` of a candidate that declares `name` beside a CONFIG; None where it does
    not (or does not parse). Raises TunablesError for a CONFIG that is no literal dict."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return None
    c_node = _assignment(tree, "CONFIG")
    if c_node is None or _assignment(tree, name) is None:
        return None
    try:
        config = ast.literal_eval(c_node.value)
    except ValueError as exc:
        raise TunablesError(f"CONFIG must be a literal dict: {exc}") from None
    if not isinstance(config, dict):
        raise TunablesError("CONFIG must be a dict")
    return read(tree, config)


def _smem(tree: ast.Module, config: Config) -> tuple[Term, ...] | None:
    """The SMEM declaration's terms, or None if there is none. Raises TunablesError when it is not a
    literal tuple of non-empty tuples of ints and CONFIG keys, or a term mixes stages' prefixes."""
    node = _assignment(tree, "SMEM")
    if node is None:
        return None
    example = "((4, 'num_stages', 'BLOCK_M', 'BLOCK_K'),)"
    try:
        terms = ast.literal_eval(node.value)
    except ValueError as exc:
        raise TunablesError(f"SMEM must be a literal tuple of terms, e.g. {example}: {exc}") from None
    if not isinstance(terms, tuple | list) or not all(
        isinstance(t, tuple | list) and t and all(isinstance(x, int | str) for x in t) for t in terms
    ):
        raise TunablesError(
            f"SMEM must be a tuple of non-empty tuples of ints and CONFIG keys, e.g. {example}"
        )
    for term in terms:
        keys = [x for x in term if isinstance(x, str)]
        missing = [k for k in keys if k not in config]
        if missing:
            raise TunablesError(f"SMEM names {', '.join(map(repr, missing))}, which CONFIG does not have")
        if len({_prefix(k) for k in keys}) > 1:
            raise TunablesError(f"an SMEM term mixes the knobs of several kernels: {term!r}")
    return tuple(tuple(t) for t in terms)


def _prefix(key: str) -> str:
    stage = re.match(r"s\d+_", key)
    return stage.group(0) if stage else ""


def declared_smem(source: str) -> tuple[Term, ...] | None:
    """The candidate's SMEM terms, or None where it declares none (or no CONFIG, or does not parse).
    Raises TunablesError for a malformed SMEM or CONFIG. Cached, as `declared_tile`."""
    return _declared_smem(source)


@functools.lru_cache(maxsize=256)
def _declared_smem(source: str) -> tuple[Term, ...] | None:
    return _declared(source, "SMEM", _smem)


def smem_bytes(config: Config, terms: tuple[Term, ...] | None) -> int | None:
    """The SMEM bound at `config`: each kernel's (prefix's) sum of its terms' products, the largest of
    them; None where nothing is declared. A term with a value that is not an int counts as 0."""
    if not terms:
        return None
    sums: dict[str, int] = {}
    for term in terms:
        keys = [x for x in term if isinstance(x, str)]
        values = [config.get(x) if isinstance(x, str) else x for x in term]
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        prefix = _prefix(keys[0]) if keys else ""
        sums[prefix] = sums.get(prefix, 0) + (math.prod(ints) if len(ints) == len(values) else 0)
    return max(sums.values())


def smem_fits(config: Config, terms: tuple[Term, ...] | None, target: str) -> bool:
    """Whether `config` keeps the SMEM bound within the target's SMEM_PER_BLOCK (True where nothing is
    declared or the target is not in the table). The tuner asks this before it writes a
    configuration into a source, beside `config_fits`."""
    limit = SMEM_PER_BLOCK.get(target)
    need = smem_bytes(config, terms)
    return limit is None or need is None or need <= limit


def per_thread(config: Config, tile: tuple[str, ...] | None) -> float | None:
    """Elements per thread of `tile` at `config`: prod(config[k] for k in tile) / (32 *
    config["num_warps"]). None where the limit does not apply: no tile, no num_warps, or a value that
    is not an int (e.g. "auto"). A file of several kernels (a generated pipeline's stages) prefixes each
    kernel's knobs with `s<k>_`: each prefix's knobs are one tile over its own `s<k>_num_warps`, and the
    largest applicable one counts."""
    if not tile:
        return None
    groups: dict[str, list[str]] = {}
    for key in tile:
        groups.setdefault(_prefix(key), []).append(key)
    worst = None
    for prefix, keys in groups.items():
        values = [config.get(k) for k in keys] + [config.get(prefix + "num_warps")]
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0]
        if len(ints) == len(values):
            n = math.prod(ints[:-1]) / (WARP_SIZE * ints[-1])
            worst = n if worst is None else max(worst, n)
    return worst


def config_fits(config: Config, tile: tuple[str, ...] | None) -> bool:
    """Whether `config` keeps `tile` within THREAD_TILE_LIMIT elements per thread (True where the limit
    does not apply). The tuner asks this before it writes a configuration into a source."""
    n = per_thread(config, tile)
    return n is None or n <= THREAD_TILE_LIMIT


def tile_per_thread(source: str) -> float | None:
    """`per_thread` of a whole candidate: its TILE at its own CONFIG."""
    declared = read(source)
    return None if declared is None else per_thread(declared[1], declared_tile(source))


def fits(source: str) -> bool:
    """`config_fits` of a whole candidate: its TILE at its own CONFIG."""
    declared = read(source)
    return declared is None or config_fits(declared[1], declared_tile(source))


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


__all__ = [
    "SMEM_PER_BLOCK",
    "THREAD_TILE_LIMIT",
    "Config",
    "TunablesError",
    "config_fits",
    "declared_smem",
    "declared_tile",
    "fits",
    "format_config",
    "per_thread",
    "read",
    "smem_bytes",
    "smem_fits",
    "tile_per_thread",
    "write",
]
