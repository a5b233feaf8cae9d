"""gunicorn's own refusals of a request it cannot parse, answered as the API answers every refusal: JSON.

gunicorn reads the request line and headers before the application sees
them, and answers what it cannot parse itself (a control byte in a header,
a header line or request line too long, a malformed request line) with an
HTML page. The API promises a JSON error for bad input (``{"error",
"message"}``, :class:`app.web.schemas.Error`): an adversarial run sent
``Idempotency-Key: a\\x7fb`` and got ``text/html``. :func:`install` makes
gunicorn write that shape instead, with its own status and reason. Under
another server it does nothing.
"""

from __future__ import annotations

import json
import sys
from http import HTTPStatus

#: the ``error`` code of each status gunicorn answers itself (others: ``bad_request``)
CODES = {403: "forbidden", 414: "request_line_too_long", 431: "request_headers_too_large",
         500: "internal_error", 501: "not_implemented"}


def phrase(status: int, otherwise: str) -> str:
    """The reason phrase of ``status`` (RFC 9110's), or ``otherwise`` for a status Python does not name."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return otherwise


def install() -> bool:
    """Patch gunicorn's error writer, if this process is one of its workers; whether it did."""
    util = sys.modules.get("gunicorn.util")
    if util is None or getattr(util.write_error, "attache_json", False):
        return False

    def write_error(sock, status_int, reason, mesg):
        # the status's own phrase: gunicorn keeps "Bad Request" for a 501 (a transfer coding it does not know, such
        # as ``chunked,``: an adversarial run read "501 Bad Request")
        reason = phrase(status_int, reason)
        body = json.dumps({"error": CODES.get(status_int, "bad_request"), "message": str(mesg) or reason},
                          sort_keys=True).encode()
        head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode("latin1")
        util.write_nonblock(sock, head + body)

    write_error.attache_json = True
    util.write_error = write_error
    return True
