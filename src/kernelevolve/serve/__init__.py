"""The live view: `kernelevolve serve`, a local web page of a workspace's runs and benches that
follows a search as it runs.

    view.py      what the page shows, as JSON-able dicts, read from the workspace opened read-only
    server.py    the HTTP server (the standard library's), its routes and its guards
    static/      the page: live.html, live.js, live.css (no framework, nothing from the network)

The page polls the JSON endpoints every two seconds and redraws only what changed: each answer
carries a `stamp`; a poll that sends it back as `?since=` gets `{"unchanged": true}` while nothing was
written.

    GET /                              the page
    GET /api/runs                      runs (newest first) and benches, one line each
    GET /api/runs/<run>                a run: header, progress, the tree and the best-so-far charts
                                       (SVG), every node's row
    GET /api/runs/<run>/nodes/<n>      one node: its verdict per shape, its source, its diff against
                                       its parent
    GET /api/runs/<run>/report         the run's static HTML report, rendered now (`report.render`)
    GET /api/benches/<bench>           a bench: header, summary, one row per op, its four charts

The charts are `report.svg`'s, the functions that draw the static run report and the bench report,
so the live view and the files written at the end show the same pictures.

Reading while a search writes: the workspace is opened read-only (`Workspace.open_readonly`: SQLite
read-only mode and `query_only`), under WAL, so the viewer never blocks the search's writes and each
answer sees whole transactions. The view never writes, creates or migrates anything.

Threat model: everything in the workspace is untrusted text: kernel sources and notes are written by a
model, messages by generated code, spec names by users. The server builds HTML and SVG only through
`report.fmt.esc`; JSON goes out with `<`, `>` and `&` as `\\u` escapes, so no answer is markup even if
sniffed; the page's script puts workspace text into the page only as text nodes (`textContent`),
never as markup, except the SVG charts built here from escaped parts. A Content-Security-Policy
allows scripts from this server only (no inline script runs), and nothing external. The server binds
to 127.0.0.1 by default and answers only requests addressed to the host it was bound to (a page on
another site cannot reach it by rebinding a name). It has no authentication: bind it elsewhere only
on a network where everyone may read the workspace's kernels.

Not here: any control of a search (stopping, resuming), and any write.

Why a layer above `report/`: a bench's rows come from `bench.runner.bench_document`, as
`kernelevolve benches show` prints them.
"""

from kernelevolve.serve.server import LiveServer, make_server
from kernelevolve.serve.view import LiveView, to_json

__all__ = ["LiveServer", "LiveView", "make_server", "to_json"]
