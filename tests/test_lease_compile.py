"""The device lease during a candidate's first call: a Triton kernel compiled after the first launch
(a pipeline's second kernel) compiles without the lease where the platform lets compiles run beside
timings, after the device finished what was launched; the next launch takes the lease again.

Driven through Triton's own runtime hooks (`triton.knobs.runtime`), the ones the worker installs
around the first call, on an evaluation object reduced to what the hooks touch.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

knobs = pytest.importorskip("triton.knobs", reason="Triton's runtime hooks (Triton >= 3.4)")

from kernelevolve.evaluate.evaluation import _Evaluation  # noqa: E402


class Timer:
    def __init__(self) -> None:
        self.syncs = 0

    def sync(self) -> None:
        self.syncs += 1


class Chan:
    def __init__(self) -> None:
        self.phases: list[str] = []

    def send(self, kind: str, **fields: Any) -> None:
        if kind == "phase":
            self.phases.append(fields["phase"])


def evaluation(exclusive: bool) -> _Evaluation:
    ev = object.__new__(_Evaluation)
    ev.state = SimpleNamespace(  # type: ignore[assignment]
        platform=SimpleNamespace(exclusive=exclusive), timer=Timer(), lease_key="dev-test"
    )
    ev.chan = Chan()  # type: ignore[assignment]
    ev.lease = None
    ev.phases = {}
    ev._phase_name = "compile"
    ev._phase_start = time.perf_counter()
    return ev


def lease_is_free(directory: Path) -> bool:
    """Whether another open of the lease file could lock it now (flock is per open file)."""
    fd = os.open(directory / "dev-test.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        assert exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        return False
    finally:
        os.close(fd)  # closing drops a lock taken here
    return True


@pytest.fixture
def lease_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KERNELEVOLVE_LEASE_DIR", str(tmp_path))
    return tmp_path


def test_a_second_kernel_compiles_without_the_lease(lease_dir: Path) -> None:
    runtime = knobs.runtime
    ev = evaluation(exclusive=False)
    timer = ev.state.timer
    with ev._first_launch_starts_run():
        runtime.launch_enter_hook(None)  # the first kernel's launch
        assert ev._phase_name == "first-run" and ev.lease is not None
        assert not lease_is_free(lease_dir)

        runtime.jit_cache_hook(key="second", repr="second kernel")  # the second kernel compiles
        assert ev._phase_name == "compile" and ev.lease is None
        assert timer.syncs == 1  # the first kernel finished under the lease
        assert lease_is_free(lease_dir)  # another candidate's timing may run meanwhile

        runtime.jit_post_compile_hook(key="second", repr="second kernel")
        assert ev._phase_name == "compile" and lease_is_free(lease_dir)  # not running yet

        runtime.launch_enter_hook(None)  # its launch: the lease again, the run limit again
        assert ev._phase_name == "first-run" and ev.lease is not None
        assert not lease_is_free(lease_dir)
    assert ev.chan.phases == ["lease", "first-run", "compile", "lease", "first-run"]
    assert runtime.jit_cache_hook is None and runtime.jit_post_compile_hook is None  # hooks restored
    ev.lease.release()


def test_an_exclusive_platform_keeps_the_lease_through_a_later_compile(lease_dir: Path) -> None:
    runtime = knobs.runtime
    ev = evaluation(exclusive=True)
    ev.take_lease()  # an exclusive platform holds it from the start
    with ev._first_launch_starts_run():
        runtime.launch_enter_hook(None)
        runtime.jit_cache_hook(key="second", repr="second kernel")
        assert ev._phase_name == "compile" and ev.lease is not None
        assert not lease_is_free(lease_dir) and ev.state.timer.syncs == 0
        runtime.jit_post_compile_hook(key="second", repr="second kernel")
        assert ev._phase_name == "first-run"
    ev.lease.release()
