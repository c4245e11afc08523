"""The settings' values: the `Settings` dataclass and what it needs, standard library only (a worker
imports this, never the loader). `kernelevolve.config` says how the layers fit together."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelevolve.errors import WorkspaceError

ENV_PREFIX = "KERNELEVOLVE_"
WORKSPACE_VARIABLE = "KERNELEVOLVE_WORKSPACE"
DEFAULT_WORKSPACE = Path(".kernelevolve")
# `KERNELEVOLVE_*` variables that are not settings, and what reads each. Loading settings refuses any
# other `KERNELEVOLVE_*` variable than these and the settings' own (`KERNELEVOLVE_<FIELD>`).
OTHER_VARIABLES = {
    WORKSPACE_VARIABLE: "the workspace directory, when no --workspace is given (resolve_workspace)",
    "KERNELEVOLVE_SEAL_KEY_FILE": "the key that seals verdicts in the store (store/seal.py)",
    "KERNELEVOLVE_PRICES": "a prices file for model providers (synth/providers/pricing.py)",
    # set by the harness for its worker and profiling processes, readable by a user's too
    "KERNELEVOLVE_NATIVE_CACHE": "where compiled native candidates are cached (native.py)",
    "KERNELEVOLVE_LEASE_DIR": "where device leases are taken (evaluate/lease.py)",
    "KERNELEVOLVE_EXPORT_BUILD": "set by `export --build` for the exported package's build step (export_native.py)",
}
PROFILE_MODES = ("auto", "off", "torch", "ncu")
WORKER_STARTS = ("auto", "fork", "spawn")
SHARE_REFERENCES = ("auto", "always", "never")
FITNESS_BASELINES = ("best", "eager", "compile")


@dataclass
class Settings:
    """Everything the harness and CLI can be told. Units are in the names."""

    workspace: Path = DEFAULT_WORKSPACE
    platform: str = "auto"  # "auto" | a registered platform name ("cuda", "cpu", "rocm", ...)
    device: int = 0
    # Baselines measured live beside every candidate, and the one fitness is computed against: "best"
    # (each shape's faster baseline in the same measurement), "eager" or "compile".
    baselines: list[str] = field(default_factory=lambda: ["eager", "compile"])
    fitness_baseline: str = "best"
    # Timing: a per-shape budget split over interleaved rounds of (eager, compile, candidate).
    timing_budget_s: float = 1.0
    min_trials: int = 20
    max_trials: int = 400
    warmup_trials: int = 3
    # and warm-up rounds for at least this long per shape (clocks, threads settle); None: the
    # platform's (0.25 s on the CPU, none beyond the rounds on a GPU)
    warmup_s: float | None = None
    # Rounds end early once every callee's median is known within +-this (95% CI); None: the
    # platform's (0.005 on a GPU; 0 on the CPU, which times its whole budget); 0: never early.
    timing_precision: float | None = None
    # The same for the search's own evaluations, which only rank candidates: the finish step
    # re-measures the winners at `timing_precision`: a run's summary, report and bench rows give those.
    # None: `timing_precision` where it is set, else the platform's (0.01 on a GPU, 0 on the CPU).
    search_timing_precision: float | None = None
    graph_threshold_us: float = 50.0  # below this single-call time a shape is timed as CUDA graphs
    checked_fraction: float = 0.1  # share of timed candidate calls whose outputs are verified
    # Correctness: seeds x distributions per shape (at least 3 x 2, enforced).
    seeds: int = 3
    # Limits for one candidate's worker.
    compile_timeout_s: float = 180.0
    run_timeout_s: float = 180.0
    prepare_timeout_s: float = 900.0
    memory_limit_gb: float = 16.0
    # The worker's sandbox (Linux; SECURITY.md): its own empty network namespace; its own PID, mount
    # and IPC namespaces (no other process in sight, a private /dev/shm) with no capabilities; reads
    # and writes confined by Landlock (reads: the system's libraries and compilers, the Python
    # installation and import paths, the spec, and `sandbox_read_paths`; writes: its own directory).
    sandbox_network: bool = True
    sandbox_processes: bool = True
    sandbox_filesystem: bool = True
    sandbox_read_paths: list[str] = field(default_factory=list)
    # None: 0.9 / (device_share * worker processes of the pool), raised for a spec that needs more
    # to 0.9 / (device_share * workers) (`evaluate.pool.gpu_shares`)
    gpu_memory_fraction: float | None = None
    # The part of each device this run's pool may hold, as a divisor: above 1, its workers together
    # get 90% of the device's memory / device_share (`kernelevolve bench --per-device K` grants each
    # run its part: `bench.schedule`); 1: 90% of what is free when the run starts.
    device_share: float = 1.0
    # Pool: candidates evaluated at once, and warm workers kept prepared ahead of need.
    workers: int = 0  # 0: auto (2 per GPU, 1 on the CPU)
    spares: int = 1
    # How a worker starts: "fork" (Linux: forked from a process of the engine's that has imported
    # torch and torch.compile's stack once, `evaluate/forkserver.py`; where it cannot serve, workers
    # are spawned), "spawn" (a fresh interpreter per worker), or "auto": fork on Linux, spawn elsewhere.
    # A forked worker starts in about half a spawned one's time on a GPU
    # (benchmarks/results/2026-11-26-h200-fork-server.md).
    worker_start: str = "auto"
    # Reference outputs shared within a pool (`evaluate/references.py`): "auto" shares them where
    # computing them held the device longer than loading them would take a later worker (on an H100,
    # small specs' references took 0.3 s of the lease and 2.5-6 s to load: not shared), "always",
    # or "never" (every worker computes its own).
    share_references: str = "auto"
    # Devices a search spreads its candidates over: indices ("0,1"), or "auto": every visible device
    # of the platform, unless `device` names another than the first (then that one alone). `device` is
    # also the one device of single-device jobs (eval, profile, baselines).
    devices: str = "auto"
    # Where candidates are evaluated: "local" (worker processes on this machine) or "ray" (tasks on a
    # Ray cluster, the `ray` extra; `ray_address` as ray.init takes it, "" for a local cluster).
    executor: str = "local"
    ray_address: str = ""
    # A worker killed from outside mid-evaluation (SIGKILL, SIGTERM) is retried this often in a fresh
    # worker before the death is the candidate's verdict.
    eval_retries: int = 1
    # Results above these are `suspicious`, never a win (a speedup: over the faster baseline at a shape;
    # a bench row that delivers more over either baseline is flagged for review, `bench.results`).
    suspicious_speedup: float = 10.0
    roofline_margin: float = (
        1.05  # allowed excess over the measured (and the datasheet) roofline before flagging
    )
    # Profiling: which profilers refine a diagnosis ("auto": torch.profiler, plus ncu where present on
    # an NVIDIA GPU; "off": the roofline alone), and how long one profiling process may take. During a
    # search "auto" profiles new bests on GPUs only (on the CPU, torch.profiler sees nothing inside a C
    # kernel); set "torch" to profile there too, and only while two rounds of parallel expansions are
    # left in the budget (a diagnosis nothing reads is not worth the device's time; search/profiling.py).
    # `kernelevolve profile` honours "auto" everywhere.
    profile: str = "auto"
    profile_timeout_s: float = 180.0
    profile_budget: int = 3  # new bests profiled per run (each ~15 s, a few of them on the device's lease)
    # Knowledge and compounding: retrieval into prompts, diagnosis in prompts, warm starts from
    # earlier runs, skills distilled from verified improvements (re-measuring up to `skills_verify`
    # candidate skills at the end of a run), and an optional dense embedder for hybrid ranking
    # ("sentence-transformers:/path/to/local/model").
    knowledge: bool = True
    diagnosis: bool = True
    warm_start: bool = True
    skills: bool = True
    skills_verify: int = 2
    kb_embedder: str = ""
    # Cost caps over every run of the workspace together (model synthesizers; a run's own caps are
    # --max-usd and --max-tokens). A run stops cleanly once the workspace's total reaches either.
    workspace_max_usd: float | None = None
    workspace_max_tokens: int | None = None
    # A model endpoint that fails (after each call's retries) costs no candidates; the run pauses
    # between tries and stops, resumable, once it has failed for this long.
    provider_outage_s: float = 900.0

    def validate(self) -> Settings:
        if self.profile not in PROFILE_MODES:
            raise WorkspaceError(f"profile must be one of {', '.join(PROFILE_MODES)}, not {self.profile!r}")
        if self.fitness_baseline not in FITNESS_BASELINES:
            raise WorkspaceError(
                f"fitness_baseline must be one of {', '.join(FITNESS_BASELINES)}, not {self.fitness_baseline!r}"
            )
        unknown = set(self.baselines) - {"eager", "compile"}
        if unknown:
            raise WorkspaceError(f"unknown baselines {sorted(unknown)}; valid: eager, compile")
        if "eager" not in self.baselines:
            self.baselines = ["eager", *self.baselines]
        # What is not measured cannot be it; and the best of eager alone is eager.
        if self.fitness_baseline not in (*self.baselines, "best") or self.baselines == ["eager"]:
            self.fitness_baseline = "eager"
        for name in ("workspace_max_usd", "workspace_max_tokens"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise WorkspaceError(f"{name} must be positive (or left unset)")
        self.seeds = max(3, self.seeds)
        if self.devices != "auto":
            parse_devices(self.devices)  # a WorkspaceError naming the setting
        if self.worker_start not in WORKER_STARTS:
            raise WorkspaceError(
                f"worker_start must be one of {', '.join(WORKER_STARTS)}, not {self.worker_start!r}"
            )
        if self.share_references not in SHARE_REFERENCES:
            raise WorkspaceError(
                f"share_references must be one of {', '.join(SHARE_REFERENCES)}, not {self.share_references!r}"
            )
        self.eval_retries = max(0, self.eval_retries)
        self.workers = max(0, self.workers)
        self.spares = max(0, self.spares)
        self.device_share = max(1.0, float(self.device_share))
        return self

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["workspace"] = str(self.workspace)
        return out


def parse_devices(text: str) -> list[int]:
    """Device indices from "0,1,2" (distinct, non-negative)."""
    try:
        found = [int(d) for d in str(text).split(",") if d.strip()]
    except ValueError:
        found = []
    if not found or len(set(found)) != len(found) or min(found) < 0:
        raise WorkspaceError(f"devices {text!r}: give distinct indices like 0,1,2,3, or auto")
    return found


def setting_names() -> list[str]:
    """The names a layer can set: every field but `workspace` (which is chosen before the layers)."""
    return [f.name for f in dataclasses.fields(Settings) if f.name != "workspace"]


def resolve_workspace(flag: str | Path | None = None) -> Path:
    if flag:
        return Path(flag)
    env = os.environ.get(WORKSPACE_VARIABLE)
    return Path(env) if env else DEFAULT_WORKSPACE


@dataclass(frozen=True)
class Source:
    """Where a setting's value in force came from: its layer, and the file or variable that set it."""

    layer: str  # "default" | "toml" | "env" | "flag"
    where: str | None = None  # the config.toml's path, the variable's name; None for default and flag

    def __str__(self) -> str:
        return f"{self.layer} {self.where}" if self.where else self.layer
