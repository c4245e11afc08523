"""Knowledge: the documents a synthesizer retrieves while it writes a kernel, and what runs learn.

- `docs.py`: the document format (markdown with front matter) and the shipped documents;
- `index.py`: the workspace's full-text index and retrieval by runtime signals (`KnowledgeBase`);
- `skills.py`: improvements distilled from runs, verified, and indexed with their provenance;
- `patterns.py`: a spec's operator pattern, a retrieval signal and what warm starts match on;
- `share.py`: a workspace's verified kernels and skills, exported and imported as one file.
"""

from kernelevolve.knowledge.index import Hit, KnowledgeBase, Signals

__all__ = ["Hit", "KnowledgeBase", "Signals"]
