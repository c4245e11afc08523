"""What a run learns as it goes: node analyses, lessons, retrieval signals, skills, warm starts.

- `analyze`: a node's analysis (context memory): what it tried (the synthesizer's note and the
  change against its parent), what the harness measured, and why it failed or won. Stored with the
  node; the memory modes show it, and `lessons` gathers the failures and regressions of the whole
  tree so that a synthesizer does not try a failed strategy again.
- `phase` and `signals`: the search phase (draft, early, late) and the runtime signals retrieval
  ranks by (platform, target, operator pattern, the parent's diagnosis, its status and error text).
- `skill_candidate`: when a child beats its parent by more than the noise, the step distilled into a
  candidate skill (`knowledge/skills.py`); `skill_checks` picks the largest candidates for the end of
  a run to re-measure, and `record_skill_checks` indexes the ones whose gain reproduced.
- `warm_seeds`: the best earlier kernels for the same spec (or, failing that, for the same
  computation: the same reference ops, a constructor and a forward that take this spec's arguments) on
  the same platform, from this workspace's runs and from imported kernels.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelevolve import pyast
from kernelevolve.knowledge import skills as sk
from kernelevolve.knowledge.index import Signals
from kernelevolve.search.tree import Node, Tree
from kernelevolve.store import Workspace
from kernelevolve.store.blobs import candidate_hash

LESSONS = 8


def analyze(node: Node, parent: Node | None) -> str:
    """One paragraph: tried / measured / why."""
    parts = []
    if node.mode == "warm":
        parts.append(f"tried: {node.note or 'an earlier run’s kernel'}")
    elif node.mode == "seed":
        parts.append(f"tried: {node.note or 'the user’s kernel'}")
    elif parent is not None and parent.source and node.source:
        change = sk.describe_change(sk.change_of(parent.source, node.source))
        parts.append(f"tried: {node.note + '; ' if node.note else ''}{change} (from node {parent.id})")
    elif node.note:
        parts.append(f"tried: {node.note}")
    if not node.ok:
        why = (node.message or node.status or "failed").strip().splitlines()
        parts.append(f"failed ({node.status}): {why[0][:300] if why else ''}")
        return "; ".join(parts)
    measured = f"measured: fitness {node.fitness:.2f}"
    if node.speedup_vs_eager is not None:
        measured += f", {node.speedup_vs_eager:.2f}x vs eager"
    if parent is not None and parent.ok and parent.fitness:
        ratio = node.fitness / parent.fitness
        measured += f", {ratio:.2f}x its parent"
        if slower_than_parent(node, parent):
            measured += " (slower: do not repeat)"
        elif ratio < 1 - SLOWER:
            measured += f" (within the two measurements' noise, {_noise(node, parent):.0%}: not shown slower)"
    parts.append(measured)
    if node.diagnosis:
        parts.append(f"why: {node.diagnosis.get('summary') or node.diagnosis.get('class')}")
    return "; ".join(parts)


def lessons(tree: Tree, limit: int = LESSONS) -> list[str]:
    """Analyses of the failed and the slower-than-parent nodes, newest first."""
    out = []
    for n in sorted(tree.nodes.values(), key=lambda n: -n.id):
        if not n.analysis:
            continue
        parent = tree.nodes.get(n.parent) if n.parent is not None else None
        if (n.state == "evaluated" and not n.ok) or slower_than_parent(n, parent):
            out.append(f"node {n.id}: {n.analysis}")
        if len(out) >= limit:
            break
    return out


def phase(tree: Tree, parents: list[int], budget: int) -> str:
    if not parents:
        return "draft"
    spent = len(tree.evaluated())
    return "early" if spent < max(4, budget // 3) else "late"


def signals(task: Any, target: str, diagnosis: bool = True) -> Signals:
    statuses, errors, diag = [], [], ""
    for p in task.parents:
        if p.status and p.status != "ok":
            statuses.append(p.status)
            errors.append(p.message[:400])
        if diagnosis and p.diagnosis and not diag:
            diag = str(p.diagnosis.get("class") or "")
    return Signals(
        platform=task.platform, target=target, pattern=task.pattern, diagnosis=diag, statuses=statuses,
        errors=" ".join(errors), phase=task.phase, text=f"{task.spec.name} {task.spec.description or ''}",
    )  # fmt: skip


# -- skills ---------------------------------------------------------------------------------------


# The least drop in fitness called "slower than its parent", where the two measurements' spreads are
# smaller: a node is slower only beyond both spreads (one verdict's spread was 62% on a noisy CPU).
SLOWER = 0.03


def _noise(node: Node, parent: Node) -> float:
    return max(SLOWER, (parent.spread or 0.0) + (node.spread or 0.0))


def slower_than_parent(node: Node, parent: Node | None) -> bool:
    """Whether `node` is slower than `parent` beyond the noise of both measurements (what a lesson
    says "do not repeat" of); a drop within their spreads is not shown to be one."""
    if parent is None or not (node.ok and parent.ok) or not parent.fitness:
        return False
    return node.fitness * (1 + _noise(node, parent)) < parent.fitness


def beats_parent(node: Node, parent: Node | None, min_gain: float) -> bool:
    if parent is None or not (node.ok and parent.ok) or not parent.fitness:
        return False
    noise = max(min_gain, (parent.spread or 0.0) + (node.spread or 0.0))
    return node.fitness > parent.fitness * (1 + noise)


def skill_candidate(
    ws: Workspace, run_id: str, spec: Any, platform: str, target: str, pattern: str, node: Node,
    parent: Node, device: str = "",
) -> dict[str, Any]:  # fmt: skip
    """Distill the step parent -> node into a candidate skill and store it (merged with a near-duplicate)."""
    new = sk.distill(run_id=run_id, spec=spec, platform=platform, target=target, pattern=pattern,
                     parent=parent, child=node, device=device)  # fmt: skip
    existing = ws.skill(new["id"])
    merged = sk.merge(existing, new)
    ws.put_skill(merged)
    return merged


@dataclass(frozen=True)
class SkillCheck:
    """One skill entry to re-measure: its parent's and child's kernels, measured live at a run's end."""

    skill_id: str
    entry: int  # index into the skill's provenance
    parent_source: str
    child_source: str


def skill_checks(ws: Workspace, run_id: str, tree: Tree, limit: int) -> list[SkillCheck]:
    """This run's largest unverified skill entries (at most `limit`) whose parent and child are in
    `tree`: what the finish step re-measures."""
    todo = []
    for skill in ws.skills():
        for i, p in enumerate(skill["provenance"]):
            if p["run"] == run_id and p.get("reproduced") is None:
                todo.append((p["gain"], skill["id"], i, p))
    todo.sort(key=lambda t: (t[0], t[1], t[2]), reverse=True)
    checks = []
    for _, skill_id, i, entry in todo[:limit]:
        parent, child = tree.nodes.get(entry["parent"]), tree.nodes.get(entry["child"])
        if parent is None or child is None or not parent.source or not child.source:
            continue
        checks.append(SkillCheck(skill_id, i, parent.source, child.source))
    return checks


def record_skill_checks(
    ws: Workspace, run_id: str, checks: list[SkillCheck], measured: list[tuple[dict[str, Any], dict[str, Any]]],
    min_gain: float, index: Callable[[list[Any]], None],
) -> list[dict[str, Any]]:  # fmt: skip
    """Record each check's outcome (`measured`: its parent's and child's verdicts, in order) and index
    the skills that became verified; returns those."""
    verified = []
    for check, (pv, cv) in zip(checks, measured, strict=True):
        found = ws.skill(check.skill_id)
        assert found is not None
        skill = found
        skill["provenance"][check.entry] = sk.reproduce(skill["provenance"][check.entry], pv, cv, min_gain)
        was = skill["status"]
        skill["status"] = sk.status_of(skill)
        skill["verification"] = {"run": run_id, "entry": check.entry, "status": skill["status"]}
        ws.put_skill(skill)
        if skill["status"] == "verified" and was != "verified":
            verified.append(skill)
    if verified:
        index([sk.as_doc(s) for s in verified])
    return verified


# -- warm starts ----------------------------------------------------------------------------------


@dataclass
class Seed:
    source: str
    note: str
    reason: str  # "same spec" | "same computation"


def forward_arity(source: str) -> tuple[int, int | None] | None:
    """How many inputs `ModelNew.forward` takes: (required, most; None for *args), or None where the
    source does not say (it does not parse, or defines no such method)."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return None
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == "ModelNew":
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "forward":
                    params = len(fn.args.posonlyargs) + len(fn.args.args) - 1  # self
                    most = None if fn.args.vararg else params
                    return params - len(fn.args.defaults), most
    return None


def init_params(source: str, cls: str) -> list[str] | None:
    """The parameter names of `cls.__init__` in `source` (self left out; [] where the class has no
    `__init__`), or None where the source does not say."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                    a = fn.args
                    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)][1:]
                    return (
                        names
                        + (["*" + a.vararg.arg] if a.vararg else [])
                        + (["**" + a.kwarg.arg] if a.kwarg else [])
                    )
            return []
    return None


def _fits(source: str, spec: Any) -> bool:
    """Whether a kernel written for another spec can be built with this spec's constructor arguments
    and called with its inputs: a warm start across specs is otherwise a candidate spent on a
    TypeError (KernelBench level 1's ELU, norms and reductions were each seeded with a kernel of
    another op whose `ModelNew()` took no arguments)."""
    inputs = next(iter(spec.inputs.values()), None)
    arity = forward_arity(source)
    if inputs is not None and arity is not None:
        least, most = arity
        if len(inputs) < least or (most is not None and len(inputs) > most):
            return False
    theirs, ours = init_params(source, "ModelNew"), init_params(spec.source, "Model")
    return theirs is None or ours is None or theirs == ours


def warm_seeds(
    ws: Workspace, spec: Any, platform: str, ops: list[str] | None, exclude_run: str, limit: int = 2
) -> list[Seed]:
    """The best earlier kernels for this spec on this platform; if there are none, at most one of
    the same computation: another spec whose reference dispatched the same aten ops (`ops`, in order:
    the same op at other sizes), whose kernel's constructor and forward take this spec's arguments.
    An operator pattern alone ("elementwise", "row") is no such match: a GELU kernel is no ELU."""
    same: list[tuple[float, dict[str, Any], dict[str, Any]]] = []
    similar: list[tuple[float, dict[str, Any], dict[str, Any]]] = []
    for run in ws.runs(limit=200):
        if run["run_id"] == exclude_run or run["platform"] != platform:
            continue
        if run["spec_fingerprint"] == spec.fingerprint:
            bucket = same
        elif ops and (run.get("config") or {}).get("ops") == ops:
            bucket = similar
        else:
            continue
        for n in ws.nodes(run["run_id"]):
            if n["state"] == "evaluated" and n["status"] == "ok" and n["source"]:
                bucket.append((float(n["fitness"] or 0), run, n))
    for k in ws.shared_kernels(platform):
        data = k["data"]
        row = {"source": k["source"], "id": k["hash"][:8], "speedup_vs_eager": data.get("speedup_vs_eager"),
               "analysis": data.get("analysis", "")}  # fmt: skip
        run = {"run_id": f"imported from {k['origin']}", "spec_fingerprint": k["spec_fingerprint"]}
        if k["spec_fingerprint"] == spec.fingerprint:
            same.append((float(data.get("fitness") or 0), run, row))
        elif ops and data.get("ops") == ops:
            similar.append((float(data.get("fitness") or 0), run, row))
    chosen = sorted(same, key=lambda x: -x[0])
    reason = "same spec"
    if not chosen:
        similar = [x for x in similar if _fits(x[2]["source"], spec)]
        chosen, reason, limit = sorted(similar, key=lambda x: -x[0]), "same computation", 1
    out, seen = [], set()
    for fitness, run, n in chosen:
        h = candidate_hash(n["source"])
        if h in seen:
            continue
        seen.add(h)
        sp = n.get("speedup_vs_eager")
        note = (f"warm start ({reason}): run {run['run_id']} node {n['id']}, fitness {fitness:.2f}"
                + (f", {sp:.2f}x vs eager there" if sp else ""))  # fmt: skip
        if n.get("analysis"):
            note += f". Its analysis: {n['analysis'][:400]}"
        out.append(Seed(n["source"], note, reason))
        if len(out) >= limit:
            break
    return out


__all__ = ["Seed", "SkillCheck", "analyze", "beats_parent", "forward_arity", "init_params", "lessons", "phase",
           "record_skill_checks", "signals", "skill_candidate", "skill_checks", "warm_seeds"]  # fmt: skip
