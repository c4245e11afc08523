"""Triton's part of the trusted compile cache: entries that still work when the cache is copied.

A run's trusted torch.compile cache (`jobs.trusted_cache`) is copied into every worker (see
`WorkerHandle.start`). Inductor's graph cache then hits, but on an H100 every worker still compiled
its Triton kernels again (ptxas and all, 2-4 s), for two reasons:
- Triton names a compiled kernel's files in a group file (`__grp__NAME.json`) by their absolute paths,
  which in a copy point into the worker that wrote them: gone, and not readable by the next one. The
  group fails to load and the kernel is compiled again. `relocate_groups` points each group at the
  files beside it (a kernel's files always live in its group's folder).
- A kernel loaded from inductor's graph cache has another Triton key than the one compiled when the
  graph was first built (its source arrives by another path), so the first worker's entries never
  match a later one's. `merge_new` adds what a later worker compiled to the trusted cache, taken, as
  the first copy was, before that worker has seen any candidate. Entries already there are never
  replaced.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path


def relocate_groups(triton_dir: Path) -> int:
    """Point every group file beneath `triton_dir` at the files in its own folder. Returns how many
    were rewritten."""
    rewritten = 0
    for group in triton_dir.glob("*/__grp__*.json") if triton_dir.is_dir() else ():
        try:
            data = json.loads(group.read_text())
            children = data.get("child_paths")
            if not isinstance(children, dict):
                continue
            moved = {name: str(group.parent / Path(str(path)).name) for name, path in children.items()}
            if moved != children:
                group.write_text(json.dumps({**data, "child_paths": moved}))
                rewritten += 1
        except (OSError, ValueError):
            continue
    return rewritten


def merge_new(worker_triton: Path, trusted_triton: Path) -> int:
    """Copy the kernel folders that `worker_triton` has and `trusted_triton` lacks (each whole, then
    renamed into place). Returns how many were added."""
    if not worker_triton.is_dir() or not trusted_triton.parent.is_dir():
        return 0
    trusted_triton.mkdir(exist_ok=True)
    have = {p.name for p in trusted_triton.iterdir()}
    added = 0
    for entry in worker_triton.iterdir():
        if entry.name in have or not entry.is_dir() or entry.is_symlink():
            continue
        tmp = trusted_triton / f".{entry.name}.tmp{time.monotonic_ns()}"
        try:
            shutil.copytree(entry, tmp, symlinks=True)
            tmp.rename(trusted_triton / entry.name)  # another pool may have added it meanwhile
            added += 1
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return added


__all__ = ["merge_new", "relocate_groups"]
