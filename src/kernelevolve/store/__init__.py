"""The workspace store: one SQLite database (WAL, numbered migrations) and content-addressed blobs.

`Workspace.open(root)` is the entry point; `BlobStore` and `migrations` are its parts. Stdlib only:
importing this package never imports torch.
"""

from kernelevolve.store.blobs import BlobStore
from kernelevolve.store.errors import storage_failed
from kernelevolve.store.workspace import Workspace

__all__ = ["BlobStore", "Workspace", "storage_failed"]
