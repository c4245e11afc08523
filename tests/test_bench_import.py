"""`kernelevolve bench DIR --import RUN`: a KernelBench run's results as an imported bench.

The fixture (`tests/fixtures/kernelbench/`, made up for these tests) is a level folder of three small
problems and a run folder in KernelBench's layout. The source's numbers are kept as reported, apart
from every metric of ours; a bench of the same folder shows them beside its own rows in its report;
`--reverify` evaluates the imported kernels in this harness (two CPU evaluations).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kernelevolve.bench import bench_document, summarize
from kernelevolve.bench.imported import import_kernelbench
from kernelevolve.bench.report import render_html, render_markdown, write_bench_report
from kernelevolve.errors import WorkspaceError
from kernelevolve.store import Workspace
from tests.conftest import cpu_settings

FIXTURE = Path(__file__).parent / "fixtures" / "kernelbench"
LEVEL = FIXTURE / "level1"
RUN = FIXTURE / "runs" / "made_up_run"


def by_path(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["path"]: r for r in doc["results"]}


def test_import_keeps_the_sources_numbers_as_reported_and_apart(tmp_path: Path) -> None:
    settings = replace(cpu_settings(tmp_path), workspace=tmp_path / "ws")
    doc = import_kernelbench(LEVEL, RUN, settings)
    assert doc["imported"] is True and doc["source"] == "made_up_run" and doc["level"] == 1
    assert doc["baselines"] == ["compile", "eager"]
    rows = by_path(doc)
    assert list(rows) == ["1_Softmax.py", "2_ReLU.py", "3_Scale.py"]
    softmax, relu, scale = rows.values()
    assert softmax["correct"] and softmax["reported_runtime_ms"] == pytest.approx(0.0213)
    assert softmax["reported_speedup_vs_eager"] == pytest.approx(0.0426 / 0.0213)
    assert softmax["reported_speedup_vs_compile"] == pytest.approx(0.0355 / 0.0213)
    assert softmax["reported_hardware"] == "Made-up GPU 80GB"
    assert softmax["reported_eager_from"] == "baseline_time file"
    # never under the keys our metrics read: no fast_p or geomean can take them in
    assert not any(k.startswith("speedup_vs") for r in rows.values() for k in r)
    assert (
        summarize(doc["results"])["correct"] == 1
        and summarize(doc["results"])["geomean_vs_eager_correct_only"] is None
    )
    assert relu["compiled"] and not relu["correct"] and "Output mismatch" in relu["message"]
    assert relu["reported_speedup_vs_eager"] is None and relu["reported_runtime_ms"] is None
    assert scale["missing"] and not scale["correct"] and "no result" in scale["message"]
    assert doc["unmatched"] == [{"path": "problem 7", "error": "problem 7 has a result in made_up_run and no "
                                 f"file in {LEVEL}"}]  # fmt: skip
    # the kernels are kept in the workspace, as the source wrote them
    kept = Path(softmax["kernel"])
    assert (
        kept.is_relative_to(tmp_path / "ws")
        and kept.read_text() == (RUN / "level_1_problem_1_sample_0_kernel.py").read_text()
    )
    assert "kernel" not in scale
    assert doc["summary"] == {"specs": 3, "compiled": 2, "correct": 1, "missing": 1, "with_reported_speedup": 1,
                              "reverified": 0, "reverified_correct": 0}  # fmt: skip
    again = import_kernelbench(LEVEL, RUN, settings)  # the same import again: the same bench, replaced
    assert again["bench_id"] == doc["bench_id"] and again["results"] == doc["results"]


def test_the_older_single_sample_form_and_a_samples_own_reference_time(tmp_path: Path) -> None:
    results = tmp_path / "old_run"
    results.mkdir()
    (results / "eval_results.json").write_text(json.dumps({
        "1": {"sample_id": 0, "compiled": True, "correctness": True, "metadata": {}, "runtime": 0.5,
              "runtime_stats": {"mean": 0.5, "hardware": "Other GPU"}, "ref_runtime": 1.5},
        "2": {"sample_id": 0, "compiled": False, "correctness": False, "runtime": -1.0,
              "metadata": {"compilation_error_name": "RuntimeError", "compilation_error": "nvcc failed"}},
    }))  # fmt: skip
    settings = replace(cpu_settings(tmp_path), workspace=tmp_path / "ws")
    rows = by_path(import_kernelbench(LEVEL, results, settings))
    assert rows["1_Softmax.py"]["reported_speedup_vs_eager"] == pytest.approx(3.0)
    assert rows["1_Softmax.py"]["reported_eager_from"] == "ref_runtime"
    assert rows["1_Softmax.py"]["reported_speedup_vs_compile"] is None
    assert rows["1_Softmax.py"]["reported_hardware"] == "Other GPU"
    assert rows["2_ReLU.py"]["message"] == "compilation_error (RuntimeError): nvcc failed"

    # results of another level than the folder's are refused, with what to give instead
    (results / "level_2_problem_1_sample_0_kernel.py").write_text("# a level-2 kernel\n")
    with pytest.raises(WorkspaceError, match="level 2") as exc:
        import_kernelbench(LEVEL, results, settings)
    assert exc.value.hint and "level folder" in exc.value.hint
    with pytest.raises(WorkspaceError, match=r"no eval_results\.json"):
        import_kernelbench(LEVEL, tmp_path, settings)


def test_a_bench_of_the_same_folder_shows_the_source_beside_its_rows_and_out_of_its_metrics(
    tmp_path: Path,
) -> None:
    settings = replace(cpu_settings(tmp_path), workspace=tmp_path / "ws")
    imported = import_kernelbench(LEVEL, RUN, settings)
    ours = [  # our own rows, as a finished bench of the folder stores them (numbers made up)
        {"name": "1_Softmax", "path": "1_Softmax.py", "correct": True, "speedup_vs_eager": 1.25,
         "speedup_vs_compile": 1.1, "flags": []},
        {"name": "2_ReLU", "path": "2_ReLU.py", "correct": True, "speedup_vs_eager": 1.5,
         "speedup_vs_compile": 1.0, "flags": []},
    ]  # fmt: skip
    with Workspace.open(settings.workspace) as ws:
        bench_id = ws.create_bench("ours", str(LEVEL.resolve()), {"track": "strict", "synthesizer": "tuner"})
        for i, row in enumerate(ours):
            ws.put_bench_item(bench_id, row["path"], i, row["name"], status="done", error="", result=row)
        doc = bench_document(ws, bench_id)
    assert doc["summary"] == summarize(ours)  # their 2.0x is in none of our numbers
    assert doc["summary"]["geomean_vs_eager_correct_only"] == pytest.approx((1.25 * 1.5) ** 0.5)
    assert [o["bench_id"] for o in doc["other_sources"]] == [imported["bench_id"]]
    text = render_markdown(doc)
    assert "## Beside made_up_run" in text and "reported by the source" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| 1_Softmax | yes | 1.25x"))
    assert "| yes | 2.00x | 1.67x |" in line  # theirs, beside ours, labelled by its column
    assert "| 3_Scale | not run |" in text  # a problem only they have a row for
    assert "Beside made_up_run" in render_html(doc, {})
    paths = write_bench_report(doc, tmp_path / "report")
    assert "Beside made_up_run" in paths["md"].read_text()


def test_cli_imports_and_writes_the_imported_report(tmp_path: Path) -> None:
    from kernelevolve.cli import app

    report = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", str(LEVEL), "--import", str(RUN), "--json", "--report", str(report),
                                      "--workspace", str(tmp_path / "ws")])  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["imported"] is True and doc["summary"]["correct"] == 1
    assert "not re-measured" in result.stderr
    md = (report / "bench.md").read_text()
    assert md.startswith("# Imported results: made_up_run") and "reported by the source" in md
    assert "| 1_Softmax | yes | yes | 0.0213 | 2.00x | 1.67x | - | - |" in md
    assert (report / "bench.csv").read_text().count("\n") == 4 and (report / "bench.html").is_file()
    missing = CliRunner().invoke(app, ["bench", str(LEVEL), "--import", str(tmp_path / "nowhere"),
                                       "--workspace", str(tmp_path / "ws")])  # fmt: skip
    assert missing.exit_code == 2 and "eval_results.json" in missing.stdout + missing.stderr


def test_reverify_evaluates_the_imported_kernels_in_this_harness(tmp_path: Path) -> None:
    results = tmp_path / "made_up_run"
    shutil.copytree(RUN, results)
    settings = replace(cpu_settings(tmp_path), workspace=tmp_path / "ws")
    doc = import_kernelbench(LEVEL, results, settings, reverify=True)
    shutil.rmtree(results)  # what was re-verified came from the workspace's copies
    rows = by_path(doc)
    good, bad = rows["1_Softmax.py"]["reverified"], rows["2_ReLU.py"]["reverified"]
    assert good["status"] == "ok" and good["correct"] and good["speedup_vs_eager"] > 0, good
    assert not bad["correct"] and bad["status"] != "ok" and bad["message"], bad
    assert "reverified" not in rows["3_Scale.py"]  # no kernel: nothing to evaluate
    assert doc["summary"]["reverified"] == 2 and doc["summary"]["reverified_correct"] == 1
    with Workspace.open(settings.workspace) as ws:
        assert bench_document(ws, doc["bench_id"])["results"] == doc["results"]


def test_benches_list_names_an_imported_bench_by_its_source(tmp_path: Path) -> None:
    """An imported bench has no track, synthesizer or budget of ours: `benches list` names its source
    instead of empty columns."""
    from typer.testing import CliRunner

    from kernelevolve.cli import app

    settings = replace(cpu_settings(tmp_path), workspace=tmp_path / "ws")
    import_kernelbench(LEVEL, RUN, settings)
    shown = CliRunner().invoke(
        app, ["benches", "list", "--workspace", str(tmp_path / "ws")], env={"COLUMNS": "200"}
    )
    assert shown.exit_code == 0, shown.output
    assert "imported: made_up_run" in shown.output and "None" not in shown.output


def test_several_samples_keep_sample_0_as_the_row_and_report_the_fastest_correct_one(tmp_path: Path) -> None:
    """KernelBench's analysis reads sample 0 (the greedy one); a pass@k reading wants the best of the
    samples: both are in the row, the best under `reported_best_*`, and still none under our keys."""
    results = tmp_path / "run"
    results.mkdir()
    (results / "eval_results.json").write_text(json.dumps({
        "1": [{"sample_id": 0, "compiled": True, "correctness": True, "runtime": 0.5, "ref_runtime": 1.5},
              {"sample_id": 1, "compiled": True, "correctness": True, "runtime": 0.3, "ref_runtime": 1.5},
              {"sample_id": 2, "compiled": True, "correctness": False, "runtime": 0.1, "ref_runtime": 1.5}],
        "2": [{"sample_id": 0, "compiled": False, "correctness": False, "runtime": -1.0},
              {"sample_id": 1, "compiled": True, "correctness": True, "runtime": 2.0, "ref_runtime": 1.0}],
    }))  # fmt: skip
    settings = replace(cpu_settings(tmp_path), workspace=tmp_path / "ws")
    rows = by_path(import_kernelbench(LEVEL, results, settings))
    one, two = rows["1_Softmax.py"], rows["2_ReLU.py"]
    assert one["sample_id"] == 0 and one["reported_speedup_vs_eager"] == pytest.approx(3.0)
    assert (one["samples"], one["correct_samples"]) == (3, 2)
    assert one["reported_best_sample_id"] == 1 and one["reported_best_runtime_ms"] == pytest.approx(0.3)
    assert one["reported_best_speedup_vs_eager"] == pytest.approx(5.0)  # not sample 2's 15x: it is wrong
    assert not two["correct"] and two["correct_samples"] == 1 and two["reported_speedup_vs_eager"] is None
    assert two["reported_best_sample_id"] == 1 and two["reported_best_speedup_vs_eager"] == pytest.approx(0.5)
    assert not any(k.startswith("speedup_vs") for r in rows.values() for k in r)
