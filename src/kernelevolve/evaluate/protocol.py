"""The worker protocol: newline-delimited JSON messages over two dedicated pipes.

The worker's stdout and stderr go to a log file, never to these pipes, so nothing a candidate prints
can be read as a message. Messages, parent -> worker: `prepare`, then one of `evaluate`, `baselines`,
`profile`, `stop`. Worker -> parent: `ready` or `prep_error`, then `phase` notices (each starts the
timeout of that phase), then `result` or `error`. The engine sends and reads plain dicts; the worker
reads the messages it receives as typed values (`messages.py`).
"""

from __future__ import annotations

import json
import os
from typing import Any


class Channel:
    def __init__(self, read_fd: int, write_fd: int):
        self._r = os.fdopen(read_fd, "r", encoding="utf-8", closefd=True)
        self._w = os.fdopen(write_fd, "w", encoding="utf-8", closefd=True)

    def send(self, op: str, **payload: Any) -> None:
        self._w.write(json.dumps({"op": op, **payload}, default=str) + "\n")
        self._w.flush()

    def recv(self) -> dict[str, Any] | None:
        line = self._r.readline()
        return json.loads(line) if line else None

    def close_write(self) -> None:
        """Close our sending end. The receiving end is closed by whoever reads it, on EOF: closing a
        file another thread is blocked reading would deadlock on the file's lock."""
        try:
            self._w.close()
        except OSError:
            pass

    def close_read(self) -> None:
        try:
            self._r.close()
        except OSError:
            pass
