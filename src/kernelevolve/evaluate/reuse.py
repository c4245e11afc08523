"""When a stored verdict stands for a new evaluation: the same kernel, spec, device, settings, method.

A warm start seeds a run with a kernel an earlier run already evaluated, and an agent may submit a
kernel twice; evaluating it again costs a worker and the device's lease for a number that is already
known. A verdict is reused where all of these are the same:
- the candidate (its hash) and the spec (its fingerprint, which covers the file and its precision);
- the device and software: the platform's identity of the device (name, driver, torch, Triton);
- what the worker is told that changes a verdict: `messages.WorkerSettings`'s fields (baselines,
  fitness baseline, seeds, timing budget and trials, precision, flags' thresholds) and the shapes
  evaluated;
- the harness's method (`timing.METHOD_VERSION`), kernelevolve's version and the digest of its files
  (`integrity`: a harness edited in between reuses nothing it made before).
`reuse_key` is a digest of the last three; the verdict records it (`Method.key`), so a stored verdict is
found again by (candidate hash, spec fingerprint, key).

Only verdicts that another evaluation would give again are reused (`REUSABLE`): a kernel that was
correct and timed, or incorrect. A timeout, an out-of-memory, a runtime error or a harness error may be
the machine's moment, not the kernel's, and is measured again.

Deliberately not here: the final re-measurement of a run's winners, which is always live (the finish
step calls the pool directly); and any trust decision about the store's rows (issue O binds verdicts
to what was evaluated).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from kernelevolve.evaluate.messages import WorkerSettings
from kernelevolve.evaluate.timing import METHOD_VERSION
from kernelevolve.evaluate.verdict import Status, Verdict
from kernelevolve.store.blobs import candidate_hash

REUSABLE = frozenset({Status.OK, Status.INCORRECT})


def reuse_key(settings: dict[str, Any], identity: dict[str, Any], shapes: list[str] | None) -> str:
    """The digest a verdict is reused under; `settings` as `Settings.to_dict()` sends them."""
    import kernelevolve
    from kernelevolve.integrity import harness

    worker = dataclasses.asdict(WorkerSettings.from_dict(settings))
    blob = json.dumps(
        {
            "method": METHOD_VERSION,
            "kernelevolve": kernelevolve.__version__,
            "harness": harness(git=False).digest,
            "device": {k: identity.get(k) for k in sorted(identity)},
            "settings": worker,
            "shapes": sorted(shapes) if shapes else None,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def stored_verdict(ws: Any, source: str, spec_fingerprint: str, key: str) -> tuple[int, Verdict] | None:
    """The stored verdict of this very kernel for this spec under `key`, marked as reused (its
    `Method.reused_from`, and its message saying so), with the evaluation it came from; None where the
    kernel must be evaluated."""
    found = ws.reusable_evaluation(candidate_hash(source), spec_fingerprint, key, {str(s) for s in REUSABLE})
    if found is None:
        return None
    evaluation_id, data = found
    verdict = Verdict.from_dict(data)
    verdict.method.reused_from = evaluation_id
    verdict.message = (
        f"{verdict.message} (the verdict of evaluation {evaluation_id}: the same kernel, spec, device, "
        "settings and method, not evaluated again)"
    )
    return evaluation_id, verdict


__all__ = ["REUSABLE", "reuse_key", "stored_verdict"]
