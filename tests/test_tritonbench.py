"""The tritonbench adapter (issue L): a spec written from a tritonbench operator.

tritonbench is not installed here, and must not be: each test writes a FAKE `tritonbench` package
into tmp_path and puts it on sys.path. The fake is shaped like the real one (meta-pytorch/tritonbench)
where the adapter and the spec it writes touch it: `tritonbench.operators.load_opbench_by_name` and
`list_operators` over the folders of `tritonbench/operators/`, `tritonbench.utils.triton_op` with
`register_benchmark(baseline=...)` filling `REGISTERED_BENCHMARKS` / `BASELINE_BENCHMARKS` under the
operator's folder name, `BenchmarkOperator(tb_args, extra_args)` whose construction seeds the random
generators and pins `torch.manual_seed` (as `env_utils.set_random_seed` does) and counts the inputs
(`__post__init__`), `tritonbench.utils.parser.get_parser(args)`, and operators whose benchmarks return
zero-argument callables and whose `get_input_iter()` yields tuples (softmax, layer_norm with a
constant shape and a scalar) or dicts (vector_add) made on `self.device`.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from kernelevolve.cli import app
from kernelevolve.errors import KernelevolveError, SpecError
from kernelevolve.spec import import_spec_module, load_spec
from kernelevolve.tritonbench import shape_name, write_spec

FAKE = {
    "tritonbench/__init__.py": "",
    "tritonbench/utils/__init__.py": "",
    "tritonbench/utils/triton_op.py": """
        import random
        from collections import OrderedDict
        from dataclasses import dataclass
        from enum import Enum

        import torch

        REGISTERED_BENCHMARKS = {}
        BASELINE_BENCHMARKS = {}
        MAIN_RANDOM_SEED = 1337


        @dataclass
        class BenchmarkOperatorBackend:
            name: str
            label: str
            baseline: bool = False
            enabled: bool = True
            fwd_only: bool = False


        class Mode(Enum):
            FWD = "fwd"
            BWD = "bwd"


        def _find_op_name_from_module_path(module_path):
            return module_path.partition("tritonbench.operators.")[2].split(".")[0]


        def set_random_seed():
            def deterministic_torch_manual_seed(*args, **kwargs):
                from torch._C import default_generator
                return default_generator.manual_seed(MAIN_RANDOM_SEED)

            torch.manual_seed(MAIN_RANDOM_SEED)
            random.seed(MAIN_RANDOM_SEED)
            torch.manual_seed = deterministic_torch_manual_seed


        def register_benchmark(operator_name=None, func_name=None, baseline=False, enabled=True,
                               fwd_only=False, label=None):
            def decorator(function):
                op_name = operator_name or _find_op_name_from_module_path(function.__module__)
                fn_name = func_name or function.__name__
                REGISTERED_BENCHMARKS.setdefault(op_name, OrderedDict())[fn_name] = (
                    BenchmarkOperatorBackend(fn_name, label or fn_name, baseline, enabled, fwd_only))
                if baseline:
                    BASELINE_BENCHMARKS[op_name] = fn_name

                def _inner(self, *args, **kwargs):
                    return function(self, *args, **kwargs)

                return _inner

            return decorator


        class PostInitProcessor(type):
            def __call__(cls, *args, **kwargs):
                obj = type.__call__(cls, *args, **kwargs)
                obj.__post__init__()
                return obj


        class BenchmarkOperator(metaclass=PostInitProcessor):
            mode = Mode.FWD
            device = "cuda"
            DEFAULT_PRECISION = "bypass"

            def __init__(self, tb_args, extra_args=None):
                set_random_seed()
                self.name = _find_op_name_from_module_path(self.__class__.__module__)
                self.tb_args = tb_args
                assert tb_args.mode in ("fwd", "bwd")
                self.mode = Mode(tb_args.mode)
                self.device = tb_args.device
                self.extra_args = extra_args
                self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(tb_args.precision)
                if tb_args.baseline:
                    BASELINE_BENCHMARKS[self.name] = tb_args.baseline

            def __post__init__(self):
                self._available_num_inputs = sum(1 for _ in self.get_input_iter())

            def get_input_iter(self):
                raise NotImplementedError("Each operator must implement its own input iterator.")
    """,
    "tritonbench/utils/parser.py": """
        import argparse


        def get_parser(args=None):
            parser = argparse.ArgumentParser(allow_abbrev=False)
            parser.add_argument("--op", type=str, required=False)
            parser.add_argument("--mode", choices=["fwd", "bwd", "fwd_bwd", "fwd_no_grad"], default="fwd")
            parser.add_argument("--precision", "--dtype", default="bypass")
            parser.add_argument("--device", "-d", default="cuda", choices=["cuda", "cpu"])
            parser.add_argument("--baseline", type=str, default=None)
            parser.parse_known_args(args)
            return parser
    """,
    "tritonbench/operators/__init__.py": "from .op import list_operators, load_opbench_by_name\n",
    "tritonbench/operators/op.py": """
        import importlib
        import pathlib


        def list_operators():
            here = pathlib.Path(__file__).parent
            return sorted(p.name for p in here.iterdir() if (p / "__init__.py").is_file())


        def load_opbench_by_name(op_name):
            found = [n for n in list_operators() if n.lower() == op_name.lower()]
            if not found:
                raise RuntimeError(f"{op_name} is not found in the Tritonbench operator list.")
            module = importlib.import_module(f"..{found[0]}", package=__name__)
            Operator = getattr(module, "Operator", None)
            if Operator is not None and not hasattr(Operator, "name"):
                Operator.name = found[0]
            return Operator
    """,
    "tritonbench/operators/softmax/__init__.py": "from .operator import Operator\n",
    "tritonbench/operators/softmax/operator.py": """
        import torch

        from tritonbench.utils.triton_op import BenchmarkOperator, register_benchmark


        class Operator(BenchmarkOperator):
            @register_benchmark()
            def log_softmax(self, x):  # not the baseline: a different result
                return lambda: torch.log_softmax(x, dim=1)

            @register_benchmark(baseline=True)
            def naive_softmax(self, x):
                def _inner():
                    z = torch.exp(x - x.max(dim=1)[0][:, None])
                    return z / z.sum(dim=1)[:, None]

                return _inner

            def get_input_iter(self):
                for M, N in [(8, 16), (8, 32), (4, 64)]:
                    yield (torch.randn([M, N], dtype=self.dtype, device=self.device),)
    """,
    "tritonbench/operators/layer_norm/__init__.py": "from .operator import Operator\n",
    "tritonbench/operators/layer_norm/operator.py": """
        import torch
        import torch.nn.functional as F

        from tritonbench.utils.triton_op import BenchmarkOperator, register_benchmark


        class Operator(BenchmarkOperator):
            @register_benchmark(baseline=True)
            def torch_layer_norm(self, *args):
                return lambda: F.layer_norm(*args)

            def get_input_iter(self):
                for N in (16, 32):
                    x = -2.3 + 0.5 * torch.randn((8, N), dtype=self.dtype, device=self.device)
                    x.requires_grad_()
                    w = torch.rand((N,), dtype=self.dtype, device=self.device, requires_grad=True)
                    b = torch.rand((N,), dtype=self.dtype, device=self.device, requires_grad=True)
                    yield (x, (N,), w, b, 1e-5)
    """,
    "tritonbench/operators/vector_add/__init__.py": "from .operator import Operator\n",
    "tritonbench/operators/vector_add/operator.py": """
        import torch

        from tritonbench.utils.triton_op import BenchmarkOperator, register_benchmark


        class Operator(BenchmarkOperator):
            @register_benchmark(baseline=True)
            def torch_add(self, x, y):
                return lambda: x + 2 * y

            def get_input_iter(self):
                for size in (64, 128):
                    yield {"y": torch.rand(size, device=self.device), "x": torch.rand(size, device=self.device)}
    """,
    "tritonbench/operators/nobase/__init__.py": "from .operator import Operator\n",
    "tritonbench/operators/nobase/operator.py": """
        import torch

        from tritonbench.utils.triton_op import BenchmarkOperator, register_benchmark


        class Operator(BenchmarkOperator):
            @register_benchmark()
            def first(self, x):
                return lambda: x + 1

            @register_benchmark()
            def second(self, x):
                return lambda: x * 3

            def get_input_iter(self):
                yield (torch.randn(4, 8, device=self.device),)
    """,
}


def _drop_fake_modules() -> None:
    for name in [n for n in sys.modules if n == "tritonbench" or n.startswith("tritonbench.")]:
        del sys.modules[name]


@pytest.fixture
def fake_tritonbench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "site"
    for rel, text in FAKE.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    # building an operator pins torch.manual_seed: put the real one back whatever the adapter does
    monkeypatch.setattr(torch, "manual_seed", torch.manual_seed)
    _drop_fake_modules()
    monkeypatch.syspath_prepend(str(root))
    yield root
    _drop_fake_modules()


def _module(path: Path) -> Any:
    return import_spec_module(path)


def _forward(module: Any, case: int, inputs: list[Any]) -> Any:
    return module.Model(*module.get_init_inputs(case=case))(*inputs)


def test_softmax_spec_loads_with_a_shape_per_input_and_calls_the_baseline(
    fake_tritonbench: Path, tmp_path: Path
) -> None:
    path = write_spec("softmax", tmp_path / "softmax.py", inputs=2)
    spec = load_spec(path)
    assert spec.names == ["8x16", "8x32"]  # the first two of three examples
    assert [s.params for s in spec.shapes] == [{"case": 0}, {"case": 1}]
    assert spec.inputs["8x32"][0].shape == [8, 32] and spec.outputs["8x32"][0].shape == [8, 32]
    source = path.read_text()
    assert "tritonbench's operator softmax" in source and "BASELINE = 'naive_softmax'" in source
    module = _module(path)
    for case in (0, 1):
        torch.manual_seed(3)
        (x,) = module.get_inputs(case=case)
        torch.testing.assert_close(_forward(module, case, [x]), torch.softmax(x, dim=1))


def test_seeds_change_the_inputs_even_after_tritonbench_pinned_manual_seed(
    fake_tritonbench: Path, tmp_path: Path
) -> None:
    module = _module(write_spec("softmax", tmp_path / "softmax.py", inputs=3))
    draws = {}
    for seed in (1, 2, 1):
        torch.manual_seed(seed)
        draws.setdefault(seed, []).append(module.get_inputs(case=2)[0])
    assert draws[1][0].shape == (4, 64)
    assert not torch.equal(draws[1][0], draws[2][0])
    assert torch.equal(draws[1][0], draws[1][1])  # a seed's draw is the same every time
    assert torch.manual_seed(5) is not None and not torch.equal(torch.randn(3), torch.randn(3))


def test_the_harness_device_is_where_inputs_are_made(fake_tritonbench: Path, tmp_path: Path) -> None:
    module = _module(write_spec("softmax", tmp_path / "softmax.py", inputs=1))
    with torch.device("meta"):
        (x,) = module.get_inputs(case=0)
    assert x.is_meta and x.shape == (8, 16)


def test_constants_are_kept_out_of_the_inputs_and_grads_detached(
    fake_tritonbench: Path, tmp_path: Path
) -> None:
    path = write_spec("layer_norm", tmp_path / "ln.py", inputs=5)
    spec = load_spec(path)
    assert spec.names == ["8x16_16", "8x32_32"]  # the iterator has two examples
    assert [str(t) for t in spec.inputs["8x32_32"]] == [
        "float32[8, 32]", "float32[32]", "float32[32]", "1e-05"
    ]  # fmt: skip
    module = _module(path)
    torch.manual_seed(0)
    inputs = module.get_inputs(case=1)
    assert not any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
    x, w, b, eps = inputs
    torch.testing.assert_close(_forward(module, 1, inputs), F.layer_norm(x, (32,), w, b, eps))


def test_dict_examples_are_passed_by_keyword(fake_tritonbench: Path, tmp_path: Path) -> None:
    module = _module(write_spec("vector_add", tmp_path / "add.py"))
    assert load_spec(tmp_path / "add.py").names == ["64", "128"]
    torch.manual_seed(0)
    y, x = module.get_inputs(case=1)  # the example's order: y, then x
    torch.testing.assert_close(_forward(module, 1, [y, x]), x + 2 * y)


def test_baseline_option_picks_another_benchmark(fake_tritonbench: Path, tmp_path: Path) -> None:
    module = _module(write_spec("softmax", tmp_path / "s.py", inputs=1, baseline="log_softmax"))
    (x,) = module.get_inputs(case=0)
    torch.testing.assert_close(_forward(module, 0, [x]), torch.log_softmax(x, dim=1))
    module = _module(write_spec("nobase", tmp_path / "n.py", baseline="second"))
    (x,) = module.get_inputs(case=0)
    torch.testing.assert_close(_forward(module, 0, [x]), x * 3)


@pytest.mark.parametrize(
    ("operator", "baseline", "message", "hint"),
    [
        (
            "softmaks",
            None,
            "no operator 'softmaks'",
            "did you mean softmax? its 4 operators: layer_norm, nobase",
        ),
        (
            "nobase",
            None,
            "registers no baseline",
            "--baseline NAME; its registered benchmarks: first, second",
        ),
        ("softmax", "triton_softmax", "no benchmark 'triton_softmax'", "log_softmax, naive_softmax"),
    ],
)
def test_clear_errors(
    fake_tritonbench: Path, tmp_path: Path, operator: str, baseline: str | None, message: str, hint: str
) -> None:
    with pytest.raises(KernelevolveError) as caught:
        write_spec(operator, tmp_path / "x.py", baseline=baseline)
    assert message in caught.value.message and hint in (caught.value.hint or "")
    assert not (tmp_path / "x.py").exists()


def test_missing_tritonbench_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tritonbench", None)  # not importable, even where installed
    with pytest.raises(KernelevolveError) as caught:
        write_spec("softmax", tmp_path / "x.py")
    assert "tritonbench is not importable" in caught.value.message
    assert "pip install tritonbench" in (caught.value.hint or "")


def test_tritonbench_arguments_reach_the_operator(fake_tritonbench: Path, tmp_path: Path) -> None:
    """--precision bf16 makes the operator draw bf16 tensors: the spec's policy is then `low`."""
    spec = load_spec(write_spec("softmax", tmp_path / "b.py", inputs=1, tb_args=["--precision", "bf16"]))
    assert str(spec.inputs["8x16"][0]) == "bfloat16[8, 16]" and spec.precision == "low"
    assert load_spec(write_spec("softmax", tmp_path / "f.py", inputs=1)).precision == "strict_fp32"


def test_an_operator_that_cannot_draw_its_inputs_says_where(
    fake_tritonbench: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = fake_tritonbench / "tritonbench/operators/broken"
    broken.mkdir()
    (broken / "__init__.py").write_text("from .operator import Operator\n")
    (broken / "operator.py").write_text(
        textwrap.dedent("""
        from tritonbench.utils.triton_op import BenchmarkOperator, register_benchmark


        class Operator(BenchmarkOperator):
            @register_benchmark(baseline=True)
            def eager(self, x):
                return lambda: x

            def get_input_iter(self):
                raise ValueError("needs --M")
                yield
    """)
    )
    with pytest.raises(SpecError) as caught:
        write_spec("broken", tmp_path / "x.py")
    assert "ValueError: needs --M" in caught.value.message and "broken/operator.py:11" in caught.value.message


def test_backward_mode_is_refused(fake_tritonbench: Path, tmp_path: Path) -> None:
    with pytest.raises(KernelevolveError, match="not supported"):
        write_spec("softmax", tmp_path / "x.py", tb_args=["--bwd"])


def test_shape_names() -> None:
    assert shape_name([torch.empty(4096, 256)]) == "4096x256"
    assert shape_name([torch.empty(2, 3), torch.empty(3), torch.empty(3)]) == "2x3_3"
    assert shape_name([torch.tensor(1.0)]) == "scalar"


def test_cli_writes_and_shows_the_spec(fake_tritonbench: Path, tmp_path: Path) -> None:
    out = tmp_path / "sm.py"
    args = ["spec", "--from-tritonbench", "softmax", "--out", str(out), "--inputs", "2", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert [s["name"] for s in shown["shapes"]] == ["8x16", "8x32"] and shown["path"] == str(out)
    assert out.is_file()
    again = CliRunner().invoke(app, args)  # an existing file is not overwritten without --force
    assert again.exit_code == 2 and "--force" in again.output
    assert CliRunner().invoke(app, [*args, "--force"]).exit_code == 0


def test_cli_errors(fake_tritonbench: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["spec", "--from-tritonbench", "nobase", "--out", str(tmp_path / "n.py")]
    )
    assert (
        result.exit_code == 2 and "registers no baseline" in result.output and "--baseline" in result.output
    )
    assert CliRunner().invoke(app, ["spec"]).exit_code == 2
    both = CliRunner().invoke(app, ["spec", str(tmp_path / "a.py"), "--from-tritonbench", "softmax"])
    assert both.exit_code == 2 and "--out" in both.output
