"""Running generated tuner candidates against their references under the Triton interpreter, for the
template tests (`test_tuner_conv.py`, `test_tuner_pool.py`): one subprocess (TRITON_INTERPRET=1, no
GPU) runs every case and writes "ok" or the failure per case id, after the harness's static guard
has accepted each file (a template whose wrapper the guard refuses fails its own tests). `interpret_script` runs any script so.
`on_cuda` runs a reference and a candidate compiled on a GPU, for the templates' `gpu` tests.
`interpret_forced` runs cases that must take one path; `recognized` and `stage_config` build the
template tests' fixtures; `load_module` imports a spec or candidate file."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernelevolve.evaluate.guards import check_source

# The start of every script these helpers run in a subprocess: `load`, a spec or candidate file as a
# module (`load_module` in a script of its own).
SCRIPT_LOAD = r"""
import importlib.util, json, sys
import torch

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
"""

_RUNNER = (
    SCRIPT_LOAD
    + r"""
import inspect
options = json.load(open(sys.argv[1]))
results = {}
for i, case in enumerate(options["cases"]):
    try:
        ref_mod, cand = load(case["spec"], f"interp_spec_{i}"), load(case["candidate"], f"interp_cand_{i}")
        params = case.get("params", {})  # a spec shape's params, passed as the harness passes them
        init_fn = getattr(ref_mod, "get_init_inputs", lambda: [])  # takes the params it names
        init = init_fn(**{k: v for k, v in params.items() if k in inspect.signature(init_fn).parameters})
        torch.manual_seed(0)
        ref = ref_mod.Model(*init)
        new = cand.ModelNew(*init)
        new.load_state_dict(ref.state_dict())
        inputs = ref_mod.get_inputs(**params)
        with torch.no_grad():
            want, got = ref(*inputs), new(*inputs)
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
        torch.testing.assert_close(got, want, rtol=options["tol"], atol=options["tol"], equal_nan=True)
        nan = options["nan_marker"]
        assert bool(torch.isnan(want).any()) == bool(nan and nan in case["id"]), "a NaN only where marked"
        results[case["id"]] = "ok"
    except Exception as exc:
        results[case["id"]] = f"{type(exc).__name__}: {exc}"
json.dump(results, open(sys.argv[2], "w"))
"""
)


def interpret(
    generated: dict[str, tuple[str, str]],
    tmp: Path,
    tol: float,
    nan_marker: str = "",
    params: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, str]:
    """Each case id -> "ok" or why not. `generated`: id -> (spec path, candidate source). Every source
    must pass the harness's static guard as a GPU candidate (what the harness refuses before running
    it), outputs must match within `tol` (NaN where the reference has NaN), and the reference must
    produce a NaN exactly in the cases whose id contains `nan_marker` (none without one). `params`:
    a case id -> a spec shape's params, passed to the spec's get_init_inputs and get_inputs as the
    harness does (the functions' defaults without)."""
    cases = []
    refused: dict[str, str] = {}
    for i, (case, (spec, source)) in enumerate(generated.items()):
        report = check_source(source, {"triton"}, platform="cuda")
        if not report.ok:
            refused[case] = f"guard: {report.syntax_error or '; '.join(str(v) for v in report.violations)}"
            continue
        (tmp / f"cand_{i}.py").write_text(source)
        cases.append({"id": case, "spec": spec, "candidate": str(tmp / f"cand_{i}.py"),
                      "params": dict((params or {}).get(case, {}))})  # fmt: skip
    (tmp / "cases.json").write_text(json.dumps({"cases": cases, "tol": tol, "nan_marker": nan_marker}))
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(tmp / "cases.json"), str(tmp / "results.json")],
        env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**json.loads((tmp / "results.json").read_text()), **refused}


def interpret_forced(generated: dict[str, tuple[str, str, str]], tmp: Path, tol: float) -> dict[str, str]:
    """`interpret`, where each case is (spec path, candidate source, a line appended to the source
    that takes away the kernels of the path the case must not run): a passing case proves which path
    ran."""
    cases = {case: (spec, source + only) for case, (spec, source, only) in generated.items()}
    return interpret(cases, tmp, tol)


def recognized(paths: dict[str, Path]) -> dict[str, tuple[str, Any]]:
    """Each spec file traced by the tuner (`trace.recognize`), which must recognize it: name -> (path,
    graph)."""
    from kernelevolve.spec import load_spec
    from kernelevolve.synth.tuner.trace import recognize

    out = {}
    for name, path in paths.items():
        graph, why = recognize(load_spec(path))
        assert graph is not None, (name, why)
        out[name] = (str(path), graph)
    return out


def stage_config(template: str, per_template: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A pipeline's config from each stage template's own knobs (`per_template[name]`), keyed as the
    pipeline names them (`s<k>_<knob>`, k the stage's index in `template`, "a+b+...")."""
    return {
        f"s{k}_{key}": value
        for k, name in enumerate(template.split("+"))
        for key, value in per_template[name].items()
    }


# The start of a script run by `interpret_script`: `load` and `nearest_tf32` (the nearest TF32 value
# of each fp32 in float64 arithmetic, torch.round being half to even: independent of the kernels'
# bit arithmetic, `_tf32_round`).
SCRIPT_PRELUDE = (
    SCRIPT_LOAD
    + r"""
def nearest_tf32(x):
    x = x.double()
    exp = torch.frexp(x)[1].clamp(min=-125)  # |x| < 2**exp: 11 bits kept (fewer in a subnormal)
    out = torch.ldexp(torch.round(torch.ldexp(x, 11 - exp)), exp - 11)
    return torch.where(torch.isfinite(x), out, x)
"""
)


def interpret_script(script: str, *args: str) -> str:
    """Run `script` (Python source, given `args` as sys.argv[1:]) under the Triton interpreter in a
    subprocess; its stdout. For checks the case runner above does not make (against float64, say)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def load_module(path: Path, name: str) -> Any:
    """The Python file at `path`, imported as module `name` (a spec or a generated candidate)."""
    found = importlib.util.spec_from_file_location(name, path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def cuda_verdicts(spec_path: Path, candidate: Path, precision: str) -> dict[str, Any]:
    """Each of the spec's shapes -> the harness's comparison (`correctness.compare`) of the candidate
    file's ModelNew in float32 against the spec's Model in float64, on CUDA with the reference's
    weights, built from the shape's params as the harness builds them."""
    import torch

    from kernelevolve.evaluate.correctness import compare, tolerance_for
    from kernelevolve.spec import call_get_init_inputs, call_get_inputs, import_spec_module, load_spec

    spec = load_spec(spec_path)
    module, cand = import_spec_module(spec_path), load_module(candidate, candidate.stem)
    out = {}
    for shape in spec.shapes:
        init = call_get_init_inputs(spec, module, shape)
        torch.manual_seed(0)
        ref = module.Model(*init).cuda().double()
        new = cand.ModelNew(*init).cuda()
        new.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
        inputs = [t.cuda() for t in call_get_inputs(spec, module, shape)]
        with torch.no_grad():
            got, want = new(*inputs), ref(*[t.double() for t in inputs])
        out[shape.name] = compare(got.double(), want, tolerance_for(torch.float32, precision))
    return out


def on_cuda(spec: Path, candidate: Path, repeat: int) -> tuple[Any, Any]:
    """(got, want): the candidate file's ModelNew in float32 and the spec's Model in float64, on CUDA
    with the reference's weights, on the spec's inputs with their first dim repeated `repeat` times."""
    import torch

    mods = [load_module(spec, f"{spec.stem}_ref"), load_module(candidate, candidate.stem)]
    ref, new = mods[0].Model().cuda().double(), mods[1].ModelNew().cuda()
    new.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    torch.manual_seed(0)
    inputs = [x.repeat(repeat, *([1] * (x.dim() - 1))).cuda() for x in mods[0].get_inputs()]
    with torch.no_grad():
        return new(*inputs), ref(*[x.double() for x in inputs])
