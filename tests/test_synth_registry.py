"""Synthesizers register by name (`synth/registry.py`): a third party's through the entry-point group
`kernelevolve.synthesizers`, the built-ins without any, PROVIDER:MODEL as the operator over a model."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from kernelevolve.errors import WorkspaceError
from kernelevolve.spec import load_spec
from kernelevolve.synth import SynthConfig, create, registry
from kernelevolve.synth.base import Proposal, Task

from .conftest import SPECS


class Echo:
    """A synthesizer of a third party's: proposes the spec's own reference as ModelNew."""

    name = "echo"

    def __init__(self, spec: Any, platform: str, kinds: tuple[str, ...]):
        self.spec, self.platform, self.kinds = spec, platform, kinds

    def propose(self, task: Task) -> Proposal:
        raise AssertionError("not called here")


def make_echo(cfg: SynthConfig, spec: Any, platform: str, kinds: tuple[str, ...], **_: Any) -> Echo:
    return Echo(spec, platform, kinds)


def _advertise(monkeypatch: pytest.MonkeyPatch, **targets: str) -> None:
    eps = [importlib.metadata.EntryPoint(name=n, value=v, group=registry.GROUP) for n, v in targets.items()]
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: eps if group == registry.GROUP else []
    )
    for name in targets:
        monkeypatch.delitem(registry._REGISTERED, name, raising=False)


def test_a_synthesizer_registers_through_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    _advertise(monkeypatch, echo="tests.test_synth_registry:make_echo")
    spec = load_spec(SPECS / "softmax.py")
    synth = create(SynthConfig("echo"), spec, "cpu", frozenset({"c"}))
    assert isinstance(synth, Echo) and synth.spec is spec and synth.kinds == ("c",)
    assert not SynthConfig("echo").is_model  # no SDK, key or price is asked of it
    assert "echo" in registry.names() and "tuner" in registry.names()


def test_an_unknown_name_says_which_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    _advertise(monkeypatch, echo="tests.test_synth_registry:make_echo")
    with pytest.raises(WorkspaceError, match="unknown synthesizer 'ech'") as err:
        create(SynthConfig("ech"), load_spec(SPECS / "softmax.py"), "cpu", ("c",))
    assert err.value.hint is not None and "echo" in err.value.hint and "agent" in err.value.hint


def test_a_plugin_that_fails_to_load_fails_its_search_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _advertise(monkeypatch, gone="tests.no_such_module:factory")
    with pytest.raises(WorkspaceError, match=r"'gone' .*failed to load: ModuleNotFoundError"):
        registry.factory_for("gone")


def test_the_built_ins_need_no_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source tree never installed has no entry points: the tuner and the agent come anyway."""
    from kernelevolve.synth.agent import ExternalAgent
    from kernelevolve.synth.tuner.driver import OfflineTuner

    _advertise(monkeypatch)
    monkeypatch.delitem(registry._REGISTERED, "tuner", raising=False)
    monkeypatch.delitem(registry._REGISTERED, "agent", raising=False)
    spec = load_spec(SPECS / "softmax.py")
    assert isinstance(create(SynthConfig(), spec, "cpu", ("c",)), OfflineTuner)
    assert isinstance(create(SynthConfig("agent"), spec, "cpu", ("c",)), ExternalAgent)
    assert registry.factory_for("openai:gpt-4.1") is registry.model and SynthConfig("openai:gpt-4.1").is_model


def test_a_name_with_a_colon_is_a_model_not_a_synthesizer() -> None:
    with pytest.raises(ValueError, match="no colon"):
        registry.register_synthesizer("mine:v1", make_echo)
