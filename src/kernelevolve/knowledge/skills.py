"""Skills: verified improvements written back into the knowledge base, with their provenance.

When a child beats its parent by more than the noise, the step is distilled into a candidate skill:
what changed (the declared tunables that moved, or for free-form code the constructs it added and
removed), on which platform and target, for which operator pattern, from which diagnosis, and how
much it gained. Without a model this is a rule-based summary of the diff and the diagnosis; an LLM
operator writing the text is not implemented yet.

A candidate skill is never retrieved. It is verified when its gain is reproduced: the parent and
the child are evaluated again, each in a fresh worker against live baselines, and the child still
wins on the node's own shape mix by more than the noise and on at least one shape besides the one
that gained most (or, for a one-shape spec, the same change wins again in a run of another spec).
Near-duplicates, the same change for the same pattern on the same platform, merge into one skill
whose provenance lists every run that found it.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from kernelevolve import tunables as tn
from kernelevolve.knowledge.docs import Doc

MARKERS = (  # constructs whose appearance or disappearance names a code change
    "tl.dot", "tl.multiple_of", "tl.max_contiguous", "num_stages", "num_warps", "GROUP_M", "tl.atomic_add",
    "tl.make_tensor_descriptor", "tl.program_id(1)", "tl.where", "tl.cumsum", "libdevice", "static_range",
    "#pragma omp", "__restrict__", "restrict", "simd", "expf", "for (int64_t", "tl.reduce", "persistent",
)  # fmt: skip


def change_of(parent_source: str, child_source: str) -> dict[str, Any]:
    """What changed from parent to child: {"tunables": {key: [old, new]}} when both declare the same
    tunables, else {"code": {"added": [...], "removed": [...], "lines": n}}."""
    try:
        a, b = tn.read(parent_source), tn.read(child_source)
    except tn.TunablesError:
        a = b = None
    if a and b and set(a[0]) == set(b[0]):
        moved = {k: [a[1][k], b[1][k]] for k in sorted(a[1]) if a[1][k] != b[1].get(k)}
        if moved and _strip_config(parent_source) == _strip_config(child_source):
            return {"tunables": moved}
    added = [m for m in MARKERS if m in child_source and m not in parent_source]
    removed = [m for m in MARKERS if m in parent_source and m not in child_source]
    diff = difflib.unified_diff(parent_source.splitlines(), child_source.splitlines(), lineterm="", n=0)
    lines = sum(1 for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---"))
    return {"code": {"added": added, "removed": removed, "lines": lines}}


def _strip_config(source: str) -> str:
    return re.sub(r"^CONFIG\s*=.*$", "", source, flags=re.MULTILINE)


def describe_change(change: Mapping[str, Any]) -> str:
    if "tunables" in change:
        return ", ".join(f"{k} {old} -> {new}" for k, (old, new) in change["tunables"].items())
    code = change.get("code", {})
    parts = []
    if code.get("added"):
        parts.append("added " + ", ".join(code["added"]))
    if code.get("removed"):
        parts.append("removed " + ", ".join(code["removed"]))
    parts.append(f"{code.get('lines', 0)} lines changed")
    return "; ".join(parts)


def skill_key(platform: str, pattern: str, change: Mapping[str, Any]) -> str:
    """Near-duplicates share a key: the same tunables moved the same way (up or down, or to the same
    value when not numeric), or the same constructs added and removed, for one pattern and platform."""
    if "tunables" in change:
        moves = []
        for k, (old, new) in sorted(change["tunables"].items()):
            if isinstance(old, int | float) and isinstance(new, int | float) and not isinstance(old, bool):
                moves.append(f"{k}:{'up' if new > old else 'down'}")
            else:
                moves.append(f"{k}:{new}")
        body = ",".join(moves)
    else:
        code = change.get("code", {})
        body = "+" + ",".join(sorted(code.get("added", []))) + "-" + ",".join(sorted(code.get("removed", [])))
    return f"{platform}|{pattern or 'any'}|{body}"


def distill(
    *, run_id: str, spec: Any, platform: str, target: str, pattern: str, parent: Any, child: Any,
    device: str = "",
) -> dict[str, Any]:  # fmt: skip
    """A candidate skill from a parent and a child that beat it (search `Node`s with sources and
    verdicts)."""
    assert parent.source is not None and child.source is not None
    change = change_of(parent.source, child.source)
    gain = child.fitness / parent.fitness if parent.fitness else 0.0
    diag = (parent.diagnosis or {}).get("class") or "undiagnosed"
    shape_gains = _shape_gains(parent.verdict or {}, child.verdict or {})
    what = describe_change(change)
    text = (
        f"On {target or platform}, for a {pattern or 'kernel'} operator ({spec.name}) whose parent was "
        f"{diag}, {what} made it {gain:.2f}x faster than its parent "
        f"(fitness {parent.fitness:.2f} -> {child.fitness:.2f})."
    )
    if shape_gains:
        text += " Per shape: " + ", ".join(f"{k} {v:.2f}x" for k, v in shape_gains.items()) + "."
    if child.diagnosis and child.diagnosis.get("class"):
        text += f" After the change: {child.diagnosis.get('summary') or child.diagnosis['class']}."
    key = skill_key(platform, pattern, change)
    return {
        "id": hashlib.sha256(key.encode()).hexdigest()[:10],
        "key": key,
        "title": f"{pattern or 'kernel'} on {target or platform}: {what}"[:160],
        "platform": platform,
        "target": target,
        "pattern": pattern,
        "change": change,
        "text": text,
        "status": "candidate",
        "provenance": [
            {
                "run": run_id,
                "spec": spec.name,
                "fingerprint": spec.fingerprint,
                "parent": parent.id,
                "child": child.id,
                "gain": round(gain, 4),
                "shape_gains": shape_gains,
                "diagnosis": diag,
                "device": device,
                "reproduced": None,
            }
        ],
        "verification": None,
    }


def _shape_gains(parent_verdict: Mapping[str, Any], child_verdict: Mapping[str, Any]) -> dict[str, float]:
    """Per shape, the child's speedup over the parent's (both against eager, measured live)."""
    p = {s["name"]: s.get("speedup_vs_eager") for s in parent_verdict.get("shapes", [])}
    out = {}
    for s in child_verdict.get("shapes", []):
        a, b = p.get(s["name"]), s.get("speedup_vs_eager")
        if a and b:
            out[s["name"]] = round(b / a, 4)
    return out


def merge(existing: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """A near-duplicate joins the existing skill: provenance accumulates (one entry per run and
    child), the text stays the first one's, and the status is recomputed."""
    if existing is None:
        return dict(new)
    out = dict(existing)
    seen = {(p["run"], p["child"]) for p in existing["provenance"]}
    out["provenance"] = list(existing["provenance"]) + [
        p for p in new["provenance"] if (p["run"], p["child"]) not in seen
    ]
    out["status"] = status_of(out)
    return out


def status_of(skill: Mapping[str, Any]) -> str:
    """verified: some provenance entry's gain was reproduced on its own node and on another shape,
    or reproduced entries come from two different specs. Otherwise still a candidate."""
    reproduced = [p for p in skill["provenance"] if p.get("reproduced")]
    if any(p.get("other_shape") for p in reproduced):
        return "verified"
    if len({p["fingerprint"] for p in reproduced}) >= 2:
        return "verified"
    return "candidate"


def reproduce(
    entry: dict[str, Any],
    parent_verdict: Mapping[str, Any],
    child_verdict: Mapping[str, Any],
    min_gain: float,
) -> dict[str, Any]:
    """Record on a provenance entry whether fresh evaluations of its parent and child reproduce the
    gain: overall by more than `min_gain` and the noise, and on a shape besides the best one."""
    pf, cf = float(parent_verdict.get("fitness") or 0), float(child_verdict.get("fitness") or 0)
    noise = max(min_gain, float(parent_verdict.get("spread") or 0) + float(child_verdict.get("spread") or 0))
    gains = _shape_gains(parent_verdict, child_verdict)
    overall = cf / pf if pf else 0.0
    ok = pf > 0 and overall > 1 + noise
    found = entry.get("shape_gains") or gains
    best_shape = max(found, key=lambda k: found[k]) if found else ""
    others = [k for k, g in gains.items() if k != best_shape and g > 1 + noise]
    return entry | {"reproduced": ok, "reproduced_gain": round(overall, 4), "reproduced_shapes": gains,
                    "other_shape": bool(ok and others), "noise": round(noise, 4)}  # fmt: skip


def as_doc(skill: Mapping[str, Any]) -> Doc:
    """A verified skill as a knowledge document."""
    runs = sorted({p["run"] for p in skill["provenance"]})
    specs = sorted({p["spec"] for p in skill["provenance"]})
    diags = sorted({str(p["diagnosis"]) for p in skill["provenance"] if p.get("diagnosis")})
    keys = list(skill["change"].get("tunables", {})) or list(skill["change"].get("code", {}).get("added", []))
    body = (
        f"{skill['text']}\n\nChange: {describe_change(skill['change'])}.\n"
        f"Verified: reproduced in fresh evaluations. Provenance: runs {', '.join(runs)}; specs {', '.join(specs)}."
    )
    return Doc(
        id=f"skill/{skill['id']}", title=f"Skill: {skill['title']}", category="skill", body=body,
        platforms=[skill["platform"]], targets=[skill["target"]] if skill.get("target") else [],
        tags=[skill["pattern"], *[str(k).lower() for k in keys]] if skill["pattern"] else [str(k).lower() for k in keys],
        triggers=[t for t in [skill["pattern"], *diags, "late"] if t], level="deep", origin="skill",
        meta={"change": skill["change"], "skill": skill["id"]},
    )  # fmt: skip


__all__ = [
    "as_doc",
    "change_of",
    "describe_change",
    "distill",
    "merge",
    "reproduce",
    "skill_key",
    "status_of",
]
