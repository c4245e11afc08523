"""Every channel from a candidate's native code to the engine's secrets, other processes and the
user's files, tried as an attacker would (`sandbox_probes.py`), in a real worker and in the
profiler's process, with the static guards on: each must reach nothing.

The engine runs in a process of its own with a canary in its environment (as OPENAI_API_KEY and
ANTHROPIC_API_KEY) and its home (a Ray token), and a real workspace database. A control run with
the sandbox's layers switched off by their settings shows that every probe can reach its target
(so a stub sandbox cannot pass), and what it reached is asserted on as well.
"""

from __future__ import annotations

import errno
import json
import secrets
from pathlib import Path

import pytest

from tests.conftest import SPECS
from tests.sandbox_probes import accepted, attacker, listeners, parse, run_engine
from tests.test_sandbox import LANDLOCK_MISSING, NETNS_MISSING, PIDNS_MISSING

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any((NETNS_MISSING, LANDLOCK_MISSING, PIDNS_MISSING)),
        reason=str(NETNS_MISSING or LANDLOCK_MISSING or PIDNS_MISSING),
    ),
]

OFF = {"sandbox_network": False, "sandbox_processes": False, "sandbox_filesystem": False}
NOT_FOUND = {-errno.ENOENT, -errno.ESRCH}


def _attack(
    tmp: Path, mode: str = "evaluate", **overrides: object
) -> tuple[list[dict[str, int]], dict[str, bool]]:
    """(each candidate's probes, what reached the test: the listeners, /dev/shm, the verdicts)."""
    canary = "kv-canary-" + secrets.token_hex(8)
    tag = "kv-test-" + secrets.token_hex(6)
    sources = [attacker(), attacker(shm_only=True)]
    with listeners(tag) as (tcp_server, unix_server):
        fields = {"@SHM_NAME@": tag, "@UNIX_NAME@": tag, "@PORT@": str(tcp_server.getsockname()[1])}
        results = run_engine(
            tmp, sources, canary, "cpu", SPECS / "softmax.py", mode=mode, fields=fields, **overrides
        )
        heard = {"tcp": accepted(tcp_server), "unix": accepted(unix_server)}
    for r in results:  # the static guard let the attacker through: what is tested is the OS
        assert "static" not in str(r["status"]).lower(), r
    probes = [parse(str(r["message"])) for r in results]
    shm_left = Path("/dev/shm") / tag
    heard["shm_left"] = shm_left.exists()
    shm_left.unlink(missing_ok=True)
    heard["canary_in_verdicts"] = canary in json.dumps(results)
    return probes, heard


def _assert_sealed(probes: list[dict[str, int]], heard: dict[str, bool]) -> None:
    first, second = probes
    assert first["environ_scan"] == 0  # the canary is in no environ the worker can open
    assert first["environ_engine"] in NOT_FOUND  # the engine has no /proc entry in its namespace
    assert first["environ_parent"] <= 0  # its parent there is the namespace's init, not the engine
    assert first["mem_file"] in NOT_FOUND
    assert first["vm_readv"] in NOT_FOUND | {-errno.EPERM}
    assert first["ptrace_engine"] in NOT_FOUND | {-errno.EPERM}
    assert first["home_file"] == -errno.EACCES  # Landlock: the home is not readable
    assert first["workspace_db"] == -errno.EACCES
    assert first["shm_write"] == 1  # its own /dev/shm is writable ...
    assert second["shm_read"] == -errno.ENOENT  # ... and gone for the next candidate
    assert first["tcp"] in (-errno.ENETUNREACH, -errno.EACCES, -errno.ECONNREFUSED)
    assert first["abstract_unix"] in (-errno.ECONNREFUSED, -errno.EPERM)
    assert heard == {"tcp": False, "unix": False, "shm_left": False, "canary_in_verdicts": False}


def _assert_open(probes: list[dict[str, int]], heard: dict[str, bool]) -> None:
    """The control: with every layer off the same probes reach every target."""
    first, second = probes
    assert first["environ_scan"] >= 1 and first["environ_engine"] == 1
    assert first["mem_file"] == 1 and first["vm_readv"] == 1
    assert first["home_file"] == 1 and first["workspace_db"] == 1
    assert first["shm_write"] == 1 and second["shm_read"] == 1
    assert first["tcp"] == 1 and first["abstract_unix"] == 1
    assert heard["tcp"] and heard["unix"] and heard["shm_left"]


def test_a_workers_native_code_reaches_no_secret_process_or_file(tmp_path: Path) -> None:
    probes, heard = _attack(tmp_path)
    _assert_sealed(probes, heard)


def test_with_the_layers_off_the_same_worker_probes_reach_everything(tmp_path: Path) -> None:
    probes, heard = _attack(tmp_path, **OFF)
    _assert_open(probes, heard)


def test_the_profilers_process_reaches_no_secret_process_or_file(tmp_path: Path) -> None:
    probes, heard = _attack(tmp_path, mode="torch")
    _assert_sealed(probes, heard)


def test_with_the_layers_off_the_same_profiled_probes_reach_everything(tmp_path: Path) -> None:
    probes, heard = _attack(tmp_path, mode="torch", **OFF)
    _assert_open(probes, heard)
