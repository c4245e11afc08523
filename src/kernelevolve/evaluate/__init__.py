"""The harness: static guards, isolated workers, correctness, timing, verdicts. See DESIGN.md.

Exports are loaded lazily: a worker process imports `kernelevolve.evaluate.worker` and must reach its
first act (taking the device lease, on the CPU) having imported almost nothing.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelevolve.evaluate.pool import EvaluatorPool
    from kernelevolve.evaluate.verdict import Method, ShapeResult, Status, TimeStats, Verdict, Violation

__all__ = ["EvaluatorPool", "Method", "ShapeResult", "Status", "TimeStats", "Verdict", "Violation"]


def __getattr__(name: str) -> Any:
    if name == "EvaluatorPool":
        from kernelevolve.evaluate.pool import EvaluatorPool

        return EvaluatorPool
    if name in __all__:
        from kernelevolve.evaluate import verdict

        return getattr(verdict, name)
    raise AttributeError(name)
