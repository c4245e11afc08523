"""Attention's decomposed pieces, rewritten before a traced graph is mapped (issue K).

Attention (a softmax between two matmuls) is templated as a pipeline (`stages.py`): the scores'
batched GEMM with its elementwise epilogue (the scale, a mask), the row softmax of the scores (an
intermediate, so a reduction of that stage's input), then the GEMM of the probabilities with V.
`scaled_dot_product_attention` decomposes into two pieces that no cut separates as such; exact
rewrites (`rewrite_attention(gm)`, in place) turn them into what the stages map:

- the scale applied to both operands (`q * s` and `k.T * s`, s = scale ** 0.5) before the scores'
  `bmm` is applied to its result instead (`bmm(q, k.T) * (s * s)`): a GEMM epilogue. Exact in real
  arithmetic; in floating point the operands are no longer rounded after their scale (s * s is
  rounded once), a difference of a few ulps in each score, well within fp32's tolerance.
- a mask that broadcasts over the scores' outer dims (`where(bias[:, :, :T, :T] == 0, -inf, s)`, a
  buffer's corner of shape [1, 1, T, T]): expanded to the scores' shape before the comparison, so
  the mask is read at that shape (`aten_mask` materializes the expand in the wrapper).
- SDPA's `is_causal=True` mask, made from two aranges (`where(arange(S)[None] - arange(L)[:, None] <= 0,
  0, -inf)` added to the scores): `causal_mask(scores)`, which the mappers read as the IR's `causal`
  op (a key after its query is -inf; the templates that write it know each score's row and column,
  and the flash template skips the key blocks after a query block's last row).
- `_safe_softmax`'s guard (a row of -inf gives 0, not NaN): `all(x == -inf)` over the softmax's dim,
  spelled `logical_not(any(logical_not(x == -inf)))`, is `amax(x) == -inf` (a NaN in the row makes
  both false), a row reduction that the softmax's stage computes with its own.

Deliberately not here: a scale that is a tensor (only Python numbers move), a mul whose result is
read elsewhere, and fused attention itself (`triton_flash` fuses the three stages).
"""

from __future__ import annotations

import math
from typing import Any

from kernelevolve.synth.tuner.aten_graph import op_name

# Views between a scaled operand and its bmm (the decomposition's expand and 3-d view).
_THROUGH = {"expand", "view", "_unsafe_view", "reshape", "clone"}


def _call(node: Any) -> bool:
    return getattr(node, "op", None) == "call_function"


def _is(node: Any, name: str) -> bool:
    return _call(node) and op_name(node) == name


def _scaled_operand(arg: Any) -> tuple[Any, Any, float] | None:
    """(the view chain's first node, the mul, its scale) where `arg` is views of `x * c` (c a
    Python number, the mul and every view read only there); None otherwise."""
    node, first = arg, None
    while _call(node) and op_name(node) in _THROUGH and len(node.users) == 1:
        first, node = node, node.args[0]
    if first is None or not _is(node, "mul") or len(node.users) != 1:
        return None
    scale = node.args[1] if len(node.args) == 2 else None
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        return None
    val = node.meta.get("val")
    if val is None or not val.dtype.is_floating_point:
        return None
    return first, node, float(scale)


def _hoist_scales(graph: Any) -> bool:
    import torch

    changed = False
    for bmm in [n for n in graph.nodes if _is(n, "bmm")]:
        found = [s for s in (_scaled_operand(a) for a in bmm.args[:2]) if s is not None]
        if not found:
            continue
        total = 1.0
        for first, mul, scale in found:
            first.replace_input_with(mul, mul.args[0])
            graph.erase_node(mul)
            total *= scale
        # Scaled after the view back to the batch dims (as a reference scales its scores), which
        # the mappers read as the GEMM's epilogue on its output.
        out = bmm
        while len(out.users) == 1 and op_name(next(iter(out.users))) in ("view", "_unsafe_view"):
            out = next(iter(out.users))
        with graph.inserting_after(out):
            scaled = graph.call_function(torch.ops.aten.mul.Tensor, (out, total))
        out.replace_all_uses_with(scaled, delete_user_cb=lambda u, s=scaled: u is not s)
        scaled.meta = {"val": out.meta["val"]}
        changed = True
    return changed


def _all_neg_inf(node: Any) -> tuple[Any, Any, bool] | None:
    """(x, dim, keepdim) where `node` is `logical_not(any(logical_not(eq(x, -inf)), dim, keepdim))`."""
    if not _is(node, "logical_not") or not _is(node.args[0], "any"):
        return None
    anything = node.args[0]
    if len(anything.args) < 2 or not _is(anything.args[0], "logical_not"):
        return None
    eq = anything.args[0].args[0]
    if not _is(eq, "eq") or len(eq.args) != 2 or eq.args[1] != -math.inf:
        return None
    keepdim = (
        bool(anything.args[2]) if len(anything.args) > 2 else bool(anything.kwargs.get("keepdim", False))
    )
    return eq.args[0], anything.args[1], keepdim


def _guard_by_amax(graph: Any) -> bool:
    import torch

    changed = False
    for node in [n for n in graph.nodes if _is(n, "logical_not")]:
        found = _all_neg_inf(node)
        x = found[0] if found else None
        val = getattr(x, "meta", {}).get("val")
        if found is None or val is None or not val.dtype.is_floating_point:
            continue
        _, dim, keepdim = found
        dims = [dim] if isinstance(dim, int) else list(dim)
        with graph.inserting_before(node):
            amax = graph.call_function(torch.ops.aten.amax.default, (x, dims, keepdim))
            test = graph.call_function(torch.ops.aten.eq.Scalar, (amax, -math.inf))
        amax.meta = {"val": torch.amax(val, dims, keepdim)}
        test.meta = {"val": node.meta["val"]}
        node.replace_all_uses_with(test)
        changed = True
    if changed:
        graph.eliminate_dead_code()
    return changed


def _leaf_chain(node: Any) -> bool:
    """Whether `node` is slices and views of a placeholder (a forward argument or a parameter)."""
    while _call(node) and op_name(node) in {"slice", "alias", *_THROUGH}:
        node = node.args[0]
    return getattr(node, "op", None) == "placeholder"


def _expand_masks(graph: Any) -> bool:
    """`where(m == c, a, b)` whose mask `m` (a slice of a buffer) broadcasts over the result's outer
    dims: `m` expanded first, so the mask is read at the result's shape (`aten_mask`)."""
    import torch

    changed = False
    for node in [n for n in graph.nodes if _is(n, "where")]:
        test = node.args[0]
        out = node.meta.get("val")
        if not (_is(test, "eq") or _is(test, "ne")) or out is None or len(test.args) != 2:
            continue
        mask, value = test.args
        val = getattr(mask, "meta", {}).get("val")
        if val is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if val.dim() > out.dim() or val.numel() >= out.numel() or not _leaf_chain(mask):
            continue
        with graph.inserting_before(node):
            wide = graph.call_function(torch.ops.aten.expand.default, (mask, list(out.shape)))
            again = graph.call_function(test.target, (wide, value))
        wide.meta = {"val": val.expand(out.shape)}
        again.meta = {"val": wide.meta["val"] == value}
        node.replace_input_with(test, again)
        changed = True
    if changed:
        graph.eliminate_dead_code()
    return changed


def causal_mask(x: Any) -> Any:
    """x with every entry whose column is after its row (over the last two dims) set to -inf: what SDPA's
    `is_causal=True` adds to its scores. The rewritten graph's node (`_causal_masks`), mapped as the
    IR's `causal` op."""
    import torch

    rows, cols = x.shape[-2], x.shape[-1]
    after = torch.ones(rows, cols, dtype=torch.bool, device=x.device).triu(1)
    return x.masked_fill(after, -math.inf)


def _arange(node: Any, count: int) -> bool:
    """Whether `node` is arange(0, count) (step 1)."""
    if not (
        _is(node, "arange")
        and getattr(node.target, "_overloadname", "") in ("start_step", "start", "default")
    ):
        return False
    args = list(node.args)
    if len(args) == 1:
        args = [0, args[0]]
    return args[:2] == [0, count] and (len(args) < 3 or args[2] == 1)


def _is_causal_test(node: Any, rows: int, cols: int) -> bool:
    """Whether `node` (bool, [rows, cols]) is `arange(cols)[None, :] - arange(rows)[:, None] <= 0`, perhaps
    and-ed with an all-true `full` (SDPA's decomposition of `is_causal`)."""
    if _is(node, "logical_and") and len(node.args) == 2:
        a, b = node.args
        if _is(b, "full") and b.args[1] is True:
            node = a
        elif _is(a, "full") and a.args[1] is True:
            node = b
        else:
            return False
    if not (_is(node, "le") and len(node.args) == 2 and node.args[1] == 0 and _is(node.args[0], "sub")):
        return False
    col, row = node.args[0].args[:2]
    if not (_is(col, "unsqueeze") and _is(row, "unsqueeze")):
        return False
    return (col.args[1] in (-2, 0) and _arange(col.args[0], cols)
            and row.args[1] in (-1, 1) and _arange(row.args[0], rows))  # fmt: skip


def _scalar(node: Any) -> float | None:
    if _is(node, "scalar_tensor") and isinstance(node.args[0], int | float):
        return float(node.args[0])
    return None


def _causal_masks(graph: Any) -> bool:
    """`add(x, where(causal test, 0, -inf))` (SDPA's `is_causal`) as `causal_mask(x)`."""
    changed = False
    for node in [n for n in graph.nodes if _is(n, "add") and len(n.args) == 2]:
        x, mask = node.args
        val = getattr(x, "meta", {}).get("val")
        if not (_is(mask, "where") and len(mask.args) == 3) or val is None or val.dim() < 2:
            continue
        if mask.meta.get("val") is None or tuple(mask.meta["val"].shape) != tuple(val.shape[-2:]):
            continue
        test, keep, drop = mask.args
        if _scalar(keep) != 0.0 or _scalar(drop) != -math.inf:
            continue
        if not _is_causal_test(test, val.shape[-2], val.shape[-1]):
            continue
        with graph.inserting_before(node):
            masked = graph.call_function(causal_mask, (x,))
        masked.meta = {"val": node.meta["val"]}
        node.replace_all_uses_with(masked)
        graph.erase_node(node)
        changed = True
    if changed:
        graph.eliminate_dead_code()
    return changed


def rewrite_attention(gm: Any) -> Any:
    """`gm` with attention's scaled operands and softmax guards rewritten (in place; see above)."""
    graph = gm.graph
    changed = _causal_masks(graph)
    changed = _hoist_scales(graph) or changed
    changed = _guard_by_amax(graph) or changed
    changed = _expand_masks(graph) or changed
    if changed:
        graph.lint()
        gm.recompile()
    return gm


__all__ = ["causal_mask", "rewrite_attention"]
