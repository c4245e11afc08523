"""A tuner graph's one-line summary, for humans and prompts (`OpGraph.description`): what the trace
(`trace.py`) and the pipeline's cuts (`stages.py`, whose refusals name the stage before) both say."""

from __future__ import annotations

from kernelevolve.synth.tuner.ir import SAME, OpGraph


def describe(g: OpGraph) -> str:
    """A graph's one-line summary, for humans and prompts (a pipeline's: its stages', in order)."""
    if g.pattern == "pipeline":
        return f"pipeline of {len(g.stages)} stages: " + "; then ".join(describe(s) for s in g.stages)
    names = ", ".join(op.op for op in g.ops)
    if g.pattern == "gemm" and g.gemm is not None:
        what = "batched matmul" if g.gemm.batched else "matmul"
        bias = " + bias" if g.gemm.bias else ""
        epi = f", epilogue: {names}" if names else ""
        a_t = ", a transposed" if g.gemm.a_layout == "km" else ""
        return f"{what} (weight layout {g.gemm.b_layout}{a_t}){bias}{epi}"
    if g.pattern == "conv" and g.conv is not None:
        c = g.conv
        groups = f", groups {c.groups}" if c.groups > 1 else ""
        bias = " + bias" if c.bias else ""
        epi = f", epilogue: {names}" if names else ""
        pad = "same" if SAME in c.padding else list(c.padding)
        return f"conv{c.dims}d (stride {list(c.stride)}, padding {pad}, dilation {list(c.dilation)}{groups}){bias}{epi}"
    if g.pattern == "pool" and g.pool is not None:
        q = g.pool
        dilation = f", dilation {list(q.dilation)}" if q.kind == "max" else ""
        epi = f", epilogue: {names}" if names else ""
        return (f"{q.kind} pool{q.x_dims}d (kernel {list(q.kernel)}, stride {list(q.stride)}, "
                f"padding {list(q.padding)}{dilation}){epi}")  # fmt: skip
    if g.pattern == "arg" and g.reduce is not None:
        dims = sorted(g.reduce.reduced)
        return f"index reduction over dims {dims} of a {g.reduce.rank}-d value: {names}"
    if g.pattern == "row" and g.reduce is not None:
        r = g.reduce
        dims = sorted({d - (1 if r.groups > 1 and d >= 2 else 0) for d in r.reduced})
        groups = f", its channels in {r.groups} groups" if r.groups > 1 else ""
        return f"row reduction over dims {dims} of a {r.rank}-d value{groups}: {names}"
    if g.pattern == "row":
        return f"row reduction over the last dim: {names}"
    if g.pattern == "scalar":
        return f"reduction to one value (a loss): {names}"
    if g.pattern == "scan":
        return f"scan along the last dim: {names}"
    return f"elementwise chain: {names}"


__all__ = ["describe"]
