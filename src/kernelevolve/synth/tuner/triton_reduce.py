"""Index arithmetic for `row` graphs whose reductions are not over the last dim (`ir.ReduceInfo`):
the row templates (`triton_row.py`) ask here for each tensor's offset, the output's, and the
wrapper's sizes.

The split dims of the domain D (D's, with dim 1 as (groups, C / groups) for a group norm) are first
merged: neighbours that are both kept or both reduced, and along which every tensor read either
varies or is broadcast alike, become one dim (LayerNorm over [C, H, W] becomes one reduced dim of
C * H * W; RMS norm over dim 1 of [B, C, H, W] becomes kept B, reduced C, kept H * W). Where that
leaves at most one kept dim followed by at most one reduced dim, the graph takes the plain row
path (offsets `r * cols + c`, `c`, `r`) unchanged. Otherwise the kernel receives the merged dims'
sizes (`s0`, `s1`, ...), splits its row index r into the kept dims' indices (`k<i>`) and its column
index c into the reduced dims' (`j<i>`) by division and remainder, and each tensor's offset is the
sum of those indices times its strides, products of the sizes of the later dims it varies along
(every tensor is contiguous; a broadcast dim has stride 0), or `r * cols + c`, `r` or `c` where
the sum comes to that (group norm's input: kept (n, group), then reduced). Full outputs are D-shaped
and contiguous; outputs of one value per row are stored at r.

Not here: choosing the dims (`aten_reduce.py`) or the kernels' loops (`triton_row.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelevolve.synth.tuner.ir import OpGraph, TensorArg
from kernelevolve.synth.tuner.triton_common import CodegenError, Names

_PLAIN_OFFSETS = {"full": "r * cols + c", "col": "c", "row": "r"}


@dataclass
class IndexPlan:
    """How a row kernel addresses memory: `general` False is the plain [rows, cols] path."""

    general: bool
    sizes: list[str]  # the merged dims' sizes, as wrapper expressions of `_shape`
    kept: list[int]  # merged dims enumerated by r, row-major
    reduced: list[int]  # merged dims enumerated by c, row-major
    present: dict[str, set[int]]  # per tensor: the merged dims it varies along

    def offset(self, name: str | None, layout: str) -> str:
        """The offset of tensor `name` (None: a full output) in a [ROWS, width] tile."""
        if not self.general:
            return _PLAIN_OFFSETS[layout]
        dims = set(range(len(self.sizes))) if name is None else self.present[name]
        kept, reduced = set(self.kept), set(self.reduced)
        if dims == kept | reduced and (not kept or not reduced or max(kept) < min(reduced)):
            return "r * cols + c"  # row-major over the kept dims, then the reduced ones
        if dims and dims == kept:
            return "r"
        if dims and dims == reduced:
            return "c"
        terms = []
        for d in sorted(dims):
            index = f"k{d}" if d in self.kept else f"j{d}"
            later = [f"s{e}" for e in sorted(dims) if e > d]
            terms.append(" * ".join([index, *later]))
        return " + ".join(terms) if terms else "0"

    def inner_kept(self) -> bool:
        """Whether the innermost dim (contiguous in memory) is a kept one: neighbouring rows are
        neighbours in memory, and a row's elements are strided."""
        return self.general and bool(self.kept) and self.kept[-1] == len(self.sizes) - 1

    def row_lines(self) -> list[str]:
        return _split("r", self.kept) if self.general else []

    def col_lines(self) -> list[str]:
        if not self.general:
            return []
        return ["if IDX64:", "    c = c.to(tl.int64)", *_split("c", self.reduced)]

    def params(self) -> list[str]:
        return [f"s{i}" for i in range(len(self.sizes))] if self.general else []

    def args(self) -> list[str]:
        return [f"_s{i}" for i in range(len(self.sizes))] if self.general else []


def _split(index: str, dims: list[int]) -> list[str]:
    """`k<d>` (or `j<d>`) = the index along each of `dims` of the row-major `index`."""
    var = "k" if index == "r" else "j"
    lines = []
    for i, d in enumerate(dims):
        later = dims[i + 1 :]
        divisor = " * ".join(f"s{e}" for e in later)
        expr = (
            (f"({index} // ({divisor}))" if len(later) > 1 else f"({index} // {divisor})") if later else index
        )
        lines.append(f"{var}{d} = {expr} % s{d}" if i > 0 else f"{var}{d} = {expr}")
    return lines


def plan(graph: OpGraph) -> IndexPlan | None:
    """The graph's index plan; None for a graph without `reduce` (the output's last dim)."""
    info = graph.reduce
    if info is None:
        return None
    g = info.groups
    rank = info.rank
    split = (
        ["_shape[0]", str(g), f"(_shape[1] // {g})", *[f"_shape[{d}]" for d in range(2, rank)]]
        if g > 1
        else [f"_shape[{d}]" for d in range(rank)]
    )
    present = dict(info.present)
    names = list(present)

    def signature(s: int) -> tuple[bool, ...]:
        return (s in info.reduced, *[s in present[n] for n in names])

    runs: list[list[int]] = []
    for s in range(len(split)):
        if runs and signature(runs[-1][-1]) == signature(s):
            runs[-1].append(s)
        else:
            runs.append([s])
    sizes = [" * ".join(split[s] for s in run) for run in runs]
    reduced = [i for i, run in enumerate(runs) if run[0] in info.reduced]
    kept = [i for i in range(len(runs)) if i not in reduced]
    merged = {n: {i for i, run in enumerate(runs) if run[0] in present[n]} for n in names}
    plain = len(kept) <= 1 and len(reduced) <= 1 and (not kept or not reduced or kept[0] < reduced[0])
    return IndexPlan(not plain, sizes, kept, reduced, merged)


def wrapper_lines(graph: OpGraph, p: IndexPlan, tensors: list[TensorArg], names: Names) -> list[str]:
    """After the tensors are fetched: `_shape` (D's), `_device`, the outputs, `_rows`, `_cols` and
    the merged sizes `_s<i>`."""
    info = graph.reduce
    assert info is not None
    if info.domain not in {t.name for t in tensors}:
        raise CodegenError(f"the tensor {info.domain!r} that gives the reduced shape is not read")
    lines = [f"_shape = {names.local(info.domain)}.shape", f"_device = {names.local(info.domain)}.device"]
    if info.out_shape is None:
        out = "_shape"
    else:
        dims = ["1" if d < 0 else f"_shape[{d}]" for d in info.out_shape]
        out = "(" + "".join(f"{d}, " for d in dims) + ")"
    lines += [
        f"_out{i} = torch.empty({out}, device=_device, dtype=torch.{graph.dtype})"
        for i in range(len(graph.outputs))
    ]
    lines += [f"_s{i} = {size}" for i, size in enumerate(p.sizes)]
    kept = " * ".join(f"_s{i}" for i in p.kept) or "1"
    red = " * ".join(f"_s{i}" for i in p.reduced) or "1"
    lines += [f"_rows = {kept}", f"_cols = {red}"]
    return lines


__all__ = ["IndexPlan", "plan", "wrapper_lines"]
