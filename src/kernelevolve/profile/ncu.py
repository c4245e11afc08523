"""Nsight Compute: a small fixed metric set for the candidate's kernels, parsed into typed values.

ncu runs the profile target (`kernelevolve.profile.target --mode ncu`) and collects only `METRICS`:
time, SM and memory throughput, DRAM traffic, occupancy (achieved, theoretical, and what limits it),
launch configuration, register use and local-memory traffic (spills), L2 hit rate, the main warp stall
reasons and instruction counts. A fixed set keeps a profile to a dozen replay passes per kernel and
keeps the parse independent of ncu's sections, which change between versions.

Only the candidate's kernels are profiled: the target makes its calls inside the NVTX push/pop range
`kernelevolve.candidate` and `command()` tells ncu to include that range alone (the trailing "/" in
`--nvtx-include` selects a push/pop range). Input generation, weight copies and random init happen
outside it. `is_helper()` recognises PyTorch's init, fill and copy kernels by name; it is a fallback
for output gathered without the range, never the primary filter (a candidate's own work can be a
copy).

`ncu --csv --page raw` prints one header row (first cell "ID"), one units row (first cell empty) and
one row per kernel launch, after ncu's own `==PROF==` lines and whatever the program printed. Numbers
carry thousands separators ("19,808"); cells can be "n/a" or empty; a metric the installed ncu does
not know is simply absent. All of that parses to None for the field, never an exception. Times are
normalised to nanoseconds and byte counts to bytes through the units row (this ncu prints base units
on the raw page; a scaled unit such as "usecond" or "Mbyte" is converted, an unknown one gives None
rather than a value off by a factor of 1000). Output with no header at all is ncu failing (no
permission for the counters, no kernel in the range, a crash): `NcuError` carries ncu's `==ERROR==`
lines and the last lines of the output.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelevolve.errors import KernelevolveError

NVTX_RANGE = "kernelevolve.candidate"

# ncu metric -> KernelMetrics field. Percentages end in "_pct"; `summarize` time-weights those.
FIELDS: dict[str, str] = {
    "gpu__time_duration.sum": "time_ns",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_throughput_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "dram__bytes_read.sum": "dram_bytes_read",
    "dram__bytes_write.sum": "dram_bytes_write",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__shared_mem_per_block_static": "shared_mem_static_bytes",
    "launch__shared_mem_per_block_dynamic": "shared_mem_dynamic_bytes",
    "launch__grid_size": "grid_size",
    "launch__block_size": "block_size",
    "launch__occupancy_limit_registers": "occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem": "occupancy_limit_shared_mem",
    "launch__waves_per_multiprocessor": "waves_per_sm",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": "spill_load_bytes",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": "spill_store_bytes",
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
    "smsp__inst_executed.sum": "instructions",
    "sm__inst_executed_pipe_tensor.sum": "tensor_instructions",
}

STALL_REASONS = (
    "long_scoreboard",
    "short_scoreboard",
    "barrier",
    "lg_throttle",
    "math_pipe_throttle",
    "mio_throttle",
    "wait",
    "not_selected",
    "no_instruction",
)
# ncu metric -> stall reason: warps stalled for that reason per issued instruction.
STALLS: dict[str, str] = {
    f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio": r for r in STALL_REASONS
}

METRICS: tuple[str, ...] = (*FIELDS, *STALLS)

# Fields whose value depends on the unit ncu prints, and the factor from each unit to the base.
_TIME_UNITS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
               "s": 1e9, "second": 1e9}  # fmt: skip
_BYTE_UNITS = {"byte": 1.0, "b": 1.0, "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6, "gbyte": 1e9,
               "gb": 1e9, "tbyte": 1e12, "kibyte": 2.0**10, "mibyte": 2.0**20, "gibyte": 2.0**30}  # fmt: skip
_UNIT_TABLES = {
    "time_ns": _TIME_UNITS,
    "dram_bytes_read": _BYTE_UNITS,
    "dram_bytes_write": _BYTE_UNITS,
    "shared_mem_static_bytes": _BYTE_UNITS,
    "shared_mem_dynamic_bytes": _BYTE_UNITS,
    "spill_load_bytes": _BYTE_UNITS,
    "spill_store_bytes": _BYTE_UNITS,
}

# Kernels PyTorch launches around a candidate: random init, fills, copies. Substrings of ncu's
# demangled names.
_HELPER_PATTERNS = (
    "distribution_elementwise",
    "distribution_nullary",
    "FillFunctor",
    "fill_kernel",
    "direct_copy_kernel",
    "copy_kernel",
)

_CUDA_NCU = Path("/usr/local/cuda/bin/ncu")
_DIM3 = re.compile(r"\s*\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)\s*")


class NcuError(KernelevolveError):
    """ncu produced no metrics: its output had no CSV header row."""


@dataclass
class KernelMetrics:
    """One kernel launch. Every metric is None where ncu did not report it."""

    id: int
    name: str
    block: tuple[int, int, int] | None = None
    grid: tuple[int, int, int] | None = None
    time_ns: float | None = None
    sm_throughput_pct: float | None = None
    memory_throughput_pct: float | None = None
    dram_throughput_pct: float | None = None
    dram_bytes_read: float | None = None
    dram_bytes_write: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    registers_per_thread: float | None = None
    shared_mem_static_bytes: float | None = None
    shared_mem_dynamic_bytes: float | None = None
    grid_size: float | None = None
    block_size: float | None = None
    occupancy_limit_registers: float | None = None
    occupancy_limit_shared_mem: float | None = None
    waves_per_sm: float | None = None
    spill_load_bytes: float | None = None
    spill_store_bytes: float | None = None
    l2_hit_rate_pct: float | None = None
    instructions: float | None = None
    tensor_instructions: float | None = None
    stalls: dict[str, float] = field(default_factory=dict)

    @property
    def spill_bytes(self) -> float | None:
        """Local-memory bytes loaded plus stored; None when ncu reported neither."""
        if self.spill_load_bytes is None and self.spill_store_bytes is None:
            return None
        return (self.spill_load_bytes or 0.0) + (self.spill_store_bytes or 0.0)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["block"] = None if self.block is None else list(self.block)
        d["grid"] = None if self.grid is None else list(self.grid)
        return d


def command(target_argv: list[str], nvtx_range: str = NVTX_RANGE, ncu: str = "ncu") -> list[str]:
    """The ncu command line that profiles `target_argv`'s kernels inside the push/pop range."""
    return [ncu, "--csv", "--page", "raw", "--metrics", ",".join(METRICS),
            "--nvtx", "--nvtx-include", f"{nvtx_range}/", *target_argv]  # fmt: skip


def find_ncu() -> str | None:
    """The ncu executable on PATH, else CUDA's default install, else None."""
    found = shutil.which("ncu")
    if found:
        return found
    if _CUDA_NCU.is_file() and os.access(_CUDA_NCU, os.X_OK):
        return str(_CUDA_NCU)
    return None


def parse_number(cell: str | None) -> float | None:
    """ncu's number cell ("19,808", "839,052.80", "3.88") as a float; None for "n/a", "" or text."""
    if cell is None:
        return None
    s = cell.strip().replace(",", "")
    if not s:
        return None
    try:
        return float(s)
    except ValueError:
        return None


def parse_dim3(cell: str | None) -> tuple[int, int, int] | None:
    """ncu's "(256, 1, 1)" as (256, 1, 1); None when the cell is not three integers."""
    m = _DIM3.fullmatch(cell or "")
    return None if m is None else (int(m[1]), int(m[2]), int(m[3]))


def parse_csv(text: str) -> list[KernelMetrics]:
    """The kernel launches in ncu's `--csv --page raw` stdout; raises NcuError when there are none
    to be found because ncu printed no CSV header."""
    lines = text.splitlines()
    start = _header_line(lines)
    if start is None:
        raise NcuError(_no_header_message(lines), hint=_NO_HEADER_HINT)
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = [h.strip() for h in rows[0]]
    col = {name: i for i, name in enumerate(header)}
    units: dict[str, str] = {}
    kernels = []
    for row in rows[1:]:
        if not row or not row[0].strip():  # the units row (first cell empty), or a blank line
            if row and not units:
                units = {h: (row[i].strip() if i < len(row) else "") for h, i in col.items()}
            continue
        if row[0].startswith("==") or len(row) < len(header):  # ncu's trailing messages
            continue
        try:
            kid = int(row[0].replace(",", ""))
        except ValueError:
            continue
        kernels.append(_kernel(kid, row, col, units))
    return kernels


def _kernel(kid: int, row: list[str], col: dict[str, int], units: dict[str, str]) -> KernelMetrics:
    def cell(name: str) -> str | None:
        i = col.get(name)
        return row[i] if i is not None and i < len(row) else None

    values: dict[str, Any] = {}
    for metric, name in FIELDS.items():
        values[name] = _scaled(name, parse_number(cell(metric)), units.get(metric, ""))
    stalls = {}
    for metric, reason in STALLS.items():
        v = parse_number(cell(metric))
        if v is not None:
            stalls[reason] = v
    return KernelMetrics(id=kid, name=(cell("Kernel Name") or "").strip(), block=parse_dim3(cell("Block Size")),
                         grid=parse_dim3(cell("Grid Size")), stalls=stalls, **values)  # fmt: skip


def _scaled(name: str, value: float | None, unit: str) -> float | None:
    table = _UNIT_TABLES.get(name)
    if value is None or table is None or not unit:
        return value
    factor = table.get(unit.split("/")[0].strip().lower())  # "byte/block" is bytes per block
    return None if factor is None else value * factor


def _header_line(lines: list[str]) -> int | None:
    """The header row: ncu quotes every cell, and a units row follows it. A quoted "ID" line the
    program printed itself is passed over when a line with a units row after it exists."""
    found = [i for i, line in enumerate(lines) if line.startswith('"ID",')]
    for i in found:
        if i + 1 < len(lines) and lines[i + 1].startswith('"",'):
            return i
    return found[-1] if found else None


_NO_HEADER_HINT = (
    "run the ncu command by hand; ERR_NVGPUCTRPERM means the GPU counters need admin rights "
    "(root, or the driver option NVreg_RestrictProfilingToAdminUsers=0), and 'No kernels were "
    "profiled' means no kernel ran inside the NVTX range"
)


def _no_header_message(lines: list[str], tail: int = 12) -> str:
    errors = [ln for ln in lines if ln.startswith("==ERROR==") or ln.startswith("==WARNING==")][:10]
    last = [ln for ln in lines if ln.strip()][-tail:]
    shown = errors + [ln for ln in last if ln not in errors]
    body = "\n".join("  " + ln[:400] for ln in shown) if shown else "  (no output)"
    return (
        f'ncu printed no CSV (expected a header row starting with "ID"); its errors and last lines:\n{body}'
    )


def is_helper(name: str) -> bool:
    """True for a kernel PyTorch launches around a candidate (random init, fill, copy).

    A fallback for output gathered without the NVTX range; the range is the primary filter, since a
    candidate's own work may be a copy or a fill."""
    return any(p in name for p in _HELPER_PATTERNS)


def summarize(kernels: list[KernelMetrics]) -> dict[str, Any]:
    """A JSON-able digest of the launches. Keys:

    launches, kernel_names (distinct, first seen first), total_time_ns (None if no launch has a
    time); the percentage fields (sm_throughput_pct, memory_throughput_pct, dram_throughput_pct,
    achieved_occupancy_pct, theoretical_occupancy_pct, l2_hit_rate_pct) averaged weighted by each
    launch's time (equal weights when any time is missing), None where no launch reports it;
    max_registers_per_thread, max_spill_bytes (local loads + stores of the worst launch);
    top_stalls: up to 3 {"reason", "ratio"} by time-weighted warps stalled per issued instruction,
    zero ratios left out; heaviest_kernel and heaviest_share: the kernel name with the most total
    time over its launches, and that time's fraction of the total.
    """
    times = [k.time_ns for k in kernels]
    timed = all(t is not None for t in times) and sum(t or 0.0 for t in times) > 0
    weights = [t or 0.0 for t in times] if timed else [1.0] * len(kernels)
    total = sum(t for t in times if t is not None) if any(t is not None for t in times) else None
    out: dict[str, Any] = {
        "launches": len(kernels),
        "kernel_names": list(dict.fromkeys(k.name for k in kernels)),
        "total_time_ns": total,
    }
    for name in FIELDS.values():
        if name.endswith("_pct"):
            out[name] = _weighted([getattr(k, name) for k in kernels], weights)
    out["max_registers_per_thread"] = _max([k.registers_per_thread for k in kernels])
    out["max_spill_bytes"] = _max([k.spill_bytes for k in kernels])
    stalls = {r: _weighted([k.stalls.get(r) for k in kernels], weights) for r in STALL_REASONS}
    ranked = sorted(((r, v) for r, v in stalls.items() if v), key=lambda rv: -rv[1])[:3]
    out["top_stalls"] = [{"reason": r, "ratio": round(v, 4)} for r, v in ranked]
    per_name: dict[str, float] = {}
    for k in kernels:
        per_name[k.name] = per_name.get(k.name, 0.0) + (k.time_ns or 0.0)
    heaviest = max(per_name, key=lambda n: per_name[n]) if per_name else None
    out["heaviest_kernel"] = heaviest
    out["heaviest_share"] = per_name[heaviest] / total if heaviest is not None and total else None
    return out


def _weighted(values: list[float | None], weights: list[float]) -> float | None:
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None]
    wsum = sum(w for _, w in pairs)
    if not pairs or wsum <= 0:
        return None
    return sum(v * w for v, w in pairs) / wsum


def _max(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


__all__ = [
    "FIELDS",
    "METRICS",
    "NVTX_RANGE",
    "STALLS",
    "STALL_REASONS",
    "KernelMetrics",
    "NcuError",
    "command",
    "find_ncu",
    "is_helper",
    "parse_csv",
    "parse_dim3",
    "parse_number",
    "summarize",
]
