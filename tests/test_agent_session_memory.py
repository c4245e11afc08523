"""An agent session's runs share a GPU's memory (`agent_jobs.Session`): each is granted its part when
it attaches, as a bench grants its runs theirs, and one that no longer fits is refused with what holds
the memory. Issue I's proof started three KernelBench runs at once in one MCP server; each planned
the whole device as its own, and their submits failed with out-of-memory errors."""

from __future__ import annotations

from contextlib import ExitStack
from types import SimpleNamespace
from typing import Any

import pytest

from kernelevolve.agent_jobs import Session
from kernelevolve.bench import schedule
from kernelevolve.config import Settings
from kernelevolve.errors import WorkspaceError
from kernelevolve.evaluate import memory

GiB = 2**30


class FakeGpu:
    name = "cuda"

    def device_memory(self, index: int) -> tuple[int, int]:
        return 80 * GiB, 80 * GiB  # (free, total)


def _engine(run_id: str, need_gib: float, wish_gib: float, platform: Any = None) -> Any:
    spec = SimpleNamespace(need=int(need_gib * GiB), wish=int(wish_gib * GiB))
    ctx = SimpleNamespace(spec=spec, platform=platform or FakeGpu(), settings=Settings())
    return SimpleNamespace(run_id=run_id, ctx=ctx)


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Session:
    monkeypatch.setattr(
        schedule, "run_demand",
        lambda spec, platform, settings: (spec.need, spec.wish) if platform.name == "cuda" else None,
    )  # fmt: skip
    monkeypatch.setattr(memory, "fit", lambda spec, platform, settings, reading: (settings, None))
    monkeypatch.setattr(memory, "settled_memory", lambda spec, platform, settings: (80 * GiB, 80 * GiB))
    return Session(tmp_path)


def test_runs_of_one_session_get_parts_of_the_device_and_a_run_that_cannot_fit_is_refused(
    session: Session,
) -> None:
    usable = 0.9 * 80 * GiB
    a, a_stack = _engine("aaaa", need_gib=10, wish_gib=20), ExitStack()
    session._share_device(a, a_stack)
    # Granted its wish with the bench's margin (30 GiB), and its pool planned on that part.
    assert a.ctx.settings.device_share == pytest.approx(usable / (30 * GiB), rel=1e-3)

    b, b_stack = _engine("bbbb", need_gib=30, wish_gib=60), ExitStack()
    with pytest.raises(WorkspaceError, match=r"run bbbb needs about 45\.0 GiB.*aaaa \(30\.0 GiB\)") as exc:
        session._share_device(b, b_stack)
    assert "finish one of them" in (exc.value.hint or "")
    assert b.ctx.settings.device_share == 1.0  # refused: nothing planned, nothing granted

    small, small_stack = _engine("cccc", need_gib=1, wish_gib=3), ExitStack()
    session._share_device(small, small_stack)  # a small run still fits beside the first
    assert small.ctx.settings.device_share == pytest.approx(usable / (4.5 * GiB), rel=1e-3)

    a_stack.close()  # run aaaa finished: its part is given back
    small_stack.close()
    session._share_device(b, b_stack)
    assert b.ctx.settings.device_share == 1.0  # alone, it wished for more than all: the whole device
    assert session._granted == {"bbbb": (("cuda", 0), int(usable))}
    b_stack.close()
    assert session._granted == {}


def test_a_cpu_run_is_granted_nothing(session: Session) -> None:
    cpu = SimpleNamespace(name="cpu", device_memory=lambda index: None)
    run, stack = _engine("dddd", need_gib=100, wish_gib=100, platform=cpu), ExitStack()
    session._share_device(run, stack)
    assert run.ctx.settings.device_share == 1.0 and session._granted == {}
