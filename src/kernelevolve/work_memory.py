"""The reference's working memory, learned on the meta device: the peak of what its forward makes.

`spec._probe_shape` runs the reference once per shape on meta tensors (no memory, no compute) under
`PeakOfNewTensors`, a dispatch mode that sees every aten op's results and keeps the peak of the bytes
held at once by the storages they made; the memory plan adds it to a worker's need
(`evaluate.memory.worker_need`).

A recurrent layer (`nn.RNNBase`: RNN, LSTM, GRU) given meta tensors is not run: on meta it decomposes
into a few ops per time step and layer whose meta kernels are Python (level 3's 35_LSTM: 512 steps x 6
layers, 15-20 s of this project's CPU and a minute of a GPU host's under a bench's load, per probe,
one problem after another under one interpreter's lock). Its results' shapes follow from its
configuration and its input's shape (`recurrent_meta`), and they are counted as it returns, with its
own working memory estimated (`recurrent_work_bytes`). A loss that is one op on meta but fills an
elementwise tensor before it reduces it (`ELEMENTWISE_LOSSES`: smooth L1, Huber, MSE, ...) counts that
tensor while it runs (`loss_work_bytes`). The knowledge base's recorders of a
reference's aten ops (`knowledge.samples`, `knowledge.patterns`) run it on meta the same way
(`recurrent_as_shapes`): a recurrent layer is one op to them, named after the aten op its forward
calls (`aten.lstm`, `aten.gru`, `aten.rnn_tanh`, `aten.rnn_relu`), not the steps it decomposes into.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any


def recurrent_work_bytes(module: Any, output: Any) -> int:
    """What a recurrent layer holds while it runs, beside its results: per layer and direction the
    gates of every step (4 for an LSTM, 3 for a GRU, 1 for an RNN, each of the hidden size) and the
    layer's output sequence, an upper bound of what an inference kernel (cuDNN's or the CPU's) keeps."""
    import torch

    gates = {"LSTM": 4, "GRU": 3}.get(module.mode, 1)  # RNNBase.mode, a subclass's too
    seq = output[0] if isinstance(output, tuple) else output
    if not isinstance(seq, torch.Tensor):
        return 0
    per_step_out = seq.numel() * seq.element_size()  # batch x seq x directions x hidden
    return per_step_out * (gates + 1)


def recurrent_meta(module: Any, args: tuple[Any, ...]) -> Any:
    """What `module` (an nn.RNN, LSTM or GRU) returns for the meta tensors `args`, as meta tensors of
    the right shapes, without running it; None where its input is not a plain meta tensor (a packed
    sequence, real values)."""
    import torch

    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.device.type != "meta" or x.dim() not in (2, 3):
        return None
    dirs, layers = (2 if module.bidirectional else 1), module.num_layers
    out_size = getattr(module, "proj_size", 0) or module.hidden_size
    output: tuple[int, ...]
    hidden: tuple[int, ...]
    cell: tuple[int, ...]
    if x.dim() == 3:
        seq, batch = (x.shape[1], x.shape[0]) if module.batch_first else (x.shape[0], x.shape[1])
        output = (batch, seq, dirs * out_size) if module.batch_first else (seq, batch, dirs * out_size)
        hidden, cell = (dirs * layers, batch, out_size), (dirs * layers, batch, module.hidden_size)
    else:  # unbatched: [seq, features]
        output = (x.shape[0], dirs * out_size)
        hidden, cell = (dirs * layers, out_size), (dirs * layers, module.hidden_size)

    def empty(shape: tuple[int, ...]) -> Any:
        return torch.empty(shape, dtype=x.dtype, device="meta")

    if isinstance(module, torch.nn.LSTM):
        return empty(output), (empty(hidden), empty(cell))
    return empty(output), empty(hidden)


# Losses that are one aten op on meta but whose CUDA and CPU kernels fill an elementwise loss tensor
# and then reduce it (`apply_loss_reduction`), with the index of their `reduction` argument: that
# tensor is their working memory (level 1's 96_HuberLoss, T = 8 GiB, holds 4 GiB more while its
# smooth_l1_loss runs, which the memory plan missed and its workers ran out of).
ELEMENTWISE_LOSSES = {
    "smooth_l1_loss": 2,
    "huber_loss": 2,
    "mse_loss": 2,
    "soft_margin_loss": 2,
    "binary_cross_entropy": 3,
}


def loss_work_bytes(func: Any, args: Any, kwargs: dict[str, Any]) -> int:
    """The elementwise loss tensor a reducing loss op (`ELEMENTWISE_LOSSES`) holds while it runs, as
    big as its broadcast inputs; 0 for any other op, or with reduction "none" (its output is that)."""
    import torch

    at = ELEMENTWISE_LOSSES.get(getattr(getattr(func, "overloadpacket", None), "__name__", ""))
    if at is None:
        return 0
    reduction = kwargs.get("reduction", args[at] if len(args) > at else 1)  # 1: at::Reduction::Mean
    tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
    if reduction == 0 or not tensors:
        return 0
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    return int(torch.Size(shape).numel()) * tensors[0].element_size()


def _flat(out: Any) -> list[Any]:
    """An LSTM's (output, (h, c)) as [output, h, c]."""
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in _flat(item)]
    return [out]


class PeakOfNewTensors:
    """The peak of bytes held at once by the storages that the ops under it make (a view, an in-place
    op or an `_unsafe_view` shares one, counted once), each counted until the last tensor seen on it
    is freed: the reference forward's working memory on meta (a convolution's output and the product
    of it, say, beside the inputs and parameters)."""

    def __init__(self) -> None:
        self.bytes = 0
        self._live = 0
        self._storages: dict[int, list[int]] = {}  # storage -> [tensors seen on it still alive, its bytes]

    def _freed(self, key: int) -> None:
        entry = self._storages[key]
        entry[0] -= 1
        if entry[0] == 0:
            self._live -= entry[1]
            del self._storages[key]

    def track(self, out: Any, args: Any = (), transient: int = 0) -> None:
        """Count `out`'s tensors whose storage is new (not one of `args`' nor a view), and `transient`
        bytes held only while they were made."""
        import torch

        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage()._cdata
            if key not in self._storages:
                given = {a.untyped_storage()._cdata for a in args if isinstance(a, torch.Tensor)}
                if t._base is not None or key in given:
                    continue  # a view or an alias of what existed before, or an op in place on it
                self._storages[key] = [0, t.untyped_storage().nbytes()]
                self._live += self._storages[key][1]
            self._storages[key][0] += 1
            weakref.finalize(t, self._freed, key)
        self.bytes = max(self.bytes, self._live + transient)

    @contextlib.contextmanager
    def running(self, model: Any) -> Iterator[PeakOfNewTensors]:
        """Track `model`'s forward run inside this context; its recurrent layers run outside the mode."""
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                tracker.track(out, args, transient=loss_work_bytes(func, args, kwargs or {}))
                return out

        def seen(module: Any, args: tuple[Any, ...], out: Any) -> None:
            tracker.track(_flat(out), args, transient=recurrent_work_bytes(module, out))

        with recurrent_as_shapes(model, seen), Mode():
            yield self


def aten_name(module: Any) -> str:
    """The aten op a recurrent layer's forward calls: `RNNBase.mode` (LSTM, GRU, RNN_TANH, RNN_RELU,
    a subclass's too) in lower case."""
    return str(module.mode).lower()


@contextlib.contextmanager
def recurrent_as_shapes(model: Any, seen: Callable[[Any, tuple[Any, ...], Any], None]) -> Iterator[None]:
    """Inside this context each recurrent layer of `model` (an nn.Module), called on meta tensors,
    returns `recurrent_meta`'s results without running, outside the innermost dispatch mode (the
    caller's recorder, entered inside this context); `seen(layer, args, out)` is told of each call.
    Given anything else (real tensors, a packed sequence), a layer runs as it would, also outside that
    mode, and `seen` is told too."""
    import torch
    from torch.utils._python_dispatch import _pop_mode_temporarily

    def outside(module: Any, forward: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            with _pop_mode_temporarily():
                out = recurrent_meta(module, args)
                if out is None:
                    out = forward(*args, **kwargs)
            seen(module, args, out)
            return out

        return run

    modules = model.modules() if isinstance(model, torch.nn.Module) else []
    recurrent = [m for m in modules if isinstance(m, torch.nn.RNNBase)]
    for m in recurrent:
        m.forward = outside(m, m.forward)  # an instance attribute, removed below
    try:
        yield
    finally:
        for m in recurrent:
            del m.forward


__all__ = ["PeakOfNewTensors", "aten_name", "recurrent_as_shapes", "recurrent_work_bytes"]
