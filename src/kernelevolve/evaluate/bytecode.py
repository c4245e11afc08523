"""Bytecode for workers where the Python installation keeps none.

Every candidate gets a fresh worker, and a worker imports torch, triton and torch.compile's stack:
about 2,000 modules. Where the installation has no bytecode beside its sources (an image built with
`PYTHONDONTWRITEBYTECODE`, or `pip install --no-compile`; the GPU machine this project is measured on
is one), each worker compiled them all from source again: 5 s of a 15-20 s start-up on an H100. And a
worker may not write bytecode itself (`PYTHONDONTWRITEBYTECODE` in its environment): what it wrote
would be read by every later worker, and a candidate could plant its own.

So the engine keeps the bytecode, in a folder of its own (`folder`: beneath the temporary directory,
created by this user with mode 0700, refused if anyone else owns it or may write it). Workers read it
(`PYTHONPYCACHEPREFIX`) and may not write it (it is not among the sandbox's writable folders). It is
filled once per machine and Python, by a process of the engine's that compiles the sources the first
worker reports having imported (`fill`), a worker that has run no candidate yet: the list names only
files beneath the Python installation and the project's own package, so nothing else is compiled.
Until it is filled, workers compile from source as before; bytecode that no longer matches its source
is ignored by Python itself.

Nothing changes where the installation has its bytecode (`needed` is False): a pip install compiles
it, and Python finds it beside the sources, where no worker may write either.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

FILLED = ".filled"  # written last: the folder's list was compiled
FILLING = ".filling"  # held (created exclusively) while one process compiles
STALE_FILLING_S = 600.0

# Compiles the files named on stdin into the bytecode folder given by -X pycache_prefix, then marks it.
_FILLER = r"""
import py_compile, sys
from pathlib import Path
folder = Path(sys.argv[1])
files = [f for f in sys.stdin.read().splitlines() if f]
done = 0
for f in files:
    try:
        py_compile.compile(f, doraise=True, quiet=2)
        done += 1
    except Exception:
        pass
(folder / ".filled").write_text(f"{done} of {len(files)}\n")
(folder / ".filling").unlink(missing_ok=True)
"""


@functools.cache  # asked at every worker's start; the installation does not change under a process
def needed() -> bool:
    """Whether this installation lacks bytecode beside its sources (torch's, read as the sign)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return False
    init = Path(spec.origin)
    return not (init.parent / "__pycache__" / f"{init.stem}.{sys.implementation.cache_tag}.pyc").exists()


def root() -> Path:
    return Path(tempfile.gettempdir()) / f"kernelevolve-{os.getuid()}" / "bytecode"


def folder() -> Path | None:
    """The engine's bytecode folder for this Python, created if needed; None where it is not needed or
    cannot be trusted (another user's, or writable by others)."""
    if not needed():
        return None
    base = root()
    path = base / f"{sys.implementation.cache_tag}-{_digest(sys.prefix + ' ' + _versions())}"
    try:
        for p in (base.parent, base, path):
            p.mkdir(mode=0o700, exist_ok=True)
            st = p.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
    except OSError:
        return None
    return path


def filled(path: Path) -> bool:
    return (path / FILLED).exists()


def fill(path: Path, files: Iterable[str]) -> subprocess.Popen[bytes] | None:
    """Compile `files` (those beneath the Python installation and this package) into `path`, in a
    background process of the engine's, at low priority. None if it is filled or being filled."""
    if filled(path) or not _claim(path):
        return None
    roots = [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]
    roots.append(Path(__file__).resolve().parent.parent)  # kernelevolve's own package
    chosen = [f for f in files if f.endswith(".py") and _beneath(Path(f), roots)]
    cmd = [sys.executable, "-X", f"pycache_prefix={path}", "-c", _FILLER, str(path)]
    if shutil.which("nice"):
        cmd = ["nice", "-n", "10", *cmd]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write("\n".join(chosen).encode())
        proc.stdin.close()
    except OSError:
        (path / FILLING).unlink(missing_ok=True)
        return None
    return proc


def module_files() -> list[str]:
    """The source files of every module this process has imported (a worker reports them once)."""
    files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    return sorted(f for f in files if isinstance(f, str) and f.endswith(".py"))


def _claim(path: Path) -> bool:
    marker = path / FILLING
    with contextlib.suppress(OSError):
        if time.time() - marker.stat().st_mtime > STALE_FILLING_S:  # a filler that died
            marker.unlink()
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError:
        return False
    return True


def _beneath(path: Path, roots: list[Path]) -> bool:
    try:
        resolved = path.resolve()
    except OSError:
        return False
    return any(resolved.is_relative_to(r) for r in roots)


@functools.cache
def _versions() -> str:
    """The packages whose modules fill the folder: an upgrade gets a new one (Python would ignore stale
    bytecode anyway, but the old folder, marked filled, would never be filled again)."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("torch", "triton", "kernelevolve"):
        try:
            found.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            continue
    return " ".join(found)


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:10]


__all__ = ["fill", "filled", "folder", "module_files", "needed"]
