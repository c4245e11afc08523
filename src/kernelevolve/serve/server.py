"""The live view's HTTP server: the standard library's `ThreadingHTTPServer`, GET only, the page's
three files and the JSON routes of `view.LiveView`, each answer with `no-store`, `nosniff` and (for
HTML) a Content-Security-Policy; requests addressed to another host are refused (DNS rebinding).
"""

from __future__ import annotations

import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kernelevolve.errors import KernelevolveError, WorkspaceError
from kernelevolve.report.render import CSP as REPORT_CSP
from kernelevolve.serve.view import LiveView, to_json

PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATIC = {  # path -> (file in static/, content type)
    "/": ("live.html", "text/html; charset=utf-8"),
    "/live.js": ("live.js", "text/javascript; charset=utf-8"),
    "/live.css": ("live.css", "text/css; charset=utf-8"),
}

_RUN = re.compile(r"/api/runs/([A-Za-z0-9_-]{1,64})")
_NODE = re.compile(r"/api/runs/([A-Za-z0-9_-]{1,64})/nodes/(\d{1,9})")
_REPORT = re.compile(r"/api/runs/([A-Za-z0-9_-]{1,64})/report")
_BENCH = re.compile(r"/api/benches/([A-Za-z0-9_-]{1,64})")
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}


class LiveServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, view: LiveView, host: str, port: int):
        self.view = view
        self.allowed_hosts = None if host in ("", "0.0.0.0", "::") else {host.lower(), *_LOOPBACK}
        self.lock = threading.Lock()  # one workspace connection: answers are built one at a time
        super().__init__((host, port), Handler)

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


class Handler(BaseHTTPRequestHandler):
    server: LiveServer
    server_version = "kernelevolve-serve"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: a poll every 2 s is not news
        pass

    def _send(self, status: int, body: bytes, content_type: str, csp: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        if csp:
            self.send_header("Content-Security-Policy", csp)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, to_json(doc), "application/json; charset=utf-8")

    def _host_ok(self) -> bool:
        allowed = self.server.allowed_hosts
        if allowed is None:
            return True
        host = (self.headers.get("Host") or "").strip().lower()
        host = host[1 : host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
        return host in allowed

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._host_ok():
            self._json(HTTPStatus.FORBIDDEN, {"error": "this server answers only requests addressed to it"})
            return
        url = urlsplit(self.path)
        path, query = url.path, parse_qs(url.query)
        since = (query.get("since") or [""])[0]
        try:
            if path in STATIC:
                name, content_type = STATIC[path]
                body = resources.files("kernelevolve.serve").joinpath("static", name).read_bytes()
                self._send(HTTPStatus.OK, body, content_type, PAGE_CSP)
                return
            view = self.server.view
            with self.server.lock:
                doc = self._answer(view, path, since)
            if isinstance(doc, str):
                self._send(HTTPStatus.OK, doc.encode(), "text/html; charset=utf-8", REPORT_CSP)
            elif doc is None:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path}", "hint": "start at /"})
            else:
                self._json(HTTPStatus.OK, doc)
        except KernelevolveError as exc:
            self._json(HTTPStatus.NOT_FOUND, {"error": exc.message, "hint": exc.hint})
        except Exception as exc:  # a reader must outlive one bad answer; say what broke
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})

    def _answer(self, view: LiveView, path: str, since: str) -> dict[str, Any] | str | None:
        if path == "/api/runs":
            stamp = view.list_stamp()
            return {"stamp": stamp, "unchanged": True} if since == stamp else {"stamp": stamp, **view.runs()}
        if m := _NODE.fullmatch(path):
            return view.node(m.group(1), int(m.group(2)))
        if m := _REPORT.fullmatch(path):
            return view.report_html(m.group(1))
        if m := _RUN.fullmatch(path):
            run_id = view.ws.resolve_run(m.group(1))
            if since and since == view.run_stamp(run_id):
                return {"stamp": since, "unchanged": True}
            return view.run(run_id)
        if m := _BENCH.fullmatch(path):
            doc = view.bench(m.group(1))
            return {"stamp": doc["stamp"], "unchanged": True} if since == doc["stamp"] else doc
        return None


def make_server(root: Path, host: str = "127.0.0.1", port: int = 8765) -> LiveServer:
    """A server for the workspace at `root`, bound (port 0: any free port) but not yet serving."""
    view = LiveView(root)
    try:
        return LiveServer(view, host, port)
    except OSError as e:
        view.close()
        raise WorkspaceError(
            f"cannot listen on {host}:{port}: {e.strerror or e}",
            hint="pick another --port (0 takes any free one), or stop what holds this one",
        ) from e


__all__ = ["LiveServer", "make_server"]
