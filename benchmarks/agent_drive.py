"""Drive kernelevolve's MCP server over stdio, as a coding agent's MCP client does: issue I's proof.

    python benchmarks/agent_drive.py --workspace WS --problems DIR --round ROUND --out OUT \
        [--budget 6] [--drafts 3] [--ahead 3] [--parallel N] [--finish]

The server is `kernelevolve mcp --workspace WS`, started as a subprocess and spoken to through the
official `mcp` client, exactly as Claude Code, Codex or Cursor would (README, "Use it from Claude
Code, Codex or Cursor"). The candidates are written by the agent (the model) between calls, as files:

    ROUND/<problem>/node<N>.py     the candidate for node N of that problem's run
    ROUND/<problem>/notes.json     {"node<N>.py": "what it changed and why", ...}

`<problem>` is `level1__50_conv_standard_2D__square_input__square_kernel` (level, two underscores, the
file's stem under DIR). For each problem folder: the run is started with `start_run` (budget, drafts)
unless WS already has one for it (`WS/agent_runs.json`); each node's task is issued with `next_task`
(new tasks until node N exists) and its candidate submitted with `submit` (path and note); the wall
time of every call is measured here, around the call. Without `--finish`, `--ahead` further tasks are
issued per run and their prompts saved, for the agent to write the next round against. With
`--finish`: `finish_run` for every run (the best re-measured in fresh workers; `--parallel` runs at once), and
the runs' trajectories exported (`kernelevolve export --format trajectories`).

The problems of issue I's record, chosen by this rule before any was tried: of KernelBench levels 1-2
at official sizes, those the offline tuner does not template (`trace.recognize` at `b942710`: 163 of
200), grouped by issue J's table of reasons, and in each group the first by level and file number:
convolution `level1/50_conv_standard_2D__square_input__square_kernel`, scalar-output loss
`level1/94_MSELoss`, int64 output `level1/51_Argmax_over_a_dimension`, batch/group/instance norm
`level1/33_BatchNorm`, pooling `level1/41_Max_Pooling_1D`, a reduction not over the last dim
`level1/47_Sum_reduction_over_a_dimension`, other elementwise ops `level1/27_SELU_`, a transposed
matmul operand `level1/16_Matmul_with_transposed_A`, and scans `level1/89_cumsum`.

Writes under OUT: `drive.json` (every call: problem, node, tool, seconds, status, the verdict's text),
`tasks/<problem>-node<N>.md` (each issued task's prompt), `trajectories.jsonl` (with --finish); and
prints a table: per problem the submissions, correct, best fitness, and the median submit time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _text(result: Any) -> Any:
    """A tool result's JSON (or its text where it is not JSON)."""
    raw = result.content[0].text if result.content else ""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


async def drive(args: argparse.Namespace) -> list[dict[str, Any]]:
    from mcp import Client, StdioServerParameters

    ws, out = args.workspace.resolve(), args.out.resolve()
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    runs_file = ws / "agent_runs.json"
    runs: dict[str, str] = json.loads(runs_file.read_text()) if runs_file.is_file() else {}
    server = StdioServerParameters(
        command=sys.executable,
        args=["-c", "from kernelevolve.cli import main; main()", "mcp", "--workspace", str(ws)],
        env=dict(os.environ),
    )
    calls: list[dict[str, Any]] = []

    async def timed(client: Any, problem: str, tool: str, params: dict[str, Any]) -> Any:
        start = time.perf_counter()
        result = _text(await client.call_tool(tool, params))
        seconds = time.perf_counter() - start
        row = {"problem": problem, "tool": tool, "node": params.get("node"), "seconds": round(seconds, 3)}
        if isinstance(result, dict):
            row |= {k: result.get(k) for k in ("status", "text", "error", "node", "fitness") if k in result}
        calls.append(row)
        print(f"  {problem[:48]:48} {tool:10} node {row.get('node')!s:>4} {seconds:6.1f} s "
              f"{row.get('status') or row.get('error') or ''}", flush=True)  # fmt: skip
        return result

    only = re.compile(args.only) if args.only else None
    problems = sorted(p for p in args.round.iterdir() if p.is_dir()) if args.round else []
    problems = [p for p in problems if only is None or only.search(p.name)]
    gate = asyncio.Semaphore(max(1, args.parallel))

    async def drive_problem(client: Any, folder: Path) -> None:
        """One problem's calls, in turn: its run started (once), each candidate's task and submit."""
        problem = folder.name
        level, stem = problem.split("__", 1)
        if problem not in runs:
            spec = args.problems / level / f"{stem}.py"
            started = await timed(client, problem, "start_run",
                                  {"spec": str(spec), "budget": args.budget, "drafts": args.drafts})  # fmt: skip
            if "run_id" not in started:
                return
            runs[problem] = started["run_id"]
            runs_file.write_text(json.dumps(runs, indent=1))
        run_id = runs[problem]
        notes = json.loads((folder / "notes.json").read_text()) if (folder / "notes.json").is_file() else {}
        for file in sorted(folder.glob("node*.py"), key=lambda f: int(f.stem[4:])):
            node = int(file.stem[4:])
            task = await timed(client, problem, "next_task", {"run_id": run_id})
            while isinstance(task, dict) and task.get("node") is not None and task["node"] < node:
                task = await timed(client, problem, "next_task", {"run_id": run_id, "new": True})
            if not isinstance(task, dict) or task.get("node") != node:
                print(f"  {problem}: node {node} was not issued ({task}); skipped", flush=True)
                continue
            (out / "tasks" / f"{problem}-node{node}.md").write_text(task.get("prompt", ""))
            await timed(client, problem, "submit",
                        {"run_id": run_id, "node": node, "path": str(file.resolve()), "note": notes.get(file.name)})  # fmt: skip
        if not args.finish:
            for _ in range(args.ahead):
                task = await timed(client, problem, "next_task", {"run_id": run_id, "new": True})
                if isinstance(task, dict) and task.get("node") is not None and not task.get("done"):
                    (out / "tasks" / f"{problem}-node{task['node']}.md").write_text(task.get("prompt", ""))

    async def gated(client: Any, folder: Path) -> None:
        async with gate:
            await drive_problem(client, folder)

    async with Client(server, read_timeout_seconds=1800) as client:
        await asyncio.gather(*(gated(client, folder) for folder in problems))
        if args.finish:
            finishing = {p: r for p, r in sorted(runs.items()) if only is None or only.search(p)}

            async def finish(problem: str, run_id: str) -> None:
                async with gate:
                    summary = await timed(client, problem, "finish_run", {"run_id": run_id})
                    (out / f"finish-{problem}.json").write_text(json.dumps(summary, indent=1, default=str))

            await asyncio.gather(*(finish(p, r) for p, r in finishing.items()))
    if args.finish and runs:
        with open(out / "trajectories.jsonl", "w") as sink:
            subprocess.run([sys.executable, "-c", "from kernelevolve.cli import main; main()", "export",
                            *finishing.values(), "--format", "trajectories", "-w", str(ws)], stdout=sink, check=False)  # fmt: skip
    (out / "drive.json").write_text(json.dumps({"runs": runs, "calls": calls}, indent=1))
    return calls


def table(calls: list[dict[str, Any]]) -> str:
    rows = [
        "| problem | submits | correct | best fitness | median submit s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for problem in sorted({c["problem"] for c in calls}):
        subs = [c for c in calls if c["problem"] == problem and c["tool"] == "submit"]
        ok = [c for c in subs if c.get("status") in ("ok", "suspicious")]
        best = max((c.get("fitness") or 0.0 for c in ok), default=0.0)
        median = statistics.median(c["seconds"] for c in subs) if subs else 0.0
        rows.append(f"| {problem} | {len(subs)} | {len(ok)} | {best:.3f} | {median:.1f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", type=Path, required=True)
    ap.add_argument("--problems", type=Path, required=True, help="the folder holding level1/, level2/")
    ap.add_argument("--round", type=Path, help="this round's candidates (one folder per problem)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=6)
    ap.add_argument("--drafts", type=int, default=3)
    ap.add_argument("--ahead", type=int, default=3, help="tasks issued per run for the next round")
    ap.add_argument("--finish", action="store_true")
    ap.add_argument("--only", help="a regular expression: the problems (folder names) driven or finished")
    ap.add_argument(
        "--parallel", type=int, default=1, help="problems driven at once (each one's calls in turn)"
    )
    args = ap.parse_args()
    calls = asyncio.run(drive(args))
    print(table(calls))


if __name__ == "__main__":
    main()
