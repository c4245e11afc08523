"""The torch.compile baseline is compile's kernel for each shape, not a shape-generic one.

A worker compiles one reference per shape of the spec. By torch's default, the second shape's
recompile marks the sizes that changed dynamic ("automatic dynamic shapes") and the third shape
reuses that graph, so every shape after the first was timed against a shape-generic kernel: a
slower baseline than compile gives a user of that shape. The worker compiles with `dynamic=False`
and raises the recompile limit to cover the spec's shapes (`worker._static_compiles`).

The worker is prepared in a subprocess (it installs its launch counter and sets the dynamo config for
the process), with dynamo's log of dynamic sizes captured; the control runs the same preparation
with `torch.compile`'s `dynamic` argument dropped, and sees the sizes go dynamic.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SPEC = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, borders):
        return (x.unsqueeze(-1) > borders).sum(-1)


def get_inputs(rows=64, features=8, n_borders=8):
    return [torch.randn(rows, features), torch.sort(torch.randn(features, n_borders), dim=1).values]


def get_init_inputs():
    return []


KERNELEVOLVE = {
    "name": "three_sizes",
    "shapes": {
        "a": {"weight": 0.4, "params": {"rows": 64, "features": 8, "n_borders": 8}},
        "b": {"weight": 0.4, "params": {"rows": 256, "features": 4, "n_borders": 16}},
        "c": {"weight": 0.2, "params": {"rows": 128, "features": 8, "n_borders": 4}},
    },
    "precision": "strict_fp32",
}
"""

PREPARE = """
import json, logging, sys
import torch
from torch._dynamo.utils import counters

from kernelevolve import integrity
from kernelevolve.config import load_settings
from kernelevolve.evaluate import worker
from kernelevolve.evaluate.messages import PrepareMsg, WorkerSettings

if sys.argv[2] == "control":  # torch's default: the sizes that change go dynamic
    compile_ = torch.compile
    torch.compile = lambda model, **kw: compile_(model, **{k: v for k, v in kw.items() if k != "dynamic"})
torch._dynamo.config.recompile_limit = 1  # below the spec's three shapes: the worker raises it
torch._logging.set_logs(dynamic=logging.INFO)
settings = WorkerSettings.from_dict(load_settings().to_dict())
digest = integrity.harness(git=False).digest
msg = PrepareMsg(platform="cpu", lease_key="x", settings=settings, harness_digest=digest, spec_path=sys.argv[1])
state = worker.prepare(msg, [])
print(json.dumps({"graphs": counters["stats"]["unique_graphs"], "errors": state.baseline_errors,
                  "compiled": [st.compiled is not None for st in state.shapes]}))
"""


def _prepare(tmp_path: Path, mode: str) -> tuple[dict[str, object], str]:
    spec = tmp_path / "three_sizes.py"
    spec.write_text(textwrap.dedent(SPEC))
    proc = subprocess.run(
        [sys.executable, "-c", PREPARE, str(spec), mode], capture_output=True, text=True, timeout=280
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
def test_each_shape_is_compiled_for_its_own_sizes(tmp_path: Path) -> None:
    got, log = _prepare(tmp_path, "harness")
    assert got["errors"] == {} and got["compiled"] == [True, True, True], got
    assert got["graphs"] == 3, got  # one graph per shape (the limit of 1 was raised to cover them)
    assert "as dynamic" not in log, log[-2000:]


@pytest.mark.slow
def test_control_by_default_the_second_shape_goes_dynamic_and_the_third_reuses_it(tmp_path: Path) -> None:
    got, log = _prepare(tmp_path, "control")
    assert "as dynamic" in log and got["graphs"] == 2, (got, log[-2000:])
