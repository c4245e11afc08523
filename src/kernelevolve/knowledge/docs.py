"""Knowledge documents: markdown with front matter, as shipped and as added by users.

The shipped documents live in `knowledge/docs/` (see `docs/knowledge.md` for the layout):

    constraints/             what a valid kernel is; every rule the harness enforces, explained
    guidance/                platform-agnostic optimization and debugging guidance
    hardware/<arch>/         one folder per architecture family (hopper, ampere, cdna3, x86-64)
    samples/<kind>-<op>.md   a runnable code sample's explanation; its kernel file is appended

A document opens with front matter between two `---` lines, one `key: value` per line, lists as
`[a, b, "c, d"]`:

    title, category, platforms, targets, tags, triggers, level, spec, kernel

`parse` reads it without a YAML dependency (the format is deliberately flat). `chunk_text` splits a
user's document into pieces of a few hundred words at its headings, so one retrieved piece fits in a
prompt. Deliberately not here: indexing and ranking (`knowledge/index.py`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelevolve.errors import KernelevolveError

DOCS_DIR = Path(__file__).parent / "docs"
CATEGORIES = ("constraint", "guidance", "hardware", "sample", "skill", "user")
LEVELS = ("basic", "deep")
LIST_KEYS = ("platforms", "targets", "tags", "triggers")
KNOWN_KEYS = {"title", "category", "level", "spec", "kernel", *LIST_KEYS}
CHUNK_WORDS = 350


class DocError(KernelevolveError):
    """A knowledge document that cannot be read (bad front matter, a missing sample file)."""


@dataclass
class Doc:
    """One indexed document. `id` is its path below the docs folder without `.md` for a shipped
    document (`guidance/tiling`), `user/<platform>/<file>#<n>` for an added one, `skill/<id>` for a
    skill. `platforms` empty or containing "any" means every platform."""

    id: str
    title: str
    category: str
    body: str
    platforms: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    triggers: list[str] = field(default_factory=list)
    level: str = "basic"
    origin: str = "builtin"  # builtin | user | skill
    path: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # samples: spec, kernel; skills: change

    def applies_to(self, platform: str) -> bool:
        return not self.platforms or "any" in self.platforms or platform in self.platforms

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "title": self.title, "category": self.category, "platforms": self.platforms,
            "targets": self.targets, "tags": self.tags, "triggers": self.triggers, "level": self.level,
            "origin": self.origin, "path": self.path, "meta": self.meta, "body": self.body,
        }  # fmt: skip


def _items(value: str) -> list[str]:
    value = value.strip()
    if not (value.startswith("[") and value.endswith("]")):
        return [value] if value else []
    out, buf, quote = [], "", ""
    for ch in value[1:-1]:
        if quote:
            if ch == quote:
                quote = ""
            else:
                buf += ch
        elif ch in "\"'":
            quote = ch
        elif ch == ",":
            out.append(buf.strip())
            buf = ""
        else:
            buf += ch
    out.append(buf.strip())
    return [x for x in out if x]


def parse(text: str, where: str = "<text>") -> tuple[dict[str, Any], str]:
    """(front matter, body) of a markdown document; no front matter gives ({}, text)."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}, text
    try:
        end = next(i for i, line in enumerate(lines[1:], 1) if line.strip() == "---")
    except StopIteration:
        raise DocError(f"{where}: front matter opened with --- is never closed") from None
    meta: dict[str, Any] = {}
    for n, line in enumerate(lines[1:end], 2):
        line = re.sub(r"\s+#.*$", "", line) if "[" not in line and '"' not in line else line
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise DocError(f"{where}:{n}: front matter lines are `key: value`, not {line.strip()!r}")
        key = key.strip()
        value = value.strip()
        if key in LIST_KEYS:
            meta[key] = [v.lower() if key != "triggers" else v for v in _items(value)]
        else:
            meta[key] = value.strip("\"'")
    return meta, "\n".join(lines[end + 1 :]).strip()


def doc_from_text(text: str, doc_id: str, path: str, origin: str, where: str = "") -> Doc:
    meta, body = parse(text, where or path)
    category = meta.get("category", "user" if origin == "user" else "")
    if category not in CATEGORIES:
        raise DocError(f"{where or path}: category {category!r} is not one of {', '.join(CATEGORIES)}")
    level = meta.get("level", "basic")
    if level not in LEVELS:
        raise DocError(f"{where or path}: level {level!r} is not one of {', '.join(LEVELS)}")
    title = meta.get("title") or _first_heading(body) or doc_id
    extra = {k: v for k, v in meta.items() if k not in KNOWN_KEYS}
    if extra:
        raise DocError(
            f"{where or path}: unknown front matter keys {sorted(extra)}", hint=f"valid: {sorted(KNOWN_KEYS)}"
        )
    return Doc(
        id=doc_id, title=title, category=category, body=body, platforms=meta.get("platforms", []),
        targets=meta.get("targets", []), tags=meta.get("tags", []), triggers=meta.get("triggers", []),
        level=level, origin=origin, path=path,
        meta={k: meta[k] for k in ("spec", "kernel") if k in meta},
    )  # fmt: skip


def _first_heading(body: str) -> str:
    m = re.search(r"^#+\s+(.+)$", body, re.MULTILINE)
    return m.group(1).strip() if m else ""


def builtin_docs(root: Path = DOCS_DIR) -> list[Doc]:
    """Every shipped document, samples with their kernel source appended as a code block."""
    docs = []
    for path in sorted(root.rglob("*.md")):
        rel = path.relative_to(root)
        doc = doc_from_text(path.read_text(), str(rel.with_suffix("")), str(rel), "builtin")
        if doc.category == "sample":
            kernel = doc.meta.get("kernel")
            if not kernel or not (path.parent / kernel).is_file():
                raise DocError(
                    f"{rel}: a sample names its kernel file (`kernel: triton/op.py`), and it must exist"
                )
            if not doc.meta.get("spec") or not (path.parent / doc.meta["spec"]).is_file():
                raise DocError(
                    f"{rel}: a sample names its reference spec (`spec: specs/op.py`), and it must exist"
                )
            code = (path.parent / kernel).read_text()
            doc.body = f"{doc.body}\n\n```python\n# {kernel}\n{code.rstrip()}\n```"
        docs.append(doc)
    return docs


def builtin_digest(root: Path = DOCS_DIR) -> str:
    """A hash of the shipped documents and sample files: the index is rebuilt when it changes."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".md", ".py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def chunk_text(text: str, max_words: int = CHUNK_WORDS) -> Iterator[tuple[str, str]]:
    """(heading, text) pieces of a document: split at markdown headings, then at paragraphs so that no
    piece is much longer than `max_words` words. Plain text without headings is split by paragraphs."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines():
        m = re.match(r"^(#{1,4})\s+(.+)$", line)
        if m:
            sections.append((m.group(2).strip(), []))
        else:
            sections[-1][1].append(line)
    for heading, lines in sections:
        paragraphs = [p.strip() for p in "\n".join(lines).split("\n\n") if p.strip()]
        piece: list[str] = []
        words = 0
        for para in paragraphs:
            n = len(para.split())
            if piece and words + n > max_words:
                yield heading, "\n\n".join(piece)
                piece, words = [], 0
            piece.append(para)
            words += n
        if piece:
            yield heading, "\n\n".join(piece)


def user_docs(folder: Path, platform: str, target: str | None = None) -> list[Doc]:
    """A user's folder (or one file) of markdown or text documents for `platform`, chunked."""
    files = [folder] if folder.is_file() else sorted(
        p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in (".md", ".markdown", ".txt")
    )  # fmt: skip
    if not files:
        raise DocError(
            f"{folder}: no .md or .txt documents found",
            hint="kb add takes a folder of markdown or text files",
        )
    docs = []
    for path in files:
        text = path.read_text(errors="replace")
        meta, body = parse(text, str(path))
        title = meta.get("title") or _first_heading(body) or path.stem.replace("-", " ").replace("_", " ")
        base = f"user/{platform}/{path.stem}"
        for n, (heading, piece) in enumerate(chunk_text(body), 1):
            docs.append(
                Doc(
                    id=f"{base}#{n}",
                    title=f"{title}: {heading}" if heading and heading != title else title,
                    category=meta.get("category", "hardware")
                    if meta.get("category") in CATEGORIES
                    else "hardware",
                    body=piece,
                    platforms=[platform],
                    targets=[target] if target else meta.get("targets", []),
                    tags=meta.get("tags", []),
                    triggers=meta.get("triggers", []),
                    level=meta.get("level", "basic") if meta.get("level") in LEVELS else "basic",
                    origin="user",
                    path=str(path.resolve()),
                )
            )
    return docs


__all__ = [
    "DOCS_DIR",
    "Doc",
    "DocError",
    "builtin_digest",
    "builtin_docs",
    "chunk_text",
    "parse",
    "user_docs",
]
