"""Static guards: read a candidate's source (never run it) and refuse what a kernel has no need for.

Threat model. Candidates are untrusted code written to look fast. These checks are the first of two
layers: they run in the engine's process on the AST alone, before any worker is used, and give the
author a precise message (rule, line, what to do instead). The second layer runs in the worker
(`kernelevolve.evaluate.runtime`): it records every aten op the candidate calls, counts kernel
launches, compares the harness's own functions and global flags before and after, and verifies
outputs. Anything that slips past the AST (a name built at run time, an op reached through a method
call) is caught there. Neither layer is a sandbox against native code; the worker's process limits
and the plausibility checks on results (`suspicious`) are the backstop.

What a candidate may do, by default:
- import, or reach through attributes, only the modules in ALLOWED_MODULES: torch and the parts of it
  a kernel needs (nn, autograd, cuda, utils.cpp_extension), triton (language and its libraries,
  runtime.driver), a few pure-Python helpers (math, functools, ...) and `kernelevolve.native`.
  Attribute paths are resolved against the real modules, so `torch.os`, `torch.ctypes` or
  `torch.multiprocessing` are refused like `import os`;
- call torch only for glue: allocation, views and reshapes, device and dtype queries, launching (the
  list is TORCH_GLUE_CALLS; a spec extends it with `allow_torch_ops`);
- define kernels for its platform: `@triton.jit` functions, or C/CUDA source compiled through
  `kernelevolve.native` or `torch.utils.cpp_extension.load_inline`.

What it may not do: fall back to the reference (subclass or name `Model`, compute the op through
torch, `F.*`, `@`, or vendor libraries), swallow errors in try/except, change global backend flags,
patch any module, class or timer, reach the interpreter's internals (dunders, setattr, exec, frames),
touch the OS (files, environment, processes, threads, sockets), or use side streams or CUDA graphs.

Why one module (over 450 lines): every static rule a candidate meets is here, in one AST pass
over one source, so a reviewer (or an author refused by one) reads the whole of what the engine
refuses, and why, in one place; each rule is a short visitor method with its message.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kernelevolve import pyast
from kernelevolve.evaluate.verdict import Violation

# Modules a candidate may import or reach through attributes: exact names, and subtrees ending in ".*".
ALLOWED_MODULES = (
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.nn.init",
    "torch.nn.parameter",
    "torch.nn.modules.*",
    "torch.autograd",
    "torch.autograd.function",
    "torch.cuda",
    "torch.utils",
    "torch.utils.cpp_extension",
    "triton",
    "triton.language.*",
    "triton.language",
    "triton.runtime",
    "triton.runtime.driver",
    "math",
    "typing",
    "functools",
    "itertools",
    "operator",
    "dataclasses",
    "enum",
    "collections",
    "numbers",
    "__future__",
    "kernelevolve.native",
)

# torch.<name>(...) calls that are glue, not compute. Other direct `torch.<name>(...)` calls, and
# anything under torch.nn.functional, linalg, fft, special, sparse and nested, are compute. Calls that
# go through modules or methods (`nn.Softmax(dim=-1)(x)`, `x.sum()`) cannot be judged from the source:
# the runtime op recorder catches those.
TORCH_GLUE_CALLS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "as_strided", "zeros", "zeros_like", "ones", "ones_like",
        "full", "full_like", "arange", "tensor", "as_tensor", "is_tensor", "is_floating_point",
        "numel", "device", "dtype", "Size", "finfo", "iinfo", "no_grad", "inference_mode",
        "enable_grad", "get_default_dtype", "result_type", "promote_types", "broadcast_shapes",
        "nn.Parameter", "nn.Module", "nn.ModuleList", "nn.ModuleDict", "nn.ParameterList",
        "nn.ParameterDict", "autograd.Function", "cuda.current_stream", "cuda.current_device",
        "cuda.get_device_properties", "cuda.get_device_capability", "cuda.device",
        "cuda.is_available", "cuda.synchronize", "cuda.device_count",
        "utils.cpp_extension.load_inline",
    }
)  # fmt: skip

# Anything reached through these prefixes is refused, call or not.
FORBIDDEN_ATTRIBUTES = {
    "torch._C": "the C++ internals are not a kernel",
    "torch.ops": "aten ops called directly are torch compute",
    "torch._dynamo": "torch.compile internals",
    "torch._inductor": "torch.compile internals",
    "torch.compile": "torch.compile is the baseline, not a candidate",
    "torch.jit": "TorchScript is not a kernel",
    "torch.fx": "graph rewriting is not a kernel",
    "torch.library": "registering ops changes torch",
    "torch.overrides": "changes how torch dispatches",
    "torch.utils._python_dispatch": "changes how torch dispatches",
    "torch.backends": "global backend flags belong to the harness",
    "torch.use_deterministic_algorithms": "a global flag",
    "torch.manual_seed": "the harness owns the random state",
    "torch.seed": "the harness owns the random state",
    "torch.random": "the harness owns the random state",
    "torch.cuda.Stream": "work on side streams is refused",
    "torch.cuda.stream": "work on side streams is refused",
    "torch.cuda.set_stream": "work on side streams is refused",
    "torch.cuda.ExternalStream": "work on side streams is refused",
    "torch.cuda.Event": "timing belongs to the harness",
    "torch.cuda.graph": "CUDA graphs belong to the harness",
    "torch.cuda.CUDAGraph": "CUDA graphs belong to the harness",
    "torch.cuda.set_per_process_memory_fraction": "memory limits belong to the harness",
    "torch.cuda.memory": "allocator internals belong to the harness",
    "triton.testing": "timing belongs to the harness",
    "triton.knobs": "global compiler settings belong to the harness",
    "triton.runtime.jit": "triton's launcher belongs to the harness",
    "triton.runtime.interpreter": "triton's launcher belongs to the harness",
}
FORBIDDEN_TORCH_PREFIX_CALLS = ("torch.set_", "torch.nn.functional.", "torch.linalg.", "torch.fft.",
                                "torch.special.", "torch.sparse.", "torch.nested.")  # fmt: skip
FORBIDDEN_BUILTINS = {
    "exec", "eval", "compile", "__import__", "open", "input", "breakpoint", "setattr", "delattr",
    "vars", "globals", "locals", "memoryview", "help", "exit", "quit",
}  # fmt: skip
ALLOWED_DUNDERS = {"__init__", "__name__", "__qualname__", "__doc__"}
FORBIDDEN_NAMES = {"__builtins__", "__loader__", "__spec__", "__file__"}

# Strings handed to a native compiler: what a kernel source may not contain.
NATIVE_FORBIDDEN = {
    r"\bpthread_create\b|std::thread|std::async|\bfork\s*\(|\bvfork\s*\(": "threads or processes",
    r"\bsystem\s*\(|\bpopen\s*\(|\bexec[lv]p?e?\s*\(|\bdlopen\s*\(|\bdlsym\s*\(": "running other programs",
    r"\bgetenv\s*\(|\benviron\b": "reading the environment",
    r"\bfopen\s*\(|\bopen\s*\(|\bsocket\s*\(|\bconnect\s*\(": "files or sockets",
    r"\bcudaStreamCreate|\bcudaGraph|\bcudaEvent": "side streams, graphs or timers",
    r"\bcublas|\bcudnn|\bcusparse|\bcufft|\bcblas_|\bmkl_|\bopenblas": "vendor libraries instead of a kernel",
    r"\b(?:at|torch)::(?!Tensor\b|empty|zeros|ones|full|kFloat|kHalf|kBFloat16|kInt|kLong|"
    r"TensorOptions|Device|kCUDA|kCPU|cuda::getCurrentCUDAStream)\w+\s*\(": "calling torch ops from native code",
    r"-l\s*(?:cublas|cudnn|cusparse|cufft|mkl|openblas|blas)": "linking vendor libraries instead of writing a kernel",
}

KIND_OF_COMPILER = {
    "kernelevolve.native.compile_c": "c",
    "kernelevolve.native.compile_cuda": "cuda",
}


@dataclass
class StaticReport:
    """What the AST says about a candidate: its kernel kinds and the rules it breaks."""

    kinds: set[str] = field(default_factory=set)  # "triton", "cuda", "c"
    kernel_names: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    syntax_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.syntax_error is None and not self.violations


def check_source(
    source: str,
    accepted_kinds: Iterable[str],
    platform: str = "",
    allow_imports: Iterable[str] = (),
    allow_torch_ops: Iterable[str] = (),
    filename: str = "candidate.py",
) -> StaticReport:
    """Run every static rule over `source`. `accepted_kinds` are the kernel kinds the platform runs."""
    report = StaticReport()
    try:
        tree = pyast.parse(source, filename=filename)
    except SyntaxError as exc:
        report.syntax_error = f"{filename}:{exc.lineno}: {exc.msg}"
        return report
    extra_glue = {op.split(".")[1] if op.startswith("aten.") else op for op in allow_torch_ops}
    checker = _Checker(report, set(allow_imports), extra_glue)
    checker.collect_aliases(tree)
    checker.visit(tree)
    checker.finish(tree, set(accepted_kinds), platform)
    return report


class _Checker(ast.NodeVisitor):
    def __init__(self, report: StaticReport, allow_imports: set[str], extra_glue: set[str]):
        self.report = report
        self.allow_imports = allow_imports
        self.extra_glue = extra_glue
        self.aliases: dict[str, str] = {}  # local name -> qualified name
        self.string_consts: dict[str, str] = {}  # NAME = "..." at any level, for native sources
        self.triton_kernels: dict[str, int] = {}
        self.native_calls: list[tuple[str, int]] = []
        self.function_stack: list[str] = []
        self.referenced: set[str] = set()

    def flag(self, rule: str, node: ast.AST | None, message: str) -> None:
        line = getattr(node, "lineno", None)
        if not any(v.rule == rule and v.line == line for v in self.report.violations):
            self.report.violations.append(Violation(rule, message, line))

    # -- names -------------------------------------------------------------------------------------

    def collect_aliases(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                if (
                    len(targets) == 1
                    and isinstance(targets[0], ast.Name)
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                ):
                    self.string_consts[targets[0].id] = value.value
        # Second pass: `nn = torch.nn` style re-bindings of module paths.
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                qual = self.qualify(node.value)
                if qual and qual.split(".")[0] in ("torch", "triton", "kernelevolve"):
                    self.aliases[node.targets[0].id] = qual

    def qualify(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if (  # getattr(torch, "matmul") is torch.matmul
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            base = self.qualify(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        if isinstance(node, ast.Attribute):
            base = self.qualify(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    # -- imports -----------------------------------------------------------------------------------

    def _module_allowed(self, module: str) -> bool:
        for m in (*ALLOWED_MODULES, *self.allow_imports):
            if m.endswith(".*") and module.startswith(m[:-1]):
                return True
            if module == m or (m in self.allow_imports and module.startswith(m + ".")):
                return True
        return False

    def _check_module(self, node: ast.AST, module: str) -> None:
        if module.startswith("kernelevolve") and module != "kernelevolve.native":
            self.flag("harness", node, "candidates may import kernelevolve.native only, never the harness")
        elif not self._module_allowed(module):
            allowed = sorted({m.removesuffix(".*") for m in (*ALLOWED_MODULES, *self.allow_imports)})
            self.flag(
                "import",
                node,
                f"importing {module!r} is not allowed in a candidate; allowed: {', '.join(allowed)}",
            )

    def _check_reached_modules(self, node: ast.AST, qual: str) -> None:
        """Walk `qual` through the real torch/triton objects: any module it passes through must be
        allowed (torch re-exports os, sys, ctypes, builtins, importlib...)."""
        for name in _modules_on_path(qual):
            if not self._module_allowed(name):
                self.flag(
                    "forbidden-api", node, f"{qual} reaches the module {name!r}, which candidates may not use"
                )
                return

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._check_module(node, a.name)
            self._check_forbidden(node, a.name)
            self._check_reached_modules(node, a.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.flag("import", node, "relative imports are not allowed in a candidate")
            return
        module = node.module or ""
        if module == "kernelevolve":
            names = [a.name for a in node.names]
            if names != ["native"]:
                self.flag(
                    "harness", node, "candidates may import kernelevolve.native only, never the harness"
                )
        else:
            self._check_module(node, module)
        for a in node.names:
            qual = f"{module}.{a.name}"
            self._check_forbidden(node, qual)
            self._check_reached_modules(node, qual)
            if module == "torch" and _is_function(qual):
                self._check_torch_call(node, qual, called=True)

    # -- expressions -------------------------------------------------------------------------------

    def _check_forbidden(self, node: ast.AST, qual: str) -> None:
        for prefix, why in FORBIDDEN_ATTRIBUTES.items():
            if qual == prefix or qual.startswith(prefix + "."):
                self.flag("forbidden-api", node, f"{qual}: {why}")
                return

    def _check_torch_call(self, node: ast.AST, qual: str, called: bool) -> None:
        if not qual.startswith("torch.") or not called:
            return
        rest = qual[len("torch.") :]
        if rest.startswith("Tensor."):
            rest = rest[len("Tensor.") :]
        in_constructor = self.function_stack[-2:] == ["class:ModelNew", "__init__"]
        if rest.startswith("nn.init.") and in_constructor:
            return
        if rest in TORCH_GLUE_CALLS or rest.split(".")[-1] in self.extra_glue:
            return
        if any(qual.startswith(p) for p in FORBIDDEN_TORCH_PREFIX_CALLS) or "." not in rest:
            if in_constructor and not qual.startswith("torch.set_"):
                return  # parameter set-up in ModelNew's constructor is not the op
            self.flag(
                "torch-compute",
                node,
                f"{qual}(...) computes through torch; a candidate launches its own kernel "
                "(allowed glue: allocation, views, device queries)",
            )

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("__") and node.attr.endswith("__") and node.attr not in ALLOWED_DUNDERS:
            self.flag("introspection", node, f"`.{node.attr}` reaches interpreter internals")
        elif node.attr in {"f_back", "f_globals", "f_locals", "gi_frame", "cr_frame", "tb_frame"}:
            self.flag("introspection", node, f"`.{node.attr}` reaches interpreter frames")
        qual = self.qualify(node)
        if qual:
            self._check_forbidden(node, qual)
            self._check_reached_modules(node, qual)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self.referenced.add(node.id)
        if node.id in FORBIDDEN_NAMES:
            self.flag("introspection", node, f"`{node.id}` reaches interpreter internals")
        if node.id == "Model" and isinstance(node.ctx, ast.Load):
            self.flag(
                "reference", node, "the reference `Model` is used; a candidate must not call or extend it"
            )
        qual = self.aliases.get(node.id)
        if qual and qual != node.id:
            self._check_forbidden(node, qual)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTINS and func.id not in self.aliases:
            self.flag("builtin", node, f"{func.id}() is not allowed in a candidate")
        computed_getattr = (
            not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))
            if len(node.args) >= 2
            else False
        )
        if isinstance(func, ast.Name) and func.id == "getattr" and computed_getattr:
            self.flag("builtin", node, "getattr() with a computed name hides what is called")
        qual = self.qualify(func)
        if qual:
            self._check_torch_call(node, qual, called=True)
            if qual in KIND_OF_COMPILER:
                self.native_calls.append((KIND_OF_COMPILER[qual], node.lineno))
                self._check_native_sources(node)
            elif qual.endswith("cpp_extension.load_inline"):
                cuda = any(k.arg == "cuda_sources" for k in node.keywords) or len(node.args) >= 3
                self.native_calls.append(("cuda" if cuda else "c", node.lineno))
                self._check_native_sources(node)
        self.generic_visit(node)

    def _check_native_sources(self, call: ast.Call) -> None:
        texts = []
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            for sub in ast.walk(arg):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    texts.append(sub.value)
                elif isinstance(sub, ast.Name) and sub.id in self.string_consts:
                    texts.append(self.string_consts[sub.id])
        code = _strip_c_comments("\n".join(texts))
        for pattern, what in NATIVE_FORBIDDEN.items():
            m = re.search(pattern, code)
            if m:
                self.flag(
                    "native-source", call, f"native source uses `{m.group(0).strip()}`: {what} is not allowed"
                )

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.flag("torch-compute", node, "`@` computes a matmul through torch; launch your own kernel")
        self.generic_visit(node)

    # -- statements --------------------------------------------------------------------------------

    def _check_assign_targets(self, targets: Iterable[ast.AST]) -> None:
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute):
                    root = sub
                    while isinstance(root, ast.Attribute):
                        root = root.value  # type: ignore[assignment]
                    if isinstance(root, ast.Name) and root.id in self.aliases:
                        self.flag(
                            "patching",
                            sub,
                            f"assigning to {ast.unparse(sub)} changes an imported module or class; "
                            "candidates may not patch torch, triton, timers or the harness",
                        )
                elif isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Attribute):
                    self._check_assign_targets([sub.value])

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check_assign_targets(node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_assign_targets([node.target])
        if isinstance(node.op, ast.MatMult):
            self.flag("torch-compute", node, "`@=` computes a matmul through torch; launch your own kernel")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_assign_targets([node.target])
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._check_assign_targets(node.targets)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            if name in self.aliases:
                self.flag("patching", node, f"`global {name}` rebinds an imported module")

    def visit_Try(self, node: ast.Try) -> None:
        for handler in node.handlers:
            if not all(isinstance(s, ast.Raise) for s in handler.body):
                self.flag(
                    "try-fallback",
                    handler,
                    "an except handler that does not re-raise can fall back to torch or hide a failure; "
                    "let errors propagate",
                )
        self.generic_visit(node)

    visit_TryStar = visit_Try  # type: ignore[assignment]

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            qual = self.qualify(target) or ""
            if qual in ("triton.jit", "triton.language.jit") or qual.endswith("triton.jit"):
                self.triton_kernels[node.name] = node.lineno
        self.function_stack.append(node.name)
        self.generic_visit(node)
        self.function_stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id == "Model":
                self.flag("reference", node, f"class {node.name} subclasses the reference `Model`")
        self.function_stack.append(f"class:{node.name}")
        self.generic_visit(node)
        self.function_stack.pop()

    # -- whole-module rules ------------------------------------------------------------------------

    def finish(self, tree: ast.Module, accepted: set[str], platform: str) -> None:
        model_new = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
        if model_new is None:
            self.flag("no-modelnew", None, "no top-level `class ModelNew(nn.Module)` is defined")
        elif not any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in model_new.body):
            self.flag("no-modelnew", model_new, "ModelNew defines no `forward` method")
        kinds = {kind for kind, _ in self.native_calls}
        if self.triton_kernels:
            kinds.add("triton")
        self.report.kinds = kinds
        self.report.kernel_names = sorted(self.triton_kernels)
        if not kinds:
            self.flag(
                "no-kernel",
                None,
                "no kernel is defined: write a @triton.jit function, or C/CUDA source compiled with "
                "kernelevolve.native.compile_c / compile_cuda (or torch.utils.cpp_extension.load_inline)",
            )
        elif not kinds & accepted:
            self.flag(
                "platform",
                None,
                f"this candidate's kernels are {', '.join(sorted(kinds))}; platform {platform or '?'} "
                f"runs {', '.join(sorted(accepted))}",
            )
        unused = [name for name in self.triton_kernels if name not in self.referenced]
        if self.triton_kernels and len(unused) == len(self.triton_kernels):
            self.flag(
                "no-launch", None, f"the triton kernel(s) {', '.join(unused)} are defined but never launched"
            )


@functools.lru_cache(maxsize=4096)
def _on_path(qual: str) -> tuple[Any, ...]:
    """The real objects along a dotted torch/triton path, walking through modules only (never calling
    or touching other objects, so nothing initializes); empty for anything else or if not installed."""
    parts = qual.split(".")
    if parts[0] not in ("torch", "triton"):
        return ()
    try:
        obj: Any = importlib.import_module(parts[0])
    except Exception:
        return ()
    found = [obj]
    for part in parts[1:]:
        if not inspect.ismodule(obj):
            break
        try:
            obj = getattr(obj, part)
        except Exception:
            break
        found.append(obj)
    return tuple(found)


def _modules_on_path(qual: str) -> list[str]:
    return [o.__name__ for o in _on_path(qual) if inspect.ismodule(o)]


def _is_function(qual: str) -> bool:
    """Whether `qual` names something callable that is not a class or module (a dtype is not).
    Unknown names count as functions: refusing too much is the safe side."""
    found = _on_path(qual)
    if len(found) != len(qual.split(".")):
        return True
    obj = found[-1]
    return callable(obj) and not inspect.isclass(obj) and not inspect.ismodule(obj)


def _strip_c_comments(code: str) -> str:
    code = re.sub(r"/\*.*?\*/", " ", code, flags=re.S)
    return re.sub(r"//[^\n]*", " ", code)
