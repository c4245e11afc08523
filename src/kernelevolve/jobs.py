"""The library-level jobs behind the CLI: evaluate candidates, time baselines, profile the hardware
and a candidate.

Each job opens the workspace, resolves the platform, and records what it measured. Nothing here prints
or exits; progress is reported through an optional callback, and failures a user must act on are the
project's exceptions (`kernelevolve.errors`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kernelevolve.config import Settings
from kernelevolve.errors import KernelevolveError
from kernelevolve.evaluate import memory
from kernelevolve.evaluate.guards import check_source
from kernelevolve.evaluate.pool import EvaluatorPool, measure_profile
from kernelevolve.evaluate.verdict import Verdict
from kernelevolve.platforms import Platform, select
from kernelevolve.spec import Spec, load_spec
from kernelevolve.store import Workspace
from kernelevolve.store.blobs import candidate_hash

Progress = Callable[[str, str, Any], None]


def device_key(identity: dict[str, str | None], platform: str) -> str:
    parts = [platform, identity.get("device") or "?", identity.get("driver") or "-",
             f"torch {identity.get('torch')}", f"triton {identity.get('triton')}"]  # fmt: skip
    return " | ".join(parts)


def trusted_cache(ws: Workspace, spec: Spec, platform: Platform, settings: Settings) -> Path:
    """Where a spec's trusted torch.compile cache lives on this device and software: filled by the
    first worker of a run, before any candidate, and copied into every later worker. The last part
    names the cache's layout (see `WorkerHandle.start`); a cache of an older layout is not reused."""
    key = device_key(platform.identity(settings.device), platform.name)
    return ws.cache_dir(f"compile-{spec.fingerprint}-{candidate_hash(key)[:8]}") / "inductor-2"


def hardware_profile(
    platform: Platform, settings: Settings, ws: Workspace, remeasure: bool = False
) -> tuple[dict[str, Any], bool]:
    """The cached profile of this device and software, measured now if absent. (profile, measured_now)
    Runs that start at once in one process (a bench's, `--per-device`) measure it once: the others
    wait for that measurement and read it from the workspace."""
    key = device_key(platform.identity(settings.device), platform.name)
    with _profile_lock(ws.root, key):
        cached = None if remeasure else ws.get_hardware_profile(key)
        if cached is not None:
            return cached, False
        store_profile(ws, platform, settings, measure_profile(platform, settings))
        stored = ws.get_hardware_profile(key)
        assert stored is not None
        return stored, True


def store_profile(ws: Workspace, platform: Platform, settings: Settings, profile: dict[str, Any]) -> None:
    """Store a measured hardware profile as this device's and software's, replacing the cached one (an
    evaluator pool measures it again where a kernel was above its roofline: `EvaluatorPool`)."""
    key = device_key(platform.identity(settings.device), platform.name)
    ws.put_hardware_profile(key, platform.name, profile.get("device", ""), profile)


def _storing_profile(
    ws: Workspace, platform: Platform, settings: Settings, on_event: Progress | None
) -> Progress:
    """`on_event`, storing the profile that the pool's event "remeasured" carries."""

    def handle(event: str, label: str, detail: Any) -> None:
        if event == "remeasured":
            store_profile(ws, platform, settings, detail)
        if on_event:
            on_event(event, label, detail)

    return handle


_PROFILE_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_PROFILE_LOCKS_GUARD = threading.Lock()


def _profile_lock(workspace: Path, key: str) -> threading.Lock:
    """One lock per workspace and hardware profile key."""
    with _PROFILE_LOCKS_GUARD:
        return _PROFILE_LOCKS.setdefault((str(workspace.resolve()), key), threading.Lock())


def sized_for(settings: Settings, platform: Platform, candidates: int, slots: int | None = None) -> Settings:
    """Resolve `workers = 0` (auto: `slots`, what the executor evaluates at once, else 2 on a GPU and
    1 on the CPU, whose timings any concurrent work would disturb) and keep no more spares than there
    are candidates left to take them."""
    workers = settings.workers or slots or (2 if platform.name in ("cuda", "rocm") else 1)
    workers = min(workers, candidates)
    return replace(settings, workers=workers, spares=min(settings.spares, max(0, candidates - workers)))


def _record_spec(ws: Workspace, spec: Spec) -> None:
    ws.record_spec(spec.fingerprint, spec.name, str(spec.path), spec.source, spec.summary())


def expand_candidates(
    paths: Iterable[Path],
    spec_path: Path,
    platform: Platform | None = None,
    skipped: list[Path] | None = None,
) -> list[Path]:
    """Files as given; a directory expands to its .py files that define ModelNew (the spec excluded)
    and, given a platform, carry kernels that platform runs (the others are listed in `skipped`)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            for f in sorted(p.glob("*.py")):
                source = f.read_text(errors="replace")
                if f.resolve() == spec_path.resolve() or "ModelNew" not in source:
                    continue
                kinds = check_source(source, accepted_kinds=()).kinds
                if platform is not None and kinds and not kinds & platform.kinds:
                    if skipped is not None:
                        skipped.append(f)
                    continue
                out.append(f)
        elif p.is_file():
            out.append(p)
        else:
            raise KernelevolveError(f"{p}: no such candidate file or directory")  # bad input, not the spec
    if not out:
        raise KernelevolveError(
            "no candidate files found", hint="pass .py files defining ModelNew, or a folder of them"
        )
    return out


def evaluate(
    spec_path: Path,
    candidate_paths: list[Path],
    settings: Settings,
    on_event: Progress | None = None,
    static_guards: bool = True,
    record: bool = True,
) -> tuple[Spec, list[Verdict]]:
    """Evaluate candidates against a spec on the selected platform; verdicts in the given order."""
    spec = load_spec(spec_path)
    platform = select(settings.platform)
    skipped: list[Path] = []
    files = expand_candidates(candidate_paths, spec_path, platform, skipped)
    if on_event:
        for f in skipped:
            on_event("skip", str(f), f"its kernels do not run on {platform.name}")
        on_event("plan", platform.name, len(files))
    settings = sized_for(settings, platform, len(files))
    settings, plan = memory.fit(spec, platform, settings, memory.settled_memory(spec, platform, settings))
    if on_event and plan.note:
        on_event("note", "memory plan", plan.note)
    with Workspace.open(settings.workspace) as ws:
        _record_spec(ws, spec)
        if on_event:
            on_event("profile", platform.name, None)
        profile, _ = hardware_profile(platform, settings, ws)
        sources = [(f.read_text(errors="replace"), str(f)) for f in files]
        with EvaluatorPool(
            spec, platform, settings, profile=profile, trusted_cache=trusted_cache(ws, spec, platform, settings),
            on_event=_storing_profile(ws, platform, settings, on_event), static_guards=static_guards,
        ) as pool:  # fmt: skip
            verdicts = []
            for (source, label), verdict in zip(sources, pool.evaluate_many(sources), strict=True):
                if record:
                    ws.record_candidate(source, label, verdict.candidate_kind)
                    ws.record_evaluation(verdict.to_dict())
                verdicts.append(verdict)
    return spec, verdicts


def baselines(
    spec_path: Path, settings: Settings, on_event: Progress | None = None
) -> tuple[Spec, list[dict[str, Any]], str, dict[str, str]]:
    """Eager and torch.compile times per shape, measured live and cached in the workspace.
    Returns (spec, rows, device key, baseline errors: why a baseline is missing)."""
    spec = load_spec(spec_path)
    platform = select(settings.platform)
    key = device_key(platform.identity(settings.device), platform.name)
    with Workspace.open(settings.workspace) as ws:
        _record_spec(ws, spec)
        trusted_settings = replace(settings, spares=0, workers=1)
        memory.plan(
            spec, platform, trusted_settings, memory.settled_memory(spec, platform, trusted_settings)
        )  # fits?
        cache = trusted_cache(ws, spec, platform, settings)
        with EvaluatorPool(spec, platform, trusted_settings, trusted_cache=cache, on_event=on_event) as pool:
            message = pool.run_trusted("baselines")
            info = pool.device_info or {}
        rows = message["baselines"]
        errors = dict(message.get("errors") or {})
        for row in rows:
            row["device"] = info.get("device")
            row["versions"] = info.get("versions")
            ws.put_baseline(spec.fingerprint, key, row["shape"], row)
    return spec, rows, key, errors


def profile_file(
    spec_path: Path, candidate_path: Path, settings: Settings, shape: str | None = None, mode: str | None = None,
    on_event: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """`kernelevolve profile`: evaluate the candidate (the verdict's roofline), profile it where it is
    correct, and diagnose. On the CPU, `auto` means torch.profiler (ncu is for NVIDIA GPUs)."""
    from kernelevolve.profile.diagnosis import diagnose
    from kernelevolve.profile.run import profile_candidate

    if not candidate_path.is_file():
        raise KernelevolveError(
            f"{candidate_path}: no such candidate file", hint="give a .py file defining ModelNew"
        )
    spec, verdicts = evaluate(spec_path, [candidate_path], settings, on_event=on_event)
    verdict = verdicts[0].to_dict()
    platform = select(settings.platform)
    metrics: dict[str, Any] = {"shape": None, "profiler": None, "ncu": None, "tools": [], "errors": []}
    if verdicts[0].ok:
        metrics = profile_candidate(spec, platform, candidate_path.read_text(), settings, shape, mode)
    else:
        metrics["errors"].append(f"not profiled: the candidate is not correct ({verdict['status']})")
    diagnosis = diagnose(verdict, metrics)
    return {
        "spec": spec.name, "candidate": str(candidate_path), "platform": platform.name,
        "status": verdict["status"], "message": verdict.get("message") or "",
        "speedup_vs_eager": verdict.get("speedup_vs_eager"), "speedup_vs_compile": verdict.get("speedup_vs_compile"),
        "roofline_fraction": verdict.get("roofline_fraction"), "diagnosis": diagnosis,
        "metrics": {"shape": metrics.get("shape"), "profiler": metrics.get("profiler"), "ncu": metrics.get("ncu"),
                    "tools": metrics.get("tools", []), "errors": metrics.get("errors", [])},
        "shapes": [{k: s.get(k) for k in ("name", "correct", "speedup_vs_eager", "speedup_vs_compile",
                                           "roofline_fraction", "bound")} for s in verdict.get("shapes", [])],
        "method": verdict.get("method"),
    }  # fmt: skip
