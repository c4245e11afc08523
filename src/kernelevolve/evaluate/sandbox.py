"""The worker's sandbox: a scrubbed environment, resource limits, and a kill that leaves nothing behind.

What it covers:
- Environment: every variable that looks like a secret (*KEY*, *TOKEN*, *SECRET*, *PASSWORD*,
  *CREDENTIAL*, cloud and LLM provider prefixes) is removed; HOME and TMPDIR point into the worker's
  own temporary directory, so dotfiles with credentials are out of reach by path.
- Limits (set by the worker on itself, before torch is imported): address-space growth through
  RLIMIT_DATA (not RLIMIT_AS, which breaks CUDA start-up), no core files, a maximum file size, and a
  CPU-time backstop; RLIMIT_NPROC where it is enforced (not for root).
- Kill: the worker leads its own process group and is a child subreaper (orphans of its descendants
  are re-parented to it); after reporting it waits to be killed rather than exiting. `kill_tree` stops
  the group, collects every descendant (including ones that left the group with setsid or
  double-forked) from /proc, and SIGKILLs them all.

What it does not cover (see SECURITY.md): the network (issue E adds a namespace where the OS allows
it), the file system outside the temporary directory (the worker runs as the same user), and a
candidate that is root on the machine can raise its own limits. The static and runtime guards keep
a candidate's Python away from `os`, `resource` and `ctypes`; native code is contained by these
limits and the kill alone.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|CERT|SIGNATURE|WEBHOOK|"
    r"^AWS_|^AZURE_|^GCP_|^GOOGLE_|^OPENAI|^ANTHROPIC|^HF_|^HUGGING|^GITHUB_|^GH_|^GITLAB|^NETRC|"
    r"^SSH_|^GPG|^DOCKER_|^NPM_|^PYPI|^TWINE|^WANDB|^DATABASE_URL|^REDIS_URL|_URI$|_DSN$",
    re.IGNORECASE,
)


def scrub_env(env: dict[str, str], workdir: Path) -> dict[str, str]:
    """A worker's environment: the parent's minus anything secret-looking, with a private HOME."""
    clean = {k: v for k, v in env.items() if not SECRET_NAME.search(k)}
    clean["HOME"] = str(workdir)
    clean["TMPDIR"] = str(workdir / "tmp")
    clean["PYTHONDONTWRITEBYTECODE"] = "1"
    clean["PYTHONUNBUFFERED"] = "1"
    clean["PYTHONNOUSERSITE"] = "1"
    return clean


def apply_limits(memory_bytes: int, cpu_seconds: int, file_bytes: int) -> list[str]:
    """Limit this process (the worker). Returns notes about limits the OS did not enforce."""
    import resource

    notes = []

    def lower(which: int, value: int) -> None:
        _soft, hard = resource.getrlimit(which)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (cap, cap))

    lower(resource.RLIMIT_CORE, 0)
    lower(resource.RLIMIT_DATA, memory_bytes)
    lower(resource.RLIMIT_FSIZE, file_bytes)
    lower(resource.RLIMIT_CPU, cpu_seconds)
    if not _become_subreaper():
        notes.append("could not become a child subreaper: double-forked processes may escape the kill")
    if os.geteuid() == 0:
        notes.append(
            "running as root: RLIMIT_NPROC is not enforced; process count is bounded by the kill only"
        )
    else:
        lower(resource.RLIMIT_NPROC, 4096)
    return notes


def _become_subreaper() -> bool:
    """Orphans of our descendants are re-parented to us, not to init, so `kill_tree` still finds a
    process that double-forked to escape (Linux 3.4+)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def descendants(pid: int, include_zombies: bool = True) -> list[int]:
    """All descendants of `pid`, found through /proc (Linux); empty elsewhere."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: parse after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] == "Z" and not include_zombies:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def kill_tree(pid: int) -> None:
    """Stop the process group (no more forking), collect every descendant, SIGKILL them all."""
    try:
        os.killpg(pid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(3):  # a child forked between the listing and the kill is caught on the next pass
        found = descendants(pid)
        for p in found:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not found:
            break
        time.sleep(0.01)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
