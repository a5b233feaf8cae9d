"""The ingest reference: a WSGI app that streams the request body to a file, fsyncs it and answers 202.

Run by the bench under the same gunicorn command line as attache's ``web``
(``Procfile``), so the difference between the two is what attache does on
top of receiving the bytes: the checks, the hash, the staged object, the
commit and the published message. ``BENCH_RAW_DIR`` names the directory.
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
    os.unlink(path)  # the bench sends thousands of MB; the bytes were durable, which is what is compared
    start_response("202 Accepted", [("Content-Type", "application/json"), ("Content-Length", "2")])
    return [b"{}"]
