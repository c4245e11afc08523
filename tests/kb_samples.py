"""The knowledge base's code samples, for the tests: where they are and which ops they cover.

Each op has a reference spec (`samples/specs/<op>.py`) and a kernel per kind (`samples/<kind>/<op>.py`,
kind `c` for the CPU and `triton` for CUDA and ROCm), explained in `samples/<kind>-<op>.md`.
"""

from __future__ import annotations

from pathlib import Path

from kernelevolve.knowledge.docs import DOCS_DIR

SAMPLES_DIR = DOCS_DIR / "samples"
OPS = sorted(p.stem for p in (SAMPLES_DIR / "specs").glob("*.py"))
KINDS = {"c": "cpu", "triton": "cuda"}  # kind -> the platform whose guards it must pass


def ops_of(kind: str) -> list[str]:
    """The ops with a sample of `kind`: every op has a Triton one; C samples are written where a CPU
    kernel is worth having (not yet for the GEMM-heavy and training suite ops)."""
    return sorted(p.stem for p in (SAMPLES_DIR / kind).glob("*.py"))


C_OPS = ops_of("c")
TRITON_OPS = ops_of("triton")


def kernel(kind: str, op: str) -> Path:
    return SAMPLES_DIR / kind / f"{op}.py"


def spec(op: str) -> Path:
    return SAMPLES_DIR / "specs" / f"{op}.py"
