"""A spec written from a tritonbench operator (github.com/meta-pytorch/tritonbench).

tritonbench describes an operator as a `BenchmarkOperator` subclass (`tritonbench/operators/<name>/`):
its implementations are methods registered with `@register_benchmark(...)` (one of them with
`baseline=True`), each taking one example's arguments and returning a zero-argument callable that
runs it; `get_input_iter()` yields the examples (a tuple of arguments, or a dict of keyword
arguments), made on `self.device` in `self.dtype`. `load_opbench_by_name(name)` finds the class, and
it is built from the arguments of tritonbench's own parser (`tritonbench.utils.parser.get_parser`).

`write_spec(operator, out_path, inputs=N)` writes a self-contained KernelBench-format spec from one:

- `Model(case)` calls the baseline benchmark (or the one named by `baseline=`) on its inputs and
  runs the callable it returns; the operator is built in forward mode, on the device the inputs
  are on, once per device and process;
- `get_inputs(case=i)` draws the i-th example of the operator's input iterator, fresh at every
  call, on the device the harness makes inputs on: the harness's seeds change its contents;
- `KERNELEVOLVE["shapes"]` has one shape per example drawn (the first N of the iterator), named
  after its tensors' sizes (`4096x256`), so that every case is checked and timed.

Arguments of an example that are neither tensors nor Python scalars (a weight's shape as a tuple,
None, a string, a dtype) are not inputs: they are written into the spec as constants of the case
and passed to the benchmark as drawn. Tensors drawn with `requires_grad` are detached (forward
mode). The examples are drawn here on the meta device (no memory), or on the CPU where the
operator's iterator needs values.

Building a tritonbench operator seeds every random generator and replaces `torch.manual_seed` by
one that always uses tritonbench's seed (`utils/env_utils.set_random_seed`); the spec builds it
with the caller's random state and `torch.manual_seed` restored, so the harness's seeds still
count. The spec imports tritonbench when it runs (as KernelBench's level 3 files import einops):
it is never a dependency of kernelevolve, and this module imports it only inside `write_spec`.

Not supported yet: backward and fwd_bwd modes (`--bwd`, a benchmark's `get_bwd_fn`), operators
of tritonbench's aten operator loader (`tritonbench.operator_loader`), examples that hold lists
of tensors (grouped GEMMs), and tritonbench's own input loaders (`--input-loader`).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import json
import re
import shlex
import subprocess
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from kernelevolve.errors import KernelevolveError, SpecError
from kernelevolve.spec import import_spec_module

INSTALL_HINT = (
    "pip install tritonbench (or: git clone https://github.com/meta-pytorch/tritonbench and put the "
    "clone on PYTHONPATH); the spec imports it where kernelevolve and its workers run"
)
DEFAULT_INPUTS = 4
_NOT_FORWARD = {"--bwd", "--fwd-bwd", "--fwd_bwd", "--mode", "--input-loader"}


def write_spec(
    operator: str,
    out_path: str | Path,
    inputs: int = DEFAULT_INPUTS,
    baseline: str | None = None,
    tb_args: Sequence[str] = (),
    overwrite: bool = False,
) -> Path:
    """Write a spec for tritonbench's `operator` at `out_path` and return the path. `inputs`: how many
    examples of its input iterator become shapes (fewer where it has fewer); `baseline`: the
    benchmark the reference calls (default: the one registered with baseline=True); `tb_args`:
    extra arguments for tritonbench's parser and the operator's own (`--precision bf16`);
    `overwrite`: replace an existing file at `out_path` (else refused)."""
    out_path = Path(out_path)
    if out_path.exists() and not overwrite:
        raise KernelevolveError(f"{out_path} exists", hint="pass --force to overwrite it, or another --out")
    if inputs < 1:
        raise KernelevolveError(f"inputs must be at least 1, not {inputs}")
    refused = [a for a in tb_args if a.split("=")[0] in _NOT_FORWARD]
    if refused:
        raise KernelevolveError(
            f"tritonbench arguments {refused} are not supported: the spec runs the operator forward, "
            "with its own input iterator",
            hint="backward mode is not supported yet; drop these arguments",
        )
    ops, triton_op = _import_tritonbench()
    cls = _load_operator(ops, operator)
    name = str(getattr(cls, "name", operator))
    chosen = _baseline(triton_op, name, baseline)
    header: dict[str, Any] = dict(operator=name, baseline=chosen, tb_args=list(tb_args), origin=_origin(ops))
    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / f"{out_path.stem}.py"
        draft.write_text(render(**header, cases=[], shapes={}))
        examples = _draw(import_spec_module(draft), name, inputs)
    cases: list[dict[str, Any]] = []
    shapes: dict[str, Any] = {}
    for i, example in enumerate(examples):
        layout, tensors = _layout(name, i, example)
        cases.append(layout)
        shapes[_unique(shape_name(tensors), shapes, i)] = {"weight": 1.0, "params": {"case": i}}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render(**header, cases=cases, shapes=shapes, low=_is_low(examples)))
    return out_path


def _import_tritonbench() -> tuple[ModuleType, ModuleType]:
    try:
        ops = importlib.import_module("tritonbench.operators")
        triton_op = importlib.import_module("tritonbench.utils.triton_op")
        importlib.import_module("tritonbench.utils.parser")
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        if missing.split(".")[0] == "tritonbench":
            raise KernelevolveError(f"tritonbench is not importable here ({exc})", hint=INSTALL_HINT) from exc
        raise KernelevolveError(
            f"importing tritonbench failed: it needs {missing!r} ({exc})",
            hint=f"install tritonbench's requirements (pip install {missing.split('.')[0]})",
        ) from exc
    except Exception as exc:
        raise KernelevolveError(f"importing tritonbench raised {type(exc).__name__}: {exc}") from exc
    return ops, triton_op


def _load_operator(ops: ModuleType, operator: str) -> Any:
    known = list(ops.list_operators())
    if operator.lower() not in {k.lower() for k in known}:
        close = difflib.get_close_matches(operator, known, n=3)
        close += [k for k in known if operator.lower() in k.lower() and k not in close]  # "attention"
        raise KernelevolveError(
            f"tritonbench has no operator {operator!r}",
            hint=(f"did you mean {', '.join(close[:5])}? " if close else "")
            + f"its {len(known)} operators: {', '.join(sorted(known)[:40])}{', ...' if len(known) > 40 else ''}",
        )
    try:
        cls = ops.load_opbench_by_name(operator)
    except ModuleNotFoundError as exc:
        raise KernelevolveError(
            f"tritonbench's operator {operator!r} needs {exc.name!r}, which is not installed ({exc})",
            hint=f"install it (pip install {(exc.name or '?').split('.')[0]}), or pick another operator",
        ) from exc
    except Exception as exc:
        raise KernelevolveError(
            f"loading tritonbench's operator {operator!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    if cls is None:  # the loader's answer for a module without an `Operator` class
        raise KernelevolveError(f"tritonbench's operator {operator!r} defines no Operator class")
    return cls


def _baseline(triton_op: ModuleType, name: str, wanted: str | None) -> str:
    registered = dict(triton_op.REGISTERED_BENCHMARKS.get(name, {}))
    listed = ", ".join(registered) or "none"
    if wanted is not None:
        if wanted not in registered:
            raise KernelevolveError(
                f"tritonbench's operator {name!r} has no benchmark {wanted!r}",
                hint=f"its registered benchmarks: {listed}",
            )
        chosen = wanted
    else:
        found = triton_op.BASELINE_BENCHMARKS.get(name)
        if found is None:
            raise KernelevolveError(
                f"tritonbench's operator {name!r} registers no baseline benchmark (baseline=True)",
                hint=f"pick the reference with --baseline NAME; its registered benchmarks: {listed}",
            )
        chosen = str(found)
    if not getattr(registered.get(chosen), "enabled", True):
        enabled = ", ".join(k for k, v in registered.items() if getattr(v, "enabled", True))
        raise KernelevolveError(
            f"tritonbench's benchmark {name}.{chosen} is disabled here (an optional dependency missing?)",
            hint=f"pick another with --baseline NAME: {enabled or 'none is enabled'}",
        )
    return chosen


def _draw(module: ModuleType, name: str, n: int) -> list[Any]:
    """The first `n` examples, drawn by the spec's own code: on meta, else for real on the CPU."""
    try:
        examples = module._examples(n, "meta")
    except Exception:
        try:
            examples = module._examples(n, "cpu")
        except Exception as exc:
            raise SpecError(
                f"tritonbench's operator {name!r}: drawing its inputs raised {type(exc).__name__}: {exc}"
                + _where(exc),
                hint="it may need a GPU (build the spec where one is) or operator arguments (--tb-args)",
            ) from exc
    if not examples:
        raise SpecError(f"tritonbench's operator {name!r}: its input iterator yields no example")
    return list(examples)


def _where(exc: BaseException) -> str:
    """` (at file:line)`: the innermost frame, the operator's own code more often than not."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _layout(name: str, case: int, example: Any) -> tuple[dict[str, Any], list[Any]]:
    """Which arguments of an example are inputs and which are constants; and its tensors."""
    import torch

    if isinstance(example, dict):
        keys: list[str] | None = [str(k) for k in example]
        items: list[tuple[Any, Any]] = list(example.items())
    elif isinstance(example, list | tuple):
        keys, items = None, list(enumerate(example))
    else:
        raise SpecError(
            f"tritonbench's operator {name!r}: example {case} is a {type(example).__name__}; "
            "the adapter reads a tuple of arguments or a dict of keyword arguments"
        )
    constants, tensors = {}, []
    for key, value in items:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif not isinstance(value, int | float | bool):
            if not _literal(value):
                raise SpecError(
                    f"tritonbench's operator {name!r}: argument {key!r} of example {case} is a "
                    f"{type(value).__name__}, neither a tensor, a Python scalar nor a literal constant",
                    hint="the adapter does not support such operators yet (lists of tensors, objects)",
                )
            constants[key] = value
    return {"keys": keys, "constants": constants}, tensors


def _literal(value: Any) -> bool:
    """Whether `value` is written back as itself by repr: None, str, a dtype, tuples and lists of them."""
    import torch

    if value is None or isinstance(value, str | int | float | bool | torch.dtype):
        return True
    return isinstance(value, list | tuple) and all(_literal(v) for v in value)


def shape_name(tensors: list[Any]) -> str:
    """`4096x256` for one tensor; the distinct sizes in order for several (`4096x1024_1024`)."""
    sizes: list[str] = []
    for t in tensors:
        text = "x".join(str(d) for d in t.shape) or "scalar"
        if text not in sizes:
            sizes.append(text)
    name = "_".join(sizes) or "case"
    return name if len(name) <= 60 else name[:60]


def _unique(name: str, taken: dict[str, Any], case: int) -> str:
    return name if name not in taken else f"{name}_case{case}"


def _is_low(examples: list[Any]) -> bool:
    """Whether the operator draws 16-bit floating tensors: the spec's precision is then `low`."""
    import torch

    def values(example: Any) -> list[Any]:
        return list(example.values()) if isinstance(example, dict) else list(example)

    return any(
        isinstance(v, torch.Tensor) and v.dtype in (torch.float16, torch.bfloat16)
        for e in examples
        for v in values(e)
    )


def _origin(ops: ModuleType) -> str:
    """tritonbench's version and, for a git checkout, its commit; what is known of them."""
    parts = []
    try:
        parts.append(importlib.metadata.version("tritonbench"))
    except importlib.metadata.PackageNotFoundError:
        pass
    root = Path(ops.__file__ or ".").resolve().parent.parent.parent
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5, check=False)  # fmt: skip
        if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", done.stdout.strip()):
            parts.append(f"commit {done.stdout.strip()[:12]}")
    except (OSError, subprocess.SubprocessError):
        pass
    return ", ".join(parts) or "version unknown"


def parse_tb_args(text: str | None) -> list[str]:
    """`--tb-args "--precision bf16 --M 1024"` as a list of arguments."""
    return shlex.split(text) if text else []


def render(
    operator: str,
    baseline: str,
    tb_args: list[str],
    origin: str,
    cases: list[dict[str, Any]],
    shapes: dict[str, Any],
    low: bool = False,
) -> str:
    ext: dict[str, Any] = {
        "name": f"tritonbench_{operator}",
        "description": f"tritonbench operator {operator}, baseline benchmark {baseline}, forward",
    }
    if shapes:
        ext["shapes"] = shapes
    if low:
        ext["precision"] = "low"
    return _TEMPLATE.format(
        operator=operator,
        baseline=baseline,
        origin=origin,
        operator_repr=repr(operator),
        baseline_repr=repr(baseline),
        tb_args=repr(tb_args),
        cases="[" + "".join(f"\n    {case!r}," for case in cases) + ("\n]" if cases else "]"),
        ext=_dict_literal(ext),
    )


def _dict_literal(ext: dict[str, Any]) -> str:
    """KERNELEVOLVE as Python, a key a line and a shape a line (str, numbers and dicts: JSON is Python)."""
    lines = ["{"]
    for key, value in ext.items():
        if key == "shapes":
            lines.append('    "shapes": {')
            lines += [f"        {json.dumps(k)}: {json.dumps(v)}," for k, v in value.items()]
            lines.append("    },")
        else:
            lines.append(f"    {json.dumps(key)}: {json.dumps(value)},")
    return "\n".join([*lines, "}"])


_TEMPLATE = '''"""tritonbench's operator {operator} as a kernelevolve spec; the reference is its benchmark {baseline}.

Written by `kernelevolve spec --from-tritonbench {operator}` from tritonbench ({origin}).
This file imports tritonbench when it runs: install it where kernelevolve and its workers run
(pip install tritonbench, or a clone of github.com/meta-pytorch/tritonbench on PYTHONPATH).
Shape i is example i of the operator's input iterator: get_inputs(case=i) draws it afresh on the
harness's device, under the harness's seed; Model(case=i) runs the benchmark on it, forward mode.
"""

import random
import sys

import torch
import torch.nn as nn

OPERATOR = {operator_repr}
BASELINE = {baseline_repr}
TB_ARGS = {tb_args}  # extra arguments for tritonbench's parser and the operator
# Per case: the example's keyword names (None: positional), and its arguments that are constants,
# not inputs (by position or keyword), passed to the benchmark as drawn.
CASES = {cases}

KERNELEVOLVE = {ext}

_OPERATORS = {{}}  # device -> the operator built there


def _operator(device):
    """The operator, built once per device with the caller's random state kept: building one seeds
    every generator and pins torch.manual_seed to tritonbench's seed."""
    key = str(device)
    if key not in _OPERATORS:
        from tritonbench.operators import load_opbench_by_name
        from tritonbench.utils.parser import get_parser

        argv = ["--op", OPERATOR, "--mode", "fwd", "--device", "cpu", *TB_ARGS]
        tb_args, extra_args = get_parser(argv).parse_known_args(argv)
        tb_args.device = key
        seed_fn, state, py_state = torch.manual_seed, torch.get_rng_state(), random.getstate()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        np = sys.modules.get("numpy")
        np_state = np.random.get_state() if np is not None else None
        try:
            _OPERATORS[key] = load_opbench_by_name(OPERATOR)(tb_args=tb_args, extra_args=extra_args)
        finally:
            torch.manual_seed = seed_fn
            torch.set_rng_state(state)
            random.setstate(py_state)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)
            if np_state is not None:
                np.random.set_state(np_state)
    return _OPERATORS[key]


def _examples(n, device):
    """The first n examples of the operator's input iterator, drawn on device."""
    out = []
    for example in _operator(device).get_input_iter():
        if len(out) == n:
            break
        out.append(example)
    return out


def _arguments(example):
    return list(example.items()) if isinstance(example, dict) else list(enumerate(example))


class Model(nn.Module):
    def __init__(self, case=0):
        super().__init__()
        self.case = case

    def forward(self, *inputs):
        layout, it = CASES[self.case], iter(inputs)
        names = layout["keys"] or range(len(inputs) + len(layout["constants"]))
        args = [layout["constants"][k] if k in layout["constants"] else next(it) for k in names]
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), "cpu")
        benchmark = getattr(_operator(device), BASELINE)
        run = benchmark(**dict(zip(names, args))) if layout["keys"] else benchmark(*args)
        return run()


def get_inputs(case=0):
    # the default device: the one the harness draws inputs on (torch.device(...) around this call)
    examples = _operator(torch.empty(0).device).get_input_iter()
    example = next((e for i, e in enumerate(examples) if i == case), None)
    if example is None:
        raise IndexError(f"{{OPERATOR}}'s input iterator has no example {{case}}")
    constants = CASES[case]["constants"]
    return [
        value.detach() if isinstance(value, torch.Tensor) else value
        for key, value in _arguments(example)
        if key not in constants
    ]


def get_init_inputs(case=0):
    return [case]
'''
