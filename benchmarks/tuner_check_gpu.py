"""A quick check of the offline tuner's templates on KernelBench at official sizes: is each recognized
problem's default candidate correct on this GPU?

    python benchmarks/tuner_check_gpu.py KERNELBENCH/level1 KERNELBENCH/level2 [--procs 4]
        [--deadline-s 300] [--out FILE.json]

Not the harness's verdict and not a timing: no sandbox, no second input distribution, no timing. For
each problem file: `recognize` its reference; if recognized, generate the default Triton candidate
(`triton_codegen.generate`), build the reference `Model` and the candidate's `ModelNew` from the same
init inputs, copy the reference's weights by name (as the harness does), run both once on the
problem's own inputs (seed 0) and judge the candidate's output with the harness's `compare` at the
strict fp32 tolerance, with the device set up as the harness's workers set it (no TF32 anywhere). The harness's KernelBench record (`kernelevolve bench`) is what counts; this
tells in minutes which templates hold at official sizes, before spending a bench on them.

Problems are split over `--procs` worker processes sharing the GPU; a worker that dies (a CUDA fault
poisons its context) is replaced and goes on after the problem that killed it. A problem that ran out
of memory beside the others is tried again alone at the end, while time is left. Prints one line per
problem, then the counts; `--out` writes every row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import importlib.util, json, sys, time, traceback
import torch
from kernelevolve.evaluate.correctness import compare, tolerance_for
from kernelevolve.platforms import get_platform
from kernelevolve.spec import call_get_init_inputs, call_get_inputs, import_spec_module, load_spec
from kernelevolve.synth.tuner.trace import recognize
from kernelevolve.synth.tuner.triton_codegen import generate

tmp = sys.argv[1]
# As the harness's workers do at strict fp32: no TF32 in the reference's matmuls and cuDNN's
# convolutions (torch lets cuDNN use TF32 by default; a TF32 reference fails a correct fp32 kernel).
get_platform("cuda").setup(torch.device("cuda:0"), "strict_fp32")
for i, line in enumerate(sys.stdin):
    path = line.strip()
    row = {"problem": path, "status": "", "template": "", "message": ""}
    t0 = time.perf_counter()
    try:
        spec = load_spec(path)
        graph, why = recognize(spec)
        if graph is None:
            row.update(status="not recognized", message=why[:300])
        else:
            gen = generate(graph)
            row["template"] = gen.template
            cand_path = f"{tmp}/cand_{abs(hash(path))}.py"
            open(cand_path, "w").write(gen.source)
            loader = importlib.util.spec_from_file_location(f"cand_{i}", cand_path)
            cand = importlib.util.module_from_spec(loader); loader.loader.exec_module(cand)
            module = import_spec_module(spec.path)
            shape = spec.shapes[0]
            torch.manual_seed(0)
            init = call_get_init_inputs(spec, module, shape)
            ref = module.Model(*init).cuda()
            new = cand.ModelNew(*init).cuda()
            new.load_state_dict(ref.state_dict(), strict=False)
            torch.manual_seed(0)
            inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in call_get_inputs(spec, module, shape)]
            with torch.no_grad():
                want = ref(*inputs)
                got = new(*inputs)
            torch.cuda.synchronize()
            want = want if isinstance(want, (tuple, list)) else [want]
            got = got if isinstance(got, (tuple, list)) else [got]
            verdicts = [compare(g, w, tolerance_for(w.dtype, "strict_fp32")) for g, w in zip(got, want)]
            bad = [v for v in verdicts if not v.passed]
            row["status"] = "correct" if not bad and len(got) == len(want) else "incorrect"
            row["message"] = bad[0].message[:300] if bad else ""
            del ref, new, inputs, want, got
    except torch.OutOfMemoryError as exc:
        row.update(status="out of memory", message=str(exc).splitlines()[0][:200])
    except Exception as exc:
        row.update(status="error", message=f"{type(exc).__name__}: {str(exc).splitlines()[0][:250] if str(exc) else ''}")
        if "CUDA error" in str(exc) or "illegal" in str(exc).lower():
            row["seconds"] = round(time.perf_counter() - t0, 2)
            print("ROW " + json.dumps(row), flush=True)
            sys.exit(3)  # the context is poisoned: the driver starts a fresh worker
    torch.cuda.empty_cache()
    row["seconds"] = round(time.perf_counter() - t0, 2)
    print("ROW " + json.dumps(row), flush=True)
"""


def run_worker(problems: list[str], tmp: str, deadline: float) -> list[dict]:
    """Rows for `problems`, in order, through as many fresh workers as faults make necessary."""
    rows: list[dict] = []
    todo = list(problems)
    while todo and time.monotonic() < deadline:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, tmp], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n".join(todo) + "\n")
        proc.stdin.close()
        for line in proc.stdout:
            if line.startswith("ROW "):
                row = json.loads(line[4:])
                rows.append(row)
                todo.remove(row["problem"])
                print(f"{Path(row['problem']).parent.name}/{Path(row['problem']).stem:60} {row['status']:15} "
                      f"{row['template']:40} {row['seconds']:6.1f}s {row['message'][:90]}", flush=True)  # fmt: skip
            if time.monotonic() > deadline:
                proc.kill()
                break
        proc.wait()
        if todo and proc.returncode not in (0, 3, -9):
            rows.append({"problem": todo.pop(0), "status": "error", "template": "", "seconds": 0.0,
                         "message": f"the worker died (exit {proc.returncode})"})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--deadline-s", type=float, default=300.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    deadline = time.monotonic() + args.deadline_s
    problems = [
        str(p) for folder in args.folders
        for p in sorted(folder.glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
    ]  # fmt: skip
    from concurrent.futures import ThreadPoolExecutor

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.procs) as ex:
        parts = [problems[i :: args.procs] for i in range(args.procs)]
        rows = [r for part in ex.map(lambda p: run_worker(p, tmp, deadline), parts) for r in part]
        again = [r["problem"] for r in rows if r["status"] == "out of memory"]
        if again and time.monotonic() < deadline:
            print(f"again, alone: {len(again)} problem(s) out of memory beside the others", flush=True)
            redo = {r["problem"]: r for r in run_worker(again, tmp, deadline)}
            rows = [redo.get(r["problem"], r) for r in rows]
    done = {r["problem"] for r in rows}
    rows += [{"problem": p, "status": "not reached", "template": "", "seconds": 0.0, "message": ""}
             for p in problems if p not in done]  # fmt: skip
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"\n{len(rows)} problems on {device}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.out:
        args.out.write_text(json.dumps({"device": device, "torch": torch.__version__, "counts": counts,
                                        "rows": rows}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
