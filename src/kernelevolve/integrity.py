"""The harness checks itself: is the kernelevolve this process imported the one that was installed?

A coding agent that drives kernelevolve has a shell as the user (issue O); editing the installed
harness (the comparison, the timer) would forge every number after it. So the engine, before it starts
any worker, and every worker, before it prepares, ask `check()`:

- **installed** (a wheel or sdist in site-packages: a `kernelevolve-*.dist-info` beside the imported
  package): every file of the package that the distribution's `RECORD` lists with a hash is hashed
  again, and a `.py` file of the package that `RECORD` does not list counts too. A difference is
  `modified`, and `check()` raises `HarnessError` naming the files: nothing is evaluated by it.
- **a working tree** (an editable install, or `src` on `PYTHONPATH`: no distribution beside the
  package): a developer edits it, so it is not refused; it is labelled, with the commit and whether
  the tree is dirty where git can say (`git` in the package's folder).

Either way `Harness.label` goes into every verdict's method (`Method.harness`) with the digest of the
package's files (sha256 over each file's path and content), so a verdict says which harness made it,
and a stored verdict is reused only under the same one (`evaluate.reuse`).

What this does not stop (SECURITY.md): an agent that can write site-packages can rewrite `RECORD` too.
The check catches an edit made without that care; the protection that holds is an agent that cannot
write the harness's files (a container, or another user), as the README says.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import functools
import hashlib
import importlib.metadata
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kernelevolve.errors import HarnessError

PACKAGE = "kernelevolve"


@dataclass(frozen=True)
class Harness:
    kind: str  # "installed" | "working tree"
    version: str
    digest: str  # sha256 over the package's files (path and content), hex
    root: str  # the folder holding the package
    modified: tuple[str, ...] = field(default=())  # files (relative to root) that differ from RECORD
    commit: str | None = None  # a working tree's git commit, where git knows it
    dirty: bool | None = None  # a working tree's uncommitted changes, where git knows

    @property
    def label(self) -> str:
        """What a verdict's method records: how the harness was installed, and its digest."""
        head = f"kernelevolve {self.version}"
        if self.kind == "installed":
            state = "modified" if self.modified else "intact"
            return f"{head} installed ({state}), files sha256 {self.digest[:16]}"
        where = f"at {self.commit[:12]}" if self.commit else "(not a git checkout)"
        dirty = "" if self.dirty is None else f", dirty: {'yes' if self.dirty else 'no'}"
        return f"{head} from a working tree {where}{dirty}, files sha256 {self.digest[:16]}"


@functools.lru_cache(maxsize=2)
def harness(git: bool = True) -> Harness:
    """This process's harness (computed once: about 300 small files). `git`: ask git for a working
    tree's commit and state (the engine does; a worker, which may not run programs, does not)."""
    import kernelevolve

    if git:  # the files' state once per process; git adds a working tree's commit to it
        h = harness(git=False)
        if h.kind == "installed":
            return h
        commit, dirty = _git_state(Path(h.root) / PACKAGE)
        return dataclasses.replace(h, commit=commit, dirty=dirty)
    package = Path(kernelevolve.__file__).resolve().parent
    root = package.parent
    files = _package_files(package)
    digest = _digest(root, files)
    # An installed distribution lies beside the package and has a RECORD (an editable install's
    # egg-info beside a checkout's package has none; its dist-info in site-packages is elsewhere).
    dists = [
        d for d in importlib.metadata.distributions(name=PACKAGE, path=[str(root)]) if d.read_text("RECORD")
    ]
    if not dists:
        return Harness("working tree", kernelevolve.__version__, digest, str(root))
    modified = _modified(dists[0], root, files)
    return Harness("installed", kernelevolve.__version__, digest, str(root), modified=modified)


def check(git: bool = True, expected_digest: str | None = None) -> Harness:
    """The harness, if it may evaluate: an installed harness whose files differ from its RECORD is
    refused, with the files named and how to restore it; so is one whose digest is not
    `expected_digest` (a worker's, against its engine's: a file changed between the two starts)."""
    h = harness(git)
    if expected_digest and h.digest != expected_digest:
        raise HarnessError(
            f"the harness's files in {h.root} changed after the engine started (files sha256 "
            f"{h.digest[:16]}, the engine's {expected_digest[:16]}): this worker evaluates nothing",
            hint="start the command again; if nothing should have changed them, see SECURITY.md",
        )
    if h.modified:
        shown = ", ".join(h.modified[:5]) + (
            f" and {len(h.modified) - 5} more" if len(h.modified) > 5 else ""
        )
        raise HarnessError(
            f"the installed harness was modified after it was installed ({shown} in {h.root} no longer "
            "match the hashes of its RECORD): it evaluates nothing",
            hint=f"reinstall it (pip install --force-reinstall --no-deps kernelevolve=={h.version}), and run "
            "coding agents where they cannot write it (SECURITY.md)",
        )
    return h


def _package_files(package: Path) -> list[Path]:
    return sorted(
        p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def _digest(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def _modified(dist: importlib.metadata.Distribution, root: Path, files: list[Path]) -> tuple[str, ...]:
    """The package's files whose content is not what RECORD says, or that RECORD does not list."""
    record = dist.read_text("RECORD") or ""
    listed: dict[str, str] = {}
    for row in csv.reader(record.splitlines()):
        if len(row) >= 2 and row[0].startswith(f"{PACKAGE}/"):
            listed[row[0]] = row[1]
    changed = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        want = listed.get(rel)
        if want is None:
            if f.suffix == ".py":  # a module added beside the installed ones
                changed.append(rel)
            continue
        algo, _, value = want.partition("=")
        if not value:
            continue
        got = base64.urlsafe_b64encode(hashlib.new(algo, f.read_bytes()).digest()).rstrip(b"=").decode()
        if got != value:
            changed.append(rel)
    missing = [rel for rel, want in listed.items() if want and not (root / rel).is_file()]
    return tuple(sorted(changed + missing))


def _git_state(package: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout holding `package`, or (None, None) where git cannot say."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return None, None
        status = subprocess.run(
            ["git", "-C", str(package), "status", "--porcelain", "--", "."],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return commit.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None, None
