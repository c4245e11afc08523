"""`--start-from`: the user's kernels as a run's first (`seed`) nodes, for every synthesizer.

The tuner's part is unit-tested on hand-made tasks (no harness); the runs evaluate real candidates on
the CPU with small shapes: the offline tuner (its templates stay on beside the seed, and a resume
never reads the file again), a scripted model (the seed is a parent of its task; a seed whose C does
not compile is a failed node, and the summary lists both seeds), and an agent run (its seeds are
evaluated at the first `next`). A file the static guards refuse stops `start` before anything is
recorded.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kernelevolve import tunables as tn
from kernelevolve.errors import KernelevolveError
from kernelevolve.search.limits import Limits
from kernelevolve.search.policies import SearchConfig
from kernelevolve.spec import load_spec
from kernelevolve.store import Workspace
from kernelevolve.store.blobs import candidate_hash
from kernelevolve.synth import SynthConfig, create, providers
from tests.conftest import EXAMPLES, SPECS, cpu_settings
from tests.fakes import ScriptedModel, text_reply
from tests.test_tuner_driver import SEED, NoTools, config_of, task

C_SOFTMAX = (EXAMPLES / "softmax/c_rowsoftmax.py").read_text()
# The same file with a C syntax error: it passes the static guards, and fails to compile in a worker.
BROKEN_C = C_SOFTMAX.replace("float inv = 1.0f / s;", "float inv = 1.0f / s")
# The seed as its author spelled it: the tuner writes CONFIG otherwise (as Python's repr does).
RESPELLED = SEED.replace('CONFIG = {"a": 1, "b": "x"}', 'CONFIG = {"a": 1,  "b": "x"}')


# -- the tuner's bases ----------------------------------------------------------------------------


def test_a_seed_is_a_tuning_base_and_its_own_spelling_counts_as_tried() -> None:
    train = load_spec(SPECS / "linear_train.py")  # no template: the seed's four configurations
    assert tn.write(RESPELLED, {"a": 1, "b": "x"}) != RESPELLED
    tuner = create(SynthConfig("tuner"), train, "cpu", ("c",), extra_seeds=[("mine.py", RESPELLED)])
    tried = {candidate_hash(RESPELLED)}  # the seed node, evaluated as written
    got = []
    for i in range(3):
        p = tuner.propose(task(train, "draft", tried=tried, seed=i), NoTools())
        assert p.source is not None, p.error
        tried.add(candidate_hash(p.source))
        got.append(tuple(config_of(p).values()))
    # (1, "x") is the seed's own configuration, in the tree already: never proposed again respelled
    assert sorted(got) == [(1, "y"), (2, "x"), (2, "y")]
    last = tuner.propose(task(train, "draft", tried=tried, seed=7), NoTools())
    assert last.source is None and last.exhausted


def test_templates_stay_on_beside_seeds_unless_the_config_says_tune() -> None:
    spec = load_spec(SPECS / "ew_chain.py")
    seeds = [("mine.py", RESPELLED)]
    with_templates = create(SynthConfig("tuner"), spec, "cpu", ("c",), extra_seeds=seeds)
    first = with_templates.propose(task(spec, "draft"), NoTools())
    assert first.source is not None and "c-elementwise" in first.source  # the tuner's own template
    alone = create(SynthConfig("tuner", templates=False), spec, "cpu", ("c",), extra_seeds=seeds)
    only = alone.propose(task(spec, "draft"), NoTools())
    assert only.source is not None and "c-elementwise" not in only.source and "_lib.f(y)" in only.source


# -- refused at start -----------------------------------------------------------------------------


def test_a_seed_that_breaks_a_guard_or_is_missing_stops_start_before_anything_is_recorded(
    tmp_path: Path,
) -> None:
    from kernelevolve.optimize import start

    ws = tmp_path / "ws"
    settings = replace(cpu_settings(tmp_path), workspace=ws)
    cheat = tmp_path / "cheat.py"
    cheat.write_text(C_SOFTMAX.replace("import torch\n", "import os\nimport torch\n", 1))
    with pytest.raises(KernelevolveError, match=r"cheat\.py breaks the harness's static guards.*os") as exc:
        start(
            SPECS / "softmax.py",
            settings,
            SearchConfig(),
            Limits(budget=2),
            SynthConfig(),
            start_from=[cheat],
        )
    assert exc.value.hint and "kernelevolve eval" in exc.value.hint
    syntax = tmp_path / "syntax.py"
    syntax.write_text("class ModelNew(:\n")
    with pytest.raises(KernelevolveError, match="does not parse"):
        start(
            SPECS / "softmax.py",
            settings,
            SearchConfig(),
            Limits(budget=2),
            SynthConfig(),
            start_from=[syntax],
        )
    with pytest.raises(KernelevolveError, match="no such file"):
        start(SPECS / "softmax.py", settings, SearchConfig(), Limits(budget=2), SynthConfig(),
              start_from=[tmp_path / "gone.py"])  # fmt: skip
    with Workspace.open(ws) as w:
        assert w.runs() == []


# -- runs -----------------------------------------------------------------------------------------


def test_tuner_run_starts_from_the_users_kernel_and_resumes_without_the_file(tmp_path: Path) -> None:
    from kernelevolve.optimize import drive, start
    from kernelevolve.synth.tuner.templates import templates_for

    spec_path = SPECS / "ew_chain.py"
    templates, why = templates_for(load_spec(spec_path), "cpu", ("c",))
    assert templates, why
    # the user's kernel: the tuner's template at a non-default configuration, with its own header
    space, config = templates[0].tunables, dict(templates[0].config)
    knob = next(k for k, choices in space.items() if len(choices) > 1)
    config[knob] = next(c for c in space[knob] if c != config[knob])
    mine = tmp_path / "mine.py"
    mine.write_text("# my kernel\n" + tn.write(templates[0].source, config))
    ws = tmp_path / "ws"
    settings = replace(cpu_settings(tmp_path, suspicious_speedup=50.0), workspace=ws)
    run_id = start(spec_path, settings, SearchConfig(draft=2, parallel=1), Limits(budget=3), SynthConfig(),
                   start_from=[mine])  # fmt: skip
    written = mine.read_text()
    mine.unlink()  # the run holds the source: a resume (or this first drive) never reads the file
    summary = drive(run_id, ws)
    with Workspace.open(ws) as w:
        nodes = w.nodes(run_id)
        run = w.run(run_id)
    assert [n["mode"] for n in nodes][:2] == ["seed", "draft"] and len(nodes) == 3
    assert nodes[0]["source"] == written and nodes[0]["status"] == "ok", nodes[0]["message"]
    assert "my kernel" not in nodes[1]["source"]  # the second node is the tuner's own template
    assert summary["seeds"] == [{
        "node": 1, "file": str(mine.resolve()), "state": "evaluated", "status": "ok",
        "fitness": nodes[0]["fitness"], "speedup_vs_eager": nodes[0]["speedup_vs_eager"],
        "speedup_vs_compile": nodes[0]["speedup_vs_compile"], "message": None,
    }]  # fmt: skip
    assert run["config"]["seeds"] == [{"path": str(mine.resolve()), "source": written, "node": 1}]
    assert "your kernel mine.py" in nodes[0]["analysis"]

    # A run given seeds is not warm-started from earlier runs (this one would be: same spec).
    mine.write_text(written)
    seeded = start(spec_path, settings, SearchConfig(), Limits(budget=3), SynthConfig(), start_from=[mine])
    plain = start(spec_path, settings, SearchConfig(), Limits(budget=3), SynthConfig())
    with Workspace.open(ws) as w:
        assert [n["mode"] for n in w.nodes(seeded)] == ["seed"]
        assert "warm" in [n["mode"] for n in w.nodes(plain)]


def _register_script(script: list) -> None:
    providers.register("scripted", lambda model, **kw: ScriptedModel(model, script=list(script), tools=False))


def test_a_model_expands_from_the_seed_and_the_summary_reports_each_seed(tmp_path: Path) -> None:
    from kernelevolve.optimize import drive, start

    good, broken = tmp_path / "good.py", tmp_path / "broken.py"
    good.write_text(C_SOFTMAX)
    broken.write_text(BROKEN_C)
    reply = (
        f"Here is the kernel.\n```python\n{C_SOFTMAX.replace('schedule(static)', 'schedule(dynamic)')}\n```\n"
    )
    ws = tmp_path / "ws"
    settings = replace(cpu_settings(tmp_path), workspace=ws)
    try:
        _register_script([text_reply(reply)])
        run_id = start(SPECS / "softmax.py", settings, SearchConfig(draft=1, parallel=1, policy="greedy"),
                       Limits(budget=3), SynthConfig("scripted:fake-1", single_shot=True),
                       start_from=[good, broken])  # fmt: skip
        summary = drive(run_id, ws)
    finally:
        providers.unregister("scripted")
    with Workspace.open(ws) as w:
        nodes = w.nodes(run_id, text=True)
    assert [n["mode"] for n in nodes[:2]] == ["seed", "seed"] and len(nodes) == 3
    assert nodes[0]["status"] == "ok" and nodes[1]["status"] == "compile_error"
    assert nodes[0]["tokens_in"] == 0 and nodes[1]["tokens_in"] == 0  # seeds cost no model call
    assert nodes[2]["parent"] == 1  # the model's task grew from the correct seed (greedy)
    assert "softmax_rows" in (nodes[2]["prompt"] or "")  # and showed it the seed's kernel
    seeds = {s["file"]: s for s in summary["seeds"]}
    assert seeds[str(good.resolve())]["status"] == "ok" and seeds[str(good.resolve())]["speedup_vs_eager"]
    failed = seeds[str(broken.resolve())]
    assert failed["status"] == "compile_error" and failed["fitness"] is None and failed["message"]


def test_agent_run_evaluates_its_seed_at_the_first_next_and_grows_from_it(tmp_path: Path) -> None:
    from kernelevolve import agent_jobs as agent
    from kernelevolve.optimize import start

    mine = tmp_path / "mine.py"
    mine.write_text(C_SOFTMAX)
    ws = tmp_path / "ws"
    settings = replace(cpu_settings(tmp_path), workspace=ws)
    run_id = start(SPECS / "softmax.py", settings, SearchConfig(draft=1), Limits(budget=3), SynthConfig("agent"),
                   start_from=[mine])  # fmt: skip
    task = agent.next_task(ws, run_id)
    assert task["node"] == 2 and task["parents"] == [1] and task["mode"] != "draft"
    assert Path(task["files"]["parent"]).read_text() == C_SOFTMAX
    with Workspace.open(ws) as w:
        seed = w.nodes(run_id)[0]
    assert seed["mode"] == "seed" and seed["state"] == "evaluated" and seed["status"] == "ok"


def test_cli_refuses_a_guarded_seed_with_exit_code_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kernelevolve.cli import app

    cheat = tmp_path / "cheat.py"
    cheat.write_text(C_SOFTMAX.replace("import torch\n", "import subprocess\nimport torch\n", 1))
    result = CliRunner().invoke(app, ["optimize", str(SPECS / "softmax.py"), "--platform", "cpu", "--start-from",
                                      str(cheat), "--workspace", str(tmp_path / "ws"), "--json"])  # fmt: skip
    said = result.stdout + result.stderr
    assert result.exit_code == 2, said
    assert "cheat.py" in said and "static guards" in said and "subprocess" in said


def test_seeds_stored_as_sources_and_older_runs_paths_still_read(tmp_path: Path) -> None:
    from kernelevolve.optimize import stored_seeds

    old = tmp_path / "old.py"
    old.write_text(SEED)  # a run recorded before sources were stored kept the path alone
    cfg = {"seeds": [str(old), {"path": "/gone/new.py", "source": RESPELLED, "node": 1}]}
    assert stored_seeds(cfg) == [(str(old), SEED), ("/gone/new.py", RESPELLED)]
