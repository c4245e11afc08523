"""Which of the knowledge base's code samples compute a given spec's reference, so a tuner can start there.

Every shipped sample document names a reference spec and a kernel (`spec: specs/softmax.py`, `kernel:
triton/softmax.py`). A sample applies to a spec when both references compute the same thing with the
same interface. `signature(spec)` captures that without running anything on a device: the reference's
aten ops in dispatch order, each with the arguments that select what it computes (a dim, a flag, a
mode: `embedding_bag` sums or averages), recorded on the meta device, where shapes are all there is;
each input's kind, dtype and rank; the constructor's argument count; the spec's dtype and its backward
flag. Sizes are left out: the sample spec has small test shapes, the spec in hand production ones.
The precision policy is compared apart: a sample written for a stricter policy serves a looser one (a
strict-fp32 kernel is a valid TF32 candidate), never the reverse.

A reference that cannot run on the meta device (data-dependent output sizes: jagged ops) is recorded on
the CPU instead, at the spec's shape with the fewest elements. Equal signatures are a strong hint,
not a proof: the harness still checks the sample against the spec's own reference, and a sample that
fails there is one failed candidate, nothing more.

`applicable_samples(spec, kind)` lists the samples of one kernel kind (`triton`, `c`) whose signature
equals the spec's; the offline tuner offers them beside its generated templates.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelevolve.knowledge.docs import DOCS_DIR, builtin_docs
from kernelevolve.spec import (
    Spec,
    call_get_init_inputs,
    call_get_inputs,
    import_spec_module,
    load_spec,
    smallest_shape,
)
from kernelevolve.work_memory import aten_name, recurrent_as_shapes

Signature = tuple[Any, ...]
_CACHE: dict[tuple[str, str], Signature | None] = {}
STRICTNESS = {"strict_fp32": 2, "tf32": 1, "low": 0}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Sample:
    doc_id: str  # e.g. samples/triton-softmax
    kind: str  # the kernel's kind: the folder it lives in (triton, c)
    kernel: Path
    spec: Path

    @property
    def source(self) -> str:
        return self.kernel.read_text()


def _modes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """An op's arguments that select what it computes rather than how big it is: flags, strings,
    dtypes and small integers (a dim, embedding_bag's mode, a reduction kind). Sizes, scales and
    tensors are left out, so a sample spec at test shapes matches a spec at production shapes."""
    import torch

    def mode(value: Any) -> Any:
        if isinstance(value, bool | str | torch.dtype):
            return value if not isinstance(value, torch.dtype) else str(value)
        if isinstance(value, int) and -2 <= value <= 3:
            return value
        return "*"

    items = [(i, mode(v)) for i, v in enumerate(args)] + [(k, mode(v)) for k, v in sorted(kwargs.items())]
    return tuple(item for item in items if item[1] != "*")


def _record(spec: Spec, device: str) -> Signature:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list[tuple[str, tuple[Any, ...]]] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def,unused-ignore]
            ops.append((func.overloadpacket.__name__, _modes(args, kwargs or {})))
            return func(*args, **(kwargs or {}))

    module = import_spec_module(spec.path)
    shape = spec.shapes[0] if device == "meta" else smallest_shape(spec)
    torch.manual_seed(0)
    with torch.device(device):
        inputs = call_get_inputs(spec, module, shape)
        init = call_get_init_inputs(spec, module, shape)
        model = module.Model(*init)

    def recurrent(layer: Any, args: tuple[Any, ...], out: Any) -> None:  # one op, not its steps
        ops.append((aten_name(layer), _modes((layer.bidirectional, layer.batch_first, layer.bias), {})))

    with recurrent_as_shapes(model, recurrent), Recorder(), torch.no_grad():
        model(*inputs)
    described = tuple(
        ("tensor", str(x.dtype), x.dim()) if isinstance(x, torch.Tensor) else (type(x).__name__,)
        for x in inputs
    )
    return (tuple(ops), described, len(init), spec.dtype, spec.backward)


def signature(spec: Spec) -> Signature | None:
    """The spec's signature (see the module docstring), or None if its reference runs nowhere here."""
    key = (str(spec.path), spec.fingerprint)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    found: Signature | None = None
    for device in ("meta", "cpu"):
        try:
            found = _record(spec, device)
            break
        except Exception:  # meta cannot run data-dependent references; the CPU is the fallback
            continue
    with _LOCK:
        _CACHE[key] = found
    return found


def builtin_samples(kind: str | None = None) -> list[Sample]:
    out = []
    for doc in builtin_docs():
        if doc.category != "sample" or not doc.meta.get("spec") or not doc.meta.get("kernel"):
            continue
        kernel = str(doc.meta["kernel"])
        sample_kind = kernel.split("/", 1)[0]
        if kind is None or sample_kind == kind:
            folder = DOCS_DIR / Path(doc.id).parent
            out.append(Sample(doc.id, sample_kind, folder / kernel, folder / str(doc.meta["spec"])))
    return out


def applicable_samples(spec: Spec, kind: str) -> list[Sample]:
    """The shipped samples of `kind` whose reference has the spec's signature, at a precision policy
    at least as strict as the spec's."""
    mine = signature(spec)
    if mine is None:
        return []
    out = []
    for sample in builtin_samples(kind):
        try:
            theirs_spec = load_spec(sample.spec, probe=False)
            theirs = signature(theirs_spec)
        except Exception:  # a broken sample spec is the tests' business, not a run's
            continue
        if theirs == mine and STRICTNESS[theirs_spec.precision] >= STRICTNESS[spec.precision]:
            out.append(sample)
    return out


__all__ = ["Sample", "applicable_samples", "builtin_samples", "signature"]
