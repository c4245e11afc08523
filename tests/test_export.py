"""Exported dispatch packages: imported in a fresh process with no harness (and, built, with neither
kernelevolve nor a compiler), they run a winning variant where its guards accept the call and the
reference everywhere else; the model is the reference's, state_dict and all."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kernelevolve.errors import KernelevolveError, SpecError
from kernelevolve.export import export_dispatch
from kernelevolve.export_runtime import accepts, derive_guards
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


def run_script(
    tmp_path: Path, body: str, out: str = "out", bare: bool = False, env: dict | None = None
) -> dict:
    """Run `body` in a fresh interpreter with the export directory first on sys.path; it prints JSON.
    `bare`: `python -E -S` with only the export directory and torch's site directory on sys.path, so
    that kernelevolve (an editable install, a .pth file, PYTHONPATH) cannot be imported."""
    import torch

    paths = [str(tmp_path / out)] + ([str(Path(torch.__file__).parents[1])] if bare else [])
    script = tmp_path / "check.py"
    script.write_text(f"import sys\nsys.path[:0] = {paths!r}\n" + textwrap.dedent(body))
    flags = ["-E", "-S"] if bare else []
    proc = subprocess.run(
        [sys.executable, *flags, str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, **(env or {})},
    )  # fmt: skip
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
    # the one change to the source: kernelevolve.native is the package's vendored copy
    vendored = source.replace("from kernelevolve.native import", "from ._kernelevolve_native import")
    assert vendored != source and len(variants) == 1 and (pkg / variants[0]).read_text() == vendored
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
        # "near": nearest to wide, but the variant was verified at wide only: its sizes are pinned
        shapes = {"decode": (256, 1024), "prefill": (4096, 2048), "wide": (1024, 8192), "unseen": (3, 5),
                  "near": (2048, 8192)}
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
            "variants": list(model.kernelevolve_variants),
            "dispatch": len(w.DISPATCH),
        }))
        """,
    )
    assert out["lazy"] == [] and out["loaded"] == []  # the native module is vendored in the package
    expected = {"decode": "reference", "prefill": "reference", "wide": variant, "unseen": "reference",
                "near": "reference"}  # fmt: skip
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
        (name,) = list(model.kernelevolve_variants)
        v = model.kernelevolve_variants[name]
        ref = lambda x: reference.Model.forward(model, x)  # the reference's computation, same weights
        small, large = torch.randn(8, 16), torch.randn(64, 16)
        res = {
            "same_init": torch.equal(plain.proj.weight, model.proj.weight),
            "is_reference": isinstance(model, reference.Model),
            "rng_untouched": after_plain == after_new,
            "tied": v.proj.weight is model.proj.weight and v.proj.bias is model.proj.bias
                    and v.scale is model.scale,
            "n_params": len(list(model.parameters())),
        }
        with torch.no_grad():
            res["choose"] = [model.choose(small), model.choose(large)]
            res["close"] = torch.allclose(model(large), ref(large), atol=1e-6)
            model.proj.weight.mul_(3.0)
            res["follows_edit"] = torch.allclose(model(large), ref(large), atol=1e-6)
            other = reference.Model(16, 12)
            model.load_state_dict(other.state_dict())
            res["follows_load"] = torch.allclose(model(large), other(large), atol=1e-6)
            model.load_state_dict(plain.state_dict(), assign=True)  # new Parameter objects: tied again
            res["follows_assign"] = v.proj.weight is model.proj.weight and torch.allclose(
                model(large), plain(large), atol=1e-6)
            model.double()  # measured in float32: float64 inputs run the reference
            res["double"] = [v.proj.weight is model.proj.weight, model.choose(large.double())]
            model.float()
            res["float"] = [v.proj.weight is model.proj.weight, model.choose(large),
                            torch.allclose(model(large), plain(large), atol=1e-6)]
        # with autograd on and parameters that require grad, the reference runs: the kernel's
        # backward was never verified
        res["grad"] = [model.choose(large), model(large).grad_fn is not None]
        # built for another n_out: the variant was not measured there, so the reference runs
        wider = w.ModelNew(16, 20)
        with torch.no_grad():
            res["other_init"] = [wider.choose(large), w.choose(large), list(wider.kernelevolve_variants)]
        print(json.dumps(res))
        """,
    )
    assert out["same_init"] and out["is_reference"] and out["rng_untouched"] and out["tied"]
    assert out["n_params"] == 2  # one copy of weight and bias
    variant = next(iter(p.stem for p in (tmp_path / "out" / "linear_pkg").glob("variant_*.py")))
    assert out["choose"] == ["reference", variant]
    assert out["close"] and out["follows_edit"] and out["follows_load"] and out["follows_assign"]
    assert out["double"] == [True, "reference"] and out["float"] == [True, variant, True]
    assert out["grad"] == ["reference", True]
    assert out["other_init"] == ["reference", variant, []]


def test_state_dict_is_the_references_both_ways_and_in_a_parent(tmp_path: Path) -> None:
    """A parent model's checkpoint still loads once its layer is swapped for the winner, and back."""
    spec = load_spec(TESTS / "specs" / "export_linear.py")
    export_dispatch(spec, {"large": (LINEAR_CANDIDATE, "x")}, tmp_path / "out", "linear_pkg")
    out = run_script(
        tmp_path,
        """
        import io, json
        import torch
        import torch.nn as nn
        import linear_pkg as w
        from linear_pkg import reference

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = reference.Model(16, 12)
                self.head = nn.Linear(12, 2)

            def forward(self, x):
                return self.head(self.layer(x))

        ref, new = reference.Model(16, 12), w.ModelNew(16, 12)
        res = {
            "keys": list(new.state_dict()) == list(ref.state_dict()),
            "shapes": {k: list(v.shape) for k, v in new.state_dict().items()}
                      == {k: list(v.shape) for k, v in ref.state_dict().items()},
        }
        new.load_state_dict(ref.state_dict())  # strict: reference checkpoint -> winner
        x = torch.randn(64, 16)
        with torch.no_grad():
            res["winner_from_ref"] = [new.choose(x), torch.allclose(new(x), ref(x), atol=1e-6)]
            back = reference.Model(16, 12)
            back.load_state_dict(new.state_dict())  # strict: winner checkpoint -> reference
            res["ref_from_winner"] = torch.allclose(back(x), new(x), atol=1e-6)

        torch.manual_seed(1)
        net = Net()
        buf = io.BytesIO()
        torch.save(net.state_dict(), buf)
        swapped = Net()
        swapped.layer = w.ModelNew(16, 12)
        buf.seek(0)
        swapped.load_state_dict(torch.load(buf))  # strict, the parent's checkpoint
        with torch.no_grad():
            res["parent"] = [swapped.layer.choose(x), torch.allclose(swapped(x), net(x), atol=1e-6)]
            res["parent_keys"] = sorted(swapped.state_dict()) == sorted(net.state_dict())
            # the whole model pickles (the load hook is a module-level function)
            whole = io.BytesIO()
            torch.save(swapped, whole)
            whole.seek(0)
            again = torch.load(whole, weights_only=False)
            res["pickled"] = [again.layer.choose(x), torch.allclose(again(x), net(x), atol=1e-6)]
        print(json.dumps(res))
        """,
    )
    variant = next(iter(p.stem for p in (tmp_path / "out" / "linear_pkg").glob("variant_*.py")))
    assert out["keys"] and out["shapes"] and out["ref_from_winner"] and out["parent_keys"]
    assert out["winner_from_ref"] == [variant, True]
    assert out["parent"] == [variant, True]
    assert out["pickled"] == [variant, True]


def test_forward_binds_keyword_arguments_by_the_references_signature(tmp_path: Path) -> None:
    spec = load_spec(TESTS / "specs" / "export_linear.py")
    export_dispatch(spec, {"large": (LINEAR_CANDIDATE, "x")}, tmp_path / "out", "linear_pkg")
    out = run_script(
        tmp_path,
        """
        import json
        import torch
        import linear_pkg as w

        model = w.ModelNew(16, 12)
        x = torch.randn(64, 16)
        with torch.no_grad():
            res = {
                "choose": [model.choose(x=x), w.choose(x=x), model.choose(x)],
                "same": torch.equal(model(x=x), model(x)),
            }
            try:
                model(y=x)  # not forward's parameter: the reference raises as it would
            except TypeError as exc:
                res["refused"] = "y" in str(exc)
        print(json.dumps(res))
        """,
    )
    variant = next(iter(p.stem for p in (tmp_path / "out" / "linear_pkg").glob("variant_*.py")))
    assert out == {"choose": [variant] * 3, "same": True, "refused": True}


# Correct only where the columns come in whole blocks of 1024 (the tail stays zero): exactly the kind
# of kernel that a shape-generic dispatch must keep away from shapes it was never checked on.
BLOCKED_SOFTMAX = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        full = x.shape[-1] // 1024 * 1024
        y = torch.zeros_like(x)
        y[:, :full] = torch.softmax(x[:, :full], dim=-1)
        return y
"""


def test_unseen_shapes_use_a_kernel_only_where_its_guards_allow(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLES / "softmax" / "spec.py")
    every = ["decode", "prefill", "wide"]  # verified correct at each (all multiples of 1024 columns)
    export_dispatch(
        spec,
        {s: (BLOCKED_SOFTMAX, "blocked") for s in every},
        tmp_path / "out",
        verified={s: every for s in every},
    )
    out = run_script(
        tmp_path,
        """
        import json
        import torch
        import kernelevolve_winner as w

        model = w.ModelNew()
        cases = {
            "seen": torch.randn(1024, 8192),
            "near": torch.randn(512, 3072),          # rows 256k, cols 1024k, in range: the kernel
            "tail": torch.randn(1024, 1000),         # cols not a multiple of 1024: the reference
            "rows": torch.randn(100, 2048),          # rows not a multiple of 256
            "big": torch.randn(8192, 2048),          # beyond the verified rows
            "strided": torch.randn(4096, 1024).t(),  # (1024, 4096), not contiguous
            "fp64": torch.randn(1024, 2048, dtype=torch.float64),
            "rank": torch.randn(2, 512, 1024),
        }
        res = {}
        with torch.no_grad():
            for name, x in cases.items():
                err = (model(x) - torch.softmax(x, dim=-1)).abs().max().item()
                res[name] = [model.choose(x), w.choose(x), err < 1e-5]
        x = torch.randn(512, 3072, requires_grad=True)
        res["grad"] = [model.choose(x), model(x).grad_fn is not None]
        print(json.dumps(res))
        """,
    )
    variant = next(iter(p.stem for p in (tmp_path / "out" / "kernelevolve_winner").glob("variant_*.py")))
    for name in ("seen", "near"):
        assert out[name] == [variant, variant, True], name
    for name in ("tail", "rows", "big", "strided", "fp64", "rank"):
        assert out[name] == ["reference", "reference", True], name
    assert out["grad"] == ["reference", True]


def test_guards_pin_what_never_varied_and_keep_equal_dimensions_equal() -> None:
    def key(*shapes: tuple[int, ...]) -> tuple:
        return tuple((s, "float32") for s in shapes)

    # a square matmul verified at 64 and 256: n == k == m on every verified shape, batch pinned at 2
    verified = [
        (key((2, 64, 64), (2, 64, 64)), [True, True]),
        (key((2, 256, 256), (2, 256, 256)), [True, True]),
    ]
    guards = derive_guards(verified)

    class T:
        def is_contiguous(self) -> bool:
            return True

    t = [T(), T()]
    assert accepts(guards, key((2, 128, 128), (2, 128, 128)), t)
    assert not accepts(guards, key((2, 128, 192), (2, 128, 192)), t)  # n != k: never verified
    assert not accepts(guards, key((2, 96, 96), (2, 96, 96)), t)  # not a multiple of gcd(64, 256)
    assert not accepts(guards, key((4, 128, 128), (4, 128, 128)), t)  # batch was pinned at 2
    assert not accepts(guards, key((2, 512, 512), (2, 512, 512)), t)  # beyond the verified range
    assert not accepts(derive_guards(verified[:1]), key((2, 256, 256), (2, 256, 256)), t)  # one shape: pinned


BUILT_CHECK = """
import importlib.util, json, warnings
import torch
import kernelevolve_winner as w

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = w.ModelNew()
res = {"kernelevolve": importlib.util.find_spec("kernelevolve") is not None,
       "warnings": [str(c.message) for c in caught], "variants": list(model.kernelevolve_variants)}
with torch.no_grad():
    for name, shape in {"wide": (1024, 8192), "near": (2048, 4096), "tail": (1000, 8192)}.items():
        x = torch.randn(shape)
        res[name] = [model.choose(x), (model(x) - torch.softmax(x, dim=-1)).abs().max().item() < 1e-5]
res["launches"] = w._kernelevolve_native.launch_count()
res["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] == "kernelevolve")
print(json.dumps(res))
"""


def test_built_package_runs_c_variants_without_kernelevolve_or_a_compiler(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLES / "softmax" / "spec.py")
    source = (EXAMPLES / "softmax" / "c_rowsoftmax.py").read_text()
    every = ["decode", "prefill", "wide"]
    for out, build in (("built", True), ("source", False)):
        export_dispatch(spec, {"wide": (source, "c")}, tmp_path / out, verified={"wide": every}, build=build)
    pkg = tmp_path / "built" / "kernelevolve_winner"
    assert len(list((pkg / "_native").glob("*.so"))) == 1
    for path in pkg.glob("*.py"):  # no module of the package imports kernelevolve
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            assert not any(n.split(".")[0] == "kernelevolve" for n in names), (path.name, names)
    # the deploy machine: no kernelevolve on sys.path, no compiler, an empty build cache
    deploy = {"CC": str(tmp_path / "no-such-cc"), "KERNELEVOLVE_NATIVE_CACHE": str(tmp_path / "cache")}
    variant = next(p.stem for p in pkg.glob("variant_*.py"))
    out = run_script(tmp_path, BUILT_CHECK, "built", bare=True, env=deploy)
    assert not out["kernelevolve"] and out["loaded"] == [] and out["warnings"] == []
    assert out["variants"] == [variant] and out["launches"] == 2
    assert out["wide"] == [variant, True] and out["near"] == [variant, True]
    assert out["tail"] == ["reference", True]
    # the same package without --build needs the compiler: it warns and runs the reference, correctly
    out = run_script(tmp_path, BUILT_CHECK, "source", bare=True, env=deploy)
    assert out["variants"] == [] and out["launches"] == 0 and "export with --build" in out["warnings"][0]
    assert out["wide"] == ["reference", True] and out["near"] == ["reference", True]


def test_export_command_writes_a_named_package_from_a_stored_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kernelevolve.cli import app
    from kernelevolve.store import Workspace

    spec = load_spec(TESTS / "specs" / "export_linear.py")
    with Workspace.open(tmp_path / "ws") as ws:
        ws.record_spec(spec.fingerprint, spec.name, str(spec.path), spec.source, {})
        run_id = ws.create_run(spec.fingerprint, str(spec.path), "cpu", "fake", "greedy", {}, {})
        node = ws.create_node(run_id, None, None, "draft")
        digest = ws.propose_node(run_id, node, source=LINEAR_CANDIDATE)
        shapes = [{"name": "small", "correct": True}, {"name": "large", "correct": True}]
        verdict = {"status": "ok", "correct": True, "fitness": 1.4, "spec_fingerprint": spec.fingerprint,
                   "candidate_hash": digest, "platform": "cpu", "shapes": shapes}  # fmt: skip
        ws.finish_node(run_id, node, verdict, 1.0)
        dispatch = {"small": {"node": None}, "large": {"node": node, "speedup_vs_eager": 1.4}}
        summary = {"spec_path": str(spec.path), "platform": "cpu", "dispatch": dispatch}
        ws.update_run(run_id, status="done", summary=summary)

    def export(*args: str) -> Any:
        base = [
            "export",
            run_id,
            "--format",
            "package",
            "-w",
            str(tmp_path / "ws"),
            "-o",
            str(tmp_path / "out"),
        ]
        return CliRunner().invoke(app, [*base, *args])

    done = export("--name", "linear_winner")
    assert done.exit_code == 0, done.output
    pkg = tmp_path / "out" / "linear_winner"
    assert (pkg / "__init__.py").is_file() and not (tmp_path / "out" / "kernelevolve_winner").exists()
    out = run_script(
        tmp_path,
        """
        import json
        import torch
        import linear_winner as w

        model = w.ModelNew(16, 12)
        # verified at batch 8 and 64 (the node's verdict), won at 64: batch 48 is nearest to 64
        with torch.no_grad():
            picks = [model.choose(torch.randn(b, 16)) for b in (64, 48, 12, 8)]
        print(json.dumps({"verified": next(iter(w.VARIANTS.values()))["verified"], "picks": picks}))
        """,
    )
    variant = next(p.stem for p in pkg.glob("variant_*.py"))
    assert out["verified"] == ["large", "small"]
    assert out["picks"] == [variant, variant, "reference", "reference"]
    for bad in ("not-a-name", "os", "torch"):
        refused = export("--name", bad)
        assert refused.exit_code == 2 and "package name" in refused.output, refused.output


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
    with pytest.raises(KernelevolveError, match="would shadow"):
        export_dispatch(spec, {}, tmp_path / "out", package="json")
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
    (name, meta), *_ = ast.literal_eval(variants).items()  # each variant: label, verified shapes, guards
    assert name == next(pkg.glob("variant_*.py")).stem and meta["label"] == label
    # exporting again replaces the package it wrote
    export_dispatch(spec, {}, tmp_path / "out")
    assert not list(pkg.glob("variant_*.py"))


def test_a_compiled_row_runs_the_reference_through_torch_compile(tmp_path: Path) -> None:
    """Where torch.compile ran the reference faster than eager (and no kernel beat it), the package
    runs the reference compiled there: compiled once per model on first use, at any input shape of
    that row (no guards), the reference eagerly elsewhere; where compiling fails, one warning and eager
    from then on; the model still pickles after a compiled call. The control: the eager row never
    compiles."""
    spec = load_spec(EXAMPLES / "softmax" / "spec.py")
    pkg = export_dispatch(spec, {}, tmp_path / "out", "compiled_pkg", compiled=["decode"])
    doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or ""
    assert "| decode | (float32[256, 1024]) | compiled | - | - |" in doc
    assert "| wide | (float32[1024, 8192]) | reference | - | - |" in doc
    out = run_script(
        tmp_path,
        """
        import io, json, pickle, warnings
        import torch

        made = []

        def fake_compile(fn, **kw):  # torch.compile's contract, without inductor's minutes on a CPU
            def run(*a, **k):
                made[-1][1] += 1
                if FAIL:
                    raise RuntimeError("no compiler")
                return fn(*a, **k)
            made.append([fn, 0])
            return run

        torch.compile = fake_compile
        FAIL = False
        import compiled_pkg as w

        model = w.ModelNew()
        x, big, odd = torch.randn(256, 1024), torch.randn(1024, 8192), torch.randn(200, 1000)
        picked = [w.choose(x), w.choose(big), model.choose(odd)]
        err = max((model(t) - torch.softmax(t, -1)).abs().max().item() for t in (x, x, big, odd))
        calls = [m[1] for m in made]
        again = pickle.loads(pickle.dumps(model))
        again_ok = torch.allclose(again(x), torch.softmax(x, -1), atol=1e-6)
        FAIL = True
        broken = w.ModelNew()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            e1 = (broken(x) - torch.softmax(x, -1)).abs().max().item()
            e2 = (broken(x) - torch.softmax(x, -1)).abs().max().item()
        print(json.dumps({"picked": picked, "err": err, "calls": calls, "again_ok": again_ok,
                          "made": len(made), "after_fail": [m[1] for m in made], "e": max(e1, e2),
                          "warned": [str(c.message) for c in caught]}))
        """,
    )
    assert out["picked"] == ["compiled", "reference", "compiled"]
    assert out["err"] < 1e-5
    assert out["calls"] == [3]  # one compiled function for the model: x twice and odd; big ran eagerly
    assert out["again_ok"] and out["made"] == 3  # the pickled copy compiled its own on first use
    assert out["after_fail"][-1] == 1  # the failing compile was tried once, then eager
    assert out["e"] < 1e-5 and len(out["warned"]) == 1 and "runs eagerly" in out["warned"][0]


BUILT_CUDA_CHECK = """
import importlib.util, json, warnings
import torch
import kernelevolve_winner as w

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = w.ModelNew().cuda()
res = {"kernelevolve": importlib.util.find_spec("kernelevolve") is not None,
       "warnings": [str(c.message) for c in caught], "variants": list(model.kernelevolve_variants)}
with torch.no_grad():
    for name, shape in {"wide": (1024, 8192), "decode": (256, 1024)}.items():
        x = torch.randn(shape, device="cuda")
        res[name] = [model.choose(x), (model(x) - torch.softmax(x, dim=-1)).abs().max().item() < 1e-5]
torch.cuda.synchronize()
res["launches"] = w._kernelevolve_native.launch_count()
print(json.dumps(res))
"""


@pytest.mark.gpu
def test_built_package_runs_a_cuda_variant_without_kernelevolve_or_nvcc(tmp_path: Path) -> None:
    """`export --build` on a GPU host: the CUDA variant's library is prebuilt into the package, which
    then runs it where neither kernelevolve nor nvcc nor a compiler is found, with an empty build cache.
    The control: the same package without --build warns there and runs the reference."""
    from tests.gpu_candidates import CUDA_CPP

    spec = load_spec(EXAMPLES / "softmax" / "spec.py")
    for out, build in (("built", True), ("source", False)):
        export_dispatch(spec, {"wide": (CUDA_CPP, "cuda")}, tmp_path / out, device_type="cuda", build=build)
    pkg = tmp_path / "built" / "kernelevolve_winner"
    assert len(list((pkg / "_native").glob("*.so"))) == 1
    deploy = {"CC": str(tmp_path / "no-cc"), "CXX": str(tmp_path / "no-cxx"), "NVCC": str(tmp_path / "no-nvcc"),
              "KERNELEVOLVE_NATIVE_CACHE": str(tmp_path / "cache")}  # fmt: skip
    variant = next(p.stem for p in pkg.glob("variant_*.py"))
    out = run_script(tmp_path, BUILT_CUDA_CHECK, "built", bare=True, env=deploy)
    assert not out["kernelevolve"] and out["warnings"] == [], out
    assert out["variants"] == [variant] and out["wide"] == [variant, True] and out["launches"] == 1
    assert out["decode"] == ["reference", True]
    out = run_script(tmp_path, BUILT_CUDA_CHECK, "source", bare=True, env=deploy)
    assert out["variants"] == [] and out["launches"] == 0 and out["warnings"], out
    assert out["wide"] == ["reference", True]
