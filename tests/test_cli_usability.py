"""The command line as a script or a new user meets it: help that shows what was written, one
`--devices` vocabulary, shell completion, errors that name the spec's line, read-only commands that
never create a workspace, `--json` errors on stdout, `--quiet`/`--verbose`, USD caps that can count,
and exit codes that tell "faster" from "correct but not faster".

Fast: nothing here starts a worker. Where a command would run a search, the library job behind it
(`kernelevolve.optimize.optimize`) is replaced by one that returns a stored-looking summary, so what
is tested is the CLI's own part: parsing, the summary's outcome, the exit code, what goes where.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import typer.main
from typer.testing import CliRunner, Result

from kernelevolve.cli import app
from kernelevolve.cli_common import EXIT_CODES, parse_devices_option, set_verbosity
from kernelevolve.cli_search import outcome
from kernelevolve.config import load_settings
from kernelevolve.cost import require_price
from kernelevolve.errors import SpecError, WorkspaceError
from kernelevolve.spec import import_spec_module, raised_by_spec
from kernelevolve.synth import SynthConfig, providers
from tests.conftest import SPECS
from tests.fakes import ScriptedModel

REPO = Path(__file__).parent.parent
SOFTMAX = SPECS / "softmax.py"


def invoke(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env=env, prog_name="kernelevolve")


@pytest.fixture(autouse=True)
def _verbosity_reset() -> Iterator[None]:
    yield
    set_verbosity(False, False)  # what a -q or -v invocation set stays with the process otherwise


# -- 1. help shows what was written ------------------------------------------------------------------


def _commands() -> Iterator[tuple[list[str], Any]]:
    def walk(path: list[str], cmd: Any) -> Iterator[tuple[list[str], Any]]:
        yield path, cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk([*path, name], sub)

    yield from walk([], typer.main.get_command(app))


def _flat(text: str) -> str:
    """Rendered help without its box drawing and line wrapping: words separated by one space."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


COMMANDS = [path for path, _ in _commands()]


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) or "kernelevolve" for p in COMMANDS])
def test_every_help_text_is_shown_as_written(path: list[str]) -> None:
    """Rich reads `[...]` in help as markup and drops it: "Workspace directory [env ...; default ...]."
    rendered as "Workspace directory ." Every option's and argument's help must render whole."""
    cmd = next(c for p, c in _commands() if p == path)
    result = invoke(*path, "--help", env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    shown = _flat(result.stdout)
    helps = [p.help for p in cmd.params if getattr(p, "help", None)]
    assert helps or not cmd.params
    for text in helps:
        assert _flat(text) in shown, f"{' '.join(path)}: help {text!r} is not shown as written"
    if cmd.help:
        first = cmd.help.split("\n\n")[0]
        assert _flat(first) in shown


def test_the_workspace_option_says_its_default() -> None:
    shown = _flat(invoke("runs", "--help", env={"COLUMNS": "100"}).stdout)
    assert (
        "Workspace directory (default ./.kernelevolve, or the environment's KERNELEVOLVE_WORKSPACE)." in shown
    )


# -- 2. one --devices vocabulary -------------------------------------------------------------------


def test_devices_option_takes_auto_all_and_indices_everywhere() -> None:
    assert parse_devices_option(None) is None
    assert parse_devices_option("auto") == "auto"
    assert parse_devices_option("all") == "auto"  # bench's word before, kept as an alias
    assert parse_devices_option(" ALL ") == "auto"
    assert parse_devices_option("1, 0") == "1,0"
    for bad in ("", "x", "0,0", "-1", "all,1"):
        with pytest.raises(WorkspaceError, match="auto"):
            parse_devices_option(bad)


def test_optimize_bench_and_resume_document_the_same_devices_words() -> None:
    for command in ("optimize", "bench", "resume"):
        shown = _flat(invoke(command, "--help", env={"COLUMNS": "100"}).stdout)
        assert "indices like 0,1,2,3, or auto (every visible device; `all` is an alias)" in shown, command


class FakeOptimize:
    """Stands in for `kernelevolve.optimize.optimize`: records what the CLI asked for, emits a few
    progress events and a debug log line, and returns `summary` (or raises `raises`)."""

    def __init__(self, summary: dict[str, Any] | None = None, raises: BaseException | None = None):
        self.summary, self.raises, self.calls = summary, raises, []

    def __call__(
        self, spec: Path, settings: Any, search: Any, limits: Any, synth: Any, on_event: Any,
        start_from: Any = None,
    ) -> Any:  # fmt: skip
        self.calls.append(
            {"spec": spec, "settings": settings, "limits": limits, "synth": synth, "start_from": start_from}
        )
        on_event("run", {"run_id": "r1"})
        logging.getLogger("kernelevolve.search").debug("a debug line from the library")
        on_event("stop", {"reason": "candidate budget reached (2/2)"})
        if self.raises is not None:
            raise self.raises
        return self.summary


def summary_of(best_node: int | None, fitness: float | None, spread: float = 0.01) -> dict[str, Any]:
    return {
        "run_id": "r1", "status": "done", "stop_reason": "candidate budget reached (2/2)",
        "best_node": best_node, "best_fitness": fitness, "best_speedup_vs_eager": fitness,
        "best_speedup_vs_compile": fitness, "best_speedup_vs_best": fitness, "baseline": "best",
        "final": {"spread": spread} if best_node else None, "nodes_evaluated": 2, "nodes_ok": 1,
        "wall_s": 1.0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "shapes": [],
    }  # fmt: skip


@pytest.fixture
def fake_optimize(monkeypatch: pytest.MonkeyPatch) -> FakeOptimize:
    fake = FakeOptimize(summary_of(2, 1.5))
    monkeypatch.setattr("kernelevolve.optimize.optimize", fake)
    return fake


def test_optimize_takes_all_as_auto_and_indices(fake_optimize: FakeOptimize, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert invoke("optimize", SOFTMAX, "--devices", "all", "-w", ws, "--json").exit_code == 0
    assert invoke("optimize", SOFTMAX, "--devices", "1,0", "-w", ws, "--json").exit_code == 0
    assert [c["settings"].devices for c in fake_optimize.calls] == ["auto", "1,0"]
    bad = invoke("optimize", SOFTMAX, "--devices", "gpus", "-w", ws)
    assert bad.exit_code == 2 and "give distinct indices like 0,1,2,3, or auto" in bad.stderr


def test_bench_takes_auto_as_well_as_all(tmp_path: Path) -> None:
    """bench used to refuse `auto` (its word was `all`): both now mean every visible GPU, and on a
    machine without one both say so, naming the word given."""
    from kernelevolve.cli_bench import _devices

    assert _devices("2,0") == [2, 0]
    if torch.cuda.is_available():
        assert _devices("auto") == _devices("all") == list(range(torch.cuda.device_count()))
    else:
        for word in ("auto", "all"):
            with pytest.raises(WorkspaceError, match=f"--devices {word}: no GPU is visible"):
                _devices(word)


# -- 3. shell completion ---------------------------------------------------------------------------


def test_completion_is_offered_and_completes_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = invoke("--help").stdout
    assert "--install-completion" in shown and "--show-completion" in shown
    # the shell named, not detected (typer reads this when it builds the command, before the runner's env)
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    script = invoke("--show-completion", "bash")
    assert script.exit_code == 0 and "_KERNELEVOLVE_COMPLETE" in script.stdout
    completed = invoke(env={"_KERNELEVOLVE_COMPLETE": "complete_bash", "COMP_WORDS": "kernelevolve opt",
                            "COMP_CWORD": "1"})  # fmt: skip
    assert "optimize" in completed.stdout.split()


# -- 4, 5. a directory given as a spec; errors raised in the spec's own code -----------------------


def test_a_directory_given_as_the_spec_says_so_and_what_to_pass() -> None:
    result = invoke("spec", SPECS)
    assert result.exit_code == 5
    assert f"{SPECS} is a directory, not a spec file" in result.stderr
    assert "softmax.py" in result.stderr or "cumsum_dim.py" in result.stderr  # what it holds
    assert "no such file" not in result.stderr
    assert "kernelevolve bench" in result.stderr  # the command for a folder of specs


INPUTS_RAISE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    w = torch.empty(3)
    torch.nn.init.xavier_uniform_(w)  # line 12: a 1-d tensor has no fan-in
    return [w]


def get_init_inputs():
    return []
"""

INIT_RAISE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(-1, 4)  # line 8: a negative width

    def forward(self, x):
        return self.proj(x)


def get_inputs():
    return [torch.randn(2, 4)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize(
    ("source", "line", "code"),
    [(INPUTS_RAISE, 12, "torch.nn.init.xavier_uniform_(w)"), (INIT_RAISE, 8, "self.proj = nn.Linear(-1, 4)")],
    ids=["get_inputs", "Model.__init__"],
)
def test_an_error_in_the_spec_names_the_spec_line_not_torch(
    tmp_path: Path, source: str, line: int, code: str
) -> None:
    spec = tmp_path / "my_spec.py"
    spec.write_text(source)
    result = invoke("spec", spec)
    assert result.exit_code == 5, result.output
    assert f"(at {spec}:{line}: {code}" in result.stderr  # the spec's own line, with its code
    assert "raised inside " in result.stderr  # and, second, where in torch it was noticed
    assert "site-packages" not in result.stderr.split("(at ")[1].split(";")[0]


def test_a_reference_that_raises_in_a_worker_is_a_spec_error_naming_its_line(tmp_path: Path) -> None:
    """What the worker reports when the reference's forward raises at a real shape (`worker.py`):
    the spec's line; an error that never passed through the spec, or running out of memory, stays
    the harness's."""
    spec = tmp_path / "fwd_spec.py"
    spec.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return torch.nn.functional.linear(x, torch.ones(3, 5))\n\n\n"
        "def get_inputs():\n    return [torch.randn(2, 4)]\n"
    )
    module = import_spec_module(spec)
    with pytest.raises(RuntimeError) as caught:
        module.Model()(torch.randn(2, 4))
    said = raised_by_spec(caught.value, spec)
    assert isinstance(said, SpecError)
    assert "the reference raised RuntimeError" in said.message and f"(at {spec}:7: return" in said.message

    def harness() -> None:
        raise RuntimeError("a harness bug")

    with pytest.raises(RuntimeError) as elsewhere:
        harness()
    assert raised_by_spec(elsewhere.value, spec) is None
    for device_said in (
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        "CUDA error: an illegal memory access",
    ):
        lost = RuntimeError(device_said)  # raised through the spec's forward, but not the spec's fault
        lost.__traceback__ = caught.value.__traceback__
        assert raised_by_spec(lost, spec) is None


# -- 6. read-only commands never create a workspace ------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["runs"],
        ["show", "r1"],
        ["resume", "r1"],
        ["export", "r1"],
        ["benches", "list"],
        ["benches", "show", "b1"],
        ["skills", "list"],
        ["skills", "show", "s1"],
        ["agent", "next", "r1"],
        ["agent", "finish", "r1"],
        ["kb", "export", "bundle.json"],
    ],
    ids=lambda a: " ".join(a),
)
def test_read_only_commands_refuse_a_missing_workspace(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "typo" / "ws"
    result = invoke(*args, "-w", missing)
    assert result.exit_code == 2, result.output
    assert f"no workspace at {missing}: it does not exist" in result.stderr
    assert "--workspace" in result.stderr  # the hint says what to pass
    assert not missing.exists() and not missing.parent.exists()


def test_a_folder_without_a_database_is_not_a_workspace(tmp_path: Path) -> None:
    result = invoke("runs", "-w", tmp_path, "--json")
    assert result.exit_code == 2
    assert "is a directory without a kernelevolve database" in json.loads(result.stdout)["error"]
    assert list(tmp_path.iterdir()) == []


def test_the_environment_workspace_is_checked_too(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = invoke("runs", env={"KERNELEVOLVE_WORKSPACE": str(missing)})
    assert result.exit_code == 2 and f"no workspace at {missing}" in result.stderr
    assert not missing.exists()


# -- 7. --json errors are JSON on stdout -----------------------------------------------------------


def test_json_errors_are_one_object_on_stdout_with_the_exit_code(tmp_path: Path) -> None:
    missing = tmp_path / "missing_spec.py"
    result = invoke("spec", missing, "--json")
    assert result.exit_code == 5
    doc = json.loads(result.stdout)
    assert doc == {
        "error": f"{missing}: no such file",
        "hint": doc["hint"],
        "kind": "SpecError",
        "exit_code": 5,
    }
    assert "KernelBench-format .py file" in doc["hint"]
    assert "error:" in result.stderr  # and the human-readable line on stderr, as without --json

    plain = invoke("spec", missing)
    assert plain.exit_code == 5 and plain.stdout == ""  # without --json stdout stays empty


def test_json_usage_errors_are_json_too() -> None:
    result = invoke("runs", "--no-such-flag", "--json")
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["kind"] == "UsageError" and doc["exit_code"] == 2 and "--no-such-flag" in doc["error"]
    assert "runs --help" in doc["hint"]
    missing_arg = invoke("eval", "--json")
    assert missing_arg.exit_code == 2 and "Missing argument" in json.loads(missing_arg.stdout)["error"]


def test_interrupted_optimize_with_json_is_a_json_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("kernelevolve.optimize.optimize", FakeOptimize(raises=KeyboardInterrupt()))
    result = invoke("optimize", SOFTMAX, "-w", tmp_path / "ws", "--json")
    assert result.exit_code == 130
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == 130 and "kernelevolve resume r1" in doc["error"]


# -- 9. --quiet and --verbose ---------------------------------------------------------------------


def test_quiet_prints_results_and_errors_only(fake_optimize: FakeOptimize, tmp_path: Path) -> None:
    loud = invoke("optimize", SOFTMAX, "-w", tmp_path / "ws", "--json")
    assert loud.exit_code == 0 and "run r1" in loud.stderr and "stopping:" in loud.stderr
    quiet = invoke("--quiet", "optimize", SOFTMAX, "-w", tmp_path / "ws", "--json")
    assert quiet.exit_code == 0
    assert quiet.stderr == ""  # no progress
    assert json.loads(quiet.stdout)["run_id"] == "r1"  # the result
    error = invoke("-q", "spec", tmp_path / "missing.py")
    assert error.exit_code == 5 and "error:" in error.stderr  # errors are never silenced
    again = invoke("optimize", SOFTMAX, "-w", tmp_path / "ws", "--json")
    assert "run r1" in again.stderr  # --quiet held for its own invocation only


def test_verbose_adds_the_librarys_debug_log(fake_optimize: FakeOptimize, tmp_path: Path) -> None:
    plain = invoke("optimize", SOFTMAX, "-w", tmp_path / "ws", "--json")
    assert "a debug line from the library" not in plain.stderr
    verbose = invoke("--verbose", "optimize", SOFTMAX, "-w", tmp_path / "ws", "--json")
    assert verbose.exit_code == 0
    assert "kernelevolve.search DEBUG: a debug line from the library" in verbose.stderr
    assert "run r1" in verbose.stderr  # beside the progress
    json.loads(verbose.stdout)  # stdout stays one document
    both = invoke("-q", "-v", "runs")
    assert both.exit_code == 2 and "contradict" in both.output


# -- 10. a USD cap must be able to count the model -------------------------------------------------


@pytest.fixture
def scripted() -> Iterator[None]:
    providers.register("scripted", ScriptedModel)
    yield
    providers.unregister("scripted")


def test_a_usd_cap_on_a_model_without_a_price_is_refused(
    scripted: None, fake_optimize: FakeOptimize, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    result = invoke("optimize", SOFTMAX, "--llm", "scripted:fake-1", "--max-usd", "5", "-w", ws, "--json")
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert "--max-usd cannot limit scripted:fake-1" in doc["error"] and "no price" in doc["error"]
    assert str(ws / "prices.toml") in doc["hint"] and "KERNELEVOLVE_PRICES" in doc["hint"]
    assert '["scripted:fake-1"]' in doc["hint"]
    assert fake_optimize.calls == []  # refused before the run started

    capped = invoke("optimize", SOFTMAX, "--llm", "scripted:fake-1", "-w", ws, "--json",
                    env={"KERNELEVOLVE_WORKSPACE_MAX_USD": "10"})  # fmt: skip
    assert capped.exit_code == 2 and "workspace_max_usd cannot limit" in json.loads(capped.stdout)["error"]

    ws.mkdir()
    (ws / "prices.toml").write_text('["fake-1"]\ninput = 1.0\noutput = 2.0\n')
    priced = invoke("optimize", SOFTMAX, "--llm", "scripted:fake-1", "--max-usd", "5", "-w", ws, "--json")
    assert priced.exit_code == 0, priced.output  # with a price the cap counts: the run starts
    assert fake_optimize.calls[0]["limits"].max_usd == 5.0


def test_require_price_checks_only_capped_models(tmp_path: Path) -> None:
    settings = load_settings(tmp_path / "ws")
    require_price(SynthConfig("tuner"), 5.0, settings)  # calls no model
    require_price(SynthConfig("openai:some-local-model"), None, settings)  # no USD cap: runs, unpriced
    require_price(SynthConfig("openai:gpt-4.1"), 5.0, settings)  # in the default table
    with pytest.raises(WorkspaceError, match="--max-usd cannot limit openai:some-local-model"):
        require_price(SynthConfig("openai:some-local-model"), 5.0, settings)


def test_the_library_refuses_too(scripted: None, tmp_path: Path) -> None:
    """`optimize.start` (behind optimize, bench and the MCP server's start_run) checks as well."""
    from kernelevolve.optimize import start
    from kernelevolve.search.limits import Limits
    from kernelevolve.search.policies import SearchConfig

    settings = load_settings(tmp_path / "ws", {"platform": "cpu"})
    with pytest.raises(WorkspaceError, match="no price"):
        start(
            SOFTMAX, settings, SearchConfig(), Limits(budget=2, max_usd=1.0), SynthConfig("scripted:fake-1")
        )


# -- 11. exit codes that tell the outcomes apart ---------------------------------------------------


def test_outcome_of_a_summary() -> None:
    assert outcome(summary_of(None, None)) == ("no_correct_kernel", 1)
    assert outcome(summary_of(2, 1.5)) == ("faster", 0)
    assert outcome(summary_of(2, 0.8)) == ("not_faster", 4)  # correct, slower than the baseline
    assert outcome(summary_of(2, 1.005)) == ("not_faster", 4)  # inside the 1% smallest gain
    assert outcome(summary_of(2, 1.04, spread=0.05)) == ("not_faster", 4)  # inside the measured spread
    assert outcome(summary_of(2, None)) == ("not_faster", 4)  # the re-measurement was not ok


@pytest.mark.parametrize(
    ("best_node", "fitness", "code", "word"),
    [(2, 1.5, 0, "faster"), (2, 0.7, 4, "not_faster"), (None, None, 1, "no_correct_kernel")],
)
def test_optimize_exit_code_and_json_outcome(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, best_node: int | None, fitness: float | None, code: int,
    word: str,
) -> None:  # fmt: skip
    monkeypatch.setattr("kernelevolve.optimize.optimize", FakeOptimize(summary_of(best_node, fitness)))
    result = invoke("optimize", SOFTMAX, "-w", tmp_path / "ws", "--json")
    assert result.exit_code == code, result.output
    doc = json.loads(result.stdout)
    assert doc["outcome"] == word and doc["exit_code"] == code
    text = invoke("optimize", SOFTMAX, "-w", tmp_path / "ws")
    assert text.exit_code == code
    if word == "not_faster":
        assert "not faster than the baseline" in text.stdout


def test_exit_codes_are_documented_in_help_and_readme() -> None:
    shown = _flat(invoke("--help", env={"COLUMNS": "100"}).stdout)
    readme = (REPO / "README.md").read_text()
    table = readme.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    for code, what in EXIT_CODES.items():
        assert f"{code}: {_flat(what)}" in shown
        assert re.search(rf"^\| {code} \|", table, re.M), f"exit code {code} is not in the README's table"
