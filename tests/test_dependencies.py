"""The package's declared dependencies match what its code imports: every third-party module that
`src/kernelevolve` imports is declared (core or an extra), and every core dependency is imported.
A user who installs what pyproject.toml says gets code that imports; nothing is installed for nothing."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "kernelevolve"
# Code that runs as candidates in the harness's workers, not as the package: its imports are the
# candidates' (torch, triton), checked by the sample tests.
SAMPLES = SRC / "knowledge" / "docs"
# Where an import name is not the distribution's name.
DISTRIBUTION = {
    "pynvml": "nvidia-ml-py",
    "pydantic_settings": "pydantic-settings",
    "sentence_transformers": "sentence-transformers",
}


def _requirement_name(text: str) -> str:
    return re.split(r"[<>=!~\[; ]", text.strip(), maxsplit=1)[0].lower()


def declared() -> tuple[set[str], set[str]]:
    """(core, extras): the distributions pyproject.toml declares, by name."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {_requirement_name(r) for r in project["dependencies"]}
    extras = {
        _requirement_name(r)
        for name, reqs in project["optional-dependencies"].items()
        if name != "dev"
        for r in reqs
    }
    return core, extras


def imported(root: Path) -> dict[str, set[str]]:
    """Third-party top-level modules imported anywhere under `root` (in functions too), with where."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if SAMPLES in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "kernelevolve":
                    found.setdefault(DISTRIBUTION.get(top, top).lower(), set()).add(path.name)
    return found


def test_every_imported_module_is_declared_and_every_core_dependency_is_imported() -> None:
    core, extras = declared()
    found = imported(SRC)
    undeclared = {name: sorted(where) for name, where in found.items() if name not in core | extras}
    assert undeclared == {}, "imported but not declared in pyproject.toml"
    assert sorted(core - set(found)) == [], "declared as a core dependency but imported nowhere"
    assert {"torch", "typer", "rich", "pydantic", "pydantic-settings", "anyio", "nvidia-ml-py"} <= set(found)


def test_the_scan_sees_an_undeclared_import(tmp_path: Path) -> None:
    """The control: a module importing something undeclared, inside a function, is found."""
    (tmp_path / "mod.py").write_text(
        "import os\ndef f():\n    import pynvml\n    from yaml import safe_load\n"
    )
    found = imported(tmp_path)
    assert set(found) == {"nvidia-ml-py", "yaml"}  # the standard library is not a dependency
    core, extras = declared()
    assert "yaml" not in core | extras
