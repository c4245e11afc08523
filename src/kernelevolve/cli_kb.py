"""The knowledge commands: kb (search, add, list, show, export, import), skills (list, show), profile.

Registered on `cli.app` (see cli.py). Output goes to stdout (tables, or one JSON document with
`--json`, an error included); errors to stderr with a hint, exit code 2. The kb commands index the
shipped documents into the workspace, creating it where needed; `skills` and `kb export` only read
one, and refuse a workspace that does not exist.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from kernelevolve.cli_common import (
    JsonOpt,
    PlatformOpt,
    WorkspaceOpt,
    app,
    err,
    fail,
    fmt_x,
    out,
    settings_for,
)
from kernelevolve.errors import KernelevolveError

T = TypeVar("T")

kb_app = typer.Typer(help="The knowledge base: search, add a platform's documents, list, show, share.",
                     no_args_is_help=True)  # fmt: skip
skills_app = typer.Typer(help="Skills distilled from verified improvements.", no_args_is_help=True)
app.add_typer(kb_app, name="kb")
app.add_typer(skills_app, name="skills")


def _with_kb(
    workspace: Path | None,
    work: Callable[[Any, Any], T],
    as_json: bool = False,
    existing: bool = False,
    reading: bool = False,
) -> T:
    """Open the workspace and its knowledge base and run `work(ws, kb)`; a library error becomes the
    CLI's error message and exit code. `existing`: refuse a workspace that is not there. `reading`:
    the command only reads the knowledge base (search, list, show), so where no workspace is there it
    reads the shipped documents from a throwaway one instead of creating ./.kernelevolve."""
    from kernelevolve.knowledge.index import KnowledgeBase
    from kernelevolve.store import Workspace
    from kernelevolve.store.workspace import DB_NAME

    try:
        settings = settings_for(workspace, existing=existing)
        with contextlib.ExitStack() as stack:
            root = settings.workspace
            if reading and not (root / DB_NAME).is_file():
                root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kernelevolve-kb-")))
                settings = dataclasses.replace(settings, workspace=root)
            ws = stack.enter_context(Workspace.open(root))
            return work(ws, KnowledgeBase.for_settings(ws, settings))
    except KernelevolveError as exc:
        fail(exc, as_json)
        raise  # _fail always exits


def _dump(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


@kb_app.command("search")
def kb_search(
    query: Annotated[str, typer.Argument(help="What you are looking for, in words.")],
    platform: Annotated[
        str | None, typer.Option("--platform", "-p", help="Only documents for this platform.")
    ] = None,
    target: Annotated[
        str | None, typer.Option(help="Hardware target, e.g. cuda:sm90 (boosts its documents).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Documents to show.")] = 5,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search the knowledge base.

    \b
    Examples:
      kernelevolve kb search "memory bound row reduction hopper"
      kernelevolve kb search "out of resources shared memory" --platform cuda --json
    """
    hits = _with_kb(
        workspace,
        lambda ws, kb: kb.search(
            query, platform=platform, limit=limit, **({"target": target} if target else {})
        ),
        as_json,
        reading=True,
    )
    if as_json:
        _dump({"query": query, "results": [{"id": h.doc.id, "title": h.doc.title, "category": h.doc.category,
                                             "platforms": h.doc.platforms, "score": round(h.score, 4),
                                             "why": h.why, "text": h.doc.body} for h in hits]})  # fmt: skip
        return
    if not hits:
        err.print("[yellow]nothing found[/] (`kernelevolve kb list` shows what is indexed)")
        raise typer.Exit(1)
    for h in hits:
        out.print(
            f"[bold]{escape(h.doc.id)}[/]  {escape(h.doc.title)}  [dim]({h.doc.category}, score {h.score:.2f})[/]"
        )
        first = " ".join(h.doc.body.split())[:240]
        out.print(f"  {escape(first)}...")


@kb_app.command("add")
def kb_add(
    path: Annotated[Path, typer.Argument(help="A folder (or a file) of .md or .txt documents.")],
    platform: Annotated[
        str, typer.Option("--platform", "-p", help="Platform name, optionally with a target: npu or npu:v2.")
    ],
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a platform's documentation (any platform, including one kernelevolve does not know).

    \b
    Example:
      kernelevolve kb add ./our-npu-manuals --platform npu:v2
    Documents are split at headings into pieces of a few hundred words and indexed; adding the same
    files again replaces them.
    """
    if not path.exists():
        fail(KernelevolveError(f"{path}: no such file or folder"), as_json)
        return
    docs = _with_kb(workspace, lambda ws, kb: kb.add(path, platform), as_json)
    if as_json:
        _dump({"added": len(docs), "ids": [d.id for d in docs]})
        return
    files = len({d.path for d in docs})
    out.print(f"added {len(docs)} pieces from {files} file(s) for platform {escape(platform)}")


@kb_app.command("list")
def kb_list(
    platform: Annotated[
        str | None, typer.Option("--platform", "-p", help="Only documents for this platform.")
    ] = None,
    category: Annotated[
        str | None, typer.Option(help="constraint | guidance | hardware | sample | skill | user")
    ] = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List indexed documents."""
    docs = _with_kb(workspace, lambda ws, kb: kb.listing(platform, category), as_json, reading=True)
    if as_json:
        _dump([{k: v for k, v in d.to_dict().items() if k != "body"} for d in docs])
        return
    table = Table(title=f"{len(docs)} documents")
    for col in ("id", "category", "platforms", "title"):
        table.add_column(col)
    for d in docs:
        table.add_row(escape(d.id), d.category, ",".join(d.platforms) or "any", escape(d.title[:80]))
    out.print(table)


@kb_app.command("show")
def kb_show(
    doc: Annotated[str, typer.Argument(help="A document id (or a unique prefix or last path part).")],
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print one document."""
    found = _with_kb(workspace, lambda ws, kb: kb.get(doc), as_json, reading=True)
    if found is None:
        fail(
            KernelevolveError(
                f"no document {doc!r} (or it names several)", hint="`kernelevolve kb list` shows the ids"
            ),
            as_json,
        )
        return
    if as_json:
        _dump(found.to_dict())
        return
    out.print(f"[bold]{escape(found.title)}[/]  [dim]{escape(found.id)} ({found.category}; "
              f"platforms {','.join(found.platforms) or 'any'})[/]")  # fmt: skip
    out.print(escape(found.body), markup=False)


@kb_app.command("export")
def kb_export(
    path: Annotated[Path, typer.Argument(help="The share file to write (JSON).")],
    workspace: WorkspaceOpt = None,
) -> None:
    """Write this workspace's verified kernels, skills and added documents to one file."""
    from kernelevolve.knowledge.share import export_bundle

    counts = _with_kb(workspace, lambda ws, kb: export_bundle(ws, path), existing=True)
    out.print(
        f"wrote {path}: {counts['kernels']} kernels, {counts['skills']} skills, {counts['docs']} documents"
    )


@kb_app.command("import")
def kb_import(
    path: Annotated[Path, typer.Argument(help="A file written by `kernelevolve kb export`.")],
    workspace: WorkspaceOpt = None,
) -> None:
    """Import another workspace's kernels (for warm starts), skills and documents."""
    from kernelevolve.knowledge.share import import_bundle

    counts = _with_kb(workspace, lambda ws, kb: import_bundle(ws, path, kb))
    out.print(f"imported {counts['kernels']} new kernels, {counts['skills']} skills "
              f"({counts['verified_skills']} verified), {counts['docs']} documents")  # fmt: skip


@skills_app.command("list")
def skills_list(
    status: Annotated[str | None, typer.Option(help="candidate | verified")] = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List skills with their status and provenance."""
    skills = _with_kb(workspace, lambda ws, kb: ws.skills(status), as_json, existing=True)
    if as_json:
        _dump(skills)
        return
    table = Table(title=f"{len(skills)} skills")
    for col in ("id", "status", "platform", "pattern", "found in", "best gain", "title"):
        table.add_column(col)
    for s in skills:
        gain = max((p.get("gain") or 0 for p in s["provenance"]), default=0)
        table.add_row(s["id"], s["status"], s["platform"], s["pattern"] or "-", str(len(s["provenance"])),
                      fmt_x(gain), escape(s["title"][:70]))  # fmt: skip
    out.print(table)


@skills_app.command("show")
def skills_show(
    skill: Annotated[str, typer.Argument(help="A skill id (or a unique prefix).")],
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print one skill: its text, change and provenance."""
    found = _with_kb(workspace, lambda ws, kb: ws.skill(skill), as_json, existing=True)
    if found is None:
        fail(
            KernelevolveError(
                f"no skill {skill!r} (or it names several)", hint="`kernelevolve skills list` shows them"
            ),
            as_json,
        )
        return
    if as_json:
        _dump(found)
        return
    out.print(f"[bold]{escape(found['title'])}[/]  [dim]{found['id']} ({found['status']})[/]")
    out.print(escape(found["text"]))
    out.print(f"change: {escape(json.dumps(found['change']))}")
    for p in found["provenance"]:
        rep = {None: "not re-measured", True: f"reproduced {fmt_x(p.get('reproduced_gain'))}",
               False: f"not reproduced ({fmt_x(p.get('reproduced_gain'))})"}[p.get("reproduced")]  # fmt: skip
        out.print(f"- run {p['run']} nodes {p['parent']}->{p['child']} on {escape(p['spec'])}: "
                  f"{fmt_x(p['gain'])}; {rep}")  # fmt: skip


@app.command("profile")
def profile_cmd(
    spec: Annotated[Path, typer.Argument(help="The spec (.py).")],
    candidate: Annotated[Path, typer.Argument(help="The candidate (.py defining ModelNew).")],
    shape: Annotated[str | None, typer.Option(help="The shape to profile (default: the heaviest).")] = None,
    profiler: Annotated[
        str | None, typer.Option(help="auto | torch | ncu | off (auto: ncu where present).")
    ] = None,
    platform: PlatformOpt = None,
    workspace: WorkspaceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Diagnose one kernel: the harness's verdict and roofline, torch.profiler and (on NVIDIA) ncu.

    \b
    Examples:
      kernelevolve profile examples/softmax/spec.py examples/softmax/triton_rowsoftmax.py
      kernelevolve profile examples/softmax/spec.py examples/softmax/c_rowsoftmax.py --platform cpu --json
    """
    from kernelevolve.jobs import profile_file

    try:
        settings = settings_for(workspace, platform=platform, profile=profiler)
        result = profile_file(spec, candidate, settings, shape=shape)
    except KernelevolveError as exc:
        fail(exc, as_json)
        return
    if as_json:
        _dump(result)
        raise typer.Exit(0 if result["status"] == "ok" else 1)
    d = result["diagnosis"] or {}
    out.print(f"[bold]{escape(result['candidate'])}[/]: {result['status']}, {fmt_x(result['speedup_vs_eager'])} vs eager, "
              f"{fmt_x(result['speedup_vs_compile'])} vs compile")  # fmt: skip
    if d:
        from kernelevolve.synth.render import diagnosis_text

        out.print(escape(diagnosis_text(d)))
    m = result["metrics"]
    out.print(f"[dim]profilers: {', '.join(m['tools']) or 'none'}[/]")
    for e in m["errors"]:
        err.print(f"[yellow]{escape(e)}[/]")
    raise typer.Exit(0 if result["status"] == "ok" else 1)
