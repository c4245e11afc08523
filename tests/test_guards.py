"""Static guards (`kernelevolve.evaluate.guards.check_source`): one snippet per rule, and honest
candidates that pass cleanly.

Every adversarial snippet is the honest C candidate below with a few lines changed, so a test that
sees its rule fire also shows that those lines, and nothing else, are what the guard refuses.
"""

from __future__ import annotations

import textwrap

import pytest

from kernelevolve.evaluate.guards import StaticReport, check_source
from kernelevolve.evaluate.verdict import Violation

C_KINDS = {"c", "triton"}  # a CPU-like platform
GPU_KINDS = {"triton", "cuda"}  # a CUDA-like platform

C_HEADER = '''import torch
import torch.nn as nn
from kernelevolve.native import compile_c

_lib = compile_c(r"""
/* y = 2 * x */
void twice(const float* x, float* y, long n) {
    for (long i = 0; i < n; ++i) y[i] = 2.0f * x[i];
}
""")
'''

HONEST_INIT = """
super().__init__()
"""

HONEST_FORWARD = """
x = x.contiguous()
y = torch.empty_like(x)
_lib.twice(x, y, x.numel())
return y
"""

TRITON_SOFTMAX = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * in_stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_stride + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        softmax_kernel[(rows,)](y, x, x.stride(0), y.stride(0), cols, BLOCK=triton.next_power_of_2(cols))
        return y
"""

LOAD_INLINE_CUDA = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = "torch::Tensor twice(torch::Tensor x);"
CUDA = r"""
#include <torch/extension.h>

__global__ void twice_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}

torch::Tensor twice(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    twice_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

_ext = load_inline(name="twice_ext", cpp_sources=CPP, cuda_sources=CUDA, functions=["twice"])


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.twice(x.contiguous())
'''


def _block(body: str, indent: int) -> str:
    return textwrap.indent(textwrap.dedent(body).strip("\n") + "\n", " " * indent)


def c_candidate(forward: str = HONEST_FORWARD, prelude: str = "", init: str = HONEST_INIT) -> str:
    """The honest C candidate with `prelude` (module level) and the bodies of __init__ and forward."""
    return (
        f"{C_HEADER}\n{textwrap.dedent(prelude).strip()}\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self):\n"
        f"{_block(init, 8)}\n"
        "    def forward(self, x):\n"
        f"{_block(forward, 8)}"
    )


def check(source: str, kinds: set[str] = C_KINDS, **kw: object) -> StaticReport:
    return check_source(source, kinds, platform="test", **kw)  # type: ignore[arg-type]


def rules(report: StaticReport) -> set[str]:
    return {v.rule for v in report.violations}


def line_of(source: str, needle: str) -> int:
    hits = [i for i, line in enumerate(source.splitlines(), 1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


def find(report: StaticReport, rule: str) -> list[Violation]:
    found = [v for v in report.violations if v.rule == rule]
    assert found, f"no {rule!r} violation in {[str(v) for v in report.violations]}"
    return found


def assert_flags(source: str, rule: str, needle: str | None = None, **kw: object) -> StaticReport:
    """`rule` fires; with `needle`, on the (single) line that contains it."""
    report = check(source, **kw)  # type: ignore[arg-type]
    assert report.syntax_error is None
    assert not report.ok
    violations = find(report, rule)
    if needle is not None:
        assert line_of(source, needle) in {v.line for v in violations}, [str(v) for v in violations]
    return report


# -- honest candidates ----------------------------------------------------------------------------


def test_honest_c_candidate_passes() -> None:
    report = check(c_candidate(), C_KINDS)
    assert report.ok, [str(v) for v in report.violations]
    assert report.kinds == {"c"}
    assert report.kernel_names == []


def test_honest_triton_candidate_passes() -> None:
    report = check(TRITON_SOFTMAX, GPU_KINDS)
    assert report.ok, [str(v) for v in report.violations]
    assert report.kinds == {"triton"}
    assert report.kernel_names == ["softmax_kernel"]


def test_load_inline_with_cuda_sources_is_a_cuda_candidate() -> None:
    report = check(LOAD_INLINE_CUDA, GPU_KINDS)
    assert report.ok, [str(v) for v in report.violations]
    assert report.kinds == {"cuda"}


def test_load_inline_with_cpp_sources_only_is_a_c_candidate() -> None:
    source = LOAD_INLINE_CUDA.replace("cuda_sources=CUDA, ", "")
    report = check(source, C_KINDS)
    assert report.kinds == {"c"}
    assert report.ok


def test_native_through_the_module_alias_is_found() -> None:
    source = (
        c_candidate()
        .replace("from kernelevolve.native import compile_c", "from kernelevolve import native")
        .replace("_lib = compile_c(", "_lib = native.compile_cuda(")
    )
    report = check(source, GPU_KINDS)
    assert report.ok, [str(v) for v in report.violations]
    assert report.kinds == {"cuda"}


def test_allowed_idioms_pass() -> None:
    """Constant getattr, super().__init__(), re-raising handlers and nn.init in the constructor."""
    source = c_candidate(
        init="""
        super().__init__()
        self.w = nn.Parameter(torch.empty(16))
        self.b = nn.Parameter(torch.randn(16))
        torch.nn.init.normal_(self.w)
        nn.init.zeros_(self.b)
        """,
        forward="""
        rows = getattr(x, "shape")[0]
        try:
            y = torch.empty_like(x)
            _lib.twice(x.contiguous(), y, x.numel())
        except ValueError as exc:
            raise RuntimeError(f"bad input with {rows} rows") from exc
        except Exception:
            raise
        finally:
            pass
        return y
        """,
    )
    report = check(source)
    assert report.ok, [str(v) for v in report.violations]


def test_a_view_through_torch_as_strided_is_glue() -> None:
    """torch.as_strided makes a view (no copy, no compute; the runtime recorder counts it as one): the
    tuner's wrappers take a permuted piece of a projection so. A compute call beside it is still
    flagged."""
    forward = """
    xs = torch.as_strided(x, (x.shape[0] // 2,), (2,), x.storage_offset() + 1)
    y = torch.empty_like(xs)
    _lib.twice(xs.contiguous(), y, y.numel())
    return {tail}
    """
    report = check(c_candidate(forward=forward.format(tail="y")))
    assert report.ok, [str(v) for v in report.violations]
    assert_flags(
        c_candidate(forward=forward.format(tail="torch.exp(y)")), "torch-compute", needle="torch.exp("
    )


# -- syntax and module shape ----------------------------------------------------------------------


def test_syntax_error_is_reported_with_its_line() -> None:
    report = check("import torch\n\ndef forward(self, x:\n    return x\n")
    assert not report.ok
    assert report.syntax_error is not None
    assert "candidate.py:3:" in report.syntax_error
    assert report.violations == []


def test_missing_modelnew() -> None:
    source = c_candidate().replace("class ModelNew(", "class Candidate(")
    report = assert_flags(source, "no-modelnew")
    assert find(report, "no-modelnew")[0].line is None


def test_modelnew_without_forward() -> None:
    source = c_candidate().replace("def forward(self, x):", "def run(self, x):")
    assert_flags(source, "no-modelnew", needle="class ModelNew(")


def test_modelnew_must_be_top_level() -> None:
    head, cls = c_candidate().split("class ModelNew", 1)
    source = head + "def make():\n" + textwrap.indent("class ModelNew" + cls, "    ")
    assert rules(check(source)) == {"no-modelnew"}


def test_no_kernel_at_all() -> None:
    source = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n" + (
        "    def forward(self, x):\n        return torch.empty_like(x)\n"
    )
    report = assert_flags(source, "no-kernel")
    assert report.kinds == set()


def test_c_candidate_on_a_gpu_platform_is_refused() -> None:
    report = check(c_candidate(), GPU_KINDS)
    assert rules(report) == {"platform"}
    message = find(report, "platform")[0].message
    assert "c" in message and "triton" in message and "cuda" in message


def test_triton_kernel_never_launched() -> None:
    source = TRITON_SOFTMAX.replace(
        "        softmax_kernel[(rows,)](y, x, x.stride(0), y.stride(0), cols, "
        "BLOCK=triton.next_power_of_2(cols))\n",
        "",
    )
    assert "softmax_kernel[" not in source
    report = check(source, GPU_KINDS)
    assert rules(report) == {"no-launch"}
    assert "softmax_kernel" in find(report, "no-launch")[0].message


# -- imports --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    ["import os", "import subprocess", "import ctypes", "import numpy as np", "from os import environ"],
)
def test_disallowed_import(statement: str) -> None:
    source = c_candidate(prelude=statement)
    report = assert_flags(source, "import", needle=statement)
    assert "allowed:" in find(report, "import")[0].message


def test_relative_import() -> None:
    assert_flags(c_candidate(prelude="from . import helpers"), "import", needle="from . import")


def test_allow_imports_extends_the_list() -> None:
    source = c_candidate(prelude="import numpy")
    assert "import" in rules(check(source))
    assert check(source, allow_imports=["numpy"]).ok


@pytest.mark.parametrize(
    "statement",
    [
        "import kernelevolve.evaluate.guards",
        "from kernelevolve import evaluate",
        "from kernelevolve import native, evaluate",
        "from kernelevolve.evaluate import verdict",
    ],
)
def test_importing_the_harness(statement: str) -> None:
    assert_flags(c_candidate(prelude=statement), "harness", needle=statement)


# -- torch compute --------------------------------------------------------------------------------


def test_torch_softmax_in_forward() -> None:
    source = c_candidate(forward="return torch.softmax(x, dim=-1)")
    report = assert_flags(source, "torch-compute", needle="torch.softmax(")
    assert "torch.softmax" in find(report, "torch-compute")[0].message


@pytest.mark.parametrize(
    "prelude",
    [
        "import torch.nn.functional as F",
        "from torch.nn import functional as F",
        "F = torch.nn.functional",
    ],
)
def test_functional_through_an_alias(prelude: str) -> None:
    source = c_candidate(prelude=prelude, forward="return F.softmax(x, dim=-1)")
    report = assert_flags(source, "torch-compute", needle="F.softmax(")
    assert "torch.nn.functional.softmax" in find(report, "torch-compute")[0].message


def test_rebinding_torch_nn() -> None:
    source = (
        "import torch\nfrom kernelevolve.native import compile_c\n\n"
        "nn = torch.nn\n_lib = compile_c('void f(float* x) {}')\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return nn.functional.relu(x)\n"
    )
    assert_flags(source, "torch-compute", needle="nn.functional.relu(")


def test_from_torch_import_matmul() -> None:
    source = c_candidate(prelude="from torch import matmul", forward="return matmul(x, x)")
    report = assert_flags(source, "torch-compute", needle="from torch import matmul")
    lines = {v.line for v in find(report, "torch-compute")}
    assert line_of(source, "return matmul(") in lines


def test_matmul_operator() -> None:
    assert_flags(c_candidate(forward="return x @ x.t()"), "torch-compute", needle="x @ x")


def test_tensor_class_method_called_through_torch() -> None:
    assert_flags(c_candidate(forward="return torch.Tensor.matmul(x, x)"), "torch-compute", needle="matmul")


@pytest.mark.parametrize("call", ["torch.linalg.norm(x)", "torch.fft.fft(x)", "torch.special.expit(x)"])
def test_torch_submodule_compute(call: str) -> None:
    assert_flags(c_candidate(forward=f"return {call}"), "torch-compute", needle=call)


def test_cumsum_refused_unless_the_spec_allows_it() -> None:
    source = c_candidate(
        forward="""
        y = torch.empty_like(x)
        _lib.twice(x.contiguous(), y, x.numel())
        return torch.cumsum(y, dim=0)
        """
    )
    assert_flags(source, "torch-compute", needle="torch.cumsum(")
    assert check(source, allow_torch_ops=["aten.cumsum"]).ok
    assert "torch-compute" in rules(check(source, allow_torch_ops=["aten.cumprod"]))


def test_random_init_is_allowed_in_the_constructor_only() -> None:
    init = """
    super().__init__()
    self.w = nn.Parameter(torch.randn(4, 4))
    """
    assert check(c_candidate(init=init)).ok
    source = c_candidate(forward="return x * torch.randn(4, 4)")
    assert_flags(source, "torch-compute", needle="torch.randn(")


def test_global_setters_are_refused_even_in_the_constructor() -> None:
    init = """
    super().__init__()
    torch.set_num_threads(1)
    """
    assert_flags(c_candidate(init=init), "torch-compute", needle="torch.set_num_threads(")


# -- forbidden APIs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("forward", "needle", "name"),
    [
        ("s = torch.cuda.Stream()", "torch.cuda.Stream()", "torch.cuda.Stream"),
        ("e = torch.cuda.Event(enable_timing=True)", "torch.cuda.Event(", "torch.cuda.Event"),
        ("g = torch.cuda.CUDAGraph()", "torch.cuda.CUDAGraph()", "torch.cuda.CUDAGraph"),
        ("return torch.ops.aten._softmax(x, -1, False)", "torch.ops.aten", "torch.ops"),
        ("f = torch.compile(self.forward)", "torch.compile(", "torch.compile"),
        ("torch.manual_seed(0)", "torch.manual_seed(", "torch.manual_seed"),
        ("p = torch._C._get_tracing_state()", "torch._C", "torch._C"),
    ],
)
def test_forbidden_torch_api(forward: str, needle: str, name: str) -> None:
    source = c_candidate(forward=forward + "\nreturn x")
    report = assert_flags(source, "forbidden-api", needle=needle)
    assert any(name in v.message for v in find(report, "forbidden-api"))


def test_event_is_refused_without_a_call() -> None:
    assert_flags(c_candidate(prelude="Event = torch.cuda.Event"), "forbidden-api", needle="Event =")


def test_triton_do_bench() -> None:
    source = TRITON_SOFTMAX.replace(
        "import triton.language as tl\n", "import triton.language as tl\nimport triton.testing\n"
    )
    source = source.replace(
        "        return y\n", "        triton.testing.do_bench(lambda: x)\n        return y\n"
    )
    report = check(source, GPU_KINDS)
    assert "forbidden-api" in rules(report)
    assert line_of(source, "do_bench") in {v.line for v in report.violations}
    source = c_candidate(prelude="from triton.testing import do_bench")
    assert_flags(source, "forbidden-api", needle="from triton.testing import do_bench")


def test_backend_flags_are_refused_and_count_as_patching() -> None:
    source = c_candidate(prelude="torch.backends.cuda.matmul.allow_tf32 = True")
    report = assert_flags(source, "forbidden-api", needle="allow_tf32")
    assert "patching" in rules(report)
    assert find(report, "patching")[0].line == line_of(source, "allow_tf32")


# -- introspection and builtins -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("forward", "needle"),
    [
        ("cls = x.__class__", "x.__class__"),
        ("d = self.__dict__", "self.__dict__"),
        ("b = __builtins__", "__builtins__"),
        ("f = self.forward.__globals__", "__globals__"),
        ("g = (i for i in range(1)).gi_frame", "gi_frame"),
    ],
)
def test_introspection(forward: str, needle: str) -> None:
    assert_flags(c_candidate(forward=forward + "\nreturn x"), "introspection", needle=needle)


@pytest.mark.parametrize(
    ("forward", "needle"),
    [
        ("setattr(torch, 'softmax', lambda t, d: t)", "setattr("),
        ("f = getattr(torch, 'mat' + 'mul')", "getattr("),
        ("exec('y = 1')", "exec("),
        ("v = eval('1 + 1')", "eval("),
        ("h = open('/etc/passwd')", "open("),
        ("m = __import__('os')", "__import__("),
        ("g = globals()", "globals()"),
    ],
)
def test_forbidden_builtin(forward: str, needle: str) -> None:
    assert_flags(c_candidate(forward=forward + "\nreturn x"), "builtin", needle=needle)


def test_getattr_with_a_constant_name_is_allowed() -> None:
    source = c_candidate(forward="n = getattr(x, 'shape')[0]\nreturn x")
    assert "builtin" not in rules(check(source))


# -- the reference --------------------------------------------------------------------------------


def test_subclassing_the_reference() -> None:
    source = c_candidate().replace("class ModelNew(nn.Module):", "class ModelNew(Model):")
    assert_flags(source, "reference", needle="class ModelNew(Model)")


def test_calling_the_reference() -> None:
    assert_flags(c_candidate(forward="return Model()(x)"), "reference", needle="Model()")


# -- patching -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "torch.softmax = lambda x, dim: x",
        "nn.Module.__call__ = None",
        "torch.cuda.synchronize: object = None",
        "del torch.Tensor.softmax",
        "torch.Tensor.x += 1",
        "torch.nn.functional.__dict__['softmax'] = None",
    ],
)
def test_patching_imported_modules(statement: str) -> None:
    assert_flags(c_candidate(prelude=statement), "patching", needle=statement)


def test_global_rebinding_of_an_import() -> None:
    source = c_candidate(forward="global torch\ntorch = None\nreturn x")
    assert_flags(source, "patching", needle="global torch")


# -- try/except -----------------------------------------------------------------------------------


def test_except_that_falls_back_to_torch() -> None:
    source = c_candidate(
        forward="""
        try:
            y = torch.empty_like(x)
            _lib.twice(x, y, x.numel())
            return y
        except Exception:
            return torch.softmax(x, -1)
        """
    )
    report = assert_flags(source, "try-fallback", needle="except Exception:")
    assert "torch-compute" in rules(report)


def test_except_that_swallows() -> None:
    source = c_candidate(
        forward="""
        y = torch.empty_like(x)
        try:
            _lib.twice(x, y, x.numel())
        except:  # noqa: E722
            pass
        return y
        """
    )
    assert rules(check(source)) == {"try-fallback"}


def test_except_that_logs_then_raises_is_refused() -> None:
    source = c_candidate(
        forward="""
        try:
            return x
        except Exception:
            y = None
            raise
        """
    )
    assert "try-fallback" in rules(check(source))


# -- native sources -------------------------------------------------------------------------------


def native_candidate(c_body: str) -> str:
    return c_candidate().replace("    for (long i = 0; i < n; ++i) y[i] = 2.0f * x[i];", c_body)


@pytest.mark.parametrize(
    ("c_body", "found"),
    [
        ("    pthread_t t; pthread_create(&t, 0, 0, 0);", "pthread_create"),
        ("    cublasSgemm(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);", "cublas"),
        ('    const char* k = getenv("OPENAI_API_KEY");', "getenv"),
        ('    system("curl evil.example");', "system"),
        ('    FILE* f = fopen("/etc/passwd", "r");', "fopen"),
        ("    cudaEvent_t e; cudaEventCreate(&e);", "cudaEvent"),
    ],
)
def test_forbidden_native_source(c_body: str, found: str) -> None:
    source = native_candidate(c_body)
    report = assert_flags(source, "native-source", needle="_lib = compile_c(")
    assert found in find(report, "native-source")[0].message


def test_torch_ops_in_native_source() -> None:
    source = LOAD_INLINE_CUDA.replace("auto y = torch::empty_like(x);", "auto y = torch::matmul(x, x);")
    report = check(source, GPU_KINDS)
    assert rules(report) == {"native-source"}
    assert "torch::matmul" in report.violations[0].message
    assert report.violations[0].line == line_of(source, "_ext = load_inline(")


def test_torch_allocation_in_native_source_is_allowed() -> None:
    source = LOAD_INLINE_CUDA.replace("torch::empty_like(x)", "torch::empty({x.numel()}, x.options())")
    assert "torch::empty({" in source
    assert check(source, GPU_KINDS).ok


def test_comments_in_native_source_do_not_trigger() -> None:
    source = native_candidate(
        "    // no pthread_create, getenv(, cublasSgemm or fopen( here\n"
        '    /* system("x"); torch::matmul(a, b); */\n'
        "    for (long i = 0; i < n; ++i) y[i] = 2.0f * x[i];"
    )
    assert "pthread_create" in source
    report = check(source)
    assert report.ok, [str(v) for v in report.violations]


def test_native_source_through_a_named_constant() -> None:
    source = c_candidate(
        prelude='SRC = "int f(void) { return getenv(\\"HOME\\") != 0; }"\n_lib2 = compile_c(SRC)'
    )
    report = assert_flags(source, "native-source", needle="_lib2 = compile_c(SRC)")
    assert "getenv" in find(report, "native-source")[0].message


# -- regressions: gaps found in review, now closed ---------------------------------


@pytest.mark.parametrize(
    "forward",
    [
        "torch.os.system('curl evil.example')",
        "k = torch.os.environ['OPENAI_API_KEY']",
        "torch.builtins.exec('import os')",
        "torch.ctypes.CDLL(None).system(b'true')",
    ],
)
def test_os_reached_through_torch_is_refused(forward: str) -> None:
    assert not check(c_candidate(forward=forward + "\nreturn x")).ok


def test_torch_multiprocessing_import_is_refused() -> None:
    assert "import" in rules(check(c_candidate(prelude="import torch.multiprocessing as mp")))


def test_inplace_matmul_operator_is_refused() -> None:
    assert "torch-compute" in rules(check(c_candidate(forward="y = x\ny @= x.t()\nreturn y")))


def test_getattr_of_a_torch_op_with_a_constant_name_is_refused() -> None:
    assert "torch-compute" in rules(check(c_candidate(forward="return getattr(torch, 'matmul')(x, x)")))


def test_torch_compute_in_a_helper_constructor_is_refused() -> None:
    prelude = """
    class Helper:
        def __init__(self, x):
            self.y = torch.softmax(x, -1)
    """
    assert "torch-compute" in rules(check(c_candidate(prelude=prelude, forward="return Helper(x).y")))


def test_annotated_native_source_constant_is_scanned() -> None:
    source = c_candidate(
        prelude='SRC: str = "int f(void) { return getenv(\\"HOME\\") != 0; }"\n_lib2 = compile_c(SRC)'
    )
    assert "native-source" in rules(check(source))


def test_importing_a_dtype_from_torch_is_allowed() -> None:
    source = c_candidate(prelude="from torch import float32", forward="return x.to(float32)")
    assert check(source).ok
