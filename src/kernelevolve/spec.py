"""Load, validate and fingerprint specs.

A spec is a Python file in the KernelBench format: a reference `Model(nn.Module)`, `get_inputs()` and
optionally `get_init_inputs()`. A plain KernelBench file is a valid spec. The optional extensions live
in one module-level dict, so they never collide with a file's own names:

    KERNELEVOLVE = {
        "name": "row_softmax",                     # default: the file's stem
        "shapes": {                                # default: one shape, get_inputs() as written
            "serving": {"weight": 0.8, "params": {"rows": 4096, "cols": 4096}},
            "small":   {"weight": 0.2, "params": {"rows": 64, "cols": 512}},
        },
        "precision": "strict_fp32",                # | "tf32" | "low"
        "dtype": "bfloat16",                       # cast floating inputs and parameters
        "tolerance": {"rtol": 1e-3, "atol": 1e-4, "rel_norm": 5e-5},
        "backward": False,                         # True: gradients are checked, fwd+bwd is timed
        "allow_torch_ops": ["aten.cumsum"],        # glue ops allowed in this spec's candidates
        "allow_imports": [],                       # extra modules candidates may import
        "scaled_range": [0.25, 4.0],               # the second input distribution (see evaluate.inputs)
    }

A shape's `params` are passed as keyword arguments to `get_inputs(**params)`, and to
`get_init_inputs` for the names it accepts. A shape may also carry `flops` and `bytes` to override the
roofline's counts.

Loading executes the spec file: specs are the user's own code and are trusted (candidates are not).
Probing runs `get_inputs` and the reference on the `meta` device, so a large spec costs no memory and
no compute here; where the meta device cannot run the reference, the worker checks it on the device.
A `get_inputs` that needs its tensors' values (a jagged batch: lengths drawn at random, values sized
by their sum, `int(lengths.sum())`) cannot run on `meta`: it is run for real on the CPU instead, and
the reference too where the meta device cannot run it and the inputs are not large
(`REAL_PROBE_BYTES`); a `Model` whose constructor needs values (a drop-path schedule read with
`.item()`) is built on the CPU and then moved to meta. `probe_notes` says so per shape (`kernelevolve
spec` shows it).

Every failure is a `SpecError` naming the file; where the spec's own code raised (get_inputs, the
constructor, the reference in a worker: `raised_by_spec`), it names the spec's line, not the torch
frame below it where the error was noticed.

The probe's working-memory count is `work_memory.py`'s. Why one module (over 450 lines): the format,
its validation, the meta-device probe and the
fingerprint all read the same `KERNELEVOLVE` dict and the same `Spec` value; a reader checks what a
spec may say in one place.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from kernelevolve.errors import SpecError
from kernelevolve.work_memory import PeakOfNewTensors

PRECISION_POLICIES = ("strict_fp32", "tf32", "low")
EXTENSION_KEYS = {
    "name": "str: a display name",
    "description": "str: what the spec models",
    "shapes": "dict: name -> {weight, params, flops?, bytes?}",
    "precision": "one of " + ", ".join(PRECISION_POLICIES),
    "dtype": "str: float32 | bfloat16 | float16 | float64",
    "tolerance": "dict: rtol, atol, rel_norm",
    "backward": "bool",
    "allow_torch_ops": "list of aten op names",
    "allow_imports": "list of module names",
    "scaled_range": "[low, high]: scale factors of the second input distribution",
}
DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass
class ShapeSpec:
    name: str
    weight: float  # normalized: the weights of a spec sum to 1
    params: dict[str, Any] = field(default_factory=dict)
    flops: float | None = None
    bytes: float | None = None


@dataclass
class TensorInfo:
    shape: list[int]
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass
class Spec:
    path: Path
    name: str
    source: str
    shapes: list[ShapeSpec]
    precision: str = "strict_fp32"
    dtype: str | None = None
    tolerance: dict[str, float] | None = None
    backward: bool = False
    allow_torch_ops: list[str] = field(default_factory=list)
    allow_imports: list[str] = field(default_factory=list)
    scaled_range: tuple[float, float] = (0.25, 4.0)
    description: str = ""
    # Filled by probing (None where the meta device could not run the reference).
    inputs: dict[str, list[TensorInfo | str]] = field(default_factory=dict)
    outputs: dict[str, list[TensorInfo] | None] = field(default_factory=dict)
    param_bytes: dict[str, int | None] = field(default_factory=dict)
    # The reference's own peak on meta: bytes of the tensors its forward makes and holds at once
    # (intermediates and outputs; not inputs or parameters). None where it was not run on meta.
    work_bytes: dict[str, int | None] = field(default_factory=dict)
    probe_notes: dict[str, str] = field(default_factory=dict)  # shapes not probed on meta alone, and why
    fingerprint: str = ""

    def shape(self, name: str) -> ShapeSpec:
        for s in self.shapes:
            if s.name == name:
                return s
        raise SpecError(f"{self.path}: no shape named {name!r}", hint="shapes: " + ", ".join(self.names))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.shapes]

    def footprint_bytes(self, shape: str) -> int | None:
        """Bytes of inputs, outputs and parameters at one shape, if probing could count them."""
        ins, outs = self.inputs.get(shape), self.outputs.get(shape)
        if ins is None or outs is None or self.param_bytes.get(shape) is None:
            return None
        total = sum(_nbytes(t) for t in ins if isinstance(t, TensorInfo))
        return total + sum(_nbytes(t) for t in outs) + (self.param_bytes[shape] or 0)

    def intermediate_bytes(self, shape: str) -> int:
        """Bytes the reference's forward holds at its peak beyond its outputs (0 if not counted)."""
        return max(0, (self.work_bytes.get(shape) or 0) - (self.output_bytes(shape) or 0))

    def output_bytes(self, shape: str) -> int | None:
        """Bytes of the outputs at one shape, if probing could count them."""
        outs = self.outputs.get(shape)
        return None if outs is None else sum(_nbytes(t) for t in outs)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "fingerprint": self.fingerprint,
            "precision": self.precision,
            "dtype": self.dtype,
            "backward": self.backward,
            "shapes": [
                {
                    "name": s.name,
                    "weight": s.weight,
                    "params": s.params,
                    "inputs": [str(t) for t in self.inputs.get(s.name, [])],
                    "outputs": [str(t) for t in (self.outputs.get(s.name) or [])],
                    **({"probe": self.probe_notes[s.name]} if s.name in self.probe_notes else {}),
                }
                for s in self.shapes
            ],
        }


def _nbytes(t: TensorInfo) -> int:
    import torch

    n = 1
    for d in t.shape:
        n *= d
    dtype = getattr(torch, t.dtype)
    return n * dtype.itemsize


def import_spec_module(path: Path) -> ModuleType:
    """Execute a spec file as a fresh module. Every failure is a `SpecError` naming the file."""
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.py"))
        named = f" (here: {', '.join(found[:5])}{', ...' if len(found) > 5 else ''})" if found else ""
        raise SpecError(
            f"{path} is a directory, not a spec file",
            hint=f"pass one spec .py file in it{named}; `kernelevolve bench {path}` runs every spec of a folder",
        )
    if not path.is_file():
        raise SpecError(f"{path}: no such file", hint="pass the path of a KernelBench-format .py file")
    source = path.read_text()
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise SpecError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    mod_name = f"kernelevolve_spec_{digest}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[mod_name]
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        raise SpecError(
            f"{path}: importing the spec raised {_describe(exc, path)}",
            hint=f"the spec needs the package {missing!r}: install it where kernelevolve runs "
            f"(pip install {missing.split('.')[0]}); its workers import the spec there too"
            if missing
            else None,
        ) from exc
    return module


def _describe(exc: BaseException, spec_path: Path) -> str:
    """`TypeError: ...` and where the spec raised it: the innermost frame in the spec file itself,
    path:line and its code. The frames below it (torch's, where the error was noticed) say less to
    the spec's author than the line that called them; the innermost of those is named too."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [i for i, f in enumerate(frames) if _same_file(f.filename, spec_path)]
    if not mine:
        outside = [f for f in frames if not _same_file(f.filename, _PACKAGE, inside=True)]
        where = f" (at {outside[-1].filename}:{outside[-1].lineno})" if outside else ""
        return f"{type(exc).__name__}: {exc}{where}"
    frame = frames[mine[-1]]
    code = f": {frame.line.strip()}" if frame.line else ""
    where = f" (at {spec_path}:{frame.lineno}{code}"
    if mine[-1] < len(frames) - 1:
        inner = frames[-1]
        where += f"; raised inside {Path(inner.filename).name}:{inner.lineno}"
    return f"{type(exc).__name__}: {exc}{where})"


_PACKAGE = Path(__file__).resolve().parent
_NOT_THE_SPEC = ("out of memory", "cannot allocate memory", "cuda error", "illegal memory access",
                 "cublas_status", "cudnn_status", "hip error", "ecc error")  # fmt: skip


def raised_by_spec(exc: BaseException, spec_path: Path) -> SpecError | None:
    """The SpecError to report for `exc` when the spec's own code raised it (a frame of the spec file
    in its traceback: the reference's forward at a shape, its constructor, get_inputs), naming the
    spec's line; None for anything else (the harness's own failure), for running out of memory,
    which the harness plans around rather than blames on the spec, and for a device's own errors
    (a lost CUDA context, a library's internal failure), which a fresh worker may not meet."""
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or any(sign in text for sign in _NOT_THE_SPEC):
        return None
    if not any(_same_file(f.filename, spec_path) for f in traceback.extract_tb(exc.__traceback__)):
        return None
    return SpecError(f"{spec_path}: the reference raised {_describe(exc, spec_path)}")


def _same_file(filename: str, path: Path, inside: bool = False) -> bool:
    """Whether a traceback's filename is `path` (or, `inside`, a file under the folder `path`)."""
    try:
        resolved = Path(filename).resolve()
        return resolved.is_relative_to(path) if inside else resolved == path.resolve()
    except (OSError, ValueError):
        return False


def load_spec(path: str | Path, probe: bool = True) -> Spec:
    """Load and validate a spec file. `probe` runs it on the meta device to learn its tensors."""
    path = Path(path)
    module = import_spec_module(path)
    source = path.read_text()
    model = getattr(module, "Model", None)
    import torch

    if model is None or not (inspect.isclass(model) and issubclass(model, torch.nn.Module)):
        raise SpecError(
            f"{path}: no reference `Model` class (an nn.Module subclass) is defined",
            hint="a spec defines class Model(nn.Module), get_inputs() and get_init_inputs()",
        )
    if not callable(getattr(module, "get_inputs", None)):
        raise SpecError(
            f"{path}: no `get_inputs()` function", hint="it returns the reference's forward arguments"
        )
    init = getattr(module, "get_init_inputs", None)
    if init is not None and not callable(init):
        raise SpecError(f"{path}: `get_init_inputs` is not a function")
    ext = getattr(module, "KERNELEVOLVE", {}) or {}
    spec = _parse_extensions(path, source, ext)
    if probe:
        for shape in spec.shapes:
            _probe_shape(spec, module, shape)
    spec.fingerprint = fingerprint(spec)
    return spec


def _parse_extensions(path: Path, source: str, ext: Any) -> Spec:
    if not isinstance(ext, dict):
        raise SpecError(f"{path}: KERNELEVOLVE must be a dict, not {type(ext).__name__}")
    unknown = set(ext) - set(EXTENSION_KEYS)
    if unknown:
        valid = "; ".join(f"{k} ({v})" for k, v in EXTENSION_KEYS.items())
        raise SpecError(f"{path}: unknown KERNELEVOLVE keys {sorted(unknown)}", hint=f"valid keys: {valid}")
    precision = ext.get("precision", "strict_fp32")
    if precision not in PRECISION_POLICIES:
        raise SpecError(f"{path}: precision {precision!r} is not one of {', '.join(PRECISION_POLICIES)}")
    dtype = ext.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        raise SpecError(f"{path}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    tol = ext.get("tolerance")
    if tol is not None:
        if not isinstance(tol, dict) or set(tol) - {"rtol", "atol", "rel_norm"}:
            raise SpecError(f"{path}: tolerance must be a dict with keys among rtol, atol, rel_norm")
        tol = {k: float(v) for k, v in tol.items()}
    for key in ("allow_torch_ops", "allow_imports"):
        value = ext.get(key, [])
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise SpecError(f'{path}: {key} must be a list of strings, e.g. ["aten.cumsum"]')
    if not isinstance(ext.get("backward", False), bool):
        raise SpecError(f"{path}: backward must be True or False, not {ext['backward']!r}")
    scaled = ext.get("scaled_range", (0.25, 4.0))
    if not (
        isinstance(scaled, list | tuple) and len(scaled) == 2 and 0 < float(scaled[0]) <= float(scaled[1])
    ):
        raise SpecError(f"{path}: scaled_range must be [low, high] with 0 < low <= high")
    return Spec(
        path=path,
        name=str(ext.get("name") or path.stem),
        source=source,
        shapes=_parse_shapes(path, ext.get("shapes")),
        precision=precision,
        dtype=dtype,
        tolerance=tol,
        backward=bool(ext.get("backward", False)),
        allow_torch_ops=[str(o) for o in ext.get("allow_torch_ops", [])],
        allow_imports=[str(m) for m in ext.get("allow_imports", [])],
        scaled_range=(float(scaled[0]), float(scaled[1])),
        description=str(ext.get("description", "")),
    )


def _parse_shapes(path: Path, shapes: Any) -> list[ShapeSpec]:
    if shapes is None:
        return [ShapeSpec(name="default", weight=1.0)]
    if not isinstance(shapes, dict) or not shapes:
        raise SpecError(f"{path}: KERNELEVOLVE['shapes'] must be a non-empty dict of name -> shape")
    out = []
    for name, entry in shapes.items():
        if not isinstance(entry, dict) or set(entry) - {"weight", "params", "flops", "bytes"}:
            raise SpecError(
                f"{path}: shape {name!r} must be a dict with keys among weight, params, flops, bytes"
            )
        weight = float(entry.get("weight", 1.0))
        if weight <= 0:
            raise SpecError(f"{path}: shape {name!r} has weight {weight}; weights must be positive")
        params = entry.get("params", {})
        if not isinstance(params, dict):
            raise SpecError(f"{path}: shape {name!r}: params must be a dict of keyword arguments")
        out.append(ShapeSpec(str(name), weight, dict(params), entry.get("flops"), entry.get("bytes")))
    total = sum(s.weight for s in out)
    for s in out:
        s.weight /= total
    return out


def call_get_inputs(spec: Spec, module: ModuleType, shape: ShapeSpec) -> list[Any]:
    """get_inputs(**params), checked: a list of tensors and Python scalars."""
    try:
        inputs = module.get_inputs(**shape.params)
    except Exception as exc:
        raise SpecError(
            f"{spec.path}: get_inputs({_kw(shape.params)}) raised {_describe(exc, spec.path)}"
        ) from exc
    import torch

    if not isinstance(inputs, list | tuple):
        raise SpecError(f"{spec.path}: get_inputs() returned {type(inputs).__name__}; it must return a list")
    for i, item in enumerate(inputs):
        if not isinstance(item, torch.Tensor | int | float | bool):
            raise SpecError(
                f"{spec.path}: get_inputs() item {i} is a {type(item).__name__}; "
                "inputs must be tensors or Python scalars"
            )
    if not any(isinstance(x, torch.Tensor) for x in inputs):
        raise SpecError(f"{spec.path}: get_inputs() returned no tensor")
    return list(inputs)


def call_get_init_inputs(spec: Spec, module: ModuleType, shape: ShapeSpec) -> list[Any]:
    fn = getattr(module, "get_init_inputs", None)
    if fn is None:
        return []
    accepted = inspect.signature(fn).parameters
    takes_kw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    kw = {k: v for k, v in shape.params.items() if takes_kw or k in accepted}
    try:
        init = fn(**kw)
    except Exception as exc:
        raise SpecError(f"{spec.path}: get_init_inputs() raised {_describe(exc, spec.path)}") from exc
    if not isinstance(init, list | tuple):
        raise SpecError(
            f"{spec.path}: get_init_inputs() returned {type(init).__name__}; it must return a list"
        )
    return list(init)


def flatten_outputs(spec: Spec, out: Any) -> list[Any]:
    """The reference's outputs as a list of tensors, or a SpecError."""
    import torch

    outs = list(out) if isinstance(out, list | tuple) else [out]
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            raise SpecError(
                f"{spec.path}: Model.forward output {i} is a {type(o).__name__}; "
                "the reference must return a tensor or a tuple of tensors"
            )
    return outs


def smallest_shape(spec: Spec) -> ShapeSpec:
    """The shape with the smallest product of its numeric params: where a reference must run for real
    (a jagged spec, whose inputs the meta device cannot make), the cheapest one to run."""
    import math

    def size(shape: ShapeSpec) -> float:
        nums = [abs(float(v)) for v in shape.params.values() if isinstance(v, int | float) and v]
        return math.prod(nums) if nums else 0.0

    return min(spec.shapes, key=size)


def _kw(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


REAL_PROBE_BYTES = 1 << 30  # a spec probed on the CPU runs its reference there only below this


def _probe_shape(spec: Spec, module: ModuleType, shape: ShapeSpec) -> None:
    """Learn a shape's tensors on the meta device (no memory, no compute), or on the CPU for real
    where `get_inputs` needs values (`_probe_inputs`)."""
    import torch

    inputs = _probe_inputs(spec, module, shape)
    spec.inputs[shape.name] = [
        TensorInfo(
            list(x.shape),
            _dtype_name(x.dtype if spec.dtype is None or not x.is_floating_point() else spec.dtype),
        )
        if isinstance(x, torch.Tensor)
        else repr(x)
        for x in inputs
    ]
    init = call_get_init_inputs(spec, module, shape)
    model = _probe_model(spec, module, shape, init)
    if spec.dtype is not None:
        model = model.to(getattr(torch, spec.dtype))
    spec.param_bytes[shape.name] = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    try:
        with torch.no_grad(), PeakOfNewTensors().running(model) as peak:
            out = model(*[_meta_cast(spec, x) for x in inputs])
        spec.work_bytes[shape.name] = peak.bytes
    except Exception:
        # Data-dependent ops cannot run on meta; the worker checks the outputs on the device.
        out = _real_outputs(spec, module, shape, inputs, init)
        if out is None:
            spec.outputs[shape.name] = None
            return
    outs = flatten_outputs(spec, out)
    spec.outputs[shape.name] = [TensorInfo(list(o.shape), _dtype_name(o.dtype)) for o in outs]


def _probe_inputs(spec: Spec, module: ModuleType, shape: ShapeSpec) -> list[Any]:
    """get_inputs on the meta device; where it needs values there (`Tensor.item() cannot be called on
    meta tensors`), on the CPU for real: the spec is trusted code, and its tensors' sizes are real.
    The caller's random state is left alone; both draws use seed 0."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            with torch.device("meta"):
                return call_get_inputs(spec, module, shape)
        except SpecError as meta_error:
            torch.manual_seed(0)
            with torch.device("cpu"):
                inputs = call_get_inputs(spec, module, shape)  # a real failure is reported from here
            reason = str(meta_error.__cause__ or meta_error).splitlines()[0][:160]
            spec.probe_notes[shape.name] = (
                f"get_inputs cannot run on the meta device ({reason}); its tensors were made on the CPU, "
                "for real"
            )
            return inputs


def _probe_model(spec: Spec, module: ModuleType, shape: ShapeSpec, init: list[Any]) -> Any:
    """The reference model on the meta device; where its constructor needs values there (a drop-path
    schedule read with `.item()`, say), built on the CPU for real and then moved to meta."""
    import torch

    try:
        with torch.device("meta"):
            return module.Model(*init)
    except Exception as meta_exc:
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model = module.Model(*init).to("meta")
        except Exception as exc:
            raise SpecError(
                f"{spec.path}: Model(*get_init_inputs()) raised {_describe(exc, spec.path)}"
            ) from exc
        reason = _describe(meta_exc, spec.path).splitlines()[0][:160]
        note = f"Model(*get_init_inputs()) cannot run on the meta device ({reason}); it was built on the CPU"
        earlier = spec.probe_notes.get(shape.name)
        spec.probe_notes[shape.name] = f"{earlier}; {note}" if earlier else note
        return model


def _real_outputs(
    spec: Spec, module: ModuleType, shape: ShapeSpec, inputs: list[Any], init: list[Any]
) -> Any | None:
    """The reference run on the CPU for its outputs' sizes, where the inputs were made there (a jagged
    spec) and are not large; None otherwise (the worker checks the outputs on the device)."""
    import torch

    if any(isinstance(x, torch.Tensor) and x.is_meta for x in inputs):  # made on meta: not real
        return None
    size = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    if size > REAL_PROBE_BYTES:
        return None
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            model = module.Model(*init)
            if spec.dtype is not None:
                model = model.to(getattr(torch, spec.dtype))
            cast = [x.to(getattr(torch, spec.dtype)) if spec.dtype and isinstance(x, torch.Tensor)
                    and x.is_floating_point() else x for x in inputs]  # fmt: skip
            out = model(*cast)
    except Exception:
        return None
    spec.probe_notes[shape.name] += "; so was the reference, for its outputs"
    return out


def _dtype_name(dtype: Any) -> str:
    """'float32', never 'torch.float32': one spelling in every record."""
    return str(dtype).removeprefix("torch.")


def _meta_cast(spec: Spec, x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        x = x.to("meta")
        if spec.dtype is not None and x.is_floating_point():
            x = x.to(getattr(torch, spec.dtype))
    return x


def fingerprint(spec: Spec) -> str:
    """A stable key over what defines the problem: source, shapes, dtype and policy."""
    source = "\n".join(line.rstrip() for line in spec.source.strip().splitlines())
    payload = {
        "source": source,
        "shapes": [
            {
                "name": s.name,
                "weight": round(s.weight, 9),
                "params": s.params,
                "inputs": [str(t) for t in spec.inputs.get(s.name, [])],
            }
            for s in spec.shapes
        ],
        "precision": spec.precision,
        "dtype": spec.dtype,
        "backward": spec.backward,
        "tolerance": spec.tolerance,
        "allow_torch_ops": sorted(spec.allow_torch_ops),
        "scaled_range": list(spec.scaled_range),
    }
    blob = json.dumps(payload, sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
