"""Retrieval: the documents a step of the search needs, ranked by its runtime signals.

A query is a `Signals` value: the platform and its target (`cuda:sm90`), the spec's operator
pattern, the parent's diagnosis class, the verdict statuses and error text of failed parents, the
search phase, and free text (the spec's name and description, or what a user typed). Ranking:

1. lexical: SQLite FTS5 with BM25 over title, tags, triggers and body (weights 4, 3, 3, 1; porter
   stemming), the query being every signal's words OR-ed together;
2. filters: a document for other platforms is never returned;
3. boosts, each a small fixed amount added to the normalized BM25 score: a trigger that equals a
   signal (the pattern, the diagnosis class, a status, the phase) or an error fragment found in the
   error text; a document written for this platform rather than for any; a hardware target that
   matches (and a penalty for another architecture's document);
   progressive specialization: the draft and early phases favour `basic` documents and constraints,
   the late phase `deep` platform material; verified skills;
4. optionally, dense embeddings (`Embedder`, e.g. a local sentence-transformers model) fused with the
   lexical ranking by reciprocal rank fusion (hybrid ranking).

Shipped documents are indexed into the workspace on first use and again when the package's documents
change; `kb add` adds a user's documents (any platform name, including one kernelevolve has never
heard of), and verified skills are indexed as they are verified.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kernelevolve.knowledge.docs import Doc, builtin_digest, builtin_docs, user_docs
from kernelevolve.store import Workspace

WEIGHTS = (4.0, 3.0, 3.0, 1.0)  # title, tags, triggers, body
CANDIDATES = 80  # lexical hits considered before boosts
STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "in",
        "is",
        "it",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "was",
        "were",
        "with",
        "not",
        "no",
        "into",
        "its",
        "than",
        "then",
        "there",
        "these",
        "those",
        "which",
        "while",
        "will",
        "can",
        "may",
        "must",
        "only",
        "one",
        "two",
        "per",
        "over",
        "under",
    ]
)
ALIASES = {"gather": ("jagged",), "batched-gemm": ("gemm",), "attention": ("row",)}  # pattern -> also matches
STATUS_WORDS = {
    "compile_error": "compile error compilation",
    "guard_violation": "guard violation rule forbidden",
    "incorrect": "incorrect mismatch tolerance wrong result",
    "runtime_error": "runtime error exception",
    "timeout": "timeout hang never ends",
    "crash": "crash illegal memory access",
    "oom": "out of memory oom",
    "suspicious": "suspicious speedup flagged",
}


@dataclass
class Signals:
    """What a step of the search knows about its situation."""

    platform: str  # "" for no platform filter (a person's free-text search)
    target: str = ""
    pattern: str = ""
    diagnosis: str = ""  # a diagnosis class: memory-bound, compute-bound, launch-bound, ...
    statuses: list[str] = field(default_factory=list)
    errors: str = ""
    phase: str = ""  # draft | early | late
    text: str = ""

    def words(self) -> list[str]:
        raw = " ".join(
            [self.text, self.pattern, self.diagnosis.replace("-", " "), self.errors[:600], self.phase]
            + [STATUS_WORDS.get(s, s) for s in self.statuses]
        )
        seen: dict[str, None] = {}
        for w in re.findall(r"[A-Za-z][A-Za-z0-9]+", raw.lower()):
            if w not in STOP and len(w) > 1:
                seen.setdefault(w, None)
        return list(seen)[:64]

    def exact(self) -> set[str]:
        """Signal values a document's trigger may equal."""
        out = {s for s in (self.pattern, self.diagnosis, self.phase) if s}
        out.update(self.statuses)
        out.update(ALIASES.get(self.pattern, ()))
        return {s.lower() for s in out}


@dataclass
class Hit:
    doc: Doc
    score: float
    why: list[str] = field(default_factory=list)


class Embedder(Protocol):
    """Dense embeddings for hybrid ranking: unit-length vectors, one per text."""

    name: str

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


EMBEDDERS: dict[str, Callable[[str], Embedder]] = {}


def register_embedder(scheme: str, factory: Callable[[str], Embedder]) -> None:
    """`scheme:argument` in the `kb_embedder` setting selects `factory(argument)`."""
    EMBEDDERS[scheme] = factory


def get_embedder(spec: str) -> Embedder | None:
    if not spec:
        return None
    scheme, _, arg = spec.partition(":")
    if scheme not in EMBEDDERS:
        from kernelevolve.errors import KernelevolveError

        raise KernelevolveError(
            f"unknown embedder {scheme!r} in kb_embedder={spec!r}",
            hint=f"known: {', '.join(sorted(EMBEDDERS)) or 'none'}; leave kb_embedder empty for lexical ranking only",
        )
    return EMBEDDERS[scheme](arg)


class _SentenceTransformers:
    """A local sentence-transformers model (the `dense` extra); never downloads anything."""

    def __init__(self, path: str):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            from kernelevolve.errors import KernelevolveError

            raise KernelevolveError(
                "dense retrieval needs sentence-transformers", hint='pip install "kernelevolve[dense]"'
            ) from None
        self.name = f"sentence-transformers:{path}"
        self._model = SentenceTransformer(path, local_files_only=True)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        vectors = self._model.encode(list(texts), normalize_embeddings=True)
        return [list(map(float, v)) for v in vectors]


register_embedder("sentence-transformers", _SentenceTransformers)


class KnowledgeBase:
    """Search, add and list documents in one workspace's index."""

    @classmethod
    def for_settings(cls, ws: Workspace, settings: Any) -> KnowledgeBase:
        """The workspace's knowledge base with the embedder the settings name (`kb_embedder`)."""
        return cls(ws, embedder=get_embedder(settings.kb_embedder))

    def __init__(self, ws: Workspace, embedder: Embedder | None = None):
        self.ws = ws
        self.embedder = embedder
        self._vectors: dict[str, list[float]] = {}
        self._docs: dict[str, Doc] | None = None
        self.ensure_builtin()

    def ensure_builtin(self) -> None:
        digest = builtin_digest()
        if self.ws.kb_meta("builtin_digest") != digest:
            self.ws.kb_replace(builtin_docs(), origin="builtin", meta={"builtin_digest": digest})
            self._docs = None

    # -- reading ----------------------------------------------------------------------------------

    def docs(self) -> dict[str, Doc]:
        if self._docs is None:
            self._docs = {row["id"]: Doc(**row) for row in self.ws.kb_doc_rows()}
        return self._docs

    def get(self, doc_id: str) -> Doc | None:
        docs = self.docs()
        if doc_id in docs:
            return docs[doc_id]
        matches = [d for i, d in docs.items() if i.startswith(doc_id) or i.endswith("/" + doc_id)]
        return matches[0] if len(matches) == 1 else None

    def listing(self, platform: str | None = None, category: str | None = None) -> list[Doc]:
        return [
            d for d in self.docs().values()
            if (platform is None or d.applies_to(platform)) and (category is None or d.category == category)
        ]  # fmt: skip

    # -- writing ----------------------------------------------------------------------------------

    def add(self, path: Path, platform: str, target: str | None = None) -> list[Doc]:
        """Index a user's folder (or file) of documents for `platform` (replacing an earlier add of
        the same files). The platform may be one kernelevolve does not know: its documents are then
        retrieved for any run or query that names it."""
        platform = platform.lower()
        if ":" in platform and target is None:
            target = platform
            platform = platform.split(":", 1)[0]
        docs = user_docs(path, platform, target)
        stale = {f"user/{platform}/{Path(d.path).stem}" for d in docs}
        for prefix in stale:
            self.ws.kb_delete(prefix + "#")
        self.ws.kb_replace(docs)
        self._docs = None
        return docs

    def index_docs(self, docs: Sequence[Doc]) -> None:
        """Index documents made elsewhere (verified skills)."""
        self.ws.kb_replace(docs)
        self._docs = None

    # -- retrieval --------------------------------------------------------------------------------

    def retrieve(
        self, signals: Signals, limit: int = 5, categories: Sequence[str] | None = None
    ) -> list[Hit]:
        words = signals.words()
        docs = self.docs()
        lexical: dict[str, float] = {}
        if words:
            query = " OR ".join(f'"{w}"' for w in words)
            for doc_id, rank in self.ws.kb_match(query, CANDIDATES, WEIGHTS):
                lexical[doc_id] = -rank  # bm25: lower is better
        # Documents whose triggers match a signal exactly are candidates even without lexical hits.
        exact = signals.exact()
        for d in docs.values():
            if exact & {t.lower() for t in d.triggers}:
                lexical.setdefault(d.id, 0.0)
        top = max(lexical.values(), default=0.0) or 1.0
        hits: list[Hit] = []
        errors = signals.errors.lower()
        for doc_id, raw in lexical.items():
            found = docs.get(doc_id)
            if found is None or (signals.platform and not found.applies_to(signals.platform)):
                continue
            d = found
            if categories and d.category not in categories:
                continue
            score, why = max(raw, 0.0) / top, []
            trig = {t.lower() for t in d.triggers}
            matched = sorted(trig & exact)
            if matched:
                score += min(1.0, 0.5 * len(matched))
                why.append("trigger " + ", ".join(matched))
            fragments = [t for t in trig if len(t) > 6 and " " in t and t in errors]
            if fragments:
                score += 1.0
                why.append(f"error text {fragments[0]!r}")
            if d.targets and signals.target:
                if any(signals.target.lower().startswith(t) for t in d.targets):
                    score += 0.4
                    why.append(f"target {signals.target}")
                else:
                    score -= 0.3
            if signals.platform and signals.platform in d.platforms:  # for this platform, not for any
                score += 0.3
            score += _phase_boost(d, signals.phase)
            if d.category == "skill":
                score += 0.2
            hits.append(Hit(d, score, why))
        hits.sort(key=lambda h: (-h.score, h.doc.id))
        if self.embedder is not None and hits:
            hits = self._hybrid(signals, hits)
        return hits[:limit]

    def search(self, query: str, platform: str | None = None, limit: int = 5, **signals: Any) -> list[Hit]:
        """Free-text search (the CLI's `kb search`); `platform` None searches every platform's docs."""
        return self.retrieve(Signals(platform=platform or "", text=query, **signals), limit=limit)

    def _hybrid(self, signals: Signals, hits: list[Hit], k: int = 60) -> list[Hit]:
        assert self.embedder is not None
        missing = [h.doc for h in hits if h.doc.id not in self._vectors]
        if missing:
            vectors = self.embedder.embed([f"{d.title}\n{d.body[:2000]}" for d in missing])
            self._vectors.update({d.id: v for d, v in zip(missing, vectors, strict=True)})
        q = self.embedder.embed([" ".join(signals.words())])[0]
        dense: list[Hit] = sorted(hits, key=lambda h: -_dot(q, self._vectors[h.doc.id]))
        dense_rank = {h.doc.id: i for i, h in enumerate(dense)}
        fused = {h.doc.id: 1 / (k + i) + 1 / (k + dense_rank[h.doc.id]) for i, h in enumerate(hits)}
        for h in hits:
            h.why.append(f"dense rank {dense_rank[h.doc.id] + 1}")
        return sorted(hits, key=lambda h: (-fused[h.doc.id], h.doc.id))


def _phase_boost(d: Doc, phase: str) -> float:
    if phase in ("draft", "early"):
        return (0.2 if d.level == "basic" else -0.1) + (
            0.2 if d.category == "constraint" and phase == "draft" else 0.0
        )
    if phase == "late":
        return 0.3 if d.level == "deep" or d.category in ("hardware", "skill") else 0.0
    return 0.0


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=False)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)) or 1.0
    )


__all__ = ["EMBEDDERS", "Embedder", "Hit", "KnowledgeBase", "Signals", "get_embedder", "register_embedder"]
