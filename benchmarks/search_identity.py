"""Whether two versions of the code search alike: the same spec, the offline tuner, the policy's fixed
seed and one pinned run id, on this machine, each version run `--reps` times in turn; the nodes'
(parent, memory mode, candidate hash, status) compared in order. A refactoring that changes nothing
leaves them identical (timings differ from run to run; where two candidates' fitness is close a
selection can follow the noise, so a difference is looked at, not assumed to be the code's).

    git archive OLD src | tar -x -C /tmp/old
    python benchmarks/search_identity.py --variant old=/tmp/old/src --variant new=src \
        [--spec examples/softmax/spec.py] [--budget 6] [--reps 2] [--out FILE.json]

Each run is `kernelevolve optimize SPEC --budget N --json` in a fresh workspace, from a fresh
interpreter that imports kernelevolve from the variant's `src`, with `secrets.token_hex` (which names
runs) pinned, so the tasks' seeds (`search/tasks.py`: the policy seed, the run id, the node) agree.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PINNED = (
    "import secrets; secrets.token_hex = lambda n=None: 'cafe0001'; from kernelevolve.cli import main; main()"
)


def run(src: Path, spec: Path, budget: int) -> dict[str, Any]:
    ws = Path(tempfile.mkdtemp(prefix="search-identity-")) / "ws"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(src.resolve())}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PINNED, "optimize", str(spec), "--budget", str(budget),
                           "--workspace", str(ws), "--json"], env=env, capture_output=True, text=True,
                          timeout=1800, check=False)  # fmt: skip
    with sqlite3.connect(ws / "kernelevolve.db") as conn:
        nodes = conn.execute(
            "SELECT id, parent, mode, candidate_hash, status FROM nodes ORDER BY id"
        ).fetchall()
    return {
        "rc": done.returncode,
        "wall_s": round(time.monotonic() - t0, 1),
        "nodes": [list(n) for n in nodes],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=SRC_FOLDER")
    ap.add_argument("--spec", type=Path, default=ROOT / "examples" / "softmax" / "spec.py")
    ap.add_argument("--budget", type=int, default=6)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    variants = [(v.split("=", 1)[0], Path(v.split("=", 1)[1])) for v in args.variant]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    for _ in range(args.reps):
        for name, src in variants:  # in turn, so both meet the same machine
            runs[name].append(run(src, args.spec, args.budget))
            print(f"{name}: rc {runs[name][-1]['rc']}, {runs[name][-1]['wall_s']} s", flush=True)
    trees = {name: [[n[:4] for n in r["nodes"]] for r in rs] for name, rs in runs.items()}
    first = trees[variants[0][0]][0]
    same = {name: [t == first for t in ts] for name, ts in trees.items()}
    for name, ts in trees.items():
        for k, t in enumerate(ts):
            print(f"{name} #{k + 1}: {'identical' if t == first else 'DIFFERENT'}: "
                  + " ".join(f"{n[0]}<{n[1]}:{n[2]}:{(n[3] or '-')[:8]}" for n in t))  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"spec": str(args.spec), "budget": args.budget, "runs": runs, "same": same},
                                       indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
