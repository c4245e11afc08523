"""The command line, end to end on the CPU platform: `eval`, `spec`, `platforms`, `baseline`, `--help`.

Commands run in-process through typer's CliRunner; evaluations still spawn real worker processes, so
the tests share one workspace (its hardware profile is measured once) and evaluate few candidates.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from kernelevolve.cli import app
from kernelevolve.spec import load_spec
from kernelevolve.store import Workspace
from tests.conftest import SPECS
from tests.cpu_candidates import HONEST, candidate

# Workers wait for the machine-wide CPU lease, which other kernelevolve processes may hold for a while.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).parent.parent
SOFTMAX = SPECS / "softmax.py"

# Short timing, as in `cpu_settings`.
ENV = {
    "KERNELEVOLVE_MIN_TRIALS": "10",
    "KERNELEVOLVE_MAX_TRIALS": "40",
    "KERNELEVOLVE_WARMUP_TRIALS": "2",
}

PARTIAL_FORWARD = """
    def forward(self, x):
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0] // 2, 0)
        return y
"""
PARTIAL = candidate(PARTIAL_FORWARD)  # half the rows are never written: incorrect


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli") / "ws"


@pytest.fixture(scope="module")
def cands(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("cands")
    (folder / "honest.py").write_text(HONEST)
    (folder / "partial.py").write_text(PARTIAL)
    (folder / "README.md").write_text("not a candidate\n")
    yield folder


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


def eval_args(workspace: Path, *paths: str | Path) -> list[str | Path]:
    return ["eval", SOFTMAX, *paths, "--json", "--no-compile", "--platform", "cpu",
            "--timing-budget", "0.15", "--workspace", workspace]  # fmt: skip


def one_json(result: Result) -> Any:
    """stdout must be exactly one JSON document (json.loads refuses anything after it)."""
    return json.loads(result.stdout)


def one_verdict(result: Result) -> Any:
    """`eval --json` is always {"spec": ..., "verdicts": [...]}: the one verdict of a one-candidate call."""
    doc = one_json(result)
    assert set(doc) == {"spec", "verdicts"} and len(doc["verdicts"]) == 1, doc
    return doc["verdicts"][0]


# -- eval ------------------------------------------------------------------------------------------


def test_eval_json_of_an_honest_candidate(workspace: Path, cands: Path) -> None:
    result = invoke(*eval_args(workspace, cands / "honest.py"))
    assert result.exit_code == 0, result.stderr + result.stdout
    doc = one_verdict(result)
    assert doc["status"] == "ok" and doc["correct"] is True
    assert isinstance(doc["speedup_vs_eager"], float) and doc["speedup_vs_eager"] > 0
    assert "speedup_vs_compile" in doc and doc["speedup_vs_compile"] is None  # --no-compile
    assert doc["candidate"] == str(cands / "honest.py")
    assert isinstance(doc["shapes"], list) and [s["name"] for s in doc["shapes"]] == ["narrow", "wide"]
    for s in doc["shapes"]:
        assert s["correct"] is True
        assert s["candidate"]["median_s"] > 0 and s["eager"]["median_s"] > 0
        assert s["compile"] is None
    method = doc["method"]
    assert method["device"] and method["torch"] and method["timer"] == "perf_counter"
    assert method["baselines"] == ["eager"] and method["fitness_baseline"] == "eager"
    assert "static guards" in result.stderr  # progress goes to stderr, never into the JSON


def test_eval_json_of_an_incorrect_candidate_exits_1(workspace: Path, cands: Path) -> None:
    result = invoke(*eval_args(workspace, cands / "partial.py"))
    assert result.exit_code == 1, result.stderr + result.stdout
    doc = one_verdict(result)
    assert doc["status"] == "incorrect" and doc["correct"] is False
    assert doc["fitness"] == 0.0 and doc["speedup_vs_eager"] is None


def test_eval_json_of_a_folder_lists_spec_and_verdicts(workspace: Path, cands: Path) -> None:
    result = invoke(*eval_args(workspace, cands))
    assert result.exit_code == 1, result.stderr + result.stdout  # one of the two is incorrect
    doc = one_json(result)
    assert set(doc) == {"spec", "verdicts"}
    assert doc["spec"]["name"] == "softmax"
    assert doc["spec"]["fingerprint"] == load_spec(SOFTMAX).fingerprint
    assert [Path(v["candidate"]).name for v in doc["verdicts"]] == ["honest.py", "partial.py"]
    assert [v["status"] for v in doc["verdicts"]] == ["ok", "incorrect"]
    with Workspace.open(workspace) as ws:  # every verdict was recorded
        recorded = {(e["candidate_hash"], e["status"]) for e in ws.evaluations(doc["spec"]["fingerprint"])}
    assert {(v["candidate_hash"], v["status"]) for v in doc["verdicts"]} <= recorded


def test_eval_of_a_missing_spec_exits_5_naming_the_file(workspace: Path, cands: Path) -> None:
    missing = workspace.parent / "no_such_spec.py"
    result = invoke("eval", missing, cands / "honest.py", "--json", "--platform", "cpu",
                    "--workspace", workspace)  # fmt: skip
    assert result.exit_code == 5  # the spec cannot be used (2 was every bad input before exit 5 existed)
    error = one_json(result)  # with --json, the error is the one document on stdout
    assert error["exit_code"] == 5 and error["kind"] == "SpecError" and "no such file" in error["error"]
    assert str(missing) in result.stderr  # never wrapped: paths stay greppable
    assert "error" in result.stderr and "no such file" in result.stderr


def test_eval_error_names_a_long_path_on_one_line(tmp_path: Path, workspace: Path, cands: Path) -> None:
    missing = tmp_path / ("a_rather_long_directory_name_" * 3) / "spec.py"
    result = invoke("eval", missing, cands / "honest.py", "--platform", "cpu", "--workspace", workspace)
    assert result.exit_code == 5
    assert str(missing) in result.stderr


def test_eval_error_names_a_path_with_brackets(tmp_path: Path) -> None:
    missing = tmp_path / "run[b]" / "spec.py"
    result = invoke("spec", missing)
    assert result.exit_code == 5
    assert "run[b]" in result.stderr


MARKUP_FORWARD = """
    def forward(self, x):
        y = torch.empty_like(x)
        _lib.softmax_rows(x, y, x.shape[1], 0, x.shape[0], 0)
        raise ValueError("expected a tensor like [/x] here")
"""


def test_eval_survives_a_candidate_error_that_looks_like_markup(workspace: Path, tmp_path: Path) -> None:
    cand = tmp_path / "markup.py"
    cand.write_text(candidate(MARKUP_FORWARD))
    result = invoke(*eval_args(workspace, cand))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1
    doc = one_verdict(result)
    assert doc["status"] == "runtime_error" and "[/x]" in doc["message"]


def test_eval_with_a_relative_spec_path(
    workspace: Path, cands: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usage in `eval --help`: relative paths. Workers run in their own directories, so the spec
    must reach them as an absolute path (it did not at 753664c: exit 2, 'softmax.py: no such file')."""
    monkeypatch.chdir(SPECS)
    result = invoke("eval", "softmax.py", cands / "honest.py", "--json", "--no-compile", "--platform",
                    "cpu", "--timing-budget", "0.15", "--workspace", workspace)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert one_verdict(result)["status"] == "ok"


# -- spec -------------------------------------------------------------------------------------------


def test_spec_json_shows_shapes_weights_and_fingerprint() -> None:
    result = invoke("spec", SOFTMAX, "--json")
    assert result.exit_code == 0, result.stderr
    doc = one_json(result)
    assert doc["name"] == "softmax"
    assert doc["fingerprint"] == load_spec(SOFTMAX).fingerprint
    assert doc["precision"] == "strict_fp32" and doc["backward"] is False
    shapes = {s["name"]: s for s in doc["shapes"]}
    assert set(shapes) == {"narrow", "wide"}
    assert shapes["narrow"]["weight"] == pytest.approx(0.75)
    assert shapes["wide"]["weight"] == pytest.approx(0.25)
    assert shapes["narrow"]["params"] == {"rows": 32, "cols": 256}
    assert shapes["wide"]["inputs"] == ["float32[16, 4096]"]


def test_spec_with_a_syntax_error_exits_5(tmp_path: Path) -> None:
    bad = tmp_path / "broken_spec.py"
    bad.write_text("import torch\n\nclass Model(torch.nn.Module:\n    pass\n")
    result = invoke("spec", bad, "--json")
    assert result.exit_code == 5
    assert one_json(result)["exit_code"] == 5
    assert "syntax error" in result.stderr and "broken_spec.py" in result.stderr


# -- platforms ------------------------------------------------------------------------------------


def test_platforms_json_measures_the_cpu_once(workspace: Path) -> None:
    first = invoke("platforms", "--json", "--workspace", workspace)
    assert first.exit_code == 0, first.stderr
    rows = {r["name"]: r for r in one_json(first)["platforms"]}
    assert {"cuda", "cpu", "rocm"} <= set(rows)
    for absent in ("cuda", "rocm"):
        assert rows[absent]["present"] is False and rows[absent]["why"]
        assert "profile" not in rows[absent]
    cpu = rows["cpu"]
    assert cpu["present"] is True and "c" in cpu["kinds"] and cpu["timed_kinds"] == ["c"]
    profile = cpu["profile"]
    assert profile["bandwidth"] > 0
    assert isinstance(profile["flops"], dict) and profile["flops"]["fp32"] > 0
    assert profile["measured_at"]

    second = invoke("platforms", "--json", "--workspace", workspace)
    assert second.exit_code == 0, second.stderr
    again = {r["name"]: r for r in one_json(second)["platforms"]}["cpu"]["profile"]
    assert again["measured_at"] == profile["measured_at"]
    assert again == profile
    with Workspace.open(workspace) as ws:
        assert ws.stats()["hardware_profiles"] == 1


# -- baseline -------------------------------------------------------------------------------------


def test_baseline_json_times_eager_and_compile_per_shape(workspace: Path) -> None:
    result = invoke("baseline", SOFTMAX, "--json", "--platform", "cpu", "--timing-budget", "0.15",
                    "--workspace", workspace)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = one_json(result)
    assert doc["device_key"].startswith("cpu | ")
    assert doc["spec"]["fingerprint"] == load_spec(SOFTMAX).fingerprint
    rows = {r["shape"]: r for r in doc["shapes"]}
    assert set(rows) == {"narrow", "wide"}
    for row in rows.values():
        assert row["eager"]["median_s"] > 0 and row["eager"]["n"] >= 10
        assert row["compile"]["median_s"] > 0  # torch.compile works on this CPU
        assert row["cuda_graphs"] is False and row["device"]
    with Workspace.open(workspace) as ws:
        cached = ws.baselines(doc["spec"]["fingerprint"])
        assert {b["shape"] for b in cached} == {"narrow", "wide"}
        assert {b["device_key"] for b in cached} == {doc["device_key"]}
        assert any(p.name.startswith("compile-") for p in (workspace / "cache").iterdir())


# -- help -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "eval",
        "baseline",
        "platforms",
        "spec",
    ],
)
def test_help_mentions_an_example(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0
    assert "Example" in result.stdout and f"kernelevolve {command} " in result.stdout


def test_help_examples_name_files_that_exist() -> None:
    named = set()
    for command in ("eval", "baseline"):
        named |= set(re.findall(r"examples/[\w/.-]+\.py", invoke(command, "--help").stdout))
    assert named
    assert sorted(p for p in named if not (REPO / p).is_file()) == []
