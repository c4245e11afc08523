"""Layered settings (`kernelevolve.config`): defaults < workspace config.toml < KERNELEVOLVE_* < flags.
Strictness and `kernelevolve config`: test_settings_strict.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelevolve.config import DEFAULT_WORKSPACE, Settings, load_settings, resolve_workspace
from kernelevolve.errors import WorkspaceError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No KERNELEVOLVE_* variable of the machine leaks into these tests."""
    for key in list(os.environ):
        if key.startswith("KERNELEVOLVE_"):
            monkeypatch.delenv(key)
    yield


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def write_toml(ws: Path, text: str) -> None:
    (ws / "config.toml").write_text(text)


def test_defaults(ws: Path) -> None:
    s = load_settings(ws)
    assert s.workspace == ws
    assert s.platform == "auto"
    assert s.baselines == ["eager", "compile"]
    assert s.fitness_baseline == "best"  # each shape's faster baseline
    assert s.timing_budget_s == 1.0
    assert s.seeds == 3
    assert s.gpu_memory_fraction is None
    assert s == Settings(workspace=ws)


def test_toml_overrides_defaults(ws: Path) -> None:
    write_toml(
        ws,
        'timing_budget_s = 2.5\nplatform = "cpu"\nbaselines = ["eager"]\nseeds = 5\n'
        "gpu_memory_fraction = 0.4\n",
    )
    s = load_settings(ws)
    assert s.timing_budget_s == 2.5
    assert s.platform == "cpu"
    assert s.baselines == ["eager"]
    assert s.fitness_baseline == "eager"  # the faster of what is measured: eager alone here
    assert s.seeds == 5
    assert s.gpu_memory_fraction == 0.4
    assert s.max_trials == Settings().max_trials  # untouched fields keep their defaults


def test_env_overrides_toml(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(ws, "timing_budget_s = 2.5\nmin_trials = 30\n")
    monkeypatch.setenv("KERNELEVOLVE_TIMING_BUDGET_S", "4.0")
    monkeypatch.setenv("KERNELEVOLVE_DEVICE", "3")
    s = load_settings(ws)
    assert s.timing_budget_s == 4.0
    assert s.device == 3 and isinstance(s.device, int)
    assert s.min_trials == 30


def test_cli_overrides_env_and_none_means_not_given(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(ws, "min_trials = 30\n")
    monkeypatch.setenv("KERNELEVOLVE_TIMING_BUDGET_S", "4.0")
    monkeypatch.setenv("KERNELEVOLVE_MAX_TRIALS", "100")
    s = load_settings(ws, {"timing_budget_s": 0.5, "max_trials": None, "min_trials": None, "seeds": 7})
    assert s.timing_budget_s == 0.5
    assert s.max_trials == 100
    assert s.min_trials == 30
    assert s.seeds == 7


def test_cli_values_are_coerced(ws: Path) -> None:
    s = load_settings(ws, {"timing_budget_s": "0.25", "baselines": "eager", "workers": "2"})
    assert s.timing_budget_s == 0.25
    assert s.baselines == ["eager"]
    assert s.workers == 2


def test_list_from_a_comma_separated_string(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELEVOLVE_BASELINES", "eager, compile,")
    assert load_settings(ws).baselines == ["eager", "compile"]
    monkeypatch.setenv("KERNELEVOLVE_BASELINES", "compile")
    assert load_settings(ws).baselines == ["eager", "compile"]


def test_optional_float_from_the_environment(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(ws, "gpu_memory_fraction = 0.4\n")
    monkeypatch.setenv("KERNELEVOLVE_GPU_MEMORY_FRACTION", "0.7")
    assert load_settings(ws).gpu_memory_fraction == 0.7
    monkeypatch.setenv("KERNELEVOLVE_GPU_MEMORY_FRACTION", "auto")
    assert load_settings(ws).gpu_memory_fraction is None


def test_declared_variables_are_accepted_and_others_refused(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `KERNELEVOLVE_*` variable that is not a setting is read by something else (declared in
    `config.OTHER_VARIABLES`) or is a mistake: it was ignored, and a misspelling passed silently."""
    monkeypatch.setenv("KERNELEVOLVE_LEASE_DIR", "/nowhere")
    assert load_settings(ws) == Settings(workspace=ws)
    monkeypatch.setenv("KERNELEVOLVE_NOT_A_SETTING", "x")
    with pytest.raises(WorkspaceError, match="unknown environment variable KERNELEVOLVE_NOT_A_SETTING"):
        load_settings(ws)


def test_unknown_toml_key_lists_valid_keys(ws: Path) -> None:
    write_toml(ws, "timing_budget = 2.0\n")
    with pytest.raises(WorkspaceError) as info:
        load_settings(ws)
    assert "'timing_budget'" in info.value.message
    assert str(ws / "config.toml") in info.value.message
    assert info.value.hint is not None
    for key in ("timing_budget_s", "seeds", "baselines", "platform"):
        assert key in info.value.hint
    assert "workspace" not in info.value.hint.split(": ", 1)[1].split(", ")


def test_workspace_cannot_be_set_in_its_own_toml(ws: Path) -> None:
    write_toml(ws, 'workspace = "/elsewhere"\n')
    with pytest.raises(WorkspaceError, match="unknown setting 'workspace'"):
        load_settings(ws)


def test_invalid_toml(ws: Path) -> None:
    write_toml(ws, "timing_budget_s = = 2\n")
    with pytest.raises(WorkspaceError, match="invalid TOML"):
        load_settings(ws)


@pytest.mark.parametrize(
    ("layer", "key", "value"),
    [
        ("toml", "timing_budget_s", '"fast"'),
        ("toml", "seeds", '"many"'),
        ("env", "timing_budget_s", "fast"),
        ("env", "max_trials", "1e3"),
        ("cli", "device", "first"),
    ],
)
def test_bad_value_names_the_setting(
    ws: Path, monkeypatch: pytest.MonkeyPatch, layer: str, key: str, value: str
) -> None:
    overrides = {}
    if layer == "toml":
        write_toml(ws, f"{key} = {value}\n")
    elif layer == "env":
        monkeypatch.setenv("KERNELEVOLVE_" + key.upper(), value)
    else:
        overrides[key] = value
    with pytest.raises(WorkspaceError) as info:
        load_settings(ws, overrides)
    assert repr(key) in info.value.message


def test_unknown_cli_override(ws: Path) -> None:
    with pytest.raises(WorkspaceError, match="unknown setting 'budget'"):
        load_settings(ws, {"budget": 1.0})


# -- validate -------------------------------------------------------------------------------------


def test_validate_enforces_at_least_three_seeds(ws: Path) -> None:
    assert Settings(seeds=1).validate().seeds == 3
    assert Settings(seeds=8).validate().seeds == 8
    assert load_settings(ws, {"seeds": 0}).seeds == 3


def test_validate_always_measures_eager() -> None:
    s = Settings(baselines=["compile"]).validate()
    assert s.baselines == ["eager", "compile"]
    assert s.fitness_baseline == "best"
    s = Settings(baselines=["eager"], fitness_baseline="compile").validate()
    assert s.fitness_baseline == "eager"  # compile is not measured, so it cannot be the baseline


def test_validate_clamps_counts() -> None:
    s = Settings(workers=-2, spares=-1).validate()
    assert (s.workers, s.spares) == (0, 0)


def test_validate_refuses_unknown_baselines() -> None:
    with pytest.raises(WorkspaceError, match="inductor"):
        Settings(baselines=["eager", "inductor"]).validate()
    with pytest.raises(WorkspaceError, match="fitness_baseline"):
        Settings(fitness_baseline="cudnn").validate()


def test_to_dict_is_plain(ws: Path) -> None:
    d = load_settings(ws).to_dict()
    assert d["workspace"] == str(ws)
    assert d["baselines"] == ["eager", "compile"]


# -- workspace resolution -------------------------------------------------------------------------


def test_resolve_workspace_flag_over_env_over_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_workspace() == DEFAULT_WORKSPACE == Path(".kernelevolve")
    monkeypatch.setenv("KERNELEVOLVE_WORKSPACE", str(tmp_path / "env"))
    assert resolve_workspace() == tmp_path / "env"
    assert resolve_workspace(None) == tmp_path / "env"
    assert resolve_workspace(tmp_path / "flag") == tmp_path / "flag"
    assert resolve_workspace(str(tmp_path / "flag")) == tmp_path / "flag"


def test_load_settings_reads_the_toml_of_the_env_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_ws, flag_ws = tmp_path / "env", tmp_path / "flag"
    env_ws.mkdir()
    flag_ws.mkdir()
    write_toml(env_ws, "seeds = 4\n")
    write_toml(flag_ws, "seeds = 6\n")
    monkeypatch.setenv("KERNELEVOLVE_WORKSPACE", str(env_ws))
    s = load_settings()
    assert (s.workspace, s.seeds) == (env_ws, 4)
    s = load_settings(flag_ws)
    assert (s.workspace, s.seeds) == (flag_ws, 6)


def test_missing_workspace_is_not_an_error(tmp_path: Path) -> None:
    s = load_settings(tmp_path / "not-yet")
    assert s.workspace == tmp_path / "not-yet"
    assert not (tmp_path / "not-yet").exists()


def test_fractional_value_for_an_integer_setting_is_refused(ws: Path) -> None:
    write_toml(ws, "max_trials = 2.9\n")
    with pytest.raises(WorkspaceError, match="max_trials"):
        load_settings(ws)
