"""What an exported package runs: the dispatch rule and the `ModelNew` class. Needs only torch.

This file is copied verbatim into every package that `kernelevolve.export` writes (as `_runtime.py`),
and `kernelevolve.export` computes the package's keys and guards with the same functions, so the
exporter and the package agree by construction. It must import nothing of kernelevolve: the package
runs where kernelevolve is not installed.

The rule, for one call `model(*args, **kwargs)`:

1. The arguments are bound by the reference `forward`'s signature, defaults applied (`bind_inputs`):
   `model(x=t)` and `model(t)` are the same call. A call the signature refuses runs the reference (which
   raises its own error); so does one with extra `**kwargs` (never measured).
2. Its key (`input_key`): per argument, a tensor's (shape, dtype) or a scalar's (type, repr).
3. The row: the measured shape with exactly that key, else the nearest measured shape of the same
   structure (same argument kinds, tensor ranks and dtypes, equal scalars), by the sum of
   |log(size ratio)| over dimensions; ties go to the spec's order. No row of that structure: reference.
4. A row that the reference won runs the reference: eagerly, or through `torch.compile` where the
   harness measured the compiled reference faster than eager at that shape (a `compiled` row; compiled
   once per model on first use; where compiling fails it warns once and runs eagerly from then on).
   A row that a variant won runs the variant only if
   the variant's guards accept the call (`accepts`), and the reference otherwise. The guards are derived
   from the shapes the variant was verified correct on (one guard per structure):
   - each dimension that took one value on every verified shape is pinned to it (the kernel may have
     it hard-coded);
   - a dimension that varied must lie within the verified [min, max] and be a multiple of the gcd of
     its verified values (tiling and vector widths divide every shape the kernel was checked on);
   - dimensions that were equal to each other on every verified shape must stay equal;
   - only shapes verified with the model's constructor arguments count (as for the rows);
   - tensors verified contiguous must be contiguous; all tensors must be on the exported device type;
   - no autograd: when grad is enabled and an input or a parameter requires grad, the reference runs
     (the harness verified forward values, never a kernel's backward).
   A variant that failed to build or load here (no compiler, no library built for this host) is
   warned about once and its rows run the reference.

Weights: `ModelNew` subclasses the reference `Model`, so its parameters and buffers are the reference's,
under the reference's names (its `state_dict` is the reference's: checkpoints load both ways, and in a
parent model that swapped the layer). Variants are held outside the module tree (not in `state_dict`,
`parameters()` or `named_modules()`), built under a forked RNG, loaded from the model's state (strict)
and then tied to its tensors. The ties are renewed after `.to()`/`.half()`/... (`_apply`) and after
`load_state_dict(..., assign=True)`; a variant whose tensors cannot be tied is dropped (reference).

What it deliberately does not do: it does not time anything or check results at run time; it does
not infer relations between dimensions other than equality (a kernel that needs `n == 4 * d` and was
only verified where that held is trusted on other shapes that keep every guard above; the gcd and
range guards make that rare, not impossible); it does not cast inputs.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn

REFERENCE = "reference"
COMPILED = "compiled"  # the reference, through torch.compile


def input_key(inputs: Sequence[Any], device_type: str | None = None) -> tuple[Any, ...] | None:
    """The dispatch key of one call's inputs: per argument, (shape, dtype) or (type, repr).

    None where a tensor is not on `device_type` (when one is given): such a call uses the reference.
    """
    key: list[tuple[Any, ...]] = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            if device_type is not None and x.device.type != device_type:
                return None
            key.append((tuple(int(d) for d in x.shape), str(x.dtype).removeprefix("torch.")))
        else:
            key.append((type(x).__name__, repr(x)))
    return tuple(key)


def forward_signature(model_class: type[nn.Module]) -> inspect.Signature | None:
    """The reference forward's signature without `self` (None where it cannot be read)."""
    try:
        sig = inspect.signature(model_class.forward)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    return sig.replace(parameters=params[1:]) if params else None


def bind_inputs(
    sig: inspect.Signature | None, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[Any] | None:
    """The call's arguments in the signature's order, defaults applied; None where the signature
    refuses them or extra `**kwargs` were passed (calls the harness never made)."""
    if sig is None:
        return None if kwargs else list(args)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD and bound.arguments.get(p.name):
            return None
    return [*bound.args, *bound.kwargs.values()]


def structure(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """What must match exactly for two keys to be comparable: tensor ranks and dtypes, scalars."""
    return tuple(("tensor", len(a), b) if isinstance(a, tuple) else ("scalar", a, b) for a, b in key)


def derive_guards(verified: Sequence[tuple[tuple[Any, ...], Sequence[bool]]]) -> list[dict[str, Any]]:
    """The guards of one variant from the (key, per-argument contiguity) it was verified correct on:
    one guard per structure (see the module docstring for the rule)."""
    groups: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], Sequence[bool]]]] = {}
    for key, contiguous in verified:
        groups.setdefault(structure(key), []).append((key, contiguous))
    guards = []
    for struct, members in groups.items():
        dims: list[list[tuple[int, int, int]] | None] = []
        columns: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for i, (a, _) in enumerate(members[0][0]):
            if not isinstance(a, tuple):
                dims.append(None)
                continue
            arg_dims = []
            for d in range(len(a)):
                values = [key[i][0][d] for key, _ in members]
                lo, hi = min(values), max(values)
                multiple = lo if lo == hi else math.gcd(*values)
                arg_dims.append((lo, hi, max(multiple, 1)))
                columns.setdefault(tuple(values), []).append((i, d))
            dims.append(arg_dims)
        equal = [group for values, group in columns.items() if len(group) > 1 and len(set(values)) > 1]
        contiguous = [all(c[i] for _, c in members) for i in range(len(struct))]
        guards.append({"structure": struct, "dims": dims, "equal": equal, "contiguous": contiguous})
    return guards


def accepts(guards: Sequence[dict[str, Any]], key: tuple[Any, ...], inputs: Sequence[Any]) -> bool:
    """Whether a variant's guards accept a call's key (and its tensors' layout)."""
    struct = structure(key)
    for guard in guards:
        if tuple(guard["structure"]) != struct:
            continue
        ok = True
        for i, arg_dims in enumerate(guard["dims"]):
            if arg_dims is None:
                continue
            for size, (lo, hi, multiple) in zip(key[i][0], arg_dims, strict=True):
                if not (lo <= size <= hi and size % multiple == 0):
                    ok = False
            if guard["contiguous"][i] and not inputs[i].is_contiguous():
                ok = False
        for group in guard["equal"]:
            if len({key[i][0][d] for i, d in group}) > 1:
                ok = False
        if ok:
            return True
    return False


def _distance(a: tuple[Any, ...], b: tuple[Any, ...]) -> float:
    total = 0.0
    for (sa, _), (sb, _) in zip(a, b, strict=True):
        if isinstance(sa, tuple):
            total += sum(abs(math.log1p(x) - math.log1p(y)) for x, y in zip(sa, sb, strict=True))
    return total


def nearest_row(rows: Sequence[dict[str, Any]], key: tuple[Any, ...]) -> dict[str, Any] | None:
    """The row measured at `key`, else the nearest row of the same structure (first on a tie)."""
    best, best_d = None, math.inf
    struct = structure(key)
    for row in rows:
        if row["key"] == key:
            return row
        if structure(row["key"]) == struct and (d := _distance(row["key"], key)) < best_d:
            best, best_d = row, d
    return best


def route(
    rows: Sequence[dict[str, Any]],
    variants: dict[str, Any],
    flat: list[Any] | None,
    device_type: str | None,
) -> dict[str, Any] | None:
    """The row whose variant (or compiled reference) runs these (bound) inputs, or None for the
    reference run eagerly (no autograd check). `variants` maps the variants available to their
    metadata (with "guards"). A compiled row needs no guard: torch.compile computes the reference at
    any shape, as the reference does."""
    key = input_key(flat, device_type) if flat is not None else None
    row = nearest_row(rows, key) if key is not None else None
    if row is not None and row["target"] == COMPILED:
        return row
    if row is None or row["target"] not in variants:
        return None
    assert key is not None and flat is not None
    return row if accepts(variants[row["target"]]["guards"], key, flat) else None


def _tie(model: nn.Module, variant: nn.Module, name: str, load: bool) -> None:
    """Share the model's parameters and buffers with the variant (after a strict load, at build)."""
    if load:
        try:
            variant.load_state_dict(model.state_dict(), strict=True)
        except RuntimeError as exc:
            raise RuntimeError(f"{name} does not have the reference's parameters and buffers: {exc}") from exc
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    for kind, named, source in (
        ("_parameters", variant.named_parameters(remove_duplicate=False), params),
        ("_buffers", variant.named_buffers(remove_duplicate=False), buffers),
    ):
        for tname, t in list(named):
            src = source.get(tname)
            if src is None:
                continue  # the variant's own (a non-persistent buffer): moved by _apply, not shared
            if (src.shape, src.dtype, src.device) != (t.shape, t.dtype, t.device):
                raise RuntimeError(f"{name}: {tname} cannot be tied to the reference's tensor")
            owner, _, leaf = tname.rpartition(".")
            getattr(variant.get_submodule(owner), kind)[leaf] = src


def _retie_hook(module: nn.Module, _incompatible_keys: Any) -> None:
    """After `load_state_dict` (a module-level function: a model with this hook still pickles)."""
    module._kernelevolve_retie()  # type: ignore[operator]


def _held(module: nn.Module) -> dict[str, nn.Module]:
    # .get: the reference's own __init__ may call .to() or .eval() before the variants exist
    held: dict[str, nn.Module] = module.__dict__.get("_kernelevolve_variants", {})
    return held


def make_model_class(
    base: type[nn.Module],
    package: str,
    rows: Sequence[dict[str, Any]],
    variants: dict[str, dict[str, Any]],
    device_type: str | None,
) -> type[nn.Module]:
    """`ModelNew`: a subclass of the reference `base` that runs the variants where the rule allows."""
    sig = forward_signature(base)
    base_init: Callable[..., None] = base.__init__

    def bound_init(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        try:
            bound = inspect.signature(base).bind(*args, **kwargs)
        except (TypeError, ValueError):
            return None
        bound.apply_defaults()
        return dict(bound.arguments)

    class ModelNew(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            base_init(self, *args, **kwargs)
            mine = bound_init(args, kwargs)
            # A row measured with other constructor arguments does not describe this model.
            my_rows = [r for r in rows if r["init"] is None or bound_init(r["init"], {}) == mine]
            # ...nor do guards derived from shapes verified with other constructor arguments.
            guards = {
                name: {
                    "guards": [
                        g
                        for g in meta["guards"]
                        if g.get("init") is None or bound_init(g["init"], {}) == mine
                    ]
                }
                for name, meta in variants.items()
            }
            built: dict[str, nn.Module] = {}
            needed = sorted({r["target"] for r in my_rows if r["target"] in variants})
            with torch.random.fork_rng(devices=[]):  # the variants' init is overwritten; keep the RNG
                for name in needed:
                    try:
                        module = importlib.import_module(f"{package}.{name}")
                        variant = module.ModelNew(*args, **kwargs)
                        _tie(self, variant, name, load=True)
                    except Exception as exc:  # no compiler, no library for this host, other weights
                        warnings.warn(f"{package}: {name} is not used (the reference runs instead): "
                                      f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)  # fmt: skip
                        continue
                    built[name] = variant
            # Plain attributes, outside the module tree: not in state_dict(), parameters(), modules().
            self.__dict__["_kernelevolve_rows"] = my_rows
            self.__dict__["_kernelevolve_variants"] = built
            self.__dict__["_kernelevolve_guards"] = guards
            self.__dict__["_kernelevolve_cache"] = {}  # (key, layout) -> row or None
            self.__dict__["_kernelevolve_compiled"] = None  # the reference through torch.compile, once used
            self.register_load_state_dict_post_hook(_retie_hook)

        @property
        def kernelevolve_variants(self) -> dict[str, nn.Module]:
            """The variants this model built, by module name (read-only use)."""
            return dict(_held(self))

        def _kernelevolve_retie(self) -> None:
            variants = _held(self)
            self.__dict__.get("_kernelevolve_cache", {}).clear()  # a variant may be dropped below
            for name, variant in list(variants.items()):
                try:
                    _tie(self, variant, name, load=False)
                except RuntimeError as exc:
                    warnings.warn(
                        f"{package}: {exc}; the reference runs instead", RuntimeWarning, stacklevel=3
                    )
                    del variants[name]

        def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
            super()._apply(fn, recurse)
            for variant in _held(self).values():
                variant._apply(fn, recurse)  # its own tensors; tied ones were converted already
            self._kernelevolve_retie()
            return self

        def train(self, mode: bool = True) -> Any:
            super().train(mode)
            for variant in _held(self).values():
                variant.train(mode)
            return self

        def __getstate__(self) -> dict[str, Any]:
            """Pickled (torch.save of the whole model, deepcopy) without its compiled reference, which is
            made again on first use."""
            state = super().__getstate__()  # the reference's own, if it has one
            if isinstance(state, dict) and state.get("_kernelevolve_compiled") not in (None, False):
                state = {**state, "_kernelevolve_compiled": None}
            return state

        def _kernelevolve_run_compiled(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
            """The reference through torch.compile (made on first use); eager where it cannot compile."""
            compiled = self.__dict__.get("_kernelevolve_compiled")
            if compiled is False:  # compiling failed once: eager from then on
                return base.forward(self, *args, **kwargs)
            if compiled is None:
                compiled = torch.compile(functools.partial(base.forward, self))
                self.__dict__["_kernelevolve_compiled"] = compiled
            try:
                return compiled(*args, **kwargs)
            except Exception as exc:  # no compiler here, an unsupported op: the reference, as measured
                self.__dict__["_kernelevolve_compiled"] = False
                warnings.warn(f"{package}: torch.compile of the reference failed, it runs eagerly instead: "
                              f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=3)  # fmt: skip
                return base.forward(self, *args, **kwargs)

        def choose(self, *args: Any, **kwargs: Any) -> str:
            """What runs this call in this model: "reference", "compiled" or a variant's name."""
            row = self._kernelevolve_route(args, kwargs)[0]
            return REFERENCE if row is None else str(row["target"])

        def _kernelevolve_route(
            self, args: Sequence[Any], kwargs: dict[str, Any]
        ) -> tuple[dict[str, Any] | None, list[Any]]:
            flat = bind_inputs(sig, args, kwargs)
            row = None
            if flat is not None:
                # The decision depends on the key and the layout only: cached (a call costs a lookup).
                key = input_key(flat, device_type)
                layout = tuple(x.is_contiguous() for x in flat if isinstance(x, torch.Tensor))
                cache = self.__dict__["_kernelevolve_cache"]
                if (key, layout) in cache:
                    row = cache[key, layout]
                else:
                    guards = self.__dict__["_kernelevolve_guards"]
                    meta = {name: guards[name] for name in _held(self)}
                    row = route(self.__dict__["_kernelevolve_rows"], meta, flat, device_type)
                    if len(cache) >= 4096:
                        cache.clear()
                    cache[key, layout] = row
            if row is not None and row["target"] != COMPILED and torch.is_grad_enabled():
                tensors = [x for x in flat or () if isinstance(x, torch.Tensor)]
                if any(t.requires_grad for t in tensors) or any(p.requires_grad for p in self.parameters()):
                    row = None  # the kernel's backward was never verified
            return row, flat or []

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            row, flat = self._kernelevolve_route(args, kwargs)
            if row is not None and row["target"] == COMPILED:
                return self._kernelevolve_run_compiled(args, kwargs)
            if row is None:
                return super().forward(*args, **kwargs)
            # The harness called the variant with get_inputs()'s positional list; the bound arguments
            # past it are defaults equal to the measured ones (the key includes them).
            return _held(self)[row["target"]](*flat[: row["n_args"]])

    ModelNew.__module__ = package
    ModelNew.__qualname__ = ModelNew.__name__ = "ModelNew"
    ModelNew.__doc__ = (
        f"The reference `{base.__name__}` with kernels where they won (see {package}'s docstring)."
    )
    return ModelNew
