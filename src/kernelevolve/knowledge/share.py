"""Sharing what a workspace learned: its verified kernels, skills and added documents as one file.

    kernelevolve kb export shared.json      # in the workspace that learned it
    kernelevolve kb import shared.json      # in another one: warm starts and retrieval use it

Kernels: each finished run's best node whose re-measurement passed (`summary.final_status == ok`),
with its spec's fingerprint and operator pattern, platform, device and speedups as measured there.
Imported kernels are never trusted for their numbers: a warm start evaluates them again, on this
workspace's device, like any candidate. Skills travel with their provenance and status; documents
added with `kb add` travel with their platform.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kernelevolve.errors import KernelevolveError
from kernelevolve.knowledge import skills as sk
from kernelevolve.knowledge.docs import Doc
from kernelevolve.knowledge.index import KnowledgeBase
from kernelevolve.store import Workspace
from kernelevolve.store.blobs import candidate_hash

FORMAT = "kernelevolve-share/1"


def export_bundle(ws: Workspace, path: Path) -> dict[str, int]:
    kernels = []
    for run in ws.runs(limit=10_000):
        summary = run.get("summary") or {}
        best = summary.get("best_node")
        if best is None or summary.get("final_status") != "ok":
            continue
        node = next((n for n in ws.nodes(run["run_id"]) if n["id"] == best), None)
        if node is None or not node["source"]:
            continue
        spec = ws.spec(run["spec_fingerprint"]) or {}
        kernels.append({
            "hash": candidate_hash(node["source"]), "spec_fingerprint": run["spec_fingerprint"],
            "spec_name": spec.get("name") or summary.get("spec") or "", "pattern": run.get("pattern") or "",
            "platform": run["platform"], "source": node["source"],
            "data": {"fitness": summary.get("best_fitness"), "speedup_vs_eager": summary.get("best_speedup_vs_eager"),
                     "speedup_vs_compile": summary.get("best_speedup_vs_compile"), "device": summary.get("device"),
                     "run": run["run_id"], "node": best, "analysis": node.get("analysis") or "",
                     "ops": (run.get("config") or {}).get("ops")},
        })  # fmt: skip
    skills = ws.skills()
    docs = [Doc(**row).to_dict() for row in ws.kb_doc_rows() if row["origin"] == "user"]
    bundle = {"format": FORMAT, "created": datetime.now(UTC).isoformat(timespec="seconds"), "workspace": str(ws.root),
              "kernels": kernels, "skills": skills, "docs": docs}  # fmt: skip
    path.write_text(json.dumps(bundle, indent=1, default=str))
    return {"kernels": len(kernels), "skills": len(skills), "docs": len(docs)}


def import_bundle(ws: Workspace, path: Path, kb: KnowledgeBase | None = None) -> dict[str, int]:
    try:
        bundle: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise KernelevolveError(
            f"cannot read {path}: {exc}", hint="give a file written by `kernelevolve kb export`"
        ) from exc
    if bundle.get("format") != FORMAT:
        raise KernelevolveError(f"{path} is not a kernelevolve share file (format {bundle.get('format')!r})",
                                hint="give a file written by `kernelevolve kb export`")  # fmt: skip
    origin = str(bundle.get("workspace") or path.name)
    added = 0
    for k in bundle.get("kernels", []):
        if candidate_hash(k["source"]) != k["hash"]:
            raise KernelevolveError(
                f"{path}: kernel {k['hash'][:8]} does not match its hash; the file was altered"
            )
        added += ws.put_shared_kernel({**k, "origin": origin})
    kb = kb or KnowledgeBase(ws)
    merged = verified = 0
    for s in bundle.get("skills", []):
        existing = ws.skill(s["id"])
        new = sk.merge(existing, s) if existing else dict(s)
        new["status"] = sk.status_of(new)
        ws.put_skill(new)
        merged += 1
        if new["status"] == "verified":
            kb.index_docs([sk.as_doc(new)])
            verified += 1
    docs = [Doc(**{k: v for k, v in d.items()}) for d in bundle.get("docs", [])]
    if docs:
        kb.index_docs(docs)
    return {"kernels": added, "skills": merged, "verified_skills": verified, "docs": len(docs)}


__all__ = ["FORMAT", "export_bundle", "import_bundle"]
