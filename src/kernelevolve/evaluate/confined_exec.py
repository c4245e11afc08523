"""Run one program inside the workers' sandbox: how the profiler starts Nsight Compute and the
torch.profiler target, which run a candidate and so are untrusted.

    python -m kernelevolve.evaluate.confined_exec --workdir DIR [sandbox flags] \
        --memory-bytes N --cpu-seconds N --file-bytes N -- PROGRAM ARG...

It confines itself as a worker does (`sandbox.confine`, with the profiler's differences: a loopback
of its own, TCP on it, root's CAP_SYS_ADMIN for the GPU's counters, /proc writable), limits itself,
and executes PROGRAM, which inherits all of it. The process the caller spawned stays outside as the
namespaces' stub and ends as PROGRAM ends. Notes about missing layers are appended to
`DIR/sandbox-notes.txt`, read back by the caller. Deliberately nothing else: what to run, and what
its output means, is the profiler's (`profile/run.py`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kernelevolve-confined-exec")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--no-netns", action="store_true")
    parser.add_argument("--no-pidns", action="store_true")
    parser.add_argument("--no-landlock", action="store_true")
    parser.add_argument("--read", type=Path, action="append", default=[])
    parser.add_argument("--protect", type=Path, action="append", default=[])
    parser.add_argument("--memory-bytes", type=int, required=True)
    parser.add_argument("--cpu-seconds", type=int, required=True)
    parser.add_argument("--file-bytes", type=int, default=2**30)
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        parser.error("no program to run")
    from kernelevolve.evaluate.sandbox import apply_limits, confine

    notes = confine(
        args.workdir,
        network=not args.no_netns,
        filesystem=not args.no_landlock,
        processes=not args.no_pidns,
        reads=args.read,
        protect=args.protect,
        profiler=True,
    )
    apply_limits(args.memory_bytes, args.cpu_seconds, args.file_bytes)
    if notes:
        with open(args.workdir / "sandbox-notes.txt", "a") as f:
            f.write("".join(n + "\n" for n in notes))
    sys.stdout.flush()
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        print(f"confined_exec: cannot run {program[0]}: {exc}", file=sys.stderr)
        os._exit(127)


if __name__ == "__main__":
    main()
