"""Exported dispatch packages: imported in a fresh process with no harness, they run the winning
variant at its exact shape and the reference everywhere else, with the reference's weights."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelevolve.errors import KernelevolveError, SpecError
from kernelevolve.export import export_dispatch
from kernelevolve.spec import load_spec

TESTS = Path(__file__).parent
EXAMPLES = TESTS.parent / "examples"

LINEAR_CANDIDATE = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n_in: int = 16, n_out: int = 12):
        super().__init__()
        self.proj = nn.Linear(n_in, n_out)
        self.register_buffer("scale", torch.ones(n_out))

    def forward(self, x):
        return torch.addmm(self.proj.bias, x, self.proj.weight.t()) * self.scale
"""


def run_script(tmp_path: Path, body: str) -> dict:
    """Run `body` in a fresh interpreter with the export directory first on sys.path; it prints JSON."""
    script = tmp_path / "check.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(tmp_path / 'out')!r})\n" + textwrap.dedent(body))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_softmax_c_variant_wins_one_shape_only(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLES / "softmax" / "spec.py")
    source = (EXAMPLES / "softmax" / "c_rowsoftmax.py").read_text()
    pkg = export_dispatch(
        spec,
        {"wide": (source, "node 17 (c)")},
        tmp_path / "out",
        speedups={"wide": 1.31, "decode": 1.0},
    )
    assert pkg == tmp_path / "out" / "kernelevolve_winner"
    variants = sorted(p.name for p in pkg.glob("variant_*.py"))
    assert len(variants) == 1 and (pkg / variants[0]).read_text() == source
    assert (pkg / "reference.py").read_text() == spec.source
    variant = variants[0].removesuffix(".py")
    doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or ""
    assert f"| wide | (float32[1024, 8192]) | {variant} | node 17 (c) | 1.31x |" in doc
    assert "| decode | (float32[256, 1024]) | reference | - | 1.00x |" in doc

    out = run_script(
        tmp_path,
        """
        import json
        import torch
        import kernelevolve_winner as w

        # importing and inspecting builds nothing and needs no kernelevolve at all
        lazy = sorted(m for m in sys.modules if m.startswith("kernelevolve."))
        shapes = {"decode": (256, 1024), "prefill": (4096, 2048), "wide": (1024, 8192), "unseen": (3, 5)}
        picked = {name: w.choose(torch.empty(s)) for name, s in shapes.items()}
        model = w.ModelNew()
        err = {}
        for name, s in shapes.items():
            x = torch.randn(s)
            err[name] = (model(x) - torch.softmax(x, dim=-1)).abs().max().item()
        x64 = torch.randn(1024, 8192, dtype=torch.float64)
        err["wide_fp64"] = (model(x64) - torch.softmax(x64, dim=-1)).abs().max().item()
        print(json.dumps({
            "lazy": lazy,
            "loaded": sorted(m for m in sys.modules if m.split(".")[0] == "kernelevolve"),
            "picked": picked,
            "model_picked": {n: model.choose(torch.empty(s)) for n, s in shapes.items()},
            "fp64": w.choose(x64),
            "err": err,
            "variants": list(model.variants),
            "dispatch": len(w.DISPATCH),
        }))
        """,
    )
    assert out["lazy"] == []
    assert set(out["loaded"]) <= {"kernelevolve", "kernelevolve.native", "kernelevolve.errors"}
    expected = {"decode": "reference", "prefill": "reference", "wide": variant, "unseen": "reference"}
    assert out["picked"] == expected and out["model_picked"] == expected
    assert out["fp64"] == "reference"  # same shape, other dtype: not what was measured
    assert out["variants"] == [variant] and out["dispatch"] == 3
    assert all(e < 1e-5 for e in out["err"].values()), out["err"]


def test_variants_share_the_reference_weights(tmp_path: Path) -> None:
    spec = load_spec(TESTS / "specs" / "export_linear.py")
    export_dispatch(spec, {"large": (LINEAR_CANDIDATE, "hand-written")}, tmp_path / "out", "linear_pkg")
    out = run_script(
        tmp_path,
        """
        import json
        import torch
        import linear_pkg as w
        from linear_pkg import reference

        torch.manual_seed(0)
        plain = reference.Model(16, 12)
        after_plain = torch.rand(3).tolist()
        torch.manual_seed(0)
        model = w.ModelNew(16, n_out=12)
        after_new = torch.rand(3).tolist()
        (name,) = list(model.variants)
        v, ref = model.variants[name], model.reference
        small, large = torch.randn(8, 16), torch.randn(64, 16)
        res = {
            "same_init": torch.equal(plain.proj.weight, ref.proj.weight),
            "rng_untouched": after_plain == after_new,
            "tied": v.proj.weight is ref.proj.weight and v.proj.bias is ref.proj.bias and v.scale is ref.scale,
            "n_params": len(list(model.parameters())),
            "choose": [model.choose(small), model.choose(large)],
            "close": torch.allclose(model(large), ref(large), atol=1e-6),
        }
        with torch.no_grad():
            ref.proj.weight.mul_(3.0)
        res["follows_edit"] = torch.allclose(model(large), ref(large), atol=1e-6)
        other = reference.Model(16, 12)
        ref.load_state_dict(other.state_dict())
        res["follows_load"] = torch.allclose(model(large), other(large), atol=1e-6)
        # built for another n_out: the variant was not measured there, so the reference runs
        wider = w.ModelNew(16, 20)
        res["other_init"] = [wider.choose(large), w.choose(large), list(wider.variants)]
        print(json.dumps(res))
        """,
    )
    assert out["same_init"] and out["rng_untouched"] and out["tied"]
    assert out["n_params"] == 2  # one copy of weight and bias
    variant = next(iter(p.stem for p in (tmp_path / "out" / "linear_pkg").glob("variant_*.py")))
    assert out["choose"] == ["reference", variant]
    assert out["close"] and out["follows_edit"] and out["follows_load"]
    assert out["other_init"] == ["reference", variant, []]


def test_refuses_what_it_cannot_dispatch_exactly(tmp_path: Path) -> None:
    text = (TESTS / "specs" / "export_linear.py").read_text()
    text = text.replace(
        '"large": {"weight": 0.5, "params": {"batch": 64,', '"wider": {"weight": 0.5, "params": {"batch": 8,'
    )
    text = text.replace('"n_in": 16, "n_out": 12}},\n    },', '"n_in": 16, "n_out": 20}},\n    },')
    twin = tmp_path / "twin.py"
    twin.write_text(text)
    spec = load_spec(twin)
    assert spec.names == ["small", "wider"]
    with pytest.raises(SpecError, match="cannot tell them apart"):
        export_dispatch(spec, {"small": (LINEAR_CANDIDATE, "x")}, tmp_path / "out")
    both = export_dispatch(
        spec, {"small": (LINEAR_CANDIDATE, "x"), "wider": (LINEAR_CANDIDATE, "x")}, tmp_path / "out"
    )
    assert len(list(both.glob("variant_*.py"))) == 1  # one file per distinct source
    with pytest.raises(SpecError, match="no shape named 'nope'"):
        export_dispatch(spec, {"nope": (LINEAR_CANDIDATE, "x")}, tmp_path / "out")
    with pytest.raises(KernelevolveError, match="not a Python identifier"):
        export_dispatch(spec, {}, tmp_path / "out", package="not-a-name")
    foreign = tmp_path / "out" / "mine"
    foreign.mkdir(parents=True)
    (foreign / "__init__.py").write_text("# someone's own package\n")
    with pytest.raises(KernelevolveError, match="was not written by kernelevolve"):
        export_dispatch(spec, {}, tmp_path / "out", package="mine")
    assert (foreign / "__init__.py").exists()


def test_labels_cannot_break_the_generated_module(tmp_path: Path) -> None:
    """Adversarial: a label is free text; it must not end the docstring or inject code."""
    spec = load_spec(TESTS / "specs" / "export_linear.py")
    label = 'x"""\nimport os; os.system("echo pwned")\n"""\\'
    pkg = export_dispatch(spec, {"small": (LINEAR_CANDIDATE, label)}, tmp_path / "out")
    tree = ast.parse((pkg / "__init__.py").read_text())
    assert not any(isinstance(n, ast.Import) and any(a.name == "os" for a in n.names) for n in ast.walk(tree))
    doc = ast.get_docstring(tree) or ""
    assert 'x""" import os; os.system("echo pwned") """\\' in doc
    variants = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "VARIANTS"
    )
    assert variants is not None
    assert ast.literal_eval(variants) == {next(pkg.glob("variant_*.py")).stem: label}
    # exporting again replaces the package it wrote
    export_dispatch(spec, {}, tmp_path / "out")
    assert not list(pkg.glob("variant_*.py"))
