"""The profiler parsers against recorded H100 output (ncu 2025.3.1, torch.profiler) and synthetic
edge cases: units row, thousands separators, metrics an ncu version lacks, ncu failing."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

from kernelevolve.errors import KernelevolveError
from kernelevolve.profile import ncu
from kernelevolve.profile.torchprof import (
    ProfilerSummary,
    busy_us,
    device_kind,
    profile_calls,
    summarize_events,
)

FIXTURES = Path(__file__).parent / "fixtures"
NVTX_CSV = (FIXTURES / "ncu" / "h100_softmax_nvtx.csv").read_text()
ALL_CSV = (FIXTURES / "ncu" / "h100_softmax_all.csv").read_text()
ADD = "void at::vectorized_elementwise_kernel<4, at::CUDAFunctorOnSelf_add<float>, std::array<char *, 2>>(int, T2, T3)"


def _rewrite(text: str, drop: set[str] = frozenset(), prefix: str = "", suffix: str = "") -> str:  # type: ignore[assignment]
    """The recorded CSV with the columns in `drop` removed, program output around it kept."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    rows = list(csv.reader(lines[start:]))
    keep = [i for i, h in enumerate(rows[0]) if h not in drop]
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for r in rows:
        w.writerow([r[i] for i in keep])
    return prefix + "\n".join(lines[:start]) + "\n" + buf.getvalue() + suffix


# ---- ncu: metric set and command ------------------------------------------------------------------


def test_metric_set_maps_every_metric_to_a_kernelmetrics_field():
    names = {f.name for f in dataclasses.fields(ncu.KernelMetrics)}
    assert len(ncu.METRICS) == len(set(ncu.METRICS)) == 21 + 9
    assert set(ncu.FIELDS.values()) <= names
    assert set(ncu.STALLS.values()) == set(ncu.STALL_REASONS)
    assert ncu.FIELDS["gpu__time_duration.sum"] == "time_ns"
    assert ncu.FIELDS["sm__maximum_warps_per_active_cycle_pct"] == "theoretical_occupancy_pct"
    assert "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio" in ncu.METRICS


def test_command_profiles_the_nvtx_push_pop_range_only():
    cmd = ncu.command(["python", "-m", "kernelevolve.profile.target", "spec.py"], ncu="/opt/ncu")
    assert cmd[0] == "/opt/ncu"
    assert cmd[-4:] == ["python", "-m", "kernelevolve.profile.target", "spec.py"]
    assert cmd[cmd.index("--nvtx-include") + 1] == "kernelevolve.candidate/"
    assert "--nvtx" in cmd and cmd[cmd.index("--page") + 1] == "raw" and "--csv" in cmd
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(ncu.METRICS)
    assert ncu.command(["x"], nvtx_range="mine")[ncu.command(["x"]).index("--nvtx-include") + 1] == "mine/"


def test_find_ncu(monkeypatch, tmp_path):
    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/somewhere/ncu" if name == "ncu" else None)
    assert ncu.find_ncu() == "/somewhere/ncu"
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    monkeypatch.setattr(ncu, "_CUDA_NCU", tmp_path / "missing" / "ncu")
    assert ncu.find_ncu() is None
    exe = tmp_path / "ncu"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(ncu, "_CUDA_NCU", exe)
    assert ncu.find_ncu() == str(exe)


# ---- ncu: parsing the recorded output -------------------------------------------------------------


def test_parse_nvtx_filtered_h100_output():
    ks = ncu.parse_csv(NVTX_CSV)
    assert [k.id for k in ks] == [0, 1, 2, 3]  # the units row is not a kernel
    assert [k.name for k in ks] == ["k", ADD, "k", ADD]
    k = ks[0]
    assert k.time_ns == 19808  # "19,808"
    assert k.registers_per_thread == 24
    assert k.grid == (4096, 1, 1) and k.block == (256, 1, 1)
    assert k.grid_size == 4096 and k.block_size == 256  # "4,096"
    assert k.dram_bytes_read == 33_562_112  # "33,562,112"
    assert k.dram_bytes_write == 12_875_008
    assert k.dram_throughput_pct == pytest.approx(70.03)
    assert k.memory_throughput_pct == pytest.approx(70.03)
    assert k.sm_throughput_pct == pytest.approx(35.34)
    assert k.achieved_occupancy_pct == pytest.approx(85.69)
    assert k.theoretical_occupancy_pct == 100
    assert k.occupancy_limit_registers == 10 and k.occupancy_limit_shared_mem == 28
    assert k.shared_mem_dynamic_bytes == 32 and k.shared_mem_static_bytes == 0  # unit "byte/block"
    assert k.waves_per_sm == pytest.approx(3.88)
    assert k.spill_load_bytes == 0 and k.spill_store_bytes == 0 and k.spill_bytes == 0
    assert k.l2_hit_rate_pct == pytest.approx(52.25)
    assert k.instructions == 5_832_704 and k.tensor_instructions == 0
    assert set(k.stalls) == set(ncu.STALL_REASONS)
    assert k.stalls["long_scoreboard"] == pytest.approx(18.63)
    assert k.stalls["barrier"] == pytest.approx(3.53)
    assert ks[1].block == (128, 1, 1) and ks[1].grid == (8192, 1, 1) and ks[1].registers_per_thread == 32
    assert ks[1].stalls["long_scoreboard"] == pytest.approx(133.23)
    d = k.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["grid"] == [4096, 1, 1] and d["stalls"]["wait"] == pytest.approx(1.53)


def test_parse_unfiltered_output_and_helper_filter():
    ks = ncu.parse_csv(ALL_CSV)
    assert len(ks) == 7
    assert "distribution_elementwise_grid_stride_kernel" in ks[0].name
    assert ks[0].time_ns == 28768 and ks[0].registers_per_thread == 44 and ks[0].grid == (1056, 1, 1)
    assert ks[0].theoretical_occupancy_pct == pytest.approx(62.5)
    assert [ncu.is_helper(k.name) for k in ks] == [True] + [False] * 6
    own = [k for k in ks if not ncu.is_helper(k.name)]
    assert [k.name for k in own].count("k") == 3
    assert any("MulFunctor" in k.name for k in own)


@pytest.mark.parametrize(
    ("name", "helper"),
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>", True),
        ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(...)", True),
        ("void at::<unnamed>::distribution_nullary_kernel<float, float, float4, ...>", True),
        ("k", False),
        ("triton_poi_fused_add_0", False),
        (ADD, False),
    ],
)
def test_is_helper(name, helper):
    assert ncu.is_helper(name) is helper


def test_program_output_before_and_ncu_lines_after_the_csv_are_ignored():
    text = _rewrite(
        NVTX_CSV,
        prefix='step 1, loss 0.5\nID,a,b\n"ID","printed by the program"\n',  # not the header
        suffix="==WARNING== some message after the table\n",
    )
    ks = ncu.parse_csv(text)
    assert [k.id for k in ks] == [0, 1, 2, 3] and ks[0].time_ns == 19808


def test_metrics_missing_from_an_older_ncu_are_none():
    dropped = {
        "sm__maximum_warps_per_active_cycle_pct",
        "lts__t_sector_hit_rate.pct",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
        "Block Size",
    }
    ks = ncu.parse_csv(_rewrite(NVTX_CSV, drop=dropped))
    assert len(ks) == 4
    k = ks[0]
    assert k.theoretical_occupancy_pct is None and k.l2_hit_rate_pct is None and k.block is None
    assert "wait" not in k.stalls and k.stalls["long_scoreboard"] == pytest.approx(18.63)
    assert k.time_ns == 19808 and k.grid == (4096, 1, 1)  # the rest is intact
    assert ncu.summarize(ks)["theoretical_occupancy_pct"] is None


def test_minimal_csv_with_na_cells_scaled_units_and_separators():
    text = (
        "==PROF== Connected to process 9 (/usr/bin/python3)\n"
        '"ID","Kernel Name","Block Size","Grid Size","gpu__time_duration.sum","dram__bytes_read.sum",'
        '"launch__registers_per_thread","sm__throughput.avg.pct_of_peak_sustained_elapsed"\n'
        '"","","","","usecond","Mbyte","register/thread","%"\n'
        '"0","k","(1024, 1, 1)","(12, 3, 1)","19.81","33.56","n/a","1,234.5"\n'
        '"1","k","","(1, 1, 1)","2,000","","","n/a"\n'
    )
    a, b = ncu.parse_csv(text)
    assert a.time_ns == pytest.approx(19_810) and a.dram_bytes_read == pytest.approx(33_560_000)
    assert a.registers_per_thread is None and a.sm_throughput_pct == pytest.approx(1234.5)
    assert a.block == (1024, 1, 1) and a.grid == (12, 3, 1)
    assert b.time_ns == pytest.approx(2_000_000) and b.dram_bytes_read is None and b.block is None
    assert a.stalls == {} and a.l2_hit_rate_pct is None and a.spill_bytes is None


def test_unknown_unit_gives_none_not_a_wrong_value():
    text = '"ID","Kernel Name","gpu__time_duration.sum"\n"","","fortnight"\n"0","k","3"\n'
    assert ncu.parse_csv(text)[0].time_ns is None


def test_without_a_units_row_the_last_id_line_is_the_header():
    ks = ncu.parse_csv('"ID","printed by the program"\n"ID","Kernel Name"\n"0","k"\n')
    assert [(k.id, k.name) for k in ks] == [(0, "k")]


def test_header_without_kernels_is_an_empty_list():
    assert ncu.parse_csv('"ID","Kernel Name"\n"",""\n') == []


def test_parse_number_and_dim3():
    assert ncu.parse_number("1,980,000") == 1_980_000
    assert ncu.parse_number("839,052.80") == pytest.approx(839_052.8)
    assert [ncu.parse_number(s) for s in ("n/a", "", "  ", "PolicySpread", None)] == [None] * 5
    assert ncu.parse_dim3("(256, 1, 1)") == (256, 1, 1)
    assert [ncu.parse_dim3(s) for s in ("", "n/a", "(1, 2)", None)] == [None] * 4


def test_no_csv_raises_a_project_error_carrying_ncus_own_lines():
    text = (
        "==PROF== Connected to process 584 (/usr/bin/python3.12)\n"
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
        "Performance Counters on the target device 0.\n"
        + "".join(f"program line {i}\n" for i in range(40))
        + "==PROF== Disconnected from process 584\n"
    )
    with pytest.raises(ncu.NcuError) as info:
        ncu.parse_csv(text)
    msg = str(info.value)
    assert isinstance(info.value, KernelevolveError)
    assert '"ID"' in msg and "ERR_NVGPUCTRPERM" in msg  # the error line, though not among the last
    assert "Disconnected from process 584" in msg and "program line 39" in msg
    assert "program line 5\n" not in msg  # only the tail
    with pytest.raises(ncu.NcuError, match="No kernels were profiled"):
        ncu.parse_csv("==PROF== Connected\n==WARNING== No kernels were profiled.\n")
    with pytest.raises(ncu.NcuError, match="no output"):
        ncu.parse_csv("")


# ---- ncu: summary ---------------------------------------------------------------------------------


def test_summarize_recorded_nvtx_output():
    ks = ncu.parse_csv(NVTX_CSV)
    s = ncu.summarize(ks)
    assert json.loads(json.dumps(s)) == s
    assert s["launches"] == 4
    assert s["kernel_names"] == ["k", ADD]
    assert s["total_time_ns"] == 19808 + 19904 + 20032 + 20032
    t = [19808, 19904, 20032, 20032]
    dram = [70.03, 70.52, 69.30, 70.18]
    assert s["dram_throughput_pct"] == pytest.approx(sum(a * b for a, b in zip(t, dram, strict=True)) / 79776)
    assert s["theoretical_occupancy_pct"] == pytest.approx(100)
    assert s["max_registers_per_thread"] == 32
    assert s["max_spill_bytes"] == 0
    assert [st["reason"] for st in s["top_stalls"]] == ["long_scoreboard", "short_scoreboard", "mio_throttle"]
    lsb = [18.63, 133.23, 18.51, 130.64]
    assert s["top_stalls"][0]["ratio"] == pytest.approx(
        sum(a * b for a, b in zip(t, lsb, strict=True)) / sum(t), abs=1e-3
    )
    # the add kernel's two launches (19904 + 20032 ns) outweigh k's (19808 + 20032 ns)
    assert s["heaviest_kernel"] == ADD
    assert s["heaviest_share"] == pytest.approx((19904 + 20032) / 79776)


def test_summarize_unfiltered_output_with_and_without_the_helper_filter():
    ks = ncu.parse_csv(ALL_CSV)
    everything = ncu.summarize(ks)
    own = ncu.summarize([k for k in ks if not ncu.is_helper(k.name)])
    assert everything["launches"] == 7 and own["launches"] == 6
    assert everything["max_registers_per_thread"] == 44 and own["max_registers_per_thread"] == 32
    assert everything["total_time_ns"] - own["total_time_ns"] == 28768
    assert own["heaviest_kernel"] == "k"
    assert own["heaviest_share"] == pytest.approx((20192 + 20000 + 19808) / own["total_time_ns"])


def test_summarize_spills_and_edge_cases():
    spilling = ncu.KernelMetrics(0, "k", time_ns=100.0, spill_load_bytes=512.0, spill_store_bytes=256.0,
                                 stalls={"long_scoreboard": 0.0, "wait": 2.0})  # fmt: skip
    quiet = ncu.KernelMetrics(1, "j", time_ns=300.0, spill_load_bytes=0.0, stalls={"wait": 4.0})
    s = ncu.summarize([spilling, quiet])
    assert s["max_spill_bytes"] == 768
    assert s["top_stalls"] == [{"reason": "wait", "ratio": 3.5}]  # zero ratios left out
    assert s["heaviest_kernel"] == "j" and s["heaviest_share"] == pytest.approx(0.75)
    untimed = ncu.summarize([ncu.KernelMetrics(0, "a", sm_throughput_pct=10.0),
                             ncu.KernelMetrics(1, "a", sm_throughput_pct=30.0)])  # fmt: skip
    assert untimed["sm_throughput_pct"] == pytest.approx(20) and untimed["total_time_ns"] is None
    assert untimed["heaviest_share"] is None
    empty = ncu.summarize([])
    assert empty["launches"] == 0 and empty["heaviest_kernel"] is None and empty["top_stalls"] == []
    assert empty["sm_throughput_pct"] is None and empty["max_registers_per_thread"] is None


# ---- torch.profiler -------------------------------------------------------------------------------


def _recorded_events() -> list[dict]:
    raw = json.loads((FIXTURES / "torch_profiler_h100_softmax.json").read_text())
    return [
        {"name": e["name"], "device_type": device_kind(e["device_type"]), "self_device_us": e["self_dev_us"],
         "cpu_us": e["cpu_us"], "start_us": e["time_range"][0], "end_us": e["time_range"][1]}
        for e in raw
    ]  # fmt: skip


def _ev(name: str, kind: str, dev: float = 0.0, cpu: float = 0.0, span: tuple[float, float] | None = None,
        self_cpu: float | None = None) -> dict:  # fmt: skip
    e: dict = {"name": name, "device_type": kind, "self_device_us": dev, "cpu_us": cpu}
    if span is not None:
        e["start_us"], e["end_us"] = span
    if self_cpu is not None:
        e["self_cpu_us"] = self_cpu
    return e


def test_device_kind():
    assert device_kind("DeviceType.CUDA") == "cuda" and device_kind("cpu") == "cpu"
    import torch

    assert device_kind(torch.autograd.DeviceType.CUDA) == "cuda"
    assert device_kind(torch.autograd.DeviceType.CPU) == "cpu"


def test_summarize_recorded_h100_events():
    events = _recorded_events()
    s = summarize_events(events, iters=3, wall_s=3 * 100e-6)
    assert s.kernels_per_call == 2  # softmax, then * 2
    softmax = [28.064, 28.832, 27.808]
    mul = [22.176, 21.377, 21.536]
    device = sum(softmax) + sum(mul)
    assert s.device_us_per_call == pytest.approx(device / 3, abs=1e-3)
    assert s.device_busy_us_per_call == pytest.approx(device / 3, abs=1e-3)  # no overlap
    assert s.wall_us_per_call == pytest.approx(100)
    assert s.launch_overhead_us_per_call == pytest.approx(100 - device / 3, abs=1e-3)
    assert [k.calls for k in s.kernels] == [3, 3]
    assert "softmax_warp_forward" in s.kernels[0].name and "MulFunctor" in s.kernels[1].name
    assert s.kernels[0].total_us == pytest.approx(sum(softmax), abs=1e-3)
    assert s.kernels[0].share == pytest.approx(sum(softmax) / device, abs=1e-4)
    assert sum(k.share for k in s.kernels) == pytest.approx(1)
    assert s.cpu_ops == []  # device kernels present
    d = s.to_dict()
    assert json.loads(json.dumps(d)) == d and d["kernels"][0]["calls"] == 3


def test_summarize_accepts_torch_style_device_type_strings():
    raw = json.loads((FIXTURES / "torch_profiler_h100_softmax.json").read_text())
    events = [{"name": e["name"], "device_type": e["device_type"], "self_device_us": e["self_dev_us"],
               "cpu_us": e["cpu_us"]} for e in raw]  # fmt: skip
    s = summarize_events(events, iters=3, wall_s=1e-3)
    assert s.kernels_per_call == 2
    assert s.device_busy_us_per_call == pytest.approx(s.device_us_per_call)  # no intervals: the sum


def test_launch_bound_synthetic_events():
    events = []
    for it in range(4):
        t0 = it * 200.0
        events.append(_ev("aten::add", "cpu", cpu=150.0, span=(t0, t0 + 150.0)))
        for j in range(10):  # ten 2-us kernels, 15 us apart: the device idles between launches
            start = t0 + 10.0 + 15.0 * j
            events.append(_ev(f"tiny_{j % 2}", "cuda", dev=2.0, span=(start, start + 2.0)))
    s = summarize_events(events, iters=4, wall_s=4 * 200e-6)
    assert s.kernels_per_call == 10
    assert s.device_us_per_call == pytest.approx(20)
    assert s.launch_overhead_us_per_call == pytest.approx(180)
    assert s.launch_overhead_us_per_call > 5 * s.device_us_per_call
    assert {k.name: k.calls for k in s.kernels} == {"tiny_0": 20, "tiny_1": 20}
    assert s.cpu_ops == []


def test_overlapping_kernels_count_once_and_overhead_is_floored():
    events = [_ev("a", "cuda", dev=10.0, span=(0.0, 10.0)), _ev("b", "cuda", dev=10.0, span=(5.0, 15.0))]
    s = summarize_events(events, iters=1, wall_s=18e-6)
    assert s.device_us_per_call == 20 and s.device_busy_us_per_call == 15
    assert s.launch_overhead_us_per_call == pytest.approx(3)  # wall - busy, not wall - summed time
    noisy = summarize_events(events, iters=1, wall_s=12e-6)
    assert noisy.launch_overhead_us_per_call == 0  # wall below busy (timing noise): floored
    assert busy_us([(0, 1), (2, 3), (2.5, 4), (10, 11)]) == pytest.approx(4)
    assert busy_us([]) == 0


def test_cpu_only_events_list_aten_ops():
    events = [
        _ev("aten::softmax", "cpu", cpu=30.0, self_cpu=2.0),
        _ev("aten::_softmax", "cpu", cpu=28.0, self_cpu=28.0),
        _ev("aten::mul", "cpu", cpu=10.0, self_cpu=10.0),
        _ev("aten::mul", "cpu", cpu=12.0, self_cpu=12.0),
        _ev("cudaLaunchKernel", "cpu", cpu=99.0),
    ]
    s = summarize_events(events, iters=2, wall_s=100e-6)
    assert s.kernels_per_call == 0 and s.kernels == [] and s.launch_overhead_us_per_call is None
    assert [(o.name, o.calls, o.cpu_us) for o in s.cpu_ops] == [
        ("aten::softmax", 1, 30.0), ("aten::_softmax", 1, 28.0), ("aten::mul", 2, 22.0)
    ]  # fmt: skip
    assert s.cpu_ops[2].self_cpu_us == 22.0
    with pytest.raises(ValueError, match="iters"):
        summarize_events(events, iters=0, wall_s=1.0)


def test_profile_calls_on_the_cpu():
    import torch

    x = torch.randn(64, 256)
    calls = []

    def fn():
        calls.append(1)
        return torch.softmax(x, dim=-1) * 2

    seen_when_recorded: list[int] = []
    s = profile_calls(fn, iters=3, device="cpu", recorded=lambda: seen_when_recorded.append(len(calls)))
    assert isinstance(s, ProfilerSummary)
    assert len(calls) == 1 + 3 + 3  # warm-up, timed loop, profiled loop
    assert seen_when_recorded == [7]  # once, after the profiled loop, before the summary
    assert s.iters == 3 and s.kernels_per_call == 0 and s.kernels == []
    assert s.launch_overhead_us_per_call is None
    assert s.wall_us_per_call > 0
    ops = {o.name: o for o in s.cpu_ops}
    assert ops["aten::softmax"].calls == 3 and ops["aten::mul"].calls == 3
    assert ops["aten::softmax"].cpu_us > 0
    assert ops["aten::softmax"].self_cpu_us is not None
    assert ops["aten::softmax"].cpu_us >= ops["aten::softmax"].self_cpu_us
    assert all(o.name.startswith("aten::") for o in s.cpu_ops)
    assert json.loads(json.dumps(s.to_dict())) == s.to_dict()


# ---- the profiled process and the device's lease ----------------------------------------------------

# A candidate that notes, at each call, whether the device's lease is held (by another open of its
# file: flock locks belong to an open file, so this process's own lease blocks it too).
LEASE_PROBE = """
import fcntl, os
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        fd = os.open(os.environ["PROBE_LEASE_FILE"], os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            held = False
        except BlockingIOError:
            held = True
        finally:
            os.close(fd)
        with open(os.environ["PROBE_OUT"], "a") as f:
            f.write("held\\n" if held else "free\\n")
        return torch.softmax(x, dim=-1)
"""


@pytest.mark.parametrize("mode", ["torch", "ncu"])
def test_a_profiled_process_gives_the_lease_back_once_its_calls_are_done(tmp_path, monkeypatch, mode):
    """The lease covers the measured calls and nothing after them: torch.profiler's trace turned into
    events and summarized, the result written and the process's end run without it (they held it
    2.7 s of a profile's 5.6 s on an H200, where the calls took a fraction of that). Mode ncu on the
    CPU makes the one call in the range that ncu, outside, would watch."""
    import fcntl
    import os

    from kernelevolve.evaluate.lease import DeviceLease
    from kernelevolve.profile import target

    leases = tmp_path / "leases"
    monkeypatch.setenv("KERNELEVOLVE_LEASE_DIR", str(leases))
    probe_out = tmp_path / "probe.txt"
    monkeypatch.setenv("PROBE_OUT", str(probe_out))
    lock_file = DeviceLease("dev-test").path  # created on first acquire
    lock_file.touch()
    monkeypatch.setenv("PROBE_LEASE_FILE", str(lock_file))
    cand = tmp_path / "candidate.py"
    cand.write_text(LEASE_PROBE)
    result = tmp_path / "result.json"
    spec = Path(__file__).parent / "specs" / "softmax.py"
    if mode == "ncu":  # without ncu outside: the range's markers are CUDA's; on the CPU, no-ops
        import torch

        monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: None)
        monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: None)
    code = target.main([str(spec), str(cand), "--shape", "narrow", "--device", "cpu", "--mode", mode,
                        "--iters", "2", "--out", str(result), "--lease", "dev-test"])  # fmt: skip
    out = json.loads(result.read_text())
    assert code == 0 and out["ok"], out
    seen = probe_out.read_text().split()
    # every call under the lease (on the CPU the first, compiling one too): then the range's one call,
    # or profile_calls' warm-up, timed and recorded calls
    assert seen == ["held"] * (1 + (1 if mode == "ncu" else 1 + 2 + 2)), seen
    assert 0 < out["device_s"] < 60
    fd = os.open(lock_file, os.O_RDWR)
    try:  # given back before main returned, not left to the process's end
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
