"""Runtime guards: what the worker watches while a candidate runs in its process.

The static guards (`guards.py`) read the source; these watch behaviour, and they are the authority:
- `OpRecorder` records every aten op the candidate's `forward` dispatches (Python, C++ extensions and
  autograd alike). Ops outside the glue allowlist mean the candidate computes through torch.
- `LaunchCounter` counts Triton launches (compiled or interpreted) and `kernelevolve.native` calls:
  a candidate that launches no kernel of its own is not a kernel.
- `Integrity` snapshots the harness's world before the candidate is imported (the attributes of torch,
  its Tensor and Module classes, the CUDA event and stream classes, triton's launcher, time, the
  harness's modules, builtins) and the global numeric flags (TF32, cuDNN, matmul precision, default
  dtype, thread count). Any replaced or deleted attribute, or any changed flag, is a violation.
- `new_threads` lists Python threads that appeared during a call and are still alive after it.

Threat model: these run in the same process as the candidate, so a candidate with native code could
in principle undo them; the static guards refuse the modules needed to reach them from Python
(`sys`, `gc`, `ctypes`, dunders), and results that are implausible are flagged `suspicious` anyway.
"""

from __future__ import annotations

import sys
import threading
import types
from collections import Counter
from typing import Any

from kernelevolve.evaluate.verdict import Violation

# aten ops (overload packet names) that are glue: allocation, views, copies, metadata, scalars.
GLUE_OPS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
        "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full",
        "zero_", "fill_", "scalar_tensor", "arange", "lift_fresh", "lift_fresh_copy", "view",
        "_unsafe_view", "reshape", "as_strided", "t", "transpose", "permute", "expand", "squeeze",
        "unsqueeze", "select", "slice", "narrow", "alias", "detach", "split", "split_with_sizes",
        "unbind", "chunk", "view_as_real", "view_as_complex", "unflatten", "flatten", "contiguous",
        "clone", "copy_", "_to_copy", "to", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
        "is_contiguous", "stride", "size", "numel", "dim", "_local_scalar_dense", "_has_compatible_shallow_copy_type",
        "resize_", "set_", "record_stream", "is_same_size", "is_pinned", "_reshape_alias", "unsafe_split",
        "expand_as", "view_as", "as_strided_", "_conj", "resolve_conj", "resolve_neg", "result_type",
    }
)  # fmt: skip


class OpRecorder:
    """Context manager: records aten ops dispatched inside it (a TorchDispatchMode)."""

    def __init__(self, extra_allowed: set[str] | None = None):
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        self.ops: Counter[str] = Counter()
        self.allowed = GLUE_OPS | {op.removeprefix("aten.").split(".")[0] for op in (extra_allowed or set())}

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                ns = getattr(func, "namespace", "aten")
                recorder.ops[f"{ns}.{func.overloadpacket.__name__}"] = (
                    recorder.ops[f"{ns}.{func.overloadpacket.__name__}"] + 1
                )
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()

    def __enter__(self) -> OpRecorder:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def compute_ops(self) -> dict[str, int]:
        return {
            op: n
            for op, n in sorted(self.ops.items())
            if not (op.startswith("aten.") and op[len("aten.") :] in self.allowed)
            and not op.startswith("prim.")
        }

    def violation(self) -> Violation | None:
        compute = self.compute_ops()
        if not compute:
            return None
        listed = ", ".join(f"{op} x{n}" for op, n in list(compute.items())[:8])
        return Violation(
            "torch-compute",
            f"forward computed through torch ({listed}); a candidate launches its own kernels "
            "(allowed torch ops are allocation, views and copies; a spec may allow more with allow_torch_ops)",
        )


class LaunchCounter:
    """Counts kernel launches of this process: Triton (compiled or interpreted) and native calls."""

    def __init__(self) -> None:
        self.triton = 0
        self._installed = False

    def install(self) -> None:
        """Wrap triton's launchers. Done by the harness before any candidate is imported."""
        if self._installed:
            return
        self._installed = True
        try:
            from triton.runtime import jit
        except Exception:  # triton absent: no triton candidates can run anyway
            return
        counter = self
        targets: list[Any] = [jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            targets.append(InterpretedFunction)
        except Exception:
            pass
        for cls in targets:
            original = cls.run

            def run(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                if not kwargs.get("warmup", False):
                    counter.triton += 1
                return _original(self, *args, **kwargs)

            cls.run = run

    def total(self) -> int:
        from kernelevolve import native

        return self.triton + native.launch_count()


def global_flags() -> dict[str, Any]:
    """Every global setting that changes numerics or speed of torch code."""
    import torch

    flags: dict[str, Any] = {
        "default_dtype": str(torch.get_default_dtype()),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "num_threads": torch.get_num_threads(),
        "cudnn.enabled": torch.backends.cudnn.enabled,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
    }
    if torch.cuda.is_available():
        m = torch.backends.cuda.matmul
        flags["cuda.matmul.allow_tf32"] = m.allow_tf32
        flags["cuda.matmul.allow_fp16_reduced"] = m.allow_fp16_reduced_precision_reduction
        flags["cuda.matmul.allow_bf16_reduced"] = m.allow_bf16_reduced_precision_reduction
    return flags


def _watched_namespaces() -> dict[str, Any]:
    import builtins
    import time

    import torch

    spaces: dict[str, Any] = {
        "builtins": builtins,
        "time": time,
        "torch": torch,
        "torch.Tensor": torch.Tensor,
        "torch.nn.Module": torch.nn.Module,
        "torch.nn.functional": torch.nn.functional,
        "torch.cuda": torch.cuda,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Stream": torch.cuda.Stream,
        "torch.cuda.CUDAGraph": torch.cuda.CUDAGraph,
        "torch.autograd": torch.autograd,
    }
    try:
        import triton.runtime.jit as tjit

        spaces["triton.runtime.jit.JITFunction"] = tjit.JITFunction
        spaces["triton.runtime.jit"] = tjit
    except Exception:
        pass
    for name, mod in list(sys.modules.items()):
        if name.startswith("kernelevolve") and mod is not None:
            spaces[name] = mod
    return spaces


class Integrity:
    """Snapshot of the harness's world; `check()` lists what changed since."""

    def __init__(self) -> None:
        self.spaces = _watched_namespaces()
        # Only code and classes: data attributes (counters, caches) legitimately change.
        self.ids = {
            name: {k: id(v) for k, v in vars(ns).items() if _is_code(v)} for name, ns in self.spaces.items()
        }
        self.flags = global_flags()

    def check(self) -> list[Violation]:
        out: list[Violation] = []
        for name, ns in self.spaces.items():
            now = vars(ns)
            changed = [k for k, i in self.ids[name].items() if k not in now or id(now[k]) != i]
            if changed:
                shown = ", ".join(f"{name}.{k}" for k in changed[:5])
                out.append(Violation("patching", f"the candidate replaced or deleted {shown}"))
        flags = global_flags()
        moved = {k: (v, flags.get(k)) for k, v in self.flags.items() if flags.get(k) != v}
        if moved:
            shown = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in moved.items())
            out.append(Violation("global-flags", f"the candidate changed global settings ({shown})"))
        return out


def _is_code(value: Any) -> bool:
    return callable(value) or isinstance(value, types.ModuleType | property | staticmethod | classmethod)


Threads = set[object]  # Thread objects, and the idents of threads that threading does not know


def python_threads() -> Threads:
    """Every running thread with a Python frame: its `Thread` object where threading knows it, else
    (a thread started through `_thread`) its ident. Not idents alone: an ended thread's ident is
    given to the next thread at once (glibc reuses its stack), so a candidate's late thread could
    pass for one that was running before, the first call's own late thread say."""
    known = {t for t in threading.enumerate() if t.ident is not None}
    idents = {t.ident for t in known}
    return known | {i for i in sys._current_frames() if i not in idents}


def new_threads(before: Threads) -> list[int]:
    """The idents of the threads running now that were not running at `before`."""
    out = []
    for t in python_threads() - before:
        ident = t.ident if isinstance(t, threading.Thread) else t
        if isinstance(ident, int):
            out.append(ident)
    return sorted(out)
