"""Strict settings (`kernelevolve.config.layers`) and `kernelevolve config`: a misspelled variable or
key, or a value that is not exactly a boolean or a number, is refused with the name to fix; each
value's layer is reported; the code reads no `KERNELEVOLVE_*` variable that is not declared; and a
worker process never imports pydantic."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kernelevolve.cli import app
from kernelevolve.config import OTHER_VARIABLES, Settings, Source, explain_settings, load_settings
from kernelevolve.errors import WorkspaceError

SRC = Path(__file__).resolve().parent.parent / "src"


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


def refusal(ws: Path, overrides: dict[str, object] | None = None) -> WorkspaceError:
    with pytest.raises(WorkspaceError) as info:
        load_settings(ws, overrides)
    return info.value


# -- unknown names -----------------------------------------------------------------------------------


def test_a_misspelled_variable_is_refused_with_the_nearest_name(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNELEVOLVE_TIMING_BUDGT_S", "2")
    error = refusal(ws)
    assert "KERNELEVOLVE_TIMING_BUDGT_S (did you mean KERNELEVOLVE_TIMING_BUDGET_S?)" in error.message
    assert error.hint == "rename KERNELEVOLVE_TIMING_BUDGT_S -> KERNELEVOLVE_TIMING_BUDGET_S (or unset it)"


def test_a_variable_far_from_every_name_is_refused_with_the_list(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNELEVOLVE_ZZZ", "1")
    monkeypatch.setenv("KERNELEVOLVE_SEDS", "4")  # both named, in one error
    error = refusal(ws)
    assert "KERNELEVOLVE_SEDS (did you mean KERNELEVOLVE_SEEDS?)" in error.message
    assert "KERNELEVOLVE_ZZZ" in error.message
    assert error.hint is not None and "rename KERNELEVOLVE_SEDS -> KERNELEVOLVE_SEEDS" in error.hint
    monkeypatch.delenv("KERNELEVOLVE_SEDS")
    error = refusal(ws)
    assert "did you mean" not in error.message
    assert error.hint is not None
    for name in ("KERNELEVOLVE_TIMING_BUDGET_S", "KERNELEVOLVE_SANDBOX_NETWORK", *OTHER_VARIABLES):
        assert name in error.hint


def test_declared_variables_that_are_not_settings_are_accepted(
    ws: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in OTHER_VARIABLES:
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    assert load_settings(ws) == Settings(workspace=ws)  # the flag's workspace over the variable's


def test_an_unknown_toml_key_is_refused_with_the_nearest_name(ws: Path) -> None:
    (ws / "config.toml").write_text("sandbox_netwrk = false\n")
    error = refusal(ws)
    assert (
        error.message
        == f"{ws / 'config.toml'}: unknown setting 'sandbox_netwrk'; did you mean 'sandbox_network'?"
    )
    (ws / "config.toml").write_text("[sandbox]\nnetwork = false\n")  # tables are not settings
    assert "unknown setting 'sandbox'" in refusal(ws).message


def test_an_unknown_flag_is_refused_with_the_nearest_name(ws: Path) -> None:
    assert refusal(ws, {"timing_budget": 1.0}).message == (
        "unknown setting 'timing_budget'; did you mean 'timing_budget_s'?"
    )


# -- values ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("TRUE", True), ("1", True), ("Yes", True), ("on", True),
     ("false", False), ("False", False), ("0", False), ("no", False), ("OFF", False)],
)  # fmt: skip
def test_booleans_from_the_environment(
    ws: Path, monkeypatch: pytest.MonkeyPatch, text: str, value: bool
) -> None:
    monkeypatch.setenv("KERNELEVOLVE_SANDBOX_NETWORK", text)
    monkeypatch.setenv("KERNELEVOLVE_KNOWLEDGE", text)
    s = load_settings(ws)
    assert s.sandbox_network is value and s.knowledge is value


@pytest.mark.parametrize("text", ["ture", "t", "y", "2", "", "enabled", "false!"])
def test_anything_else_is_not_a_boolean(ws: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("KERNELEVOLVE_SANDBOX_NETWORK", text)
    error = refusal(ws)
    assert error.message == (
        f"environment variable KERNELEVOLVE_SANDBOX_NETWORK (setting 'sandbox_network'): cannot read "
        f"{text!r} as a boolean (true, false, 1, 0, yes, no, on, off; in any case)"
    )
    assert error.hint == "set KERNELEVOLVE_SANDBOX_NETWORK to a boolean, or unset it"


def test_booleans_in_the_toml(ws: Path) -> None:
    (ws / "config.toml").write_text("sandbox_network = false\nskills = 0\n")
    s = load_settings(ws)
    assert (s.sandbox_network, s.skills) == (False, False)
    (ws / "config.toml").write_text('sandbox_network = "ture"\nknowledge = 2\n')
    error = refusal(ws)
    lines = error.message.splitlines()
    toml = ws / "config.toml"
    assert lines[0].startswith(f"{toml}: setting 'sandbox_network': cannot read 'ture' as a boolean (true")
    assert lines[1].startswith(f"{toml}: setting 'knowledge': cannot read 2 as a boolean (true")
    assert error.hint == f"correct {toml}"


@pytest.mark.parametrize(
    ("name", "text"),
    [("TIMING_BUDGET_S", "nan"), ("TIMING_BUDGET_S", "inf"), ("TIMING_BUDGET_S", "2,5"),
     ("MAX_TRIALS", "40.5"), ("MAX_TRIALS", "forty"), ("GPU_MEMORY_FRACTION", "half")],
)  # fmt: skip
def test_numbers_must_parse(ws: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> None:
    monkeypatch.setenv("KERNELEVOLVE_" + name, text)
    error = refusal(ws)
    assert error.message.startswith(f"environment variable KERNELEVOLVE_{name} (setting '{name.lower()}')")
    assert f"cannot read {text!r} as a " in error.message


def test_numbers_and_unset_words(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELEVOLVE_TIMING_BUDGET_S", "2")
    monkeypatch.setenv("KERNELEVOLVE_MAX_TRIALS", " 40 ")
    monkeypatch.setenv("KERNELEVOLVE_WARMUP_S", "none")
    monkeypatch.setenv("KERNELEVOLVE_TIMING_PRECISION", "")
    (ws / "config.toml").write_text('workspace_max_usd = "auto"\nmin_trials = 10.0\n')
    s = load_settings(ws)
    assert s.timing_budget_s == 2.0 and isinstance(s.timing_budget_s, float)
    assert s.max_trials == 40 and s.min_trials == 10 and isinstance(s.min_trials, int)
    assert (s.warmup_s, s.timing_precision, s.workspace_max_usd) == (None, None, None)


def test_lists_stay_comma_separated_not_json(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELEVOLVE_SANDBOX_READ_PATHS", "/opt/a,/opt/b")
    assert load_settings(ws).sandbox_read_paths == ["/opt/a", "/opt/b"]
    monkeypatch.setenv("KERNELEVOLVE_SANDBOX_READ_PATHS", '["/opt/a"]')  # a JSON list is a name here
    assert load_settings(ws).sandbox_read_paths == ['["/opt/a"]']


# -- layers and their sources ------------------------------------------------------------------------


def test_each_layer_overrides_the_one_below_and_is_named(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = ws / "config.toml"
    toml.write_text("seeds = 4\nmin_trials = 30\nmax_trials = 300\nworkers = 3\n")
    monkeypatch.setenv("KERNELEVOLVE_MIN_TRIALS", "31")
    monkeypatch.setenv("KERNELEVOLVE_MAX_TRIALS", "301")
    monkeypatch.setenv("KERNELEVOLVE_SPARES", "2")
    s, sources = explain_settings(ws, {"max_trials": 302, "platform": "cpu", "workers": None})
    assert (s.seeds, s.min_trials, s.max_trials, s.workers, s.spares, s.platform) == (4, 31, 302, 3, 2, "cpu")
    assert sources["seeds"] == sources["workers"] == Source("toml", str(toml))
    assert sources["min_trials"] == Source("env", "KERNELEVOLVE_MIN_TRIALS")
    assert sources["spares"] == Source("env", "KERNELEVOLVE_SPARES")
    assert sources["max_trials"] == sources["platform"] == Source("flag")
    assert sources["timing_budget_s"] == Source("default") and s.timing_budget_s == Settings().timing_budget_s
    assert sources["workspace"] == Source("flag")
    assert set(sources) == set(s.to_dict())


def test_the_workspace_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert explain_settings()[1]["workspace"] == Source("default")
    monkeypatch.setenv("KERNELEVOLVE_WORKSPACE", str(tmp_path / "env"))
    s, sources = explain_settings()
    assert (s.workspace, sources["workspace"]) == (tmp_path / "env", Source("env", "KERNELEVOLVE_WORKSPACE"))


# -- kernelevolve config -----------------------------------------------------------------------------


def invoke(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, ["config", *map(str, args)], env=env)


def test_config_lists_each_value_and_its_source(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "config.toml").write_text("seeds = 5\n")
    monkeypatch.chdir(ws.parent)  # short paths: a table row on one line
    result = invoke("--workspace", "ws", "--platform", "cpu", env={"KERNELEVOLVE_TIMING_BUDGET_S": "2.5"})
    assert result.exit_code == 0, result.stderr + result.stdout
    rows = {
        cells[0]: cells[1:]
        for line in result.stdout.splitlines()
        if len(cells := [c.strip() for c in re.split(r"[│|]", line)[1:-1]]) == 3
    }
    assert rows["timing_budget_s"] == ["2.5", "env KERNELEVOLVE_TIMING_BUDGET_S"]
    assert rows["seeds"] == ["5", f"toml {Path('ws') / 'config.toml'}"]
    assert rows["workspace"] == ["ws", "flag"]
    assert rows["platform"] == ["cpu", "flag"]
    assert rows["max_trials"] == [str(Settings().max_trials), "default"]
    assert rows["gpu_memory_fraction"] == ["unset", "default"]
    assert set(rows) - {"setting"} == set(Settings().to_dict())


def test_config_json(ws: Path, tmp_path: Path) -> None:
    (ws / "config.toml").write_text('baselines = ["eager"]\n')
    key = str(tmp_path / "seal.key")
    env = {"KERNELEVOLVE_SANDBOX_NETWORK": "off", "KERNELEVOLVE_SEAL_KEY_FILE": key}
    result = invoke("--json", "-w", ws, "--device", "1", env=env)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    settings = doc["settings"]
    assert settings["sandbox_network"] == {
        "value": False, "source": "env", "where": "KERNELEVOLVE_SANDBOX_NETWORK"
    }  # fmt: skip
    assert settings["baselines"] == {"value": ["eager"], "source": "toml", "where": str(ws / "config.toml")}
    assert settings["fitness_baseline"]["value"] == "eager"  # after Settings.validate
    assert settings["device"] == {"value": 1, "source": "flag", "where": None}
    assert settings["workspace"] == {"value": str(ws), "source": "flag", "where": None}
    assert settings["seeds"] == {"value": 3, "source": "default", "where": None}
    assert doc["environment"] == {"KERNELEVOLVE_SEAL_KEY_FILE": key}


def test_config_refuses_what_every_command_refuses(ws: Path) -> None:
    result = invoke("-w", ws, env={"KERNELEVOLVE_SANDBOX_NETWORK": "ture"})
    assert result.exit_code == 2
    assert "KERNELEVOLVE_SANDBOX_NETWORK" in result.stderr and "'ture'" in result.stderr
    assert "yes, no, on, off" in result.stderr
    result = invoke("-w", ws, env={"KERNELEVOLVE_TIMING_BUDGT_S": "2"})
    assert result.exit_code == 2
    assert "did you mean KERNELEVOLVE_TIMING_BUDGET_S?" in result.stderr


# -- the variables the code reads --------------------------------------------------------------------

VARIABLE = re.compile(r"KERNELEVOLVE_[A-Z][A-Z0-9_]*")


def read_variables(text: str) -> set[str]:
    return set(VARIABLE.findall(text))


def undeclared(found: set[str]) -> set[str]:
    settings = {"KERNELEVOLVE_" + name.upper() for name in Settings().to_dict() if name != "workspace"}
    return found - settings - set(OTHER_VARIABLES)


def test_the_code_reads_no_undeclared_variable() -> None:
    """Every `KERNELEVOLVE_*` name in the package's code and docs is a setting's variable or one of
    `OTHER_VARIABLES`: a new one that is neither would be refused by `load_settings` wherever set."""
    found: dict[str, set[str]] = {}
    for path in sorted((SRC / "kernelevolve").rglob("*")):
        if path.suffix in (".py", ".md"):
            for name in read_variables(path.read_text()):
                found.setdefault(name, set()).add(str(path.relative_to(SRC)))
    assert {"KERNELEVOLVE_LEASE_DIR", "KERNELEVOLVE_NATIVE_CACHE", "KERNELEVOLVE_PRICES"} <= set(found)
    assert {name: sorted(found[name]) for name in undeclared(set(found))} == {}
    # and each declared one is read somewhere besides its declaration
    elsewhere = {n for n, paths in found.items() if paths - {"kernelevolve/config/values.py"}}
    assert set(OTHER_VARIABLES) - elsewhere - {"KERNELEVOLVE_WORKSPACE"} == set()


def test_the_scan_finds_an_undeclared_variable() -> None:
    """The control: a read of an undeclared variable is found; a setting's and a declared one's are not."""
    code = 'os.environ.get("KERNELEVOLVE_NEW_THING"); env["KERNELEVOLVE_LEASE_DIR"] = d  # KERNELEVOLVE_SEEDS'
    assert undeclared(read_variables(code)) == {"KERNELEVOLVE_NEW_THING"}


# -- what a worker imports ---------------------------------------------------------------------------


def test_a_worker_never_imports_pydantic() -> None:
    """The worker's entry module and the settings value import no pydantic; loading settings does (the
    control: the check can see it)."""
    script = (
        "import sys\n"
        "import kernelevolve.evaluate.worker\n"
        "from kernelevolve.config import Settings, load_settings\n"
        "Settings(seeds=1).validate()\n"
        "def seen(): return sorted(m for m in sys.modules if m.split('.')[0].startswith('pydantic'))\n"
        "print(seen())\n"
        "load_settings(sys.argv[1])\n"
        "print(len(seen()) > 0)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELEVOLVE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script, "/nonexistent-ws"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "True"]
