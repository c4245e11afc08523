"""The package's import graph (issue H): no module imports, directly or through others, a module that
imports it back; and no package imports one above it in the layers (`LAYERS`, lowest first: contracts
and values at the bottom, the harness above the store and platforms, the search above what writes
candidates, the CLI on top). Read from the sources (every `import` statement, those inside functions
and under TYPE_CHECKING included: a lazy import is still a dependency), not from what an interpreter
happened to load."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "kernelevolve"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports: `import a.b`, `from a import b` (b a module or a
    name in a), relative imports resolved."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `a.b.name` -> the module `a.b`
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# The layers, lowest first; a name is a top-level module or package of kernelevolve. A module may
# import its own package, its layer's others (no loop between them: the test below) and lower layers.
LAYERS = [
    ["errors", "pyast", "config"],  # leaves
    # values; the harness's self-check; a spec written from a tritonbench operator
    ["spec", "roofline", "tunables", "native", "integrity", "work_memory", "tritonbench"],
    ["store", "report", "export", "export_native", "export_runtime"],  # the workspace; exports of it
    ["platforms"],  # devices, their profiles and timers
    ["evaluate"],  # the harness
    ["profile"],  # profilers and diagnosis (in sandboxed processes of the harness's)
    ["knowledge"],  # documents, retrieval, skills
    ["synth"],  # what writes candidates: the operator, providers, the offline tuner
    ["search"],  # the tree search
    ["data", "cost"],  # records out of the workspace; the cost estimate
    ["jobs", "optimize", "agent_jobs", "bench", "serve"],  # the jobs behind the commands; the live view
    [
        "cli_common",
        "cli",
        "cli_search",
        "cli_agent",
        "cli_kb",
        "cli_bench",
        "cli_serve",
        "mcp_server",
        "cli_config",
    ],
]


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _upward(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Imports from a module to a module of a higher layer."""
    rank = {name: i for i, layer in enumerate(layers) for name in layer}
    out = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = _top(name), _top(target)
            if a != b and a and b and rank[b] > rank[a]:  # "": the package's own __init__
                out.append(f"{name} -> {target}")
    return out


def test_no_package_imports_one_above_it() -> None:
    modules = _modules()
    graph = {name: _imports(path, name, modules) for name, path in modules.items()}
    named = {name for layer in LAYERS for name in layer}
    assert {_top(m) for m in modules} - {""} == named  # every part in a layer, no layer of a gone part
    assert _upward(graph, LAYERS) == []
    # and the parts of one layer do not import each other in a loop
    parts: dict[str, set[str]] = {}
    for name, targets in graph.items():
        parts.setdefault(_top(name), set()).update(_top(t) for t in targets if _top(t) != _top(name))
    assert _cycles(parts) == []


def test_an_upward_import_is_found() -> None:
    """The control: an import from a lower layer to a higher one is listed; the reverse is not."""
    graph = {"k.store.a": {"k.search.b"}, "k.search.b": {"k.store.c"}, "k.store.c": set()}
    assert _upward(graph, [["store"], ["search"]]) == ["k.store.a -> k.search.b"]


def test_the_package_has_no_import_loops() -> None:
    modules = _modules()
    assert len(modules) > 100 and "kernelevolve.evaluate.worker" in modules
    graph = {name: _imports(path, name, modules) for name, path in modules.items()}
    # a package's __init__ may gather its modules, and they may import their package's contract from
    # it: a parent package <-> its own submodule is not a loop between modules
    for name in graph:
        graph[name] = {t for t in graph[name] if not (name.startswith(t + ".") and t in modules)}
    assert _cycles(graph) == []


def test_the_loop_finder_finds_a_loop() -> None:
    """The control: a graph with a loop through three modules, and one without."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


LONG = 450  # lines: a module longer than this says why it is one module


def _long_without_reason(modules: dict[str, Path]) -> list[str]:
    out = []
    for name, path in sorted(modules.items()):
        source = path.read_text()
        doc = ast.get_docstring(ast.parse(source)) or ""
        if len(source.splitlines()) > LONG and "Why one module" not in doc:
            out.append(f"{name} ({len(source.splitlines())} lines)")
    return out


def test_a_long_module_says_why_it_is_one() -> None:
    """Issue H: modules a newcomer can read top to bottom. Past LONG lines a module either splits or
    its docstring gives the reason ("Why one module ..."), which a reviewer can then weigh."""
    assert _long_without_reason(_modules()) == []


def test_the_length_check_sees_a_long_module(tmp_path: Path) -> None:
    """The control: a long module without a reason is listed, with one it is not."""
    body = "x = 1\n" * (LONG + 1)
    (tmp_path / "plain.py").write_text('"""A module."""\n' + body)
    (tmp_path / "said.py").write_text('"""A module.\n\nWhy one module: a table.\n"""\n' + body)
    found = _long_without_reason({"k.plain": tmp_path / "plain.py", "k.said": tmp_path / "said.py"})
    assert found == [f"k.plain ({LONG + 2} lines)"]


def test_the_design_doc_names_every_module() -> None:
    """docs/design.md's layout is the map a newcomer starts from: every module appears in it by name
    (the knowledge base's code samples, data rather than modules, aside)."""
    import re

    doc = (SRC.parent / "docs" / "design.md").read_text()
    missing = [
        name
        for name, path in _modules().items()
        if path.stem != "__init__"
        and ".knowledge.docs." not in name
        and not re.search(rf"\b{re.escape(path.stem)}\b", doc)
    ]
    assert missing == []
