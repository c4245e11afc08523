"""Run the search over every spec of a directory: the project's suites or any KernelBench-format folder.

`run_bench(directory, ...)` finds the spec files (`discover`), records a bench in the workspace and
gives each spec its own run (`optimize.start` + `optimize.drive`, the same runs `optimize` makes),
one after the other (or `per_device` at a time), and returns the bench document: options,
environment, one result row per spec (`bench.results`) and the summary metrics (`bench.metrics`).

Resuming: a bench is found again by its key, a hash of the directory and the options that change the
numbers (track, baselines, synthesizer, budget, policy, platform). Running the same command again
skips the specs already done, resumes a run that was interrupted and starts the rest. A spec is done
for its file and for the knowledge base's code samples that compute it (`item_key`): a changed file,
or a sample added or changed for it since, runs it again. `fresh=True` starts a new bench;
`redo=REGEX` runs the done specs whose path matches again, each in a new run (a result measured
before a harness fix, say); a redo that is interrupted resumes like any run.

Several devices (`devices=[0, 1, 2, 3]`): one spec per device at a time, each run's evaluator pool on
its own device; the runs share the workspace (SQLite transactions). A spec's numbers come from one
device, like any run's.

Several specs per device (`per_device=K`, with or without `devices`): up to K runs at once on each
device (`schedule.py`). A search spends most of its time starting workers on the host (python, torch,
the compile baseline), so the device idles; K runs keep it busier. Their numbers stay clean: every
first run, correctness check and timing holds the device's lease (`evaluate/lease.py`, shared by every
process on the host), so no two timings overlap on a device. What K costs: K times the host CPU, and
the device's memory is shared: each run is granted what its memory plan asks for, a spec too large
to sit beside the others waits until they end and then runs with the device to itself
(`schedule.DeviceMemory`). The hardware profile is measured once per device, not by each of the K
runs (`jobs.hardware_profile`).

Failures stay local: a spec that fails to load is recorded as a `load_error` and skipped; a run that
raises (the harness failing, say) is recorded with its error and counts as incorrect, and the next
run of the command tries it again, since the cause may have been the machine's. Only Ctrl-C stops the
bench, and the next run of the command picks it up: a run resumes on the devices of the command that
resumes it, not those it started on.

Precision tracks: `strict` holds every fp32 spec to strict fp32 (TF32 is not allowed even where the
spec declares it); `tf32` allows TF32 for every fp32 spec. A spec whose data is bf16 or fp16 keeps its
own policy on both tracks. Where a track changes a spec's policy, the bench runs a derived copy of the
file (the original plus one line that sets `precision`), written under the workspace, so the run's
record names exactly what was measured.

Why one module (over 450 lines): the bench's resume rules (bench key, item key, file key, what
is cached, what runs again) and the run that obeys them read together; rows and metrics are
`results.py`'s and `metrics.py`'s, scheduling is `schedule.py`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kernelevolve.bench.metrics import summarize
from kernelevolve.bench.results import baseline_flags, held_back, held_baselines, result_row
from kernelevolve.bench.schedule import run_demand, schedule
from kernelevolve.config import Settings
from kernelevolve.cost import estimate
from kernelevolve.errors import KernelevolveError, SpecError, WorkspaceError
from kernelevolve.evaluate.handle import prestart
from kernelevolve.search.limits import Limits
from kernelevolve.search.policies import SearchConfig
from kernelevolve.spec import Spec, TensorInfo, load_spec
from kernelevolve.store import Workspace
from kernelevolve.synth import SynthConfig

Event = Callable[[str, dict[str, Any]], None]
TRACKS = {"strict": "strict_fp32", "tf32": "tf32"}
_SKIP_NAMES = {"__init__.py", "conftest.py", "setup.py"}


def _natural(path: Path) -> list[Any]:
    """Sort key: `2_x.py` before `10_x.py` (KernelBench names its problems by number)."""
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", str(path))]


def discover(directory: Path) -> list[Path]:
    """Every spec file under `directory` (recursively): `*.py`, not hidden, not `_private.py`,
    not a package's `__init__.py`; in natural order. A single file is a bench of one."""
    if directory.is_file():
        return [directory]
    if not directory.is_dir():
        raise WorkspaceError(f"{directory}: no such directory", hint="give a folder of spec files")
    found = [
        p for p in directory.rglob("*.py")
        if p.name not in _SKIP_NAMES and not p.name.startswith("_")
        and not any(part.startswith((".", "_")) for part in p.relative_to(directory).parts[:-1])
    ]  # fmt: skip
    if not found:
        raise WorkspaceError(
            f"{directory}: no .py spec files", hint="a spec is a KernelBench-format .py file"
        )
    return sorted(found, key=_natural)


def track_precision(spec: Spec, track: str) -> str:
    """The precision policy a spec runs under on `track`: the track's for fp32 data, the spec's own
    where its data is bf16 or fp16 (by its `dtype`, or by the inputs it makes)."""
    low = ("bfloat16", "float16")
    made = {t.dtype for infos in spec.inputs.values() for t in infos if isinstance(t, TensorInfo)}
    if spec.dtype in low or made & set(low):
        return spec.precision
    return TRACKS[track]


def _track_file(ws: Workspace, bench_id: str, rel: str, spec: Spec, precision: str) -> Path:
    """A copy of the spec file with its precision policy set by the track."""
    out = ws.root / "benches" / bench_id / "specs" / rel.replace("/", "__")
    out.parent.mkdir(parents=True, exist_ok=True)
    line = (
        "\n\n# Added by `kernelevolve bench` (precision track): the spec as written, under another policy.\n"
        f'KERNELEVOLVE = {{**globals().get("KERNELEVOLVE", {{}}), "precision": {precision!r}}}\n'
    )
    text = spec.source + line
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return out


def auto_per_device(platform: str, cpus: int | None = None, devices: int = 1) -> int:
    """Specs run at once per device by default: on a GPU, one per 4 of the device's host cores (the
    host's over the `devices` used), up to 4 (a spec's run keeps 3 worker processes busy preparing
    and evaluating, and the device's lease lets one timing through at a time, so one spec alone leaves
    the device idle while its workers start); on the CPU, 1 (a timing there has the machine to itself)."""
    if platform not in ("cuda", "rocm"):
        return 1
    return max(1, min(4, (cpus or os.cpu_count() or 4) // (4 * max(1, devices))))


def bench_key(directory: Path, options: dict[str, Any]) -> str:
    blob = json.dumps({"dir": str(directory.resolve()), **options}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_bench(
    directory: Path,
    settings: Settings,
    search: SearchConfig,
    limits: Limits,
    synth: SynthConfig,
    *,
    track: str = "strict",
    fresh: bool = False,
    only: str | None = None,
    redo: str | None = None,
    devices: Sequence[int] | None = None,
    per_device: int | None = None,
    order_from: Path | None = None,
    on_event: Event | None = None,
) -> dict[str, Any]:
    """Run (or resume) the bench of `directory`; returns the bench document (see `bench_document`).
    With several `devices`, that many specs run at once, each run on one device; `per_device` specs
    run at once on each device (the one of `settings.device` when no `devices` are given); None:
    `auto_per_device`. Specs start longest first where their times are known (`start_order`: from
    the workspace's earlier benches, or the bench document `order_from`)."""
    from kernelevolve import optimize as jobs
    from kernelevolve.platforms import select

    if per_device is not None and per_device < 1:
        raise WorkspaceError(
            f"--per-device {per_device}: give 1 or more (the specs run at once on each device)"
        )
    if track not in TRACKS:
        raise WorkspaceError(f"unknown track {track!r}", hint="tracks: " + ", ".join(TRACKS))
    emit = on_event or (lambda event, data: None)
    files = discover(directory)
    pattern, again = _regex("--only", only), _regex("--redo", redo)
    if pattern is not None:
        files = [
            p for p in files if pattern.search(str(p.relative_to(directory) if directory.is_dir() else p))
        ]
        if not files:
            raise WorkspaceError(f"no spec under {directory} matches --only {only!r}")
    platform = select(settings.platform)
    if per_device is None:
        per_device = auto_per_device(platform.name, devices=len(devices) if devices else 1)
    options = {
        "track": track, "fitness_baseline": settings.fitness_baseline, "synthesizer": synth.name,
        "budget": limits.budget, "policy": search.policy, "platform": platform.name, "only": only,
    }  # fmt: skip
    key = bench_key(directory, options)
    with Workspace.open(settings.workspace) as ws:
        bench_id = None if fresh else ws.find_bench(key)
        resumed = bench_id is not None
        if bench_id is None:
            config = {**options, "search": asdict(search), "limits": asdict(limits), "synth": asdict(synth),
                      "timing_budget_s": settings.timing_budget_s, "per_device": per_device,
                      "suspicious_speedup": settings.suspicious_speedup}  # fmt: skip
            bench_id = ws.create_bench(key, str(directory.resolve()), config)
        else:  # the most specs per device any invocation of this bench ran
            config = ws.bench(bench_id)["config"]
            if per_device > config.get("per_device", 1):
                ws.set_bench_config(bench_id, {**config, "per_device": per_device})
        items = {row["path"]: row for row in ws.bench_items(bench_id)}
        rels = [str(p.relative_to(directory)) if directory.is_dir() else p.name for p in files]
        for i, (path, rel) in enumerate(zip(files, rels, strict=True)):
            if rel not in items:
                ws.put_bench_item(bench_id, rel, i, path.stem)
        ws.set_bench_status(bench_id, "running")
        # What is left to spend: the full budget for every spec not done yet (an upper bound: a run
        # resumed halfway, or stopped early by patience, spends less).
        left = sum(
            1 for rel in rels if items.get(rel, {}).get("status") != "done" or (again and again.search(rel))
        )
        cost = estimate(ws, synth, left * limits.budget, settings)
        order = start_order(rels, {**known_walls(ws), **(walls_in(order_from) if order_from else {})})
        measuring = left or any(wants_baselines(items[r]["result"] or {}) for r in rels if r in items)
    if measuring:  # the fork server's imports overlap the specs' staging below; none for a bench all done
        prestart(platform, settings, settings.device)
    emit("bench", {"bench_id": bench_id, "specs": len(files), "resumed": resumed, "dir": str(directory),
                   "estimate": cost.to_dict(), "estimate_line": cost.line()})  # fmt: skip

    interrupt = threading.Event()  # Ctrl-C, for the runs in threads other than the main one
    staged: dict[int, tuple[Spec, Path, str, dict[str, Any], bool]] = {}  # (spec, file, key, item, cached)

    catalogue = samples_digest()

    def stage(i: int) -> bool:
        """Load spec i and settle what needs no run, before any device memory is granted to it: a
        spec that does not load, or whose result is cached (each reported here). True: it runs.
        A result stored with this file's `file_key` is cached without loading the spec at all."""
        path, rel = files[i], rels[i]
        with Workspace.open(settings.workspace) as ws:
            item = next(r for r in ws.bench_items(bench_id) if r["path"] == rel)
        info = {"index": i + 1, "total": len(files), "path": rel}
        if again is not None and again.search(rel):
            if item["status"] == "done":
                item = {**item, "status": "redo", "fingerprint": ""}  # done: a new run, not the cached row
            elif item["run_id"]:  # half done: it resumes, or an interrupted redo would start over each time
                item = {**item, "redo_unfinished": True}
        quick = file_key(path, track, catalogue)
        done = item["status"] == "done" and bool(item["result"]) and not item["error"]
        if done and item["file_key"] == quick and not wants_baselines(item["result"]):
            emit("cached", {**info, "name": item["name"], "result": item["result"]})
            return False
        try:
            spec = load_spec(path)
        except Exception as exc:  # a bench survives any spec: SpecError, or the file's own bug
            message = _said(exc) if isinstance(exc, KernelevolveError) else f"{type(exc).__name__}: {exc}"
            with Workspace.open(settings.workspace) as ws:
                ws.put_bench_item(
                    bench_id, rel, i, path.stem, status="load_error", error=message, result=None
                )
            emit("load_error", {**info, "error": message})
            return False
        precision = track_precision(spec, track)
        run_path = path
        if precision != spec.precision:
            with Workspace.open(settings.workspace) as ws:
                run_path = _track_file(ws, bench_id, rel, spec, precision)
            spec = load_spec(run_path)
        key = item_key(spec)
        cached = done and item["fingerprint"] == key
        if cached:  # stored before file keys were: the next resume needs no loading
            with Workspace.open(settings.workspace) as ws:
                ws.put_bench_item(bench_id, rel, i, item["name"], file_key=quick)
        if cached and not wants_baselines(item["result"]):
            emit("cached", {**info, "name": spec.name, "result": item["result"]})
            return False
        staged[i] = (spec, run_path, key, item, cached)  # cached: only its baselines are missing
        return True

    def demand(i: int) -> tuple[int, int] | None:
        """(one worker's need, the pool's wish) in bytes for spec i; None where nothing is planned."""
        return run_demand(staged[i][0], platform, settings)

    def one(i: int, device_settings: Settings) -> None:
        spec, run_path, key, item, cached = staged.pop(i)
        info = {"index": i + 1, "total": len(files), "path": rels[i], "device": device_settings.device}
        result: dict[str, Any] | None
        if cached:  # a row from an earlier bench, still without the reference's times
            result = with_baselines(device_settings, run_path, item["result"])
            with Workspace.open(settings.workspace) as ws:
                ws.put_bench_item(bench_id, rels[i], i, spec.name, fingerprint=key, run_id=item["run_id"],
                                  status="done", error="", result=result)  # fmt: skip
        else:
            result = _run_one(jobs, device_settings, search, limits, synth, bench_id, i, rels[i], run_path, spec,
                              key, item, info, emit, interrupt)  # fmt: skip
        if result is not None:
            with Workspace.open(settings.workspace) as ws:
                ws.put_bench_item(
                    bench_id, rels[i], i, spec.name, file_key=file_key(files[i], track, catalogue)
                )
            emit("result", {**info, "name": spec.name, "result": result})

    schedule(one, len(files), settings, devices, per_device, interrupt, demand, platform.device_memory, stage,
             order=order)  # fmt: skip

    with Workspace.open(settings.workspace) as ws:
        ws.set_bench_status(bench_id, "done")
        return {**bench_document(ws, bench_id), "estimate": cost.to_dict()}


def start_order(rels: Sequence[str], walls: Mapping[str, float]) -> list[int]:
    """The specs' indices in the order the bench starts them: those whose time is unknown first, as
    listed, then the others longest first (walls: a spec's name, its file's stem -> the seconds its
    run took). Longest-first shortens a bench of several specs at once: in the 11-28 TF32 suites
    run, sdpa_mlp_block (13 minutes) and conv1d_serving (11) were among the last to end; by that
    run's times, 24 specs on 8 slots end after 1,175 s longest first against 1,342 s as listed."""
    stems = [Path(rel).stem for rel in rels]
    unknown = [i for i, stem in enumerate(stems) if stem not in walls]
    known = sorted((i for i, stem in enumerate(stems) if stem in walls), key=lambda i: -walls[stems[i]])
    return unknown + known


def known_walls(ws: Workspace) -> dict[str, float]:
    """Each spec name's run time in the workspace's latest bench that ran it to the end."""
    out: dict[str, float] = {}
    for bench in reversed(ws.benches()):  # oldest first: later benches overwrite
        for item in ws.bench_items(bench["bench_id"]):
            wall = (item["result"] or {}).get("wall_s") if item["status"] == "done" else None
            if isinstance(wall, int | float) and wall > 0:
                out[Path(item["path"]).stem] = float(wall)
    return out


def walls_in(path: Path) -> dict[str, float]:
    """Each spec name's run time in a bench document (`kernelevolve bench --json`, or a record
    holding one under `report`)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise WorkspaceError(f"--order-from {path}: not a readable JSON file ({exc})") from None
    rows = doc.get("results") if isinstance(doc, dict) else None
    if rows is None and isinstance(doc, dict) and isinstance(doc.get("report"), dict):
        rows = doc["report"].get("results")
    if not isinstance(rows, list):
        raise WorkspaceError(
            f"--order-from {path}: no bench results in it",
            hint="give a bench document: `kernelevolve bench ... --json > bench.json`",
        )
    return {
        Path(str(row.get("path") or row["name"])).stem: float(row["wall_s"])
        for row in rows
        if isinstance(row, dict) and row.get("name") and isinstance(row.get("wall_s"), int | float)
    }


def _said(exc: KernelevolveError) -> str:
    """An error and what to do about it, in one row of the bench."""
    return f"{exc.message} ({exc.hint})" if exc.hint else exc.message


def _regex(option: str, text: str | None) -> re.Pattern[str] | None:
    try:
        return re.compile(text) if text else None
    except re.error as exc:
        raise WorkspaceError(f"{option} {text!r} is not a regular expression: {exc}") from None


def samples_digest() -> str:
    """A digest of the shipped code samples (what `item_key` reads of them), once per bench."""
    from kernelevolve.knowledge.samples import builtin_samples

    found = sorted((s.doc_id, s.source) for kind in ("triton", "c") for s in builtin_samples(kind))
    return hashlib.sha256(json.dumps(found).encode()).hexdigest()[:16]


def file_key(path: Path, track: str, catalogue: str) -> str:
    """What a spec's result stands for, from what needs no loading: the file's bytes, the track, the
    timing method, torch's version and the shipped samples. Equal keys mean an equal `item_key`."""
    import torch

    from kernelevolve.evaluate.timing import METHOD_VERSION

    parts = [
        hashlib.sha256(path.read_bytes()).hexdigest(),
        track,
        f"t{METHOD_VERSION}",
        torch.__version__,
        catalogue,
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def item_key(spec: Spec) -> str:
    """What a spec's result in a bench stands for: its file, the code samples the synthesizers
    start from for it (a sample added for an op that failed must not leave the failure cached), and
    the timing method (a result measured under an older one is measured again)."""
    from kernelevolve.evaluate.timing import METHOD_VERSION
    from kernelevolve.knowledge.samples import applicable_samples

    samples = sorted((s.doc_id, s.source) for kind in ("triton", "c") for s in applicable_samples(spec, kind))
    method = f"t{METHOD_VERSION}"
    if not samples:
        return f"{spec.fingerprint}+{method}"
    digest = hashlib.sha256(json.dumps(samples).encode()).hexdigest()[:8]
    return f"{spec.fingerprint}+{method}+{digest}"


def _run_one(
    jobs: Any, settings: Settings, search: SearchConfig, limits: Limits, synth: SynthConfig, bench_id: str,
    position: int, rel: str, run_path: Path, spec: Spec, key: str, item: dict[str, Any],
    info: dict[str, Any], emit: Event, interrupt: threading.Event | None = None,
) -> dict[str, Any] | None:  # fmt: skip
    """Start or resume the spec's run and drive it to its end; its result row (None: not loadable)."""
    precision = spec.precision
    run_id = item["run_id"] if item["fingerprint"] == key else None
    try:
        if run_id is None:
            run_id = jobs.start(run_path, settings, search, limits, synth)
            with Workspace.open(settings.workspace) as ws:
                ws.put_bench_item(bench_id, rel, position, spec.name, fingerprint=key, run_id=run_id,
                                  status="running", error="")  # fmt: skip
            emit("start", {**info, "name": spec.name, "run_id": run_id})
        else:
            note = "--redo starts a spec again once its run is done; this one's is not, so it resumes"
            emit("resume", {**info, "name": spec.name, "run_id": run_id,
                            **({"note": note} if item.get("redo_unfinished") else {})})  # fmt: skip
        events = _forward(emit, {**info, "name": spec.name})
        summary = jobs.drive(
            run_id, settings.workspace, events, where=jobs.placement(settings), interrupt=interrupt
        )
        with Workspace.open(settings.workspace) as ws:
            nodes = ws.nodes(run_id)
        result = with_baselines(settings, run_path, result_row(spec.name, rel, summary, nodes, precision))
        error = ""
    except SpecError as exc:  # found while setting the run up (the meta probe, a shape): not loadable
        with Workspace.open(settings.workspace) as ws:
            ws.put_bench_item(bench_id, rel, position, spec.name, status="load_error", error=_said(exc))
        emit("load_error", {**info, "error": _said(exc)})
        return None
    except KernelevolveError as exc:
        error = _said(exc)
        result = _failed_row(spec.name, rel, run_id, precision, error)
        emit("run_error", {**info, "name": spec.name, "error": error})
    with Workspace.open(settings.workspace) as ws:
        ws.put_bench_item(bench_id, rel, position, spec.name, fingerprint=key, run_id=run_id, status="done",
                          error=error, result=result)  # fmt: skip
    return result


def wants_baselines(row: dict[str, Any]) -> bool:
    """Whether a row lacks the reference's times: no candidate was timed, and none were measured."""
    return not row.get("shapes") and "baselines" not in row and "baselines_error" not in row


def with_baselines(settings: Settings, spec_path: Path, row: dict[str, Any]) -> dict[str, Any]:
    """The row with the eager and torch.compile times per shape where no candidate's timing gave them
    (no candidate, or none correct): what a reader of the bench wants to know of every problem, and
    the proof that the harness could prepare it. A failure is the row's `baselines_error`."""
    from kernelevolve.jobs import baselines

    if not wants_baselines(row):
        return row
    try:
        _, rows, _, errors = baselines(spec_path, settings)
    except KernelevolveError as exc:
        return {**row, "baselines_error": _said(exc)}
    except Exception as exc:  # a bench survives any spec
        return {**row, "baselines_error": f"{type(exc).__name__}: {exc}"}

    def us(stats: dict[str, Any] | None) -> float | None:
        return stats["median_s"] * 1e6 if stats else None

    times = [
        {"shape": r["shape"], "eager_us": us(r.get("eager")), "compile_us": us(r.get("compile"))}
        for r in rows
    ]
    return {**row, "baselines": times} | ({"baselines_missing": errors} if errors else {})


def _failed_row(name: str, rel: str, run_id: str | None, precision: str, error: str) -> dict[str, Any]:
    """The row of a run that raised: a run without a correct kernel, with the error as its message."""
    return {**result_row(name, rel, {"run_id": run_id}, [], precision), "message": error}


def _forward(emit: Event, info: dict[str, Any]) -> Event:
    """The run's own events, tagged with the spec's position in the bench."""

    def on_event(event: str, data: dict[str, Any]) -> None:
        emit("run_event", {**info, "event": event, "data": data})

    return on_event


def bench_document(ws: Workspace, bench_id: str) -> dict[str, Any]:
    """The bench as one JSON-able object: options, environment, results, load errors, summary; and,
    apart, `other_sources`: what imported benches of the same folder report (`bench.imported`), never
    in `summary`. An imported bench's own document is `imported.imported_document`'s."""
    from kernelevolve.bench.imported import imported_document, imported_for

    bench = ws.bench(bench_id)
    if bench["config"].get("imported"):
        return imported_document(ws, bench["bench_id"])
    items = ws.bench_items(bench["bench_id"])
    limit = float(bench["config"].get("suspicious_speedup") or Settings().suspicious_speedup)
    results = [_reviewed(ws, r["result"], limit) for r in items if r["status"] == "done" and r["result"]]
    load_errors = [{"path": r["path"], "error": r["error"]} for r in items if r["status"] == "load_error"]
    pending = [r["path"] for r in items if r["status"] in ("pending", "running")]
    method = next((r["method"] for r in results if r.get("method")), None) or {}
    cfg = bench["config"]
    environment = {
        "device": method.get("device") or next((r.get("device") for r in results if r.get("device")), None),
        "platform": cfg.get("platform"),
        "driver": method.get("driver"), "torch": method.get("torch"), "triton": method.get("triton"),
        "python": method.get("python"), "kernelevolve": method.get("kernelevolve"),
        "timer": method.get("timer"),
    }  # fmt: skip
    return {
        "bench_id": bench["bench_id"],
        "dir": bench["dir"],
        "status": bench["status"] if not pending else "incomplete",
        "created_at": bench["created_at"],
        "updated_at": bench["updated_at"],
        "track": cfg.get("track"),
        "fitness_baseline": cfg.get("fitness_baseline"),
        "synthesizer": cfg.get("synthesizer"),
        "budget": cfg.get("budget"),
        "policy": cfg.get("policy"),
        "timing_budget_s": cfg.get("timing_budget_s"),
        "per_device": cfg.get("per_device", 1),
        "environment": environment,
        "results": [{k: v for k, v in r.items() if k != "method"} for r in results],
        "load_errors": load_errors,
        "pending": pending,
        "summary": summarize(results, load_errors=len(load_errors)),
        "other_sources": imported_for(ws, bench["dir"]),
    }


def _reviewed(ws: Workspace, row: dict[str, Any], limit: float) -> dict[str, Any]:
    """A stored result row as the document shows it: flagged where it delivers more than `limit`
    times over a baseline (`results.baseline_flags`), with the baselines whose figures it holds back
    (`held`: `results.held_baselines`); and a row stored before rows counted their
    suspicious candidates gets the count from its run's nodes (a done run's nodes do not change)."""
    row = {**row, "flags": baseline_flags(row, limit), "held": held_baselines(row, limit)}
    if "suspicious" in row or not row.get("run_id"):
        return row
    return {**row, **held_back(ws.nodes(row["run_id"]))}


__all__ = ["TRACKS", "bench_document", "bench_key", "discover", "run_bench", "track_precision"]
