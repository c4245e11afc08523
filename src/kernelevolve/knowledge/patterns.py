"""A spec's operator pattern, from the aten ops its reference dispatches on the meta device.

The pattern is a retrieval signal (documents carry it as a trigger) and what warm starts match on
across specs: `attention`, `conv`, `batched-gemm`, `gemm`, `gather`, `bucketize`, `scan`, `row`,
`elementwise`, or "" when the reference cannot run on the meta device (data-dependent shapes). It
costs no device time and no memory: tensors on `meta` have shapes only.
"""

from __future__ import annotations

from typing import Any

from kernelevolve.spec import (
    ShapeSpec,
    Spec,
    call_get_init_inputs,
    call_get_inputs,
    import_spec_module,
    smallest_shape,
)
from kernelevolve.work_memory import aten_name, recurrent_as_shapes

RULES: tuple[tuple[str, frozenset[str]], ...] = (
    ("recurrent", frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})),  # one op each (`work_memory`)
    ("attention", frozenset({"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                             "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                             "_scaled_dot_product_cudnn_attention"})),
    ("conv", frozenset({"convolution", "conv1d", "conv2d", "conv3d", "_convolution", "conv_transpose2d"})),
    ("gather", frozenset({"embedding_bag", "_embedding_bag", "_embedding_bag_forward_only", "embedding", "index_select", "gather", "index",
                          "scatter_add", "index_add", "scatter", "segment_reduce", "_segment_reduce"})),
    ("bucketize", frozenset({"bucketize", "searchsorted"})),
    ("scan", frozenset({"cumsum", "cumprod", "logcumsumexp"})),
)  # fmt: skip
GEMM = frozenset({"mm", "addmm", "matmul", "linear", "bmm", "baddbmm"})
ROW = frozenset({"_softmax", "_safe_softmax", "softmax", "_log_softmax", "log_softmax", "sum", "mean", "amax", "amin", "max",
                 "min", "var", "var_mean", "std", "native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm",
                 "norm", "linalg_vector_norm", "logsumexp", "prod", "argmax", "topk", "sort"})  # fmt: skip


def classify(ops: list[str]) -> str:
    names = set(ops)
    if names & {"bmm", "matmul", "baddbmm"} and names & {"_softmax", "softmax", "_safe_softmax"}:
        return "attention"
    for pattern, members in RULES:
        if names & members:
            return pattern
    if names & GEMM:
        return "batched-gemm" if names & {"bmm", "baddbmm"} else "gemm"
    if names & ROW:
        return "row"
    return "elementwise" if names else ""


def aten_ops(spec: Spec) -> list[str]:
    """The aten op names the reference dispatches at the spec's first shape, on the meta device; where
    the meta device cannot run it (a jagged spec's `get_inputs` needs values), on the CPU at its
    smallest shape."""
    try:
        return _record(spec, "meta", spec.shapes[0])
    except Exception:
        return _record(spec, "cpu", smallest_shape(spec))


def _record(spec: Spec, device: str, shape: ShapeSpec) -> list[str]:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list[str] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def,unused-ignore]
            ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    module = import_spec_module(spec.path)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        inputs = call_get_inputs(spec, module, shape)
        model = module.Model(*call_get_init_inputs(spec, module, shape))

    def recurrent(layer: Any, args: tuple[Any, ...], out: Any) -> None:  # one op, not its steps
        ops.append(aten_name(layer))

    with recurrent_as_shapes(model, recurrent), Recorder(), torch.no_grad():
        model(*inputs)
    return ops


def spec_pattern(spec: Spec) -> str:
    try:
        return classify(aten_ops(spec))
    except Exception:  # a reference that runs nowhere here: no pattern, not an error
        return ""


__all__ = ["aten_ops", "classify", "spec_pattern"]
