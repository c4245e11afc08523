"""The native side of an export: a variant's kernelevolve.native imports, the vendored copy of that
module, and the ahead-of-time build.

A candidate builds its C/C++/CUDA source with `from kernelevolve.native import compile_c` at import.
An exported package must run without kernelevolve, so:

- `rewrite_imports` points those imports at `<package>._kernelevolve_native` (any other kernelevolve
  import is refused: a candidate has no business with one);
- `vendored_native` is kernelevolve.native's own source, its one kernelevolve import replaced by a copy
  of the error class, with `compile_c`/`compile_cuda` that load a prebuilt library from the package's
  `_native/` first (keyed by source, flags and host CPU for C; source, flags and GPU arch for CUDA)
  and build with the system compiler otherwise;
- `build_native` (`export --build`) imports and constructs each native variant in a subprocess whose
  vendored module saves what it builds into `_native/`: a deploy host of the same CPU (GPU arch) then
  loads the libraries with no compiler. Another host misses the key and builds, or fails with a hint.

What it deliberately does not do: it does not cross-compile (a library is built for the host that
exports, with `-march=native`), and a kernel that compiles only inside `forward` is not prebuilt
(`build_native` says so). Triton kernels need none of this: Triton compiles them at first call.

Threat model: `build_native` imports generated code (the variants), in a subprocess with the
exporting user's rights, as `ModelNew` would; native code can do anything that process can.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kernelevolve.errors import KernelevolveError

NATIVE_MODULE = "_kernelevolve_native"
BUILD_TIMEOUT_S = 1800  # every native variant of one package, imported and constructed


def rewrite_imports(name: str, source: str) -> tuple[str, bool]:
    """The variant's source with `kernelevolve.native` imports pointed at the vendored copy, and
    whether it had any. Any other kernelevolve import is refused: the package runs without it."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise KernelevolveError(f"{name}: the variant's source does not parse: {exc}") from exc
    edits: list[tuple[ast.stmt, str]] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "kernelevolve"
        ):
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
            if node.module == "kernelevolve.native":
                edits.append((node, f"from .{NATIVE_MODULE} import {names}"))
            elif node.module == "kernelevolve" and [a.name for a in node.names] == ["native"]:
                edits.append((node, f"from . import {NATIVE_MODULE} as {node.names[0].asname or 'native'}"))
            else:
                raise _foreign_import(name, f"from {node.module} import {names}")
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "kernelevolve" for a in node.names):
            if len(node.names) == 1 and node.names[0].name == "kernelevolve.native" and node.names[0].asname:
                edits.append((node, f"from . import {NATIVE_MODULE} as {node.names[0].asname}"))
            else:
                raise _foreign_import(name, "import " + ", ".join(a.name for a in node.names))
    data = source.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    for node, text in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        assert node.end_lineno is not None and node.end_col_offset is not None
        a, b = starts[node.lineno - 1] + node.col_offset, starts[node.end_lineno - 1] + node.end_col_offset
        data = data[:a] + text.encode() + data[b:]
    return data.decode(), bool(edits)


def _foreign_import(name: str, statement: str) -> KernelevolveError:
    return KernelevolveError(
        f"{name}: `{statement}` needs kernelevolve where the package runs; only kernelevolve.native is vendored",
        hint="a candidate imports torch, triton and `from kernelevolve.native import compile_c` only",
    )


_ERROR_CLASS = '''

class KernelevolveError(Exception):
    """Vendored from kernelevolve.errors: a message and a hint that says what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\\n  hint: {self.hint}"
'''

# Appended to the vendored kernelevolve.native: prebuilt libraries first, else a build (a compiler).
_PREBUILT = """

# --- prebuilt libraries (added by kernelevolve export) ---------------------------------------------

_PREBUILT_DIR = Path(__file__).with_name("_native")
_BUILD_ENV = "KERNELEVOLVE_EXPORT_BUILD"  # set by `export --build`: save what is built into _PREBUILT_DIR
_jit_compile_c, _jit_compile_cuda = compile_c, compile_cuda


def _prebuilt(key_parts: list[Any], build: Callable[[], NativeLibrary], source: str, lang: str, device: str) -> NativeLibrary:
    key = hashlib.sha256(json.dumps([_CACHE_FORMAT, *key_parts]).encode()).hexdigest()
    path = _PREBUILT_DIR / f"{key}.so"
    if path.exists():
        return NativeLibrary(_load(path), path, parse_signatures(source, lang), device)
    try:
        lib = build()
    except NativeCompileError as exc:
        raise NativeCompileError(
            f"no library prebuilt for this host, and building one failed: {exc.message}",
            hint="export with --build on a host like this one, or install the compiler",
        ) from exc
    if os.environ.get(_BUILD_ENV) == "1":
        _PREBUILT_DIR.mkdir(exist_ok=True)
        tmp = _PREBUILT_DIR / f".{key}.{os.getpid()}.tmp"
        shutil.copyfile(lib.path, tmp)
        os.replace(tmp, path)
    return lib


def compile_c(  # type: ignore[no-redef]
    source: str, *, lang: str = "c", flags: Sequence[str] = (), openmp: bool = True, timeout_s: float = 120.0
) -> NativeLibrary:
    parts = ["c", source, lang, list(flags), openmp, _host_cpu()]
    build = lambda: _jit_compile_c(source, lang=lang, flags=flags, openmp=openmp, timeout_s=timeout_s)  # noqa: E731
    return _prebuilt(parts, build, source, lang, "cpu")


def compile_cuda(  # type: ignore[no-redef]
    source: str, *, flags: Sequence[str] = (), arch: str | None = None, timeout_s: float = 120.0
) -> NativeLibrary:
    parts = ["cuda", source, list(flags), _cuda_arch(arch)]
    build = lambda: _jit_compile_cuda(source, flags=flags, arch=arch, timeout_s=timeout_s)  # noqa: E731
    return _prebuilt(parts, build, source, "cuda", "cuda")
"""


def vendored_native() -> str:
    """kernelevolve.native's source, standing alone: its one kernelevolve import replaced by a copy of
    the error class, and prebuilt libraries looked up first."""
    from kernelevolve import native

    source = Path(native.__file__).read_text()
    line = "from kernelevolve.errors import KernelevolveError\n"
    if source.count(line) != 1 or "\nfrom kernelevolve" in source.replace(line, ""):
        raise KernelevolveError(
            "kernelevolve.native's imports changed: the export cannot vendor it",
            hint="update kernelevolve.export_native.vendored_native",
        )
    header = "# Vendored by kernelevolve export from kernelevolve.native; it needs nothing of kernelevolve.\n"
    return header + source.replace(line, _ERROR_CLASS.lstrip("\n")) + _PREBUILT


def build_native(pkg: Path, inits: dict[str, list[list[Any]]]) -> None:
    """Import each native variant (module name -> constructor arguments) and construct it in a
    subprocess that saves the libraries it builds in the package (`_native/`)."""
    native = list(inits)
    code = "\n".join([
        "import importlib, sys",
        f"sys.path.insert(0, {str(pkg.parent)!r})",
        f"for name, inits in {list(inits.items())!r}:",
        f"    module = importlib.import_module({pkg.name!r} + '.' + name)",
        "    for init in inits:",
        "        module.ModelNew(*init)",
    ])  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kernelevolve-export-") as cache:
        env = {**os.environ, "KERNELEVOLVE_EXPORT_BUILD": "1", "KERNELEVOLVE_NATIVE_CACHE": cache}
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise KernelevolveError(
                f"building the native variants of {pkg.name} took over {BUILD_TIMEOUT_S} s",
                hint="export without --build: they then compile where the package is first used",
            ) from None
    if proc.returncode != 0:
        raise KernelevolveError(
            f"building the native variants of {pkg.name} failed:\n{proc.stderr[-3000:]}",
            hint="build on a host with the compiler (and, for CUDA, the GPU) the package will run on",
        )
    built = sorted(p.name for p in (pkg / "_native").glob("*.so")) if (pkg / "_native").is_dir() else []
    if not built:
        raise KernelevolveError(
            f"{', '.join(native)} built no library at import or construction: they compile later, on "
            "first call, where a compiler is needed",
            hint="export without --build, or call compile_c/compile_cuda at module level in the variant",
        )
