"""Other systems' results, imported beside a bench: a KernelBench run's directory.

KernelBench (github.com/ScalingIntelligence/KernelBench, `scripts/eval_from_generations.py`) writes a
run named R into `runs/R/`:

- `eval_results.json`: per problem id (a string), its samples, each with `sample_id`, `compiled`,
  `correctness`, `metadata` (the error's name and text, the device's name as `hardware`), `runtime`
  and `runtime_stats` (milliseconds; -1 where it was not timed), and `ref_runtime` where the
  evaluation timed the reference too. Since late 2025 a problem holds a list of samples; before, one
  sample object. Both are read. Like KernelBench's own analysis, a problem's row is its sample 0 (the
  greedy sample); the others are counted (`samples`, `correct_samples`), and the fastest correct one
  is named beside it (`reported_best_*`: sample id, runtime, speedups), as a pass@k reading wants.
- the generated kernels, `level_{L}_problem_{P}_sample_{S}_kernel.py`.

KernelBench computes speedups against a file of reference times measured once per machine
(`results/timing/<hardware>/baseline_time_torch.json`, and `..._compile_...json`: per level, per
problem file, a `mean` in milliseconds). Copy such files beside `eval_results.json` to import the
speedups they give (`baseline_time_torch*.json`: "compile" in the name is the torch.compile
baseline, else eager); a sample's own `ref_runtime` stands for eager where there is no file.

`import_kernelbench(problems, results, ...)` matches the run's problem ids to the spec files of the
problems folder (KernelBench names them `{id}_{Name}.py`, so a row is found under the same relative
path as the row of a bench of that folder) and records an imported bench: one item per problem, its
kernel stored in the workspace. Its numbers are the source's: measured on its machine by its method,
they are kept under `reported_*` keys, never as `speedup_vs_*`, so that no metric of ours (fast_p,
the geomeans: `bench.metrics`) can take them in; the report shows them apart, labelled as reported
by the source (`bench_document` attaches them to a bench of the same folder). `reverify=True`
evaluates each imported kernel in our harness, live against eager and torch.compile on this
machine: those verdicts are ours, under `reverified`, and still not a search's result.

Deliberately not here: tritonbench or other formats (one reader per format would sit beside this one);
of several samples per problem only sample 0's kernel is stored and re-verified (the fastest
correct one is reported, not kept).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelevolve.config import Settings
from kernelevolve.errors import KernelevolveError, WorkspaceError
from kernelevolve.store import Workspace

FORMAT = "kernelbench"
RESULTS_FILE = "eval_results.json"
_KERNEL = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
_PROBLEM = re.compile(r"^(\d+)_.+\.py$")
# KernelBench's metadata keys that say why a sample failed, most telling first
ERROR_KEYS = ("compilation_error", "runtime_error", "correctness_issue", "error_during_performance",
              "other_error", "cuda_error")  # fmt: skip

Event = Callable[[str, dict[str, Any]], None]


def problem_files(problems: Path) -> dict[int, Path]:
    """The problems folder's spec files by KernelBench problem id (the number before the first `_`)."""
    if not problems.is_dir():
        raise WorkspaceError(
            f"{problems}: no such folder",
            hint="give the KernelBench level folder the results are for (KernelBench/level1, say)",
        )
    found: dict[int, Path] = {}
    for f in sorted(problems.glob("*.py")):
        m = _PROBLEM.match(f.name)
        if m:
            found.setdefault(int(m.group(1)), f)
    if not found:
        raise WorkspaceError(
            f"{problems}: no KernelBench problem files ({{id}}_{{Name}}.py)",
            hint="give the level folder whose problems the results are for",
        )
    return found


def read_results(results: Path) -> dict[int, list[dict[str, Any]]]:
    """`eval_results.json` as problem id -> samples (the old one-object-per-problem form as a list)."""
    path = results / RESULTS_FILE
    if not path.is_file():
        raise WorkspaceError(
            f"{results}: no {RESULTS_FILE}",
            hint="give a KernelBench run's folder (runs/RUN_NAME), as scripts/eval_from_generations.py writes it",
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise WorkspaceError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WorkspaceError(f"{path}: expected an object of problem ids, found {type(data).__name__}")
    out: dict[int, list[dict[str, Any]]] = {}
    for key, value in data.items():
        samples = value if isinstance(value, list) else [value]
        try:
            out[int(key)] = [s for s in samples if isinstance(s, dict)]
        except ValueError:
            raise WorkspaceError(f"{path}: {key!r} is not a problem id") from None
    return out


def read_baselines(results: Path, level: int | None) -> dict[str, dict[str, dict[str, Any]]]:
    """Reference times beside the results: baseline ("eager" | "compile") -> problem file -> entry
    (`mean` in ms, `hardware`), from KernelBench's `baseline_time_torch*.json` files found there."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for f in sorted(results.glob("baseline_time_torch*.json")):
        baseline = "compile" if "compile" in f.name else "eager"
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise WorkspaceError(f"{f} is not JSON: {exc}") from None
        levels = [k for k in data if re.fullmatch(r"level\d+", k)]
        key = f"level{level}" if level is not None else (levels[0] if len(levels) == 1 else None)
        if key is None or key not in data:
            raise WorkspaceError(
                f"{f}: no times for level {level if level is not None else '?'} (it has {', '.join(levels) or 'none'})",
                hint="copy the baseline file of the level the results are for",
            )
        out.setdefault(baseline, {}).update(data[key])
    return out


def kernel_files(results: Path) -> dict[tuple[int, int], tuple[int, Path]]:
    """The generated kernels: (problem, sample) -> (level, file)."""
    out = {}
    for f in sorted(results.glob("level_*_problem_*_sample_*_kernel.py")):
        m = _KERNEL.match(f.name)
        if m:
            out[(int(m.group(2)), int(m.group(3)))] = (int(m.group(1)), f)
    return out


def _level(problems: Path, kernels: dict[tuple[int, int], tuple[int, Path]]) -> int | None:
    """The KernelBench level: the kernels' file names say it; the folder's name (level2) must agree."""
    levels = {lv for lv, _ in kernels.values()}
    named = re.search(r"level_?(\d+)$", problems.name)
    if len(levels) > 1:
        raise WorkspaceError(
            f"the kernels are of several levels ({sorted(levels)}): import one level at a time"
        )
    if levels and named and int(named.group(1)) not in levels:
        raise WorkspaceError(
            f"the results are for level {levels.pop()}, and {problems} is level {named.group(1)}",
            hint="give the level folder the results are for",
        )
    if levels:
        return levels.pop()
    return int(named.group(1)) if named else None


def _message(sample: dict[str, Any]) -> str | None:
    meta = sample.get("metadata") or {}
    for key in ERROR_KEYS:
        if meta.get(key):
            name = meta.get(f"{key}_name")
            return f"{key}{f' ({name})' if name else ''}: {str(meta[key]).strip()[:300]}"
    if not sample.get("compiled"):
        return "did not compile (the source gives no message)"
    if not sample.get("correctness"):
        return "incorrect (the source gives no message)"
    return None


def _ms(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value > 0 else None


def imported_row(
    rel: str, name: str, pid: int, level: int | None, samples: list[dict[str, Any]] | None,
    baselines: dict[str, dict[str, dict[str, Any]]], file_name: str, source: str,
) -> dict[str, Any]:  # fmt: skip
    """One problem's row as the source reported it (sample 0), every number under `reported_*`."""
    row: dict[str, Any] = {"name": name, "path": rel, "problem_id": pid, "level": level, "imported": True,
                           "source": source, "samples": len(samples or [])}  # fmt: skip
    if not samples:
        return {**row, "compiled": False, "correct": False, "missing": True,
                "message": "no result in the source (KernelBench's analysis counts it as a failure)"}  # fmt: skip
    sample = next((s for s in samples if s.get("sample_id") == 0), samples[0])
    correct = bool(sample.get("compiled")) and bool(sample.get("correctness"))
    runtime = _ms(sample.get("runtime")) if correct else None
    row |= {
        "sample_id": sample.get("sample_id", 0),
        "compiled": bool(sample.get("compiled")),
        "correct": correct,
        "correct_samples": sum(1 for s in samples if s.get("compiled") and s.get("correctness")),
        "reported_runtime_ms": runtime,
        "reported_hardware": (sample.get("metadata") or {}).get("hardware")
        or (sample.get("runtime_stats") or {}).get("hardware"),
        "message": None if correct else _message(sample),
        "excessive_speedup": bool((sample.get("metadata") or {}).get("excessive_speedup")),
    }
    timed = [(t, s) for s in samples if s.get("compiled") and s.get("correctness")
             for t in [_ms(s.get("runtime"))] if t]  # fmt: skip
    best_ms, best = min(timed, key=lambda ts: ts[0]) if timed else (None, None)
    row |= {
        "reported_best_sample_id": best.get("sample_id") if best else None,
        "reported_best_runtime_ms": best_ms,
    }
    for baseline in ("eager", "compile"):
        entry = baselines.get(baseline, {}).get(file_name)
        ref = _ms(entry.get("mean")) if entry else None
        said_by = "baseline_time file" if ref is not None else None
        if ref is None and baseline == "eager":
            ref, said_by = _ms(sample.get("ref_runtime")), "ref_runtime"
        row[f"reported_{baseline}_ms"] = ref
        row[f"reported_speedup_vs_{baseline}"] = ref / runtime if ref is not None and runtime else None
        row[f"reported_{baseline}_from"] = said_by if ref is not None else None
        if ref is None and baseline == "eager" and best is not None:  # the best sample's own reference time
            ref = _ms(best.get("ref_runtime"))
        row[f"reported_best_speedup_vs_{baseline}"] = ref / best_ms if ref is not None and best_ms else None
    return row


def import_kernelbench(
    problems: Path,
    results: Path,
    settings: Settings,
    *,
    reverify: bool = False,
    on_event: Event | None = None,
) -> dict[str, Any]:
    """Import the KernelBench run in `results` for the problems of `problems` as an imported bench
    (again: the same bench, its rows replaced); its document (`imported_document`)."""
    emit = on_event or (lambda event, data: None)
    files = problem_files(problems)
    samples = read_results(results)
    kernels = kernel_files(results)
    level = _level(problems, kernels)
    baselines = read_baselines(results, level)
    source = results.resolve().name
    key = (
        "import:"
        + hashlib.sha256(
            json.dumps([FORMAT, str(problems.resolve()), str(results.resolve())]).encode()
        ).hexdigest()[:16]
    )
    config = {"imported": True, "format": FORMAT, "source": source, "results_dir": str(results.resolve()),
              "level": level, "baselines": sorted(baselines), "reverified": reverify}  # fmt: skip
    with Workspace.open(settings.workspace) as ws:
        bench_id = ws.find_bench(key)
        if bench_id is None:
            bench_id = ws.create_bench(key, str(problems.resolve()), config)
        else:
            ws.set_bench_config(bench_id, config)
        store = ws.root / "benches" / bench_id / "imported"
        store.mkdir(parents=True, exist_ok=True)
        rows = []
        for position, (pid, path) in enumerate(sorted(files.items())):
            rel = path.name
            row = imported_row(rel, path.stem, pid, level, samples.get(pid), baselines, path.name, source)
            found = kernels.get((pid, int(row.get("sample_id") or 0)))
            if found is not None:
                text = found[1].read_text(errors="replace")
                kept = store / found[1].name
                kept.write_text(text)  # the workspace keeps it: a reverify needs no results folder
                row["kernel"] = str(kept)
                row["candidate_hash"] = ws.record_candidate(
                    text, f"imported from {source}: {found[1].name}", None
                )
            rows.append((position, rel, path, row))
        unmatched = sorted(set(samples) - set(files))
        for i, pid in enumerate(unmatched, len(files)):
            ws.put_bench_item(bench_id, f"problem {pid}", i, f"problem {pid}", status="load_error",
                              error=f"problem {pid} has a result in {source} and no file in {problems}")  # fmt: skip
    emit("imported", {"bench_id": bench_id, "source": source, "problems": len(rows), "unmatched": unmatched})
    for position, rel, path, row in rows:
        if reverify and row.get("kernel"):
            emit("reverify", {"name": row["name"], "index": position + 1, "total": len(rows)})
            row["reverified"] = _reverify(path, Path(row["kernel"]), settings)
        with Workspace.open(settings.workspace) as ws:
            ws.put_bench_item(bench_id, rel, position, row["name"], status="done", error="", result=row)
    with Workspace.open(settings.workspace) as ws:
        ws.set_bench_status(bench_id, "done")
        return imported_document(ws, bench_id)


def _reverify(spec_path: Path, kernel: Path, settings: Settings) -> dict[str, Any]:
    """The imported kernel evaluated here, live against eager and torch.compile (`kernelevolve eval`'s
    job): our verdict on their kernel. A spec or harness failure is the verdict's message."""
    from kernelevolve import jobs

    try:
        _, verdicts = jobs.evaluate(spec_path, [kernel], settings)
    except KernelevolveError as exc:
        return {"status": "error", "correct": False, "message": exc.message}
    v = verdicts[0]
    return {
        "status": str(v.status), "correct": v.correct, "speedup_vs_eager": v.speedup_vs_eager,
        "speedup_vs_compile": v.speedup_vs_compile, "fitness": v.fitness,
        "message": None if v.ok else (v.message or "").strip()[:300], "device": v.method.device,
    }  # fmt: skip


def imported_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over an imported bench's rows, as the source reported them (and as re-verified here)."""
    reverified = [r["reverified"] for r in rows if r.get("reverified")]
    return {
        "specs": len(rows),
        "compiled": sum(1 for r in rows if r.get("compiled")),
        "correct": sum(1 for r in rows if r.get("correct")),
        "missing": sum(1 for r in rows if r.get("missing")),
        "with_reported_speedup": sum(1 for r in rows if r.get("reported_speedup_vs_eager")),
        "reverified": len(reverified),
        "reverified_correct": sum(1 for v in reverified if v.get("correct")),
    }


def imported_document(ws: Workspace, bench_id: str) -> dict[str, Any]:
    """An imported bench as one JSON-able object: where it came from, its rows, their counts."""
    bench = ws.bench(bench_id)
    items = ws.bench_items(bench["bench_id"])
    rows = [r["result"] for r in items if r["status"] == "done" and r["result"]]
    cfg = bench["config"]
    return {
        "bench_id": bench["bench_id"],
        "dir": bench["dir"],
        "imported": True,
        "format": cfg.get("format"),
        "source": cfg.get("source"),
        "results_dir": cfg.get("results_dir"),
        "level": cfg.get("level"),
        "baselines": cfg.get("baselines") or [],
        "status": bench["status"],
        "updated_at": bench["updated_at"],
        "note": "numbers reported by the source (its machine, its method), not re-measured here; "
        "`reverified` entries are this harness's own evaluation of the source's kernels",
        "results": rows,
        "unmatched": [{"path": r["path"], "error": r["error"]} for r in items if r["status"] == "load_error"],
        "summary": imported_summary(rows),
    }


def imported_for(ws: Workspace, directory: str) -> list[dict[str, Any]]:
    """The imported benches of the same problems folder, newest first: for a bench's report."""
    return [imported_document(ws, b["bench_id"]) for b in ws.benches(limit=1000)
            if b["config"].get("imported") and b["dir"] == directory]  # fmt: skip


__all__ = [
    "FORMAT",
    "import_kernelbench",
    "imported_document",
    "imported_for",
    "imported_row",
    "read_results",
]
