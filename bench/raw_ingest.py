"""The ingest reference: a WSGI app that streams the request body to a file, fsyncs it and answers 202.

Run by the bench under the same gunicorn command line as attache's ``web``
(``Procfile``), so the difference between the two is what attache does on
top of receiving the bytes: the checks, the hash, the staged object, the
commit and the published message. ``BENCH_RAW_DIR`` names the directory.

The file is kept, as attache keeps its staged bytes (the bench removes the
directory when the figure is done). Until the third session of 2026-12-03
it was deleted right after its fsync, so its pages came straight back for
the next request: on the bench's virtual machines a page of memory taken
for the first time costs a host fault, and a 5.2 MB file written and kept
cost 18-20 ms of system CPU there against 2.6-3.0 for one deleted at once,
a cost attache paid for every upload and the reference never did
(``docs/performance.md``). A request to ``/discard`` still deletes its
file, for that earlier figure.
"""

from __future__ import annotations

import os
import tempfile

CHUNK = 1024 * 1024


def app(environ, start_response):
    body = environ["wsgi.input"]
    remaining = int(environ.get("CONTENT_LENGTH") or 0)
    fd, path = tempfile.mkstemp(dir=os.environ["BENCH_RAW_DIR"])
    with os.fdopen(fd, "wb") as fh:
        while remaining > 0:
            chunk = body.read(min(CHUNK, remaining))
            if not chunk:
                break
            fh.write(chunk)
            remaining -= len(chunk)
        fh.flush()
        os.fsync(fh.fileno())
    if environ.get("PATH_INFO") == "/discard":
        os.unlink(path)
    start_response("202 Accepted", [("Content-Type", "application/json"), ("Content-Length", "2")])
    return [b"{}"]
