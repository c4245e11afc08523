"""Native kernels for candidates: C/C++ (CPU) or CUDA C++ (NVIDIA) source, built in a second or two
and called with tensors.

`torch.utils.cpp_extension.load_inline` takes a minute per build (torch's headers). This module builds
plain source into a shared library with the system compiler (`cc`, `c++`, `nvcc`) and calls its
`extern "C"` functions through ctypes, with signatures read from the source: pointer parameters take
tensors, scalars take numbers, and a candidate writes no ctypes.

    from kernelevolve.native import compile_c, compile_cuda

    lib = compile_c(r'''
    void axpy(float a, const float* x, float* y, long n) {
        #pragma omp parallel for
        for (long i = 0; i < n; ++i) y[i] += a * x[i];
    }
    ''')
    lib.axpy(2.0, x, y, x.numel())      # x, y: contiguous float32 CPU tensors

    lib = compile_cuda(r'''
    __global__ void add_kernel(const float* x, const float* y, float* out, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = x[i] + y[i];
    }
    extern "C" void add(const float* x, const float* y, float* out, int n, cudaStream_t stream) {
        add_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, y, out, n);
    }
    ''')
    lib.add(x, y, out, x.numel())       # the trailing stream defaults to torch's current stream

Builds are cached on disk under a hash of (source, language, command line, compiler version, arch,
host CPU): a worker that meets a known candidate loads it without compiling. Each call checks the
argument count and types and the tensors' device, and for CUDA `cudaGetLastError()` afterwards. Calls
are counted (`launch_count()`) so that the harness can tell that a native function ran at all.

What it deliberately does not do: it does not check dtypes, shapes, strides or contiguity. The kernel
sees raw memory at `tensor.data_ptr()`, so a candidate passes `.contiguous()` tensors of the dtype its
code expects. It does not synchronize after CUDA calls: an asynchronous fault (an illegal address)
surfaces at the next synchronizing call, not at the launch. It reads signatures with a small
regex-based parser, not a compiler: functions made by macros, templates, C++ overloads and `inline`
functions are not callable. Nothing of torch is linked in.

Threat model: this module runs inside an untrusted candidate's worker process, and it compiles and
loads whatever source the candidate gives it; native code can do anything the process can. The
sandbox around the worker, not this module, contains that. The launch counter lives in the same
process, so a candidate can forge it (or call a no-op function): it shows that an honest candidate
launched something, and correctness comes from the harness comparing outputs. The build cache is
shared by every process that sees the same directory; where candidates must not influence each
other, the sandbox gives each worker its own `KERNELEVOLVE_NATIVE_CACHE`.

Why one module (over 450 lines): it is imported by candidates, inside workers, as one small
public API (`compile_c`, `compile_cuda`); the signature parser, the build and the ctypes call are
its three sections, in that order.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import numbers
import operator
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from ctypes import c_bool, c_double, c_float, c_int32, c_int64, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelevolve.errors import KernelevolveError

_CACHE_FORMAT = 1  # bump when the build recipe or the appended helpers change
_HEAD_LINES, _TAIL_LINES = 25, 15  # compiler output kept in errors: the first errors are the cause
_NVCC_FALLBACK = "/usr/local/cuda/bin/nvcc"
_CUDA_HELPERS = """
#include <cuda_runtime.h>
extern "C" int kernelevolve_last_error(void) { return (int)cudaGetLastError(); }
extern "C" const char* kernelevolve_error_string(int e) { return cudaGetErrorString((cudaError_t)e); }
"""


class NativeCompileError(KernelevolveError, RuntimeError):
    """The source could not be built or loaded, or a function's signature cannot be mapped."""


_launches = 0
_launch_lock = threading.Lock()


def launch_count() -> int:
    """How many native function calls returned in this process since the last reset."""
    return _launches


def reset_launch_count() -> None:
    global _launches
    with _launch_lock:
        _launches = 0


# --- signatures -----------------------------------------------------------------------------------

_SCALARS = dict.fromkeys(["int", "signed", "signed int", "int32_t"], "i32")
_SCALARS |= dict.fromkeys(["unsigned", "unsigned int", "uint32_t"], "u32")
_SCALARS |= dict.fromkeys(["long", "long int", "long long", "long long int", "int64_t", "ssize_t"], "i64")
_SCALARS |= dict.fromkeys(["ptrdiff_t"], "i64") | dict.fromkeys(["size_t", "uint64_t"], "u64")
_SCALARS |= dict.fromkeys(["unsigned long", "unsigned long long"], "u64") | {"cudaStream_t": "stream"}
_SCALARS |= {"float": "f32", "double": "f64", "bool": "bool", "_Bool": "bool"}
_CTYPES: dict[str, Any] = {"ptr": c_void_p, "stream": c_void_p, "i32": c_int32, "u32": c_uint32}
_CTYPES |= {"i64": c_int64, "u64": c_uint64, "f32": c_float, "f64": c_double, "bool": c_bool}
_INT_RANGES = {"i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-(2**63), 2**63 - 1)}
_INT_RANGES["u64"] = (0, 2**64 - 1)
_QUALIFIERS = {"const", "volatile", "restrict", "__restrict", "__restrict__", "register", "struct", "union"}
_NOT_EXPORTED = {"static", "inline", "__inline__", "__forceinline__", "constexpr", "template", "operator"}
_NOT_EXPORTED |= {"__global__", "="}  # "=": an initializer, not a function
# Comments, string and character literals, and preprocessor lines (with their continuations).
_NOISE_RE = re.compile(
    r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|^[ \t]*#(?:\\\n|[^\n])*", re.S | re.M
)
_NESTED = r"\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"  # parentheses, up to three deep
_DECORATION_RE = re.compile(rf"__(?:attribute__|declspec|launch_bounds__|cluster_dims__)\s*(?:{_NESTED})?")
_HEAD_RE = re.compile(rf"(?P<prefix>.*?)\b(?P<name>[A-Za-z_]\w*)\s*(?P<params>{_NESTED})\s*", re.S)


@dataclass(frozen=True)
class Signature:
    """An exported function as read from the source. Kinds: "ptr", "stream", "i32", "u32", "i64",
    "u64", "f32", "f64", "bool"; `restype` may also be "void". `error` says why it cannot be called."""

    name: str
    restype: str
    argtypes: tuple[str, ...]
    params: tuple[str, ...]  # the declarations as written, for messages
    error: str | None = None


def _strip_noise(source: str) -> str:
    def blank(m: re.Match[str]) -> str:
        text = m.group(0)
        if text[0] == '"':
            return text if text in ('"C"', '"C++"') else '""'
        return "' '" if text[0] == "'" else " "

    return _NOISE_RE.sub(blank, source)


def _top_level_heads(code: str) -> Iterator[tuple[str, bool]]:
    """Yield (head, in_extern_c_block) for each top-level `head {`: a function definition's head is
    its declaration. An `extern "C" { }` block is see-through; other blocks are skipped whole."""
    extern_blocks, depth, start = 0, 0, 0  # depth: inside a function body, a struct, a namespace
    for i, ch in enumerate(code):
        if ch not in "{};":
            continue
        head, start = code[start:i], i + 1
        if depth:
            depth += {"{": 1, "}": -1, ";": 0}[ch]
        elif ch == "{" and re.fullmatch(r'\s*extern\s*"C"\s*', head):
            extern_blocks += 1
        elif ch == "{":
            yield head, extern_blocks > 0
            depth = 1
        elif ch == "}" and extern_blocks:
            extern_blocks -= 1


def _kind(decl: str) -> str | None:
    """The kind of a parameter (or a return type), or None where it maps to nothing callable."""
    if any(c in decl for c in "()&.<>"):  # function pointers, references, varargs, templates
        return None
    if "*" in decl or "[" in decl:
        return "ptr"
    words = [w for w in re.findall(r"[A-Za-z_]\w*", re.sub(r"\bstd\s*::", "", decl)) if w not in _QUALIFIERS]
    for n in (len(words), len(words) - 1):  # with and without the parameter's name
        if n > 0 and (kind := _SCALARS.get(" ".join(words[:n]))):
            return kind
    return None


def parse_signatures(source: str, lang: str = "c") -> dict[str, Signature]:
    """The callable functions a source defines. For "c", every top-level non-static function; for
    "c++" and "cuda", only `extern "C"` ones (others have mangled names), never `__global__` kernels
    or `__device__` functions."""
    found: dict[str, Signature] = {}
    for head, in_extern_c in _top_level_heads(_strip_noise(source)):
        m = _HEAD_RE.fullmatch(_DECORATION_RE.sub(" ", head))
        if m is None:
            continue
        name, words = m["name"], re.findall(r'"C\+*"|::|[A-Za-z_]\w*|\S', m["prefix"])
        if (
            not words
            or words[-1] == "::"  # a C++ member or namespaced function
            or _NOT_EXPORTED & set(words)
            or ("__device__" in words and "__host__" not in words)
            or (lang != "c" and not in_extern_c and '"C"' not in words)
        ):
            continue
        ret = " ".join(w for w in words if w not in {"extern", '"C"', "__host__", "__device__"})
        decls = tuple(" ".join(p.split()) for p in re.split(r",(?![^()]*\))", m["params"][1:-1]))
        decls = () if decls in (("",), ("void",)) else decls
        kinds = [_kind(d) for d in decls]
        restype = "void" if ret == "void" else _kind(ret)
        error = None
        if restype in (None, "ptr", "stream"):
            error = f"{name}: its return type `{ret}` is not void, an integer, float, double or bool"
        for i, (decl, kind) in enumerate(zip(decls, kinds, strict=True)):
            if kind is None or (kind == "stream" and i != len(decls) - 1):
                error = f"{name}: parameter {i + 1} `{decl}` has a type this module does not map"
                break
        found[name] = Signature(name, restype or "void", tuple(k or "" for k in kinds), decls, error)
    return found


# --- building -------------------------------------------------------------------------------------


def _find_compiler(env: str, default: str, hint: str) -> list[str]:
    value = os.environ.get(env)
    words = shlex.split(value) if value else [default]
    path = shutil.which(words[0]) if words else None
    if path is None and not value and default == "nvcc" and os.access(_NVCC_FALLBACK, os.X_OK):
        path = _NVCC_FALLBACK
    if path is None:
        where = f"${env}={value!r}" if value else f"`{default}` on PATH"
        where += f" or {_NVCC_FALLBACK}" if default == "nvcc" and not value else ""
        raise NativeCompileError(f"{default} compiler not found: looked for {where}", hint=hint)
    return [path, *words[1:]]


@functools.cache
def _compiler_version(path: str) -> str:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeCompileError(f"could not run `{path} --version`: {e}") from e
    return done.stdout.strip()  # all of it: nvcc's first line names no version


@functools.cache
def _host_cpu() -> str:
    """What `-march=native` depends on, so that a cache shared between machines stays correct."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0].splitlines()
    except OSError:
        first = []
    keys = {"vendor_id", "model name", "flags", "Features", "CPU implementer", "CPU part"}
    return "\n".join([platform.machine(), *(ln for ln in first if ln.split(":")[0].strip() in keys)])


def _cache_dir() -> Path:
    configured = os.environ.get("KERNELEVOLVE_NATIVE_CACHE")
    path = Path(configured or Path(tempfile.gettempdir()) / f"kernelevolve-native-{os.getuid()}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not configured and path.lstat().st_uid != os.getuid():  # a shared /tmp: someone else's dir
        hint = "set KERNELEVOLVE_NATIVE_CACHE to a private directory"
        raise NativeCompileError(f"the build cache {path} belongs to another user", hint=hint)
    return path


def _failure(summary: str, cmd: Sequence[str], output: str, build: Path) -> NativeCompileError:
    lines = output.replace(f"{build}/", "").replace(str(build), ".").rstrip().splitlines()
    if len(lines) > _HEAD_LINES + _TAIL_LINES:
        omitted = f"... ({len(lines) - _HEAD_LINES - _TAIL_LINES} lines omitted) ..."
        lines = [*lines[:_HEAD_LINES], omitted, *lines[-_TAIL_LINES:]]
    hint = "fix the source at the line the compiler names (the file is shown as candidate.*)"
    return NativeCompileError("\n".join([f"{summary}: {shlex.join(cmd)}", *lines]), hint=hint)


def _build(
    compiler: list[str], base: list[str], flags: Sequence[str], source: str, suffix: str, timeout_s: float
) -> Path:
    """Compile `source` to a shared library in the cache, or find it there; return its path."""
    if isinstance(flags, str):
        raise TypeError("flags is a sequence of strings, e.g. ['-lm'], not one string")
    src, out = f"candidate{suffix}", "candidate.so"
    cmd = [*compiler, *base, src, "-o", out, *flags]  # flags last, so that `-l` libraries link
    host = _host_cpu() if suffix != ".cu" else ""
    blob = json.dumps([_CACHE_FORMAT, source, cmd, _compiler_version(compiler[0]), host]).encode()
    cache = _cache_dir()
    target = cache / f"{hashlib.sha256(blob).hexdigest()}.so"
    if target.exists():
        return target
    build = Path(tempfile.mkdtemp(prefix=f".build-{target.stem[:12]}-", dir=cache))
    try:
        (build / src).write_text(source)
        pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "errors": "replace"}
        try:
            proc = subprocess.Popen(cmd, cwd=build, text=True, start_new_session=True, **pipes)
        except OSError as e:
            raise NativeCompileError(f"could not run {compiler[0]}: {e}") from e
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's children (cc1, cicc, ptxas) too
            output, _ = proc.communicate()
            raise _failure(f"compilation timed out after {timeout_s:g} s", cmd, output, build) from None
        if proc.returncode != 0:
            raise _failure(f"compilation failed (exit {proc.returncode})", cmd, output, build)
        os.replace(build / out, target)  # atomic: another process may be building the same key
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return target


def _load(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        hint = "an undefined symbol usually means a missing library, e.g. flags=['-lm']"
        raise NativeCompileError(f"built {path.name} but could not load it: {e}", hint=hint) from e


def compile_c(
    source: str, *, lang: str = "c", flags: Sequence[str] = (), openmp: bool = True, timeout_s: float = 120.0
) -> NativeLibrary:
    """Build C (`lang="c"`: C11, `cc`) or C++ (`lang="c++"`: C++17, `c++`) source for the CPU with
    `-O3 -march=native` (and `-fopenmp` unless `openmp=False`); never `-ffast-math` unless `flags`
    asks for it. In C++, only `extern "C"` functions are callable."""
    if lang not in ("c", "c++"):
        raise ValueError(f"lang must be 'c' or 'c++', got {lang!r}")
    env, default, package = ("CC", "cc", "gcc") if lang == "c" else ("CXX", "c++", "g++")
    compiler = _find_compiler(env, default, f"install a compiler (`apt-get install {package}`) or set {env}")
    base = ["-std=c11" if lang == "c" else "-std=c++17", "-O3", "-march=native", "-fPIC", "-shared"]
    suffix = ".c" if lang == "c" else ".cpp"
    path = _build(compiler, base + ["-fopenmp"] * openmp, flags, source, suffix, timeout_s)
    return NativeLibrary(_load(path), path, parse_signatures(source, lang), "cpu")


def _cuda_arch(arch: str | None) -> str:
    if arch is not None:
        target = arch.removeprefix("sm_").removeprefix("compute_").replace(".", "")
        if not re.fullmatch(r"\d{2,3}[af]?", target):
            raise ValueError(f"arch must look like 'sm_90a' or '80', got {arch!r}")
        return target
    import torch

    if not torch.cuda.is_available():
        raise NativeCompileError("no CUDA device to target", hint="pass arch, e.g. arch='sm_90a'")
    major, minor = torch.cuda.get_device_capability()
    # Arch-specific instructions (wgmma on Hopper, tcgen05 on Blackwell) need the `a` target.
    return f"{major}{minor}" + ("a" if (major, minor) in {(9, 0), (10, 0), (10, 3)} else "")


def compile_cuda(
    source: str, *, flags: Sequence[str] = (), arch: str | None = None, timeout_s: float = 120.0
) -> NativeLibrary:
    """Build CUDA C++ source with `nvcc -O3` for `arch` (default: the current device; `sm_90a` on
    H100). Only `extern "C"` host functions are callable; each call checks `cudaGetLastError()`."""
    hint = "install the CUDA toolkit (it provides nvcc) or set NVCC to nvcc's path"
    compiler, target = _find_compiler("NVCC", "nvcc", hint), _cuda_arch(arch)
    base = ["-O3", "-shared", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{target},code=sm_{target}"]
    path = _build(compiler, base, flags, source + _CUDA_HELPERS, ".cu", timeout_s)
    return NativeLibrary(_load(path), path, parse_signatures(source, "cuda"), "cuda")


# --- calling --------------------------------------------------------------------------------------


class NativeLibrary:
    """A loaded build: `lib.name` (or `lib["name"]`) is a callable `NativeFunction` for each function
    in `signatures`, looked up on first use."""

    def __init__(self, handle: ctypes.CDLL, path: Path, signatures: dict[str, Signature], device: str):
        self.path, self.device, self.signatures = path, device, signatures  # device: "cpu" | "cuda"
        self._handle = handle
        self._functions: dict[str, NativeFunction] = {}
        self._check: Callable[[], str | None] | None = None
        if device == "cuda":
            last_error, error_string = handle.kernelevolve_last_error, handle.kernelevolve_error_string
            last_error.restype, last_error.argtypes = ctypes.c_int, []
            error_string.restype, error_string.argtypes = ctypes.c_char_p, [ctypes.c_int]

            def check() -> str | None:
                code = last_error()
                return (error_string(code) or b"unknown error").decode() if code else None

            self._check = check

    def __getattr__(self, name: str) -> NativeFunction:
        if name.startswith("__") or "_functions" not in self.__dict__:
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> NativeFunction:
        if name in self._functions:
            return self._functions[name]
        signature = self.signatures.get(name)
        if signature is None:
            exports = ", ".join(sorted(self.signatures)) or "none"
            only = ' (extern "C" host functions only)' if self.device == "cuda" else ""
            raise AttributeError(
                f"no function {name!r}; exported functions found in the source{only}: {exports}"
            )
        if signature.error:
            hint = "pass tensors as pointers and scalars as int, int64_t, size_t, float, double or bool"
            raise NativeCompileError(f"cannot call {signature.error}", hint=hint)
        try:
            cfunc = getattr(self._handle, name)
        except AttributeError:
            raise AttributeError(f"{name} is defined in the source but not exported by the library") from None
        cfunc.argtypes = [_CTYPES[k] for k in signature.argtypes]
        cfunc.restype = None if signature.restype == "void" else _CTYPES[signature.restype]
        self._functions[name] = function = NativeFunction(signature, cfunc, self.device, self._check)
        return function

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self.signatures})

    def __repr__(self) -> str:
        return f"<NativeLibrary {self.path.name} ({self.device}): {', '.join(sorted(self.signatures))}>"


class NativeFunction:
    """One exported function. Pointer parameters take tensors on the library's device (the kernel
    sees raw memory at `data_ptr()`: no dtype, shape or contiguity check); scalars take numbers. A
    trailing `cudaStream_t` may be omitted (torch's current stream) or given as a `torch.cuda.Stream`."""

    def __init__(self, signature: Signature, cfunc: Any, device: str, check: Callable[[], str | None] | None):
        self.name, self.signature = signature.name, signature
        self._cfunc, self._device, self._check = cfunc, device, check

    def __call__(self, *args: Any) -> Any:
        kinds = self.signature.argtypes
        stream_last = bool(kinds) and kinds[-1] == "stream"
        if stream_last and len(args) == len(kinds) - 1:
            args = (*args, None)
        if len(args) != len(kinds):
            optional = " (the trailing cudaStream_t may be omitted)" if stream_last else ""
            usage = f"{self.name}({', '.join(self.signature.params)})"
            raise TypeError(f"{self.name}() takes {len(kinds)} arguments{optional}, got {len(args)}: {usage}")
        result = self._cfunc(
            *[self._convert(i, kind, arg) for i, (kind, arg) in enumerate(zip(kinds, args, strict=True))]
        )
        global _launches
        with _launch_lock:
            _launches += 1
        if self._check is not None and (error := self._check()) is not None:
            raise RuntimeError(f"CUDA error: {error} (after {self.name})")
        return result

    def _convert(self, index: int, kind: str, value: Any) -> Any:
        import torch

        where = f"{self.name}() argument {index + 1} `{self.signature.params[index]}`"
        got = type(value).__name__
        if kind == "ptr":
            if not isinstance(value, torch.Tensor):
                refused = " (raw addresses are refused)" if isinstance(value, int) else ""
                raise TypeError(f"{where} is a pointer: pass a torch.Tensor, got {got}{refused}")
            device = value.device
            if device.type != self._device or (
                self._device == "cuda" and device.index != torch.cuda.current_device()
            ):
                raise ValueError(f"{where}: the tensor is on {device}, the kernel runs on {self._device}")
            return value.data_ptr()
        if kind == "stream":
            if value is None or isinstance(value, torch.cuda.Stream):
                return (torch.cuda.current_stream() if value is None else value).cuda_stream
            raise TypeError(f"{where}: pass a torch.cuda.Stream or leave it out, got {got}")
        if isinstance(value, torch.Tensor):
            raise TypeError(f"{where} is a scalar: pass a Python number, not a tensor")
        if kind in ("f32", "f64"):
            if isinstance(value, numbers.Real):
                return float(value)
            raise TypeError(f"{where} is a {kind} scalar: pass a number, got {got}")
        try:
            number = operator.index(value)  # refuses floats for integer parameters
        except TypeError:
            raise TypeError(f"{where} is an integer: got {got}") from None
        if kind == "bool":
            return bool(number)
        low, high = _INT_RANGES[kind]
        if not low <= number <= high:
            raise OverflowError(f"{where}: {number} does not fit in {kind}")
        return number
