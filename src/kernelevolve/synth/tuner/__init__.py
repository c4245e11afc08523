"""The offline tuner: templates generated from the reference, and search over declared tunables.

`trace.recognize` maps a spec's reference onto an `ir.OpGraph`; `c_codegen` (CPU) and `triton_codegen`
(CUDA, ROCm) turn it into candidate files that declare `TUNABLES`/`CONFIG` (`kernelevolve/tunables.py`);
`templates` gathers those templates, the knowledge base's code samples and the user's seeds as the
tuner's bases; `moves` turns a parent's configuration into the next ones worth trying; and
`driver.OfflineTuner` is the synthesizer that answers the search engine's tasks with them.

Exports resolve lazily, so importing this package costs nothing (no torch, no triton).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelevolve.synth.tuner.driver import OfflineTuner
    from kernelevolve.synth.tuner.templates import templates_for
    from kernelevolve.synth.tuner.trace import recognize

_EXPORTS = {
    "OfflineTuner": "kernelevolve.synth.tuner.driver",
    "templates_for": "kernelevolve.synth.tuner.templates",
    "recognize": "kernelevolve.synth.tuner.trace",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["OfflineTuner", "recognize", "templates_for"]
