"""kernelevolve.native: C/C++ built with the system compiler and called through ctypes with tensors.

CPU tests need `cc`/`c++` (gcc or clang with OpenMP). One test builds CUDA source without a GPU (skipped
without nvcc); the `gpu` tests run kernels and are skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from kernelevolve import native
from kernelevolve.native import NativeCompileError, compile_c, compile_cuda, parse_signatures

KERNELS = r"""
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* out = x + y */
void vadd(const float* x, const float *y, float * out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

// out[r] = sum of row r of a (rows x cols, row-major)
void rowsum(const float* a, float* out, int rows, int cols) {
    for (int r = 0; r < rows; ++r) {
        float s = 0.0f;
        for (int c = 0; c < cols; ++c) s += a[r * cols + c];
        out[r] = s;
    }
}

void axpb(float a, const float* x, float b, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b;
}

double dot(const double* x, const double* y, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) s += x[i] * y[i];
    return s;
}

int first_negative(const int32_t* x, unsigned int n, bool from_end) {
    for (unsigned int k = 0; k < n; ++k) {
        unsigned int i = from_end ? n - 1 - k : k;
        if (x[i] < 0) return (int)i;
    }
    return -1;
}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "native-cache"
    monkeypatch.setenv("KERNELEVOLVE_NATIVE_CACHE", str(cache))
    return cache


@pytest.fixture
def lib() -> native.NativeLibrary:
    return compile_c(KERNELS)


@pytest.mark.parametrize("n", [1, 7, 4096])
def test_vector_add_matches_torch(lib: native.NativeLibrary, n: int) -> None:
    x, y = torch.randn(n), torch.randn(n)
    out = torch.full((n,), float("nan"))
    assert lib.vadd(x, y, out, n) is None
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 5), (64, 257)])
def test_row_sum_matches_torch(lib: native.NativeLibrary, rows: int, cols: int) -> None:
    a = torch.randn(rows, cols)
    out = torch.empty(rows)
    lib.rowsum(a, out, rows, cols)
    torch.testing.assert_close(out, a.sum(dim=1), rtol=1e-5, atol=1e-5)


def test_scalar_arguments_and_return_values(lib: native.NativeLibrary) -> None:
    n = 1000
    x, y = torch.randn(n), torch.empty(n)
    lib.axpb(2.5, x, -0.75, y, n)  # a float, b float, n int64
    torch.testing.assert_close(y, 2.5 * x - 0.75)
    lib.axpb(3, x, 1, y, n)  # ints are fine where floats are expected
    torch.testing.assert_close(y, 3 * x + 1)

    a, b = torch.randn(33, dtype=torch.float64), torch.randn(33, dtype=torch.float64)
    assert lib.dot(a, b, 33) == pytest.approx(torch.dot(a, b).item(), rel=1e-12)

    v = torch.tensor([5, -1, 3, -7, 2], dtype=torch.int32)
    assert lib.first_negative(v, 5, False) == 1
    assert lib.first_negative(v, 5, True) == 3
    assert lib.first_negative(v[:1], 1, False) == -1


def test_int64_arguments_keep_their_high_bits() -> None:
    lib = compile_c(
        "#include <stdint.h>\nint64_t echo(int64_t v, unsigned long long u) { return v + (int64_t)(u >> 40); }"
    )
    assert lib.echo(-(2**40) - 3, 2**41) == -(2**40) - 3 + 2
    assert lib.echo(2**62, 0) == 2**62


def test_bad_scalars_are_refused(lib: native.NativeLibrary) -> None:
    x, out = torch.randn(4), torch.empty(4)
    with pytest.raises(TypeError, match="integer"):
        lib.vadd(x, x, out, 4.0)
    with pytest.raises(OverflowError):
        lib.rowsum(x, out, 2**31, 1)
    with pytest.raises(TypeError, match="not a tensor"):
        lib.vadd(x, x, out, torch.tensor(4))
    with pytest.raises(TypeError, match="number"):
        lib.axpb("2", x, 0.0, out, 4)


def test_python_int_for_a_pointer_is_refused(lib: native.NativeLibrary) -> None:
    x, out = torch.randn(4), torch.empty(4)
    with pytest.raises(TypeError, match="raw addresses are refused"):
        lib.vadd(x.data_ptr(), x, out, 4)
    with pytest.raises(TypeError, match=r"argument 3 `float \* out`.*torch\.Tensor"):
        lib.vadd(x, x, [0.0] * 4, 4)


def test_tensor_on_another_device_is_refused(lib: native.NativeLibrary) -> None:
    x = torch.randn(4)
    with pytest.raises(ValueError, match="meta"):
        lib.vadd(x, x, torch.empty(4, device="meta"), 4)


def test_wrong_argument_count(lib: native.NativeLibrary) -> None:
    x = torch.randn(4)
    with pytest.raises(TypeError, match=r"takes 4 arguments, got 3"):
        lib.vadd(x, x, x)
    with pytest.raises(TypeError, match=r"takes 4 arguments, got 5"):
        lib.vadd(x, x, x, 4, 4)


def test_missing_symbol_lists_exports(lib: native.NativeLibrary) -> None:
    with pytest.raises(AttributeError) as info:
        _ = lib.vector_add
    message = str(info.value)
    assert "vector_add" in message
    for name in ("vadd", "rowsum", "axpb", "dot", "first_negative"):
        assert name in message
    assert not hasattr(lib, "__wrapped__")


def test_launch_count_counts_completed_calls(lib: native.NativeLibrary) -> None:
    x, out = torch.randn(8), torch.empty(8)
    native.reset_launch_count()
    assert native.launch_count() == 0
    lib.vadd(x, x, out, 8)
    lib.rowsum(x, out, 2, 4)
    assert native.launch_count() == 2
    with pytest.raises(TypeError):
        lib.vadd(x, x, out)  # refused before the call: not a launch
    assert native.launch_count() == 2
    native.reset_launch_count()
    assert native.launch_count() == 0


def test_cache_hit_skips_the_compiler(monkeypatch: pytest.MonkeyPatch, private_cache: Path) -> None:
    commands: list[list[str]] = []
    real_popen = subprocess.Popen

    def recording_popen(cmd: list[str], *args: Any, **kwargs: Any) -> Any:
        commands.append(list(cmd))
        return real_popen(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    first = compile_c(KERNELS)
    assert len(commands) == 1
    cmd = commands[0]
    assert {"-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-std=c11"} <= set(cmd)
    assert "-ffast-math" not in cmd
    assert len(list(private_cache.glob("*.so"))) == 1

    def no_compiler(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the compiler ran on a cache hit: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_compiler)
    monkeypatch.setattr(subprocess, "run", no_compiler)
    second = compile_c(KERNELS)
    assert second.path == first.path
    x, out = torch.randn(5), torch.empty(5)
    second.vadd(x, x, out, 5)
    torch.testing.assert_close(out, 2 * x)

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    changed = compile_c(KERNELS.replace("out[i] = x[i] + y[i]", "out[i] = x[i] - y[i]"))
    assert len(commands) == 2 and changed.path != first.path
    changed.vadd(x, x, out, 5)
    torch.testing.assert_close(out, torch.zeros(5))
    compile_c(KERNELS, flags=["-ffast-math"])  # other flags: another build
    assert len(commands) == 3 and commands[-1][-1] == "-ffast-math"


def test_syntax_error_names_candidate_file_and_line(private_cache: Path) -> None:
    source = "#include <stdint.h>\n\nvoid broken(float* x, int64_t n) {\n    x[0] = 1.0f +;\n}\n"
    with pytest.raises(NativeCompileError) as info:
        compile_c(source)
    message = str(info.value)
    assert "candidate.c:4:" in message
    assert "-O3" in message  # the command is shown
    assert str(private_cache) not in message  # no temporary paths
    assert isinstance(info.value, RuntimeError)
    assert not list(private_cache.glob("*.so")) and not list(private_cache.glob(".build-*"))


def test_long_compiler_output_is_shortened() -> None:
    source = "void f(void) {\n" + "".join(f"    undeclared_{i} = 1;\n" for i in range(100)) + "}\n"
    with pytest.raises(NativeCompileError) as info:
        compile_c(source)
    message = str(info.value)
    assert "lines omitted" in message
    assert "candidate.c:2:" in message  # the first error is kept
    assert len(message.splitlines()) < 50


def test_compile_timeout() -> None:
    with pytest.raises(NativeCompileError, match="timed out"):
        compile_c(KERNELS + "\n/* fresh key */\n", timeout_s=0.001)


def test_missing_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/bin/cc")
    with pytest.raises(NativeCompileError, match=r"\$CC='/nonexistent/bin/cc'") as info:
        compile_c(KERNELS)
    assert "install" in str(info.value)
    monkeypatch.setenv("NVCC", "no-such-nvcc-anywhere")
    with pytest.raises(NativeCompileError, match="nvcc compiler not found"):
        compile_cuda("", arch="sm_80")


def test_cpp_source_exports_only_extern_c() -> None:
    source = r"""
#include <algorithm>
#include <cstdint>
#include <vector>

template <typename T> static T clamp_to(T v, T lo, T hi) { return std::min(std::max(v, lo), hi); }
float helper(float v) { return v; }  // C++ linkage: mangled, not callable

extern "C" {
void clamp(const float* x, float* out, std::int64_t n, float lo, float hi) {
    std::vector<float> tmp(x, x + n);
    for (std::int64_t i = 0; i < n; ++i) out[i] = clamp_to(tmp[i], lo, hi);
}
}
extern "C" int answer() { return 42; }
"""
    lib = compile_c(source, lang="c++")
    assert set(lib.signatures) == {"clamp", "answer"}
    x, out = torch.randn(100) * 3, torch.empty(100)
    lib.clamp(x, out, 100, -1.0, 0.5)
    torch.testing.assert_close(out, x.clamp(-1.0, 0.5))
    assert lib.answer() == 42
    with pytest.raises(AttributeError, match=r"answer, clamp"):
        _ = lib.helper


def test_openmp_parallel_for() -> None:
    source = r"""
#include <omp.h>
#include <stdint.h>
int max_threads(void) { return omp_get_max_threads(); }
double scaled_sum(const float* x, float* y, float s, int64_t n) {
    double total = 0.0;
    #pragma omp parallel for reduction(+:total)
    for (int64_t i = 0; i < n; ++i) { y[i] = s * x[i]; total += x[i]; }
    return total;
}
"""
    lib = compile_c(source)
    assert lib.max_threads() >= 1
    x, y = torch.rand(1 << 20), torch.empty(1 << 20)
    total = lib.scaled_sum(x, y, 0.5, x.numel())
    torch.testing.assert_close(y, 0.5 * x)
    assert total == pytest.approx(x.double().sum().item(), rel=1e-9)


def test_unmappable_signature_fails_at_lookup() -> None:
    source = "struct P { int a; };\nint by_value(struct P p) { return p.a; }\nfloat* leak(float* x) { return x; }\nint ok(void) { return 1; }\n"
    lib = compile_c(source)
    assert lib.ok() == 1
    with pytest.raises(NativeCompileError, match=r"by_value: parameter 1 `struct P p`"):
        _ = lib.by_value
    with pytest.raises(NativeCompileError, match=r"leak: its return type `float \*`"):
        _ = lib.leak


def test_signature_parser_on_tricky_declarations() -> None:
    source = r"""
#include <stddef.h>
#include <stdint.h>
#define SQUARE(x) ((x) * (x)) \
    /* continued { */
static int helper(int x) { return SQUARE(x); }   /* not exported */
static inline float fast(float x) { return x; }
// void commented_out(float* x) {}
/* void block_commented(float* x) {
} */
const char* banner = "void in_string(float* x) {";
struct config { int n; float eps; };
typedef struct { double v; } wrapped;

void spaced(const float*x, const float * y,float *out, unsigned int n) { (void)banner; }
__attribute__((visibility("default"))) void
multi_line(
    const int64_t *restrict idx,   // pointer to int64
    void* scratch,
    long long count,
    size_t bytes,
    double scale,
    _Bool flag
) {
    if (flag) { for (long long i = 0; i < count; ++i) {} }
}
unsigned noargs(void) { return 1u; }
int empty_params() { return 0; }
float arrays(float x[], const float y[4], int n) { return 0.0f; }
"""
    sigs = parse_signatures(source)
    assert set(sigs) == {"spaced", "multi_line", "noargs", "empty_params", "arrays"}
    assert sigs["spaced"].argtypes == ("ptr", "ptr", "ptr", "u32")
    assert sigs["spaced"].restype == "void"
    assert sigs["multi_line"].argtypes == ("ptr", "ptr", "i64", "u64", "f64", "bool")
    assert sigs["multi_line"].params[0] == "const int64_t *restrict idx"
    assert sigs["noargs"] == native.Signature("noargs", "u32", (), ())
    assert sigs["empty_params"].argtypes == () and sigs["empty_params"].restype == "i32"
    assert sigs["arrays"].argtypes == ("ptr", "ptr", "i32") and sigs["arrays"].restype == "f32"
    assert all(s.error is None for s in sigs.values())
    lib = compile_c(source)  # and the compiler agrees that it is valid C
    assert lib.noargs() == 1 and lib.arrays(torch.empty(1), torch.empty(4), 1) == 0.0
    with pytest.raises(AttributeError, match="spaced"):
        _ = lib.helper


def test_signature_parser_on_cuda_declarations() -> None:
    source = r"""
#include <cuda_bf16.h>
template <int BLOCK> __global__ void __launch_bounds__(256, 2) kernel(const __nv_bfloat16* x, float* y) {}
__device__ float dev(float x) { return x; }
__global__ void plain_kernel(float* y, int n) {}
namespace detail { extern "C" void hidden_in_namespace(float* x) {} }
void cpp_linkage(float* x, int n) {}
extern "C" __host__ void launch(const __nv_bfloat16* x, float* y, int n, cudaStream_t stream) {
    plain_kernel<<<1, 256, 0, stream>>>(y, n);
}
extern "C" {
    float peek(const float *p) { return 0.0f; }
    void bad_stream(cudaStream_t s, int n) {}
}
"""
    sigs = parse_signatures(source, "cuda")
    assert set(sigs) == {"launch", "peek", "bad_stream"}
    assert sigs["launch"].argtypes == ("ptr", "ptr", "i32", "stream")
    assert sigs["peek"].restype == "f32"
    error = sigs["bad_stream"].error
    assert error is not None and "bad_stream" in error and "cudaStream_t s" in error


def test_module_imports_without_torch() -> None:
    code = "import sys, kernelevolve.native; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


CUDA_ADD = r"""
__global__ void add_kernel(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}
extern "C" void add(const float* x, const float* y, float* out, int n, cudaStream_t stream) {
    add_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, y, out, n);
}
extern "C" void bad_launch(float* out, int n) {
    add_kernel<<<1, 4096>>>(out, out, out, n);  // more threads per block than any GPU allows
}
"""


def _have_nvcc() -> bool:
    return bool(shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists())


@pytest.mark.skipif(not _have_nvcc(), reason="needs nvcc (building needs no GPU)")
def test_cuda_source_builds_without_a_gpu() -> None:
    lib = compile_cuda(CUDA_ADD, arch="sm_90a")
    assert set(lib.signatures) == {"add", "bad_launch"}
    with pytest.raises(AttributeError, match="add, bad_launch"):
        _ = lib.add_kernel  # __global__ kernels are not callable
    x = torch.ones(4)
    native.reset_launch_count()
    with pytest.raises(ValueError, match="on cpu"):
        lib.add(x, x, x, 4)
    with pytest.raises(TypeError, match=r"takes 5 arguments \(the trailing cudaStream_t may be omitted\)"):
        lib.add(x, x)
    assert native.launch_count() == 0


@pytest.mark.gpu
def test_cuda_vector_add() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    lib = compile_cuda(CUDA_ADD)
    n = 100_003
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    native.reset_launch_count()
    lib.add(x, y, out, n)  # on torch's current stream
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)

    stream, out2 = torch.cuda.Stream(), torch.zeros_like(x)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        lib.add(x, y, out2, n)
    lib.add(x, y, out2, n, stream)
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(out2, x + y, rtol=0, atol=0)
    assert native.launch_count() == 3
    with pytest.raises(TypeError, match="raw addresses"):
        lib.add(x.data_ptr(), y, out, n)

    with pytest.raises(RuntimeError, match=r"CUDA error: .+ \(after bad_launch\)"):
        lib.bad_launch(out, n)
    lib.add(x, y, out, n)  # the error was not sticky: the next call is clean
    torch.cuda.synchronize()
