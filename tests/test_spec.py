"""Spec loading (`kernelevolve.spec.load_spec`): the KernelBench format, the KERNELEVOLVE
extensions, every error a user can make, and the fingerprint.

Each test writes its own tiny spec into `tmp_path`.
"""

from __future__ import annotations

import dataclasses
import textwrap
import time
from pathlib import Path

import pytest

from kernelevolve.errors import SpecError
from kernelevolve.evaluate.inputs import check_footprint
from kernelevolve.spec import (
    EXTENSION_KEYS,
    Spec,
    TensorInfo,
    call_get_init_inputs,
    fingerprint,
    import_spec_module,
    load_spec,
)

# A plain KernelBench-format file: module-level constants, no extensions. 65536 x 65536 fp32 is
# 16 GiB per tensor: probing must not allocate it.
KERNELBENCH = """
import torch
import torch.nn as nn

batch_size = 65536
dim = 65536


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.softmax(x * self.scale, dim=-1)


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [2.0]
"""

# A spec with the extensions: two weighted shapes; get_init_inputs takes one of the two params.
EXTENDED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.w = nn.Parameter(torch.ones(cols))

    def forward(self, x, alpha):
        return (torch.cumsum(x, dim=-1) * self.w * alpha).sum(dim=0)


def get_inputs(rows=4, cols=8):
    return [torch.randn(rows, cols), 0.5]


def get_init_inputs(cols=8):
    return [cols]


KERNELEVOLVE = {
    "name": "scaled_cumsum",
    "description": "a cumulative sum, scaled",
    "shapes": {
        "serving": {"weight": 3, "params": {"rows": 2, "cols": 16}},
        "small": {"weight": 1, "params": {"rows": 4, "cols": 32}, "flops": 1000, "bytes": 2048},
    },
    "precision": "tf32",
    "dtype": "float64",
    "tolerance": {"rtol": 1e-2, "atol": 1e-3, "rel_norm": 1e-3},
    "backward": True,
    "allow_torch_ops": ["aten.cumsum"],
    "allow_imports": ["numpy"],
    "scaled_range": [0.5, 2.0],
}
"""

TINY = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs(n=8):
    return [torch.randn(n)]


def get_init_inputs():
    return []
"""


def write(tmp_path: Path, source: str, name: str = "op.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def spec_error(path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(path) in info.value.message
    return info.value


# -- the KernelBench format -----------------------------------------------------------------------


def test_plain_kernelbench_file_loads_without_allocating(tmp_path: Path) -> None:
    path = write(tmp_path, KERNELBENCH, "softmax_big.py")
    t0 = time.perf_counter()
    spec = load_spec(path)
    assert time.perf_counter() - t0 < 10  # 16 GiB of randn would take far longer (or fail)
    assert spec.name == "softmax_big"
    assert spec.source == path.read_text()
    assert [(s.name, s.weight, s.params) for s in spec.shapes] == [("default", 1.0, {})]
    assert spec.precision == "strict_fp32" and spec.dtype is None and spec.tolerance is None
    assert not spec.backward and spec.allow_torch_ops == [] and spec.allow_imports == []
    assert spec.inputs == {"default": [TensorInfo([65536, 65536], "float32")]}
    assert spec.outputs == {"default": [TensorInfo([65536, 65536], "float32")]}
    assert spec.param_bytes == {"default": 0}
    assert spec.footprint_bytes("default") == 2 * 65536 * 65536 * 4
    assert len(spec.fingerprint) == 16


def test_without_probe_nothing_is_run(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, KERNELBENCH), probe=False)
    assert spec.inputs == {} and spec.outputs == {}
    assert spec.footprint_bytes("default") is None


def test_get_init_inputs_is_optional(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, TINY.replace("def get_init_inputs():\n    return []\n", "")))
    assert spec.outputs["default"] == [TensorInfo([8], "float32")]


def test_data_dependent_reference_leaves_outputs_unknown(tmp_path: Path) -> None:
    source = TINY.replace("return x * 2", "return x[x > 0]")
    spec = load_spec(write(tmp_path, source))
    assert spec.inputs["default"] == [TensorInfo([8], "float32")]
    assert spec.outputs["default"] is None
    assert spec.footprint_bytes("default") is None


# -- extensions -----------------------------------------------------------------------------------


def test_extensions_are_parsed(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, EXTENDED))
    assert spec.name == "scaled_cumsum"
    assert spec.description == "a cumulative sum, scaled"
    assert spec.names == ["serving", "small"]
    serving, small = spec.shapes
    assert serving.weight == pytest.approx(0.75) and small.weight == pytest.approx(0.25)
    assert serving.params == {"rows": 2, "cols": 16}
    assert (serving.flops, serving.bytes) == (None, None)
    assert (small.flops, small.bytes) == (1000, 2048)
    assert spec.precision == "tf32"
    assert spec.dtype == "float64"
    assert spec.tolerance == {"rtol": 1e-2, "atol": 1e-3, "rel_norm": 1e-3}
    assert spec.backward is True
    assert spec.allow_torch_ops == ["aten.cumsum"]
    assert spec.allow_imports == ["numpy"]
    assert spec.scaled_range == (0.5, 2.0)
    assert spec.shape("small") is small


def test_shape_params_reach_get_inputs_and_get_init_inputs(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, EXTENDED))
    # The spec's dtype applies to floating inputs; the Python scalar is kept as its repr.
    assert {k: [str(t) for t in v] for k, v in spec.inputs.items()} == {
        "serving": ["float64[2, 16]", "0.5"],
        "small": ["float64[4, 32]", "0.5"],
    }
    assert {k: [str(t) for t in v or []] for k, v in spec.outputs.items()} == {
        "serving": ["float64[16]"],
        "small": ["float64[32]"],
    }
    # Model(cols) in float64: get_init_inputs saw `cols` of each shape (and not `rows`, which it
    # does not accept: that would have raised TypeError).
    assert spec.param_bytes == {"serving": 16 * 8, "small": 32 * 8}


def test_get_init_inputs_receives_only_accepted_params(tmp_path: Path) -> None:
    path = write(tmp_path, EXTENDED)
    spec = load_spec(path, probe=False)
    module = import_spec_module(path)
    assert call_get_init_inputs(spec, module, spec.shape("small")) == [32]
    source = EXTENDED.replace(
        "def get_init_inputs(cols=8):\n    return [cols]", "def get_init_inputs(**kw):\n    return [kw]"
    )
    path = write(tmp_path, source, "kw.py")
    spec = load_spec(path, probe=False)
    assert call_get_init_inputs(spec, import_spec_module(path), spec.shape("small")) == [
        {"rows": 4, "cols": 32}
    ]


def test_unknown_shape_name(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, EXTENDED), probe=False)
    with pytest.raises(SpecError) as info:
        spec.shape("huge")
    assert info.value.hint is not None and "serving" in info.value.hint


def test_footprint_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, KERNELBENCH))
    need = spec.footprint_bytes("default")
    assert need == 32 * 2**30
    check_footprint(spec, 4 * need + 1, "cuda:0")  # fits: no error
    with pytest.raises(SpecError) as info:
        check_footprint(spec, 80 * 2**30, "cuda:0")
    assert "'default'" in info.value.message and "cuda:0" in info.value.message
    assert str(spec.path) in info.value.message


def test_footprint_names_the_shape_that_does_not_fit(tmp_path: Path) -> None:
    source = TINY.replace(
        "def get_init_inputs",
        'KERNELEVOLVE = {"shapes": {"s": {"params": {"n": 16}}, "l": {"params": {"n": 2**20}}}}\n\n\ndef get_init_inputs',
    )
    spec = load_spec(write(tmp_path, source))
    with pytest.raises(SpecError, match="shape 'l'"):
        check_footprint(spec, 2**20, "cpu")
    check_footprint(spec, 2**30, "cpu")


# -- errors ---------------------------------------------------------------------------------------


def test_nonexistent_path(tmp_path: Path) -> None:
    spec_error(tmp_path / "missing.py")


def test_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "import torch\n\ndef get_inputs(:\n    pass\n")
    err = spec_error(path)
    assert f"{path}:3:" in err.message and "syntax error" in err.message


def test_import_failure(tmp_path: Path) -> None:
    err = spec_error(write(tmp_path, TINY + "\nraise ImportError('no such backend')\n"))
    assert "ImportError: no such backend" in err.message


def test_missing_model(tmp_path: Path) -> None:
    err = spec_error(write(tmp_path, TINY.replace("class Model(", "class Reference(")))
    assert "Model" in err.message


def test_model_that_is_not_a_module(tmp_path: Path) -> None:
    source = TINY.replace("class Model(nn.Module):", "class Model:")
    assert "nn.Module" in spec_error(write(tmp_path, source)).message
    source = TINY + "\n\nModel = 3\n"
    assert "Model" in spec_error(write(tmp_path, source, "int_model.py")).message


def test_missing_get_inputs(tmp_path: Path) -> None:
    err = spec_error(write(tmp_path, TINY.replace("def get_inputs(", "def make_inputs(")))
    assert "get_inputs" in err.message


def test_get_inputs_raising(tmp_path: Path) -> None:
    source = TINY.replace("return [torch.randn(n)]", "raise ValueError('bad n')")
    err = spec_error(write(tmp_path, source, "raising.py"))
    assert "ValueError: bad n" in err.message
    assert "raising.py:" in err.message  # the frame inside the spec


def test_get_inputs_returning_a_non_list(tmp_path: Path) -> None:
    source = TINY.replace("return [torch.randn(n)]", "return torch.randn(n)")
    err = spec_error(write(tmp_path, source))
    assert "Tensor" in err.message and "list" in err.message


def test_input_that_is_a_string(tmp_path: Path) -> None:
    source = TINY.replace("return [torch.randn(n)]", "return [torch.randn(n), 'mean']")
    err = spec_error(write(tmp_path, source))
    assert "item 1" in err.message and "str" in err.message


def test_inputs_without_a_tensor(tmp_path: Path) -> None:
    source = TINY.replace("return [torch.randn(n)]", "return [1, 2.0]")
    assert "no tensor" in spec_error(write(tmp_path, source)).message


def test_forward_returning_a_dict(tmp_path: Path) -> None:
    source = TINY.replace("return x * 2", "return {'y': x * 2}")
    err = spec_error(write(tmp_path, source))
    assert "dict" in err.message and "forward" in err.message


def test_model_constructor_raising(tmp_path: Path) -> None:
    source = TINY.replace(
        "def get_init_inputs():\n    return []", "def get_init_inputs():\n    return [1, 2]"
    )
    assert "Model(*get_init_inputs())" in spec_error(write(tmp_path, source)).message


def test_unknown_extension_key(tmp_path: Path) -> None:
    err = spec_error(write(tmp_path, TINY + '\nKERNELEVOLVE = {"precison": "tf32"}\n'))
    assert "precison" in err.message
    assert err.hint is not None
    for key in EXTENSION_KEYS:
        assert key in err.hint


@pytest.mark.parametrize(
    ("extension", "words"),
    [
        ('{"precision": "fp8"}', ["precision", "'fp8'", "strict_fp32"]),
        ('{"dtype": "int8"}', ["dtype", "'int8'"]),
        ('{"shapes": {"a": {"weight": -1.0}}}', ["'a'", "weight", "positive"]),
        ('{"shapes": {"a": {"weight": 0}}}', ["'a'", "positive"]),
        ('{"shapes": {}}', ["non-empty"]),
        ('{"shapes": {"a": {"size": 3}}}', ["'a'", "weight, params"]),
        ('{"shapes": {"a": {"params": [1, 2]}}}', ["'a'", "params"]),
        ('{"tolerance": {"eps": 1e-3}}', ["tolerance"]),
        ('{"scaled_range": [4.0, 0.25]}', ["scaled_range"]),
        ('["shapes"]', ["must be a dict", "list"]),
    ],
)
def test_invalid_extension(tmp_path: Path, extension: str, words: list[str]) -> None:
    err = spec_error(write(tmp_path, TINY + f"\nKERNELEVOLVE = {extension}\n"))
    for word in words:
        assert word in err.message


# -- fingerprint ----------------------------------------------------------------------------------


def test_fingerprint_is_stable_across_loads(tmp_path: Path) -> None:
    path = write(tmp_path, EXTENDED)
    assert load_spec(path).fingerprint == load_spec(path).fingerprint
    other = write(tmp_path, EXTENDED, "elsewhere.py")
    assert load_spec(other).fingerprint == load_spec(path).fingerprint


def test_fingerprint_ignores_trailing_whitespace(tmp_path: Path) -> None:
    base = load_spec(write(tmp_path, EXTENDED)).fingerprint
    padded = "\n".join(line + "   " for line in EXTENDED.splitlines()) + "\n\n\n"
    assert load_spec(write(tmp_path, padded, "padded.py")).fingerprint == base


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("* alpha)", "* alpha + 0)"),  # the source
        ('"rows": 2, "cols": 16', '"rows": 3, "cols": 16'),  # a shape param
        ('"precision": "tf32"', '"precision": "strict_fp32"'),
        ('"weight": 3', '"weight": 2'),
    ],
)
def test_fingerprint_changes_with_the_problem(tmp_path: Path, old: str, new: str) -> None:
    assert old in EXTENDED
    base = load_spec(write(tmp_path, EXTENDED)).fingerprint
    assert load_spec(write(tmp_path, EXTENDED.replace(old, new), "edited.py")).fingerprint != base


def test_fingerprint_covers_the_parsed_fields(tmp_path: Path) -> None:
    """Not only the source text: the parsed values are part of the key too."""
    spec = load_spec(write(tmp_path, EXTENDED))
    assert fingerprint(spec) == spec.fingerprint
    changed: list[Spec] = [
        dataclasses.replace(spec, precision="strict_fp32"),
        dataclasses.replace(spec, dtype="float32"),
        dataclasses.replace(spec, backward=False),
        dataclasses.replace(spec, tolerance=None),
        dataclasses.replace(
            spec, shapes=[dataclasses.replace(spec.shapes[0], params={"rows": 9, "cols": 16}), spec.shapes[1]]
        ),
    ]
    for other in changed:
        assert fingerprint(other) != spec.fingerprint


# -- surprising behaviour -------------------------------------------------------------------------


def test_allow_torch_ops_must_be_a_list(tmp_path: Path) -> None:
    path = write(tmp_path, TINY + '\nKERNELEVOLVE = {"allow_torch_ops": "aten.cumsum"}\n')
    with pytest.raises(SpecError, match="allow_torch_ops must be a list of strings"):
        load_spec(path, probe=False)


def test_backward_must_be_a_bool(tmp_path: Path) -> None:
    path = write(tmp_path, TINY + '\nKERNELEVOLVE = {"backward": "no"}\n')
    with pytest.raises(SpecError, match="backward must be True or False"):
        load_spec(path, probe=False)
