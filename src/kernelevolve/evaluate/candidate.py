"""The candidate once imported, as every phase of its evaluation calls and checks it, and how a phase
ends the evaluation early.

- `Candidate`: the candidate's file and its `ModelNew` per shape (filled by the `compile` phase,
  `evaluation.py`), with what its checks compare against (the harness's world and the processes
  alive before the import); `call_fresh` (one call on fresh inputs), `recorders` (the runtime op
  recorders), `check_integrity`, `check_processes`, `sync`.
- `Failed`: raised by a phase (`evaluation.py`, `trials.py`) to end the evaluation with a verdict;
  `evaluation.evaluate` turns it into the verdict, so it never leaves the worker's evaluation.
- `classify`: an exception raised by the candidate's code, as a status and a message that names the
  candidate's line.

Deliberately not here: the phases and their order (`evaluation.py`), the correctness trials
(`trials.py`), the verdict's numbers (`scoring.py`). Threat model: `runtime.py` (what the recorders
and the integrity check see), `sandbox.py` (the process).
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from typing import Any

from kernelevolve.evaluate.inputs import make_inputs
from kernelevolve.evaluate.prepared import Prepared, ShapeState, forward_backward, trainable_inputs
from kernelevolve.evaluate.runtime import Integrity, OpRecorder
from kernelevolve.evaluate.sandbox import descendants
from kernelevolve.evaluate.verdict import Status, Violation

COMPILE_ERRORS = (
    "CompilationError",
    "CompileTimeAssertionFailure",
    "UnsupportedLanguageConstruct",
    "NativeCompileError",
)
BACKWARD_GLUE = {"aten.add", "aten.add_"}  # the autograd engine accumulates gradients with these


class Failed(Exception):
    """Ends the evaluation with a verdict (internal control flow, never leaves `evaluation.evaluate`)."""

    def __init__(self, status: Status, message: str, violations: list[Violation] | None = None):
        super().__init__(message)
        self.status, self.message, self.violations = status, message, violations or []


def classify(exc: BaseException, phase: str, candidate_file: str) -> tuple[Status, str]:
    name = type(exc).__name__
    text = str(exc).strip()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == candidate_file]
    where = f" (candidate line {frames[-1].lineno})" if frames else ""
    message = f"{name}: {text[:3000]}{where}"
    lowered = text.lower()
    if (
        isinstance(exc, MemoryError)
        or name == "OutOfMemoryError"
        or any(k in lowered for k in ("out of memory", "can't allocate memory", "cannot allocate memory"))
    ):
        return Status.OOM, message
    if name in COMPILE_ERRORS or "error building extension" in lowered or phase == "import":
        return Status.COMPILE_ERROR, message
    if "illegal memory access" in lowered or "cuda error" in lowered or "misaligned address" in lowered:
        return (
            Status.RUNTIME_ERROR,
            message + " (the CUDA context is lost; the next candidate runs in a fresh worker)",
        )
    return Status.RUNTIME_ERROR, message


@dataclass
class Candidate:
    """One candidate in a prepared worker: empty until `compile` writes, imports and builds it."""

    state: Prepared
    torch: Any
    uses_load_inline: bool  # its calls are not counted as launches (`trials._profiled_kernels`)
    file: str = ""  # the candidate's source file ("" before `compile` wrote it)
    models: dict[str, Any] = field(default_factory=dict)  # its ModelNew per shape name
    integrity: Integrity | None = None  # the harness's world as it was before the import
    children_before: set[int] = field(default_factory=set)  # processes alive before the import

    @property
    def spec(self) -> Any:
        return self.state.spec

    def sync(self) -> None:
        if self.state.device.type == "cuda":
            self.torch.cuda.synchronize(self.state.device)

    def check_integrity(self) -> None:
        assert self.integrity is not None
        problems = self.integrity.check()
        if problems:
            raise Failed(Status.GUARD_VIOLATION, problems[0].message, problems)

    def check_processes(self) -> None:
        spawned = set(descendants(os.getpid(), include_zombies=False)) - self.children_before
        if spawned:
            raise Failed(
                Status.GUARD_VIOLATION,
                f"the candidate started {len(spawned)} process(es) that outlived the call; candidates may not create processes",
                [Violation("processes", f"{len(spawned)} processes started")],
            )

    def recorders(self) -> tuple[OpRecorder, OpRecorder]:
        """Op recorders for the forward and the backward half: gradient accumulation by the autograd
        engine (`aten.add`) is allowed in the backward only."""
        allowed = set(self.spec.allow_torch_ops)
        return OpRecorder(allowed), OpRecorder(allowed | BACKWARD_GLUE)

    def call_fresh(self, st: ShapeState, seed: int) -> None:
        """The candidate's model at `st` once (and its backward, for a training spec), on fresh
        inputs of `seed`, to the end of its device work."""
        inputs = make_inputs(self.spec, self.state.module, st.shape, seed, "spec", self.state.device)
        torch = self.torch
        model = self.models[st.shape.name]
        forward_backward(model, trainable_inputs(inputs, torch, self.spec.backward), st.grad_outputs, torch)
        self.sync()
