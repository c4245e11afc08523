"""The GEMM template's dots and b layouts at KernelBench's official sizes, timed against the
reference's own eager call (cuBLAS, strict fp32: no TF32) on one GPU.

    python benchmarks/gemm_layout_gpu.py KERNELBENCH/level1/1_*.py KERNELBENCH/level1/2_*.py ...
        [--rounds 15] [--flip B_KMAJOR] [--flip PAD_K] [--precision tf32 [--round-tf32]] [--out FILE.json]

Not the harness's verdict (no sandbox, no second input distribution, no torch.compile baseline): a
minutes-long look at what one knob does before a bench spends candidates on it. For each problem
whose reference the tuner recognizes as one GEMM: the triton-gemm template's default configuration
(the ieee dot), its 3xTF32 drafts, and each of those with the other `B_KMAJOR` where the knob exists
(b given as [K, N] copied K-contiguous before the launch, or not), and with `--flip PAD_K` the other
`PAD_K` too (a K that is not a multiple of the K slice padded with zeros, or masked). Each variant is compiled, run once
on the problem's inputs and judged with the harness's `compare` at the strict fp32 tolerance, then
timed in `--rounds` rounds interleaved with the reference (one call each per round, CUDA events, the
L2 cache flushed before each call); the median ratio reference / variant is its speedup. Prints one
line per variant and a table last; `--out` writes every row as JSON.

`--precision tf32` generates and judges at the TF32 policy (the reference still without TF32: the
error is against fp32); `--round-tf32` adds, for each variant whose dot is TF32, one that rounds both
operands to the nearest TF32 value in registers before the dot and one that rounds a only (Triton's
TF32 dot truncates them; `triton_common.HELPERS["tf32_round"]` is the rounding), with each variant's
relative norm error against the reference: what rounding costs and buys before the template takes it.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def timed(fn: Any, flush: Any) -> float:
    """One call's device time in ms, the L2 cache flushed before it."""
    import torch

    flush.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


FLIPS = {"B_KMAJOR": "b", "PAD_K": "pad"}  # the 0/1 knobs `--flip` may name, and their labels


def variants(gen: Any, flips: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(label, configuration): the default, the drafts, and each of those with every knob in `flips`
    flipped, alone and together (where the template has the knob)."""
    out = [("default", dict(gen.config))] + [(f"draft{i}", dict(d)) for i, d in enumerate(gen.drafts)]
    for knob in flips:
        if knob in gen.tunables:
            out += [
                (f"{label}/{FLIPS[knob]}{1 - int(c[knob])}", {**c, knob: 1 - int(c[knob])})
                for label, c in out
            ]
    return out


ROUNDINGS = {  # label -> the K loop's dot with its operands rounded (`--round-tf32`)
    "rndAB": "acc = tl.dot(_tf32_round(a), _tf32_round(b), acc, input_precision=DOT)",
    "rndA": "acc = tl.dot(_tf32_round(a), b, acc, input_precision=DOT)",
}
DOT_LINE = "acc = tl.dot(a, b, acc, input_precision=DOT)"


def sources(graph: Any, config: dict[str, Any], precision: str, rounding: bool) -> list[tuple[str, str]]:
    """(label suffix, source): the variant as generated and, with `rounding` and a TF32 dot, rounded."""
    from kernelevolve.synth.tuner.triton_codegen import generate
    from kernelevolve.synth.tuner.triton_common import HELPERS

    source = generate(graph, config=config, precision=precision, template="triton-gemm").source
    out = [("", source)]
    if rounding and config.get("DOT") == "tf32" and DOT_LINE in source:
        out += [
            (f"/{k}", source.replace(DOT_LINE, line) + "\n\n" + HELPERS["tf32_round"])
            for k, line in ROUNDINGS.items()
        ]
    return out


def run_problem(
    path: Path,
    rounds: int,
    tmp: Path,
    flips: list[str],
    precision: str = "strict_fp32",
    rounding: bool = False,
) -> list[dict[str, Any]]:
    import torch

    from kernelevolve.evaluate.correctness import compare, tolerance_for
    from kernelevolve.spec import call_get_init_inputs, call_get_inputs, import_spec_module, load_spec
    from kernelevolve.synth.tuner.trace import recognize
    from kernelevolve.synth.tuner.triton_codegen import generate

    spec = load_spec(path)
    graph, why = recognize(spec)
    if graph is None or graph.pattern != "gemm":
        return [{"problem": path.stem, "variant": "-", "status": f"not a recognized gemm: {why[:120]}"}]
    base = generate(graph, template="triton-gemm", precision=precision)
    module = import_spec_module(spec.path)
    shape = spec.shapes[0]
    torch.manual_seed(0)
    init = call_get_init_inputs(spec, module, shape)
    ref = module.Model(*init).cuda()
    torch.manual_seed(0)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in call_get_inputs(spec, module, shape)]
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")  # past an H100/H200's L2
    with torch.no_grad():
        want = ref(*inputs)
    flops = 2.0 * sum(graph.rows.values()) / len(graph.rows) * next(iter(graph.cols.values()))
    flops *= next(iter(graph.inner.values()), 0)
    rows = []
    builds = [(label + suffix, config, source) for label, config in variants(base, flips)
              for suffix, source in sources(graph, config, precision, rounding)]  # fmt: skip
    for label, config, source in builds:
        row: dict[str, Any] = {"problem": path.stem, "variant": label, "config": config}
        try:
            file = tmp / f"{path.stem}_{label.replace('/', '_')}.py"
            file.write_text(source)
            loader = importlib.util.spec_from_file_location(file.stem, file)
            assert loader is not None and loader.loader is not None
            cand = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(cand)
            new = cand.ModelNew(*init).cuda()
            new.load_state_dict(ref.state_dict(), strict=False)
            with torch.no_grad():
                got = new(*inputs)
                torch.cuda.synchronize()
                verdict = compare(got, want, tolerance_for(want.dtype, precision))
                row["status"] = "correct" if verdict.passed else f"incorrect: {verdict.message[:120]}"
                row["rel_norm_err"] = float(f"{verdict.rel_norm_err:.3g}")
                ratios, ms = [], []
                run_ref, run_new = functools.partial(ref, *inputs), functools.partial(new, *inputs)
                for _ in range(2):  # warm both
                    timed(run_ref, flush), timed(run_new, flush)
                for _ in range(rounds):
                    r, c = timed(run_ref, flush), timed(run_new, flush)
                    ratios.append(r / c)
                    ms.append((r, c))
            row["speedup"] = round(statistics.median(ratios), 3)
            row["ref_ms"] = round(statistics.median(r for r, _ in ms), 3)
            row["ms"] = round(statistics.median(c for _, c in ms), 3)
            row["tflops"] = round(flops / (row["ms"] * 1e-3) / 1e12, 1) if flops else None
            del new, got, run_new
        except Exception as exc:  # a variant that fails to build or run is a row, not the end
            row["status"] = (
                f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            )
        torch.cuda.empty_cache()
        print(json.dumps({k: v for k, v in row.items() if k != "config"}), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--flip", action="append", choices=sorted(FLIPS), help="knob to flip (default B_KMAJOR)"
    )
    parser.add_argument("--precision", choices=["strict_fp32", "tf32"], default="strict_fp32")
    parser.add_argument("--round-tf32", action="store_true", help="add TF32 variants with rounded operands")
    args = parser.parse_args()
    flips = args.flip or ["B_KMAJOR"]
    import torch

    from kernelevolve.platforms import get_platform

    # As the harness's workers at strict fp32: no TF32 in the reference's matmuls.
    get_platform("cuda").setup(torch.device("cuda:0"), "strict_fp32")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.problems:
            rows += run_problem(path, args.rounds, Path(tmp), flips, args.precision, args.round_tf32)
    print(
        f"\n{'problem':<42} {'variant':<16} {'DOT':<7} {'B_KMAJOR':>8} {'PAD_K':>5} {'ms':>9} {'ref ms':>9} {'speedup':>8} {'TFLOP/s':>8} {'rel err':>8}  status"
    )
    for r in rows:
        c = r.get("config") or {}
        print(
            f"{r['problem'][:42]:<42} {r['variant']:<16} {c.get('DOT', '')!s:<7} {c.get('B_KMAJOR', '-')!s:>8} "
            f"{c.get('PAD_K', '-')!s:>5} "
            f"{r.get('ms', ''):>9} {r.get('ref_ms', ''):>9} {r.get('speedup', ''):>8} {r.get('tflops', '')!s:>8} "
            f"{r.get('rel_norm_err', '')!s:>8}  {r['status'][:60]}"
        )
    if args.out:
        doc = {
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
            "seconds": round(time.perf_counter() - t0, 1),
            "rows": rows,
        }
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
