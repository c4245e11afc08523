"""Knowledge: what a synthesizer may retrieve while it writes a kernel.

For now a small built-in set of specific snippets (`kernelevolve.knowledge.builtin`) searched by
keyword. The knowledge base proper (markdown documents, a full-text index, skills written back from
verified improvements) will live beside it and answer the same `search(query, platform, limit)`.
"""

from kernelevolve.knowledge.builtin import search

__all__ = ["search"]
