"""Jagged inputs (issue P): a spec whose `get_inputs` sizes one tensor by another's values, written the
natural way (`lengths = torch.randint(...)`, `torch.randn(int(lengths.sum()), dim)`), loads, is
evaluated and is searched on the CPU. The meta device cannot make such inputs: the probe makes them on
the CPU and says so; timing rounds keep every draw consistent in the buffers' sizes; the offline
tuner starts from the knowledge base's jagged-sum sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelevolve.evaluate.inputs import conform
from kernelevolve.knowledge.docs import DOCS_DIR
from kernelevolve.spec import load_spec
from tests.test_search_e2e import cli

SUITE_SPEC = Path(__file__).parent.parent / "suites" / "recsys" / "jagged_sum_pooling.py"
SAMPLE_SPEC = DOCS_DIR / "samples" / "specs" / "jagged_sum.py"
C_KERNEL = DOCS_DIR / "samples" / "c" / "jagged_sum.py"


def test_the_probe_makes_jagged_inputs_on_the_cpu_with_their_real_sizes() -> None:
    spec = load_spec(SUITE_SPEC)
    for shape in spec.shapes:
        assert "cannot run on the meta device" in spec.probe_notes[shape.name]
        assert "Tensor.item() cannot be called on meta tensors" in spec.probe_notes[shape.name]
        values, lengths = spec.inputs[shape.name]
        p = shape.params
        torch.manual_seed(0)  # the probe's draw: the memory plan and the fingerprint see these sizes
        expected = torch.randint(0, 2 * p["mean_len"] + 1, (p["batch"],))
        assert lengths.shape == [p["batch"]] and lengths.dtype == "int64"
        assert values.shape == [int(expected.sum()), p["dim"]]
        assert spec.outputs[shape.name] is not None and spec.outputs[shape.name][0].shape == [
            p["batch"],
            p["dim"],
        ]
        assert (
            spec.footprint_bytes(shape.name)
            == (values.shape[0] * p["dim"] + p["batch"] * p["dim"]) * 4 + p["batch"] * 8
        )
    assert load_spec(SUITE_SPEC).fingerprint == spec.fingerprint  # the draw is seeded: one fingerprint


def test_a_spec_that_cannot_make_its_inputs_anywhere_still_says_why(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        SAMPLE_SPEC.read_text().replace("int(lengths.sum())", "int(lengths.sum()) + undefined_name")
    )
    from kernelevolve.errors import SpecError

    with pytest.raises(SpecError, match="NameError: name 'undefined_name' is not defined"):
        load_spec(bad)


DROP_PATH_SPEC = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, depth: int = 4, dim: int = 64):
        super().__init__()
        rates = [x.item() for x in torch.linspace(0, 0.1, depth)]  # values: not on the meta device
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in rates)
        self.rates = rates

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x

def get_inputs():
    return [torch.randn(8, 64)]

def get_init_inputs():
    return [4, 64]
"""


def test_a_model_whose_constructor_needs_values_is_built_on_the_cpu_and_counted(tmp_path: Path) -> None:
    """KernelBench level 3's 29_SwinMLP and 30_SwinTransformerV2 read a drop-path schedule with
    `.item()` while they are built: the probe builds such a model on the CPU, moves it to meta, and
    counts its parameters and outputs as for any other spec."""
    path = tmp_path / "drop_path.py"
    path.write_text(DROP_PATH_SPEC)
    spec = load_spec(path)
    note = spec.probe_notes["default"]
    assert "Model(*get_init_inputs()) cannot run on the meta device" in note and "built on the CPU" in note
    params = 4 * (64 * 64 + 64) * 4
    assert spec.footprint_bytes("default") == params + 2 * 8 * 64 * 4  # weights, the input, the output
    broken = tmp_path / "broken.py"
    broken.write_text(DROP_PATH_SPEC.replace("super().__init__()", "super().__init__(); undefined_name"))
    from kernelevolve.errors import SpecError

    with pytest.raises(SpecError, match=r"Model.*raised NameError"):
        load_spec(broken)


def test_timing_draws_keep_the_buffers_sizes_and_stay_consistent() -> None:
    def draw(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        lengths = torch.randint(0, 9, (64,))
        return [torch.randn(int(lengths.sum()), 8), lengths]

    like = draw(7)
    for seed in range(1, 6):
        fresh = draw(seed)
        assert fresh[0].shape != like[0].shape  # a jagged draw: another size every seed
        values, lengths = conform(fresh, like)
        assert values.shape == like[0].shape and torch.equal(lengths, like[1])  # the structure stays
        assert int(lengths.sum()) == values.shape[0]
        assert not torch.equal(values, like[0])  # new contents every round, the draw's own values
        assert torch.equal(values.reshape(-1)[:100], fresh[0].reshape(-1)[:100])
    same = draw(7)
    assert conform(same, like)[1] is same[1]  # sizes that match are left as drawn


def test_spec_eval_and_optimize_work_on_a_jagged_spec_from_the_cli(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shown = cli("spec", str(SUITE_SPEC), ws=ws)
    assert shown.returncode == 0, shown.stderr
    assert "cannot run on the meta device" in shown.stdout and "made on the CPU" in shown.stdout

    evaluated = cli("eval", str(SAMPLE_SPEC), str(C_KERNEL), "--json", ws=ws)
    assert evaluated.returncode == 0, evaluated.stderr
    (verdict,) = json.loads(evaluated.stdout)["verdicts"]  # one candidate: one verdict in the wrapper
    assert verdict["correct"] and verdict["status"] in ("ok", "suspicious"), verdict["message"]
    assert all(s["roofline_fraction"] is not None for s in verdict["shapes"])

    searched = cli("optimize", str(SAMPLE_SPEC), "--platform", "cpu", "--budget", "2", "--json", ws=ws)
    assert searched.returncode == 0, searched.stderr
    summary = json.loads(searched.stdout)
    assert summary["status"] == "done" and summary["nodes_evaluated"] == 2
    assert summary["best_node"] is not None, summary  # the tuner started from the jagged-sum sample
    assert all(s["correct"] for s in summary["shapes"]) and summary["best_speedup_vs_eager"] > 1.0
