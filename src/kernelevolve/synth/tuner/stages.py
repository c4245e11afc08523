"""Split a traced graph that no single template covers into a pipeline of stages (`OpGraph.stages`).

`map_graph` first maps the whole traced graph (`aten_map.GraphMapper`). Where that is refused, it
looks for a cut: a value S (a float tensor computed in the graph) such that the graph's part that
computes S (S and its ancestors: the *prefix*) is itself templated with S as its output, and the rest
reads nothing of the prefix but S (and views of the inputs and parameters, and the forward's tensor
constants, get_attr nodes, which are copied into the rest). The rest then becomes a graph of its
own, S one of its inputs (the intermediate, written by the prefix's kernel in fp32, contiguous, in
the traced shape), and is mapped the same way, recursively:
conv -> pool -> pool gives three stages. Cuts are tried latest first, so each stage fuses as much as
its template can (a convolution keeps its whole elementwise epilogue up to the pooling).

An intermediate reaches a later stage as an extra forward argument: stage k's graph reads it from
`input:<n + j>` (n the reference's inputs, j the intermediate's number) named `_mid<j>`, so every
template fetches it as it fetches an input. Where no cut gives templated stages, the refusal names the
stage that is not templated and why (from the latest cut whose prefix is templated), e.g. "stage 2 of
the pipeline (after conv2d (...)) is not templated: aten.native_group_norm is not templated".

Attention (issue K) is such a pipeline: the scores' batched GEMM with its epilogue (the scale, a
mask), then the row softmax, whose input is the scores' intermediate (a reduction of a graph input,
as the mappers template reductions), then the GEMM of the probabilities with V. The latest cuts are
refused first (a matmul before a reduction in one graph), and the cut at the scaled, masked scores
wins. Where `scaled_dot_product_attention`'s decomposition would defeat every cut (q and k scaled
apart before the GEMM, the softmax's -inf guard reading the scores beside the softmax), the trace
has already rewritten it exactly (`aten_attention`). Where no pipeline is formed, the refusal is
prefaced as attention (`_attention`): the fused flash-attention template (`triton_flash`) takes the
three stages' pipeline, so an attention no pipeline covers has no template.

Deliberately not here: the stages' code (`triton_stages.py`), a stage that needs two intermediates (a
residual around a pooling), and cuts inside a template's own op (a split-K GEMM).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernelevolve.synth.tuner.aten_graph import StandIn, copy_graph, op_name
from kernelevolve.synth.tuner.aten_map import _TRANSPOSES, _VIEWS, FLOAT_DTYPES, GraphMapper, Unsupported
from kernelevolve.synth.tuner.aten_pool import _POOLS
from kernelevolve.synth.tuner.describe import describe
from kernelevolve.synth.tuner.ir import OpGraph, TensorArg

# What maps one graph (`GraphMapper` or a factory with its signature that picks a mapper per graph).
Mapper = Callable[[Any, list[str], list[str]], GraphMapper]
MAX_STAGES = 8
# Graph mappings tried per traced shape before giving up: each candidate cut maps its prefix once.
_BUDGET = 400


def map_graph(
    gm: Any, sources: list[str], forward_args: list[str], shape_name: str, mapper: Mapper = GraphMapper
) -> OpGraph:
    """The traced graph as one OpGraph: a single template's, or a `pipeline` of stages, each graph
    mapped by `mapper`. Raises `Unsupported` with the reason (the whole graph's, or the first stage
    no template covers)."""
    try:
        return mapper(gm, sources, forward_args).build(shape_name)
    except Unsupported as exc:
        whole = exc
    budget = [_BUDGET]
    stages, why = _split(
        mapper, StandIn(gm.graph, gm), sources, forward_args, len(forward_args), shape_name, budget
    )
    if stages is None:
        raise Unsupported(_attention(gm.graph) + (why or str(whole))) from None
    for k, stage in enumerate(stages):
        if k < len(stages) - 1:
            stage.dtype = "float32"  # an intermediate: stored in fp32, whatever the reference's dtype
        stage.tensors = [_fp32_if_intermediate(t, len(forward_args)) for t in stage.tensors]
    last = stages[-1]
    return OpGraph(
        pattern="pipeline",
        tensors=[],
        ops=[],
        outputs=list(last.outputs),
        dtype=last.dtype,
        forward_args=list(forward_args),
        stages=stages,
        rows={shape_name: last.rows.get(shape_name, 0)},
        cols={shape_name: last.cols.get(shape_name, 0)},
    )


def _split(
    mapper: Mapper,
    gm: StandIn,
    sources: list[str],
    args: list[str],
    n_inputs: int,
    shape_name: str,
    budget: list[int],
    depth: int = 0,
) -> tuple[list[OpGraph] | None, str]:
    """The stages of `graph` (its whole output), or None and why not. `args`: the forward arguments
    a stage may read, the reference's and the intermediates so far."""
    if depth + 1 >= MAX_STAGES:
        return None, f"a pipeline has at most {MAX_STAGES} stages"
    graph = gm.graph
    # get_attr nodes are the forward's constants (torch.tensor(c)): free, copied where read.
    nodes = [n for n in graph.nodes if n.op in ("call_function", "get_attr") and n.users]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in graph.nodes if n.op == "output")
    outputs = set(out_node.all_input_nodes)
    ancestors: dict[Any, set[Any]] = {}
    for n in nodes:  # topological order: each node's compute ancestors, itself included
        ancestors[n] = {n}.union(*(ancestors[a] for a in n.all_input_nodes if a in ancestors))
    free: set[Any] = set()  # views of inputs and parameters (and constants): copied where a stage needs them
    for n in nodes:
        if (_is_view(n) or not n.all_input_nodes) and all(
            a in placeholders or a in free for a in n.all_input_nodes
        ):
            free.add(n)
    mains = {n for n in nodes if op_name(n) in _MAIN_OPS}  # a template has one at most: prune cuts
    why = ""
    for cut in reversed(nodes):
        if budget[0] <= 0:
            return None, why or "no cut into templated stages was found within the search budget"
        if cut in outputs or not _float_tensor(cut) or cut in free:
            continue
        prefix = ancestors[cut]
        if len(prefix & mains) > 1:
            continue
        rest = [n for n in nodes if n not in prefix]
        borrowed = {a for n in rest for a in n.all_input_nodes if a in prefix and a is not cut}
        if not rest or borrowed - free or outputs & prefix:
            continue
        budget[0] -= 1
        try:
            head_graph = copy_graph(placeholders, [n for n in nodes if n in prefix], cut)
            head = mapper(StandIn(head_graph, gm), sources, args).build(shape_name)
        except Unsupported:
            continue
        j = len(args) - n_inputs
        mid = f"_mid{j}"
        copied = [n for n in nodes if n in free and any(n in ancestors[b] for b in borrowed)]
        tail = StandIn(copy_graph(placeholders, copied + rest, out_node.args[0], cut), gm)
        tail_sources, tail_args = [*sources, f"input:{len(args)}"], [*args, mid]
        budget[0] -= 1
        later: list[OpGraph] | None
        try:
            later = [mapper(tail, tail_sources, tail_args).build(shape_name)]
        except Unsupported as exc:
            later, sub = _split(
                mapper, tail, tail_sources, tail_args, n_inputs, shape_name, budget, depth + 1
            )
            if later is None:  # the deepest stage's reason, else this tail's own
                limit = f" (and {sub})" if sub.startswith("a pipeline has at most") else ""
                why = why or (
                    sub
                    if sub.startswith("stage ")
                    else f"stage {depth + 2} of the pipeline (after {describe(head)}) is not templated: {exc}{limit}"
                )
                continue
        return [head, *later], ""
    return None, why


_MAIN_OPS = {"convolution", "mm", "addmm", "bmm", *_POOLS}
_MATMULS = {"mm", "addmm", "bmm"}


def _attention(graph: Any) -> str:
    """A refusal's preface where the graph is attention (a softmax of one matmul's result feeding
    another matmul) and still no pipeline was formed (the flash template fuses the pipeline's three
    stages: it needs them); empty otherwise."""
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    after: set[Any] = set()  # nodes computed from a matmul's result
    for n in nodes:
        if op_name(n) in _MATMULS or any(a in after for a in n.all_input_nodes):
            after.add(n)
    for n in nodes:
        if op_name(n) in ("_softmax", "_safe_softmax") and n in after:
            feeds, stack, seen = False, list(n.users), set()
            while stack and not feeds:
                u = stack.pop()
                if u in seen:  # a node reached twice (a value used twice) is walked once
                    continue
                seen.add(u)
                feeds = op_name(u) in _MATMULS
                stack.extend(u.users)
            if feeds:
                return (
                    f"attention (a softmax between two matmuls) is templated only as a pipeline of at "
                    f"most {MAX_STAGES} stages: the scores' batched GEMM (scale and mask in its "
                    "epilogue), their row softmax, then the GEMM with V (or those three fused: "
                    "triton-flash); here no such pipeline was formed: "
                )
    return ""


def _is_view(n: Any) -> bool:
    # (a split's pieces too: views of its input, `aten_mask.split_leaves`)
    return op_name(n).removesuffix("_") in _VIEWS or op_name(n) in {
        *_TRANSPOSES,
        "split_with_sizes",
        "getitem",
    }


def _float_tensor(n: Any) -> bool:
    val = n.meta.get("val")
    return (
        val is not None
        and not isinstance(val, tuple | list)
        and hasattr(val, "shape")
        and len(val.shape) > 0
        and str(val.dtype).removeprefix("torch.") in FLOAT_DTYPES
    )


def _fp32_if_intermediate(t: TensorArg, n_inputs: int) -> TensorArg:
    """An intermediate (a forward argument past the reference's own) is read as the fp32 it is."""
    kind, _, what = t.source.partition(":")
    if kind == "input" and int(what) >= n_inputs:
        return TensorArg(t.name, t.source, t.layout, "float32")
    return t


__all__ = ["MAX_STAGES", "map_graph"]
