"""The library-level jobs behind `optimize`, `resume`, `tune` and `runs`: set a run up, drive it.

A run's record holds everything needed to continue it in another process: the spec's path and
fingerprint, the platform, the harness settings, the search configuration, the synthesizer and the
limits. `resume` rebuilds the engine from that record alone (a spec file that changed since is
refused: the tree's verdicts would no longer be about it).

A user's own kernels (`optimize --start-from FILE`, `agent start --start-from FILE`) become the
tree's first nodes, `seed` nodes: proposed at `start` with the file's source and evaluated first like
any candidate, so every synthesizer grows the tree from them once they are evaluated; the offline
tuner also takes a seed that declares tunables as one of its bases, beside its own templates. A seed
file is read once, at `start`: its source is stored with the run (the node, and the run's config for
the tuner), so a resume never reads it again and a file changed or deleted since changes nothing. At
`start` a seed file must exist and pass the static guards (parse, define ModelNew with a kernel this
platform runs, break no rule): those are refused with the guard's message before anything is
recorded, as `kernelevolve eval` would refuse them. What needs a worker (compiling, correctness,
timing) is the harness's to say: a seed that fails there is a failed node with its verdict, and the
search goes on from the other nodes.

Like `jobs.py`, nothing here prints or exits: progress goes to a callback, errors a user must act on
are the project's exceptions.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kernelevolve.config import Settings
from kernelevolve.cost import require_price
from kernelevolve.errors import KernelevolveError, SpecError, WorkspaceError
from kernelevolve.evaluate import memory
from kernelevolve.evaluate.executors import executor_slots
from kernelevolve.jobs import _record_spec, hardware_profile, sized_for, store_profile, trusted_cache
from kernelevolve.knowledge.patterns import aten_ops, classify
from kernelevolve.platforms import Platform, get_platform, select
from kernelevolve.search.context import EngineContext
from kernelevolve.search.engine import Engine
from kernelevolve.search.limits import Limits
from kernelevolve.search.policies import SearchConfig
from kernelevolve.spec import Spec, load_spec
from kernelevolve.store import Workspace
from kernelevolve.store.seal import key_id, key_path
from kernelevolve.synth import SynthConfig, create

Event = Callable[[str, dict[str, Any]], None]


def run_dir(ws: Workspace, run_id: str) -> Path:
    return ws.root / "runs" / run_id


def _context(
    ws: Workspace, spec: Spec, platform: Platform, settings: Settings, out_dir: Path, shapes: list[str] | None
) -> EngineContext:
    profile, _ = hardware_profile(platform, settings, ws)
    trusted = trusted_cache(ws, spec, platform, settings)
    return EngineContext(
        ws, spec, platform, settings, profile, trusted, out_dir, shapes,
        store_profile=lambda measured: store_profile(ws, platform, settings, measured),
    )  # fmt: skip


def _meter(synth: SynthConfig, limits: Limits, workspace: Path, run: dict[str, Any]) -> Any:
    """The run's meter: its own caps, and the workspace's caps as configured now (config.toml or the
    environment, not the run's stored settings: a cap lowered during a bench holds for its next runs)."""
    if not synth.is_model:
        return None
    from kernelevolve.config import load_settings
    from kernelevolve.synth.providers.meter import Meter, WorkspaceCap

    current = load_settings(workspace)

    def elsewhere() -> tuple[int, float]:
        with Workspace.open(workspace) as ws:
            return ws.spend(exclude_run=run["run_id"])

    cap = WorkspaceCap(current.workspace_max_usd, current.workspace_max_tokens, elsewhere)
    meter = Meter(
        max_usd=limits.max_usd, max_tokens=limits.max_tokens, workspace=workspace, workspace_cap=cap
    )
    # a resumed run starts with what it already spent
    meter.preload(tokens=run["tokens_in"] + run["tokens_out"], usd=run["cost_usd"])
    return meter


def start(
    spec_path: Path,
    settings: Settings,
    search: SearchConfig,
    limits: Limits,
    synth: SynthConfig,
    *,
    shapes: list[str] | None = None,
    extra_seeds: list[Path] | None = None,
    start_from: list[Path] | None = None,
) -> str:
    """Record a new run and return its id (nothing is evaluated yet). `extra_seeds`: kernels the
    offline tuner takes as its bases (`kernelevolve tune`'s); `start_from`: the user's kernels, the
    run's first (`seed`) nodes, for any synthesizer."""
    spec = load_spec(spec_path)
    platform = select(settings.platform)
    search.validate()
    limits.validate()
    for name in shapes or ():
        spec.shape(name)  # a SpecError naming the valid shapes
    if synth.name != "tuner" and extra_seeds:
        raise WorkspaceError("seed kernels are for the offline tuner (`kernelevolve tune`)")
    seeds = read_seeds(start_from or [], spec, platform)  # refused now, before anything is recorded
    if synth.is_model:  # fail now, not at the first expansion, on a missing SDK or key
        from kernelevolve.synth.providers import check_model

        check_model(synth.name, base_url=synth.base_url)
        require_price(synth, limits.max_usd, settings)  # a USD cap must be able to count this model
    with Workspace.open(settings.workspace) as ws:
        _record_spec(ws, spec)
        config = {
            "search": dataclasses.asdict(search),
            "synth": dataclasses.asdict(synth),
            "settings": {k: v for k, v in settings.to_dict().items() if k != "workspace"},
            "shapes": shapes,
            # the tuner's bases, with their sources: a resume never reads the files again
            "seeds": [{"path": str(p.resolve()), "source": p.read_text()} for p in extra_seeds or []]
            # the user's kernels: the new run's first nodes, 1..n (`seed_nodes`)
            + [{"path": str(p.resolve()), "source": text, "node": i} for i, (p, text) in enumerate(seeds, 1)],
        }
        ops = reference_ops(spec)
        config["ops"] = ops  # what a warm start of a later run matches on (`learning.warm_seeds`)
        pattern = classify([op for op in ops if op != "backward"]) if ops else ""
        run_id = ws.create_run(
            spec.fingerprint, str(spec.path.resolve()), platform.name, synth.name, search.policy, config,
            dataclasses.asdict(limits), pattern=pattern,
        )  # fmt: skip
        if seeds:
            seed_nodes(ws, run_id, seeds)
        elif settings.warm_start and not extra_seeds and synth.name != "agent":
            warm_start(ws, run_id, spec, platform.name, ops)
        return run_id


def read_seeds(paths: list[Path], spec: Spec, platform: Platform) -> list[tuple[Path, str]]:
    """The user's kernels for `--start-from`, (path, source), each checked by the static guards the
    harness applies first (`evaluate.pool.static_report`): a file that is missing, does not parse,
    or breaks a guard is bad input (a KernelevolveError: exit 2, not the spec's 5) naming the file and the rule, before any search."""
    from kernelevolve.evaluate.pool import static_report

    out = []
    for path in paths:
        if not path.is_file():
            raise KernelevolveError(
                f"--start-from {path}: no such file",
                hint="give a .py file defining ModelNew with its kernels",
            )
        source = path.read_text(errors="replace")
        report = static_report(source, spec, platform)
        if report.syntax_error:
            raise KernelevolveError(f"--start-from {path} does not parse: {report.syntax_error}",
                            hint="fix the file; `kernelevolve eval SPEC FILE` checks it alone")  # fmt: skip
        if report.violations:
            rules = "; ".join(str(v) for v in report.violations)
            raise KernelevolveError(
                f"--start-from {path} breaks the harness's static guards on {platform.name}: {rules}",
                hint="fix what the rules name (docs/harness.md says why each exists); "
                "`kernelevolve eval SPEC FILE` checks it alone",
            )
        out.append((path, source))
    return out


def seed_nodes(ws: Workspace, run_id: str, seeds: list[tuple[Path, str]]) -> list[int]:
    """The user's kernels as a new run's first nodes (1..n, in order): `seed` nodes, proposed with
    the file's source and evaluated first like any candidate."""
    from kernelevolve.evaluate.guards import check_source

    nodes = []
    for i, (path, source) in enumerate(seeds, 1):
        node_id = ws.create_node(run_id, None, None, "seed")
        assert node_id == i, f"seed nodes are a new run's first: node {node_id} of run {run_id}"
        kinds = check_source(source, accepted_kinds=()).kinds
        ws.propose_node(run_id, node_id, source=source, kind=sorted(kinds)[0] if kinds else None,
                        note=f"your kernel {path.name} (--start-from {path})",
                        response=f"start from the user's kernel {path.resolve()}")  # fmt: skip
        nodes.append(node_id)
    return nodes


def reference_ops(spec: Spec) -> list[str] | None:
    """The aten ops the reference's forward dispatches, in order (None where it runs nowhere here),
    then "backward" for a training spec: its kernels compute the gradients too, so a forward's
    kernel of the same ops is not the same computation (the suites' rmsnorm_backward was warm-started
    with rmsnorm's kernel, and every gradient was wrong)."""
    try:
        ops = aten_ops(spec)
    except Exception:  # a reference that runs nowhere here: no ops, not an error
        return None
    return [*ops, "backward"] if ops and spec.backward else ops


def warm_start(ws: Workspace, run_id: str, spec: Spec, platform: str, ops: list[str] | None) -> list[int]:
    """Seed a new run's tree with the best earlier kernels for its spec (or, failing that, for the
    same computation: the same reference ops) on its platform: `warm` nodes, proposed with the earlier
    kernel and evaluated afresh like any other."""
    from kernelevolve.evaluate.guards import check_source
    from kernelevolve.search.learning import warm_seeds

    nodes = []
    for seed in warm_seeds(ws, spec, platform, ops, exclude_run=run_id):
        node_id = ws.create_node(run_id, None, None, "warm")
        kinds = check_source(seed.source, accepted_kinds=()).kinds
        ws.propose_node(run_id, node_id, source=seed.source, kind=sorted(kinds)[0] if kinds else None,
                        note=seed.note, response=f"warm start: {seed.reason}")  # fmt: skip
        nodes.append(node_id)
    return nodes


# The settings that say where a run evaluates, not what it is: a resumed run takes them from where it
# resumes (a bench resumed on a machine with fewer GPUs must not look for the device it started on).
PLACEMENT = ("device", "devices", "device_share")


def placement(settings: Settings) -> dict[str, Any]:
    return {k: getattr(settings, k) for k in PLACEMENT}


def build_engine(
    ws: Workspace,
    run_id: str,
    on_event: Event | None = None,
    limits: Limits | None = None,
    where: dict[str, Any] | None = None,
    interrupt: threading.Event | None = None,
) -> Engine:
    """The engine of a stored run, rebuilt from its record. `limits` replaces the stored ones (a
    resumed run given a larger budget, say) and is stored in their place; `where` (`PLACEMENT`
    fields) replaces the stored placement for this drive only."""
    run_id = ws.resolve_run(run_id)
    run = ws.run(run_id)
    cfg = run["config"]
    unknown = set(where or ()) - set(PLACEMENT)
    if unknown:
        raise ValueError(f"not placement settings: {sorted(unknown)}")
    stored = {**_settings_fields(cfg["settings"]), **(where or {})}
    settings = Settings(**{**stored, "workspace": ws.root}).validate()
    spec = load_spec(run["spec_path"])
    if spec.fingerprint != run["spec_fingerprint"]:
        raise SpecError(
            f"{run['spec_path']} changed since run {run_id} started (its fingerprint differs)",
            hint="restore the spec file, or start a new run with `kernelevolve optimize`",
        )
    foreign = ws.foreign_seals(run_id)
    if foreign:  # refuse before anything is spent: its verdicts would all read tampered
        raise WorkspaceError(
            f"run {run_id}: {sum(foreign.values())} of its verdicts were sealed under another seal key "
            f"({', '.join(sorted(foreign))}; this machine's, {key_path()}, is {key_id()}): "
            "resumed here, it could rank none of them and would spend its budget again",
            hint="copy the key file that sealed them here and name it in KERNELEVOLVE_SEAL_KEY_FILE, "
            "or start the run afresh (`kernelevolve optimize`; in a bench, `--redo NAME`)",
        )
    platform = get_platform(run["platform"])
    search = SearchConfig(**{**cfg["search"], "schedule": tuple(cfg["search"]["schedule"])})
    synth_fields = dict(cfg["synth"])
    if "templates" not in synth_fields:  # recorded before the field: a run with seeds was `tune`'s
        synth_fields["templates"] = not cfg.get("seeds")
    synth_cfg = SynthConfig(**synth_fields)
    if limits is not None:
        ws.update_run(run_id, limits=dataclasses.asdict(limits))
    limits = limits or Limits(**run["limits"])
    settings = sized_for(settings, platform, 10**6, executor_slots(settings, platform))
    settings, plan = memory.fit(spec, platform, settings, memory.settled_memory(spec, platform, settings))
    if plan.note and on_event is not None:
        on_event("memory_plan", {"note": plan.note})
    seeds = stored_seeds(cfg)
    meter = _meter(synth_cfg, limits, ws.root, run)
    synthesizer = create(
        synth_cfg, spec, platform.name, platform.kinds, meter=meter, extra_seeds=seeds, workspace=ws.root
    )
    ctx = _context(ws, spec, platform, settings, run_dir(ws, run_id), cfg.get("shapes"))
    return Engine(
        ctx, run_id, synthesizer, search, limits, on_event=on_event, meter=meter, interrupt=interrupt
    )


def stored_seeds(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """A run's seed kernels for the tuner, (label, source), as stored with the run; a run recorded
    before sources were stored kept paths only, read now."""
    out = []
    for entry in cfg.get("seeds") or []:
        if isinstance(entry, str):
            out.append((entry, Path(entry).read_text()))
        else:
            out.append((str(entry["path"]), str(entry["source"])))
    return out


def drive(
    run_id: str,
    workspace: Path,
    on_event: Event | None = None,
    limits: Limits | None = None,
    where: dict[str, Any] | None = None,
    interrupt: threading.Event | None = None,
) -> dict[str, Any]:
    """Run (or resume) `run_id` to its limits (on the devices `where` names, else its own); returns
    the summary. Setting `interrupt` (from any thread) stops it like Ctrl-C: KeyboardInterrupt."""
    with Workspace.open(workspace) as ws:
        engine = build_engine(ws, run_id, on_event, limits, where, interrupt)
        if engine.synth.name == "agent":
            raise WorkspaceError(
                f"run {engine.run_id} is driven by an external agent",
                hint=f"use `kernelevolve agent next {engine.run_id}` and `kernelevolve agent submit`",
            )
        return engine.run()


def _settings_fields(stored: dict[str, Any]) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(Settings)}
    return {k: v for k, v in stored.items() if k in known and k != "workspace"}


def optimize(
    spec_path: Path,
    settings: Settings,
    search: SearchConfig,
    limits: Limits,
    synth: SynthConfig,
    on_event: Event | None = None,
    start_from: list[Path] | None = None,
) -> dict[str, Any]:
    run_id = start(spec_path, settings, search, limits, synth, start_from=start_from)
    if on_event:
        on_event("run", {"run_id": run_id})
        with Workspace.open(settings.workspace) as ws:
            first = ws.nodes(run_id)
        for mode, event in (("warm", "warm_start"), ("seed", "seeds")):
            nodes = [{"node": n["id"], "note": n["note"]} for n in first if n["mode"] == mode]
            if nodes:
                on_event(event, {"nodes": nodes})
    return drive(run_id, settings.workspace, on_event)


def tune(
    spec_path: Path,
    kernel: Path,
    settings: Settings,
    search: SearchConfig,
    limits: Limits,
    on_event: Event | None = None,
) -> dict[str, Any]:
    """The offline tuner on a user's kernel, one run per spec shape; a per-shape table of the best
    configuration found."""
    from kernelevolve import tunables

    source = kernel.read_text()
    try:
        declared = tunables.read(source)
    except tunables.TunablesError as exc:
        raise SpecError(f"{kernel}: {exc}") from None
    if declared is None:
        raise SpecError(
            f"{kernel} declares no tunables",
            hint="add module-level TUNABLES = {'BLOCK': [256, 512, 1024]} and CONFIG = {'BLOCK': 512}, "
            "and read CONFIG in the kernel's launch",
        )
    spec = load_spec(spec_path)
    rows = []
    for shape in spec.names:
        run_id = start(
            spec_path, settings, replace(search, draft=1), limits, SynthConfig("tuner", templates=False),
            shapes=[shape], extra_seeds=[kernel],
        )  # fmt: skip
        if on_event:
            on_event("run", {"run_id": run_id, "shape": shape})
        summary = drive(run_id, settings.workspace, on_event)
        best_config = None
        if summary.get("best_candidate"):
            found = tunables.read(Path(summary["best_candidate"]).read_text())
            best_config = found[1] if found else None
        row: dict[str, Any] = next((s for s in summary.get("shapes", []) if s["shape"] == shape), {})
        rows.append({
            "shape": shape, "run_id": run_id, "config": best_config, "start_config": declared[1],
            "time_us": row.get("time_us"), "speedup_vs_eager": row.get("speedup_vs_eager"),
            "speedup_vs_compile": row.get("speedup_vs_compile"), "roofline_fraction": row.get("roofline_fraction"),
            "nodes_evaluated": summary["nodes_evaluated"], "best_candidate": summary.get("best_candidate"),
        })  # fmt: skip
    return {"spec": spec.name, "kernel": str(kernel), "tunables": declared[0], "shapes": rows}


def runs(workspace: Path, limit: int = 50) -> list[dict[str, Any]]:
    with Workspace.open(workspace) as ws:
        return ws.runs(limit)


def show(workspace: Path, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with Workspace.open(workspace) as ws:
        run = ws.run(run_id)
        return run, ws.nodes(run["run_id"])


__all__ = ["drive", "optimize", "run_dir", "runs", "show", "start", "tune"]
