"""How much of an HTTP/1 request has arrived, read as gunicorn's parser will read it.

:class:`PartialRequest` holds a connection's bytes as they come and says
when a thread may take the request (:data:`WHOLE`): its head has ended
(after any empty lines before its request line), and its body too when
that is small enough to gather (a ``Content-Length``, or a
``Transfer-Encoding`` ending in ``chunked``, as ``message.Message.set_body_reader``
reads them); or that its head is too large (:data:`TOO_LARGE`). Each call
reads on from where the last stopped, so a request sent a byte at a time
costs no more than one sent whole. Used by :mod:`app.web.request_head`,
which gathers requests on gunicorn's poller; nothing here touches a socket.
"""

from __future__ import annotations

import re

#: bytes of a request gathered on the poller at most: a head that has not ended within them is refused with ``431``
#: (gunicorn's own limits allow some 800 KB), a body that does not fit with its head is read in a thread
GATHER_BYTES = 64 * 1024
#: bytes of a body gathered however long its head: the sign-in forms' limit (app.web.request), so that one is
#: always here whole, or refused, before a thread reads it
BODY_BYTES_GATHERED = 16 * 1024
#: a chunk's size line (with its extensions) at most before the framing counts as broken: gunicorn's
#: ``--limit-request-field_size``, 8190
SIZE_LINE_BYTES = 8192

#: header fields of a head gunicorn reads at most (its ``--limit-request-fields``, 100): past them it refuses the head
FIELDS = 100
#: transfer codings a head may list, in all, before its framing counts as refused: a real client lists one to three,
#: and 60,000 commas over eight fields under gunicorn's field limit cost the poller 3 ms a head (a re-attack)
CODINGS = 16

#: what :meth:`PartialRequest.whole` says of the bytes gathered so far
WAIT, WHOLE, TOO_LARGE = "wait", "whole", "too large"
#: a chunked body being gathered (its length is known only at its end)
CHUNKED = -1


def head_end(data, start: int = 0) -> int | None:
    """Where the head in ``data`` ends (after its blank line; a bare LF's too, for the parser to judge), or None."""
    ends = [at + len(blank) for blank in (b"\r\n\r\n", b"\n\n") if (at := data.find(blank, start)) >= 0]
    return min(ends) if ends else None


#: a request line whose version gunicorn reads as HTTP/1.1 (chunked bodies, ``Expect: 100-continue``)
_HTTP_1_1_ON = re.compile(rb" HTTP/1\.[1-9]$")


def framing(head: bytes) -> tuple[int | None, bool]:
    """A head's body as gunicorn will read it (``message.Message.set_body_reader``): its declared length, or
    :data:`CHUNKED` (a ``Transfer-Encoding`` list, in one or more fields, that ends with ``chunked``, in HTTP/1.1),
    or None for no body or framing the parser refuses before reading one; and whether the client awaits
    ``100 Continue`` before sending it."""
    lines = head.lstrip(b"\r\n").split(b"\n")  # empty lines before the request line are skipped, as gunicorn does
    # HTTP/1.1 or a later HTTP/1 (gunicorn takes 1.0-1.9, and 1.1 on as 1.1): an HTTP/1.2 client awaiting 100
    # Continue was not invited here, and waited for it until the body's idle bound (a re-attack)
    http11 = _HTTP_1_1_ON.search(lines[0].rstrip()) is not None
    if len(lines) > FIELDS + 3:  # gunicorn refuses the head (the request line, the blank one and what follows it
        return None, False  # are lines too): 20,000 tiny fields cost the poller 4 ms a head to read (a re-attack)
    lengths, codings, awaits = [], [], False
    for line in lines[1:]:
        if len(line) > SIZE_LINE_BYTES:  # gunicorn refuses the head: a field of 60,000 commas, split into codings
            return None, False  # here, cost the poller 11 ms (an adversarial run)
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name = name.strip().lower()
        if name == b"content-length":
            lengths.append(value.strip(b" \t\r"))
        elif name == b"transfer-encoding":
            if len(codings) + value.count(b",") >= CODINGS:
                return None, False
            codings += [coding.strip(b" \t\r").lower() for coding in value.split(b",")]
        elif name == b"expect":
            awaits = http11 and value.strip(b" \t\r").lower() == b"100-continue"
    if codings:
        chunked = codings[-1] == b"chunked" and codings.count(b"chunked") == 1 and http11 and not lengths
        return (CHUNKED if chunked else None), awaits
    if len(lengths) == 1 and lengths[0].isdigit():
        # one of 4,301 digits or more is more than int() takes: its ValueError on the poller ended the worker
        # process, and every connection on it, for a request with no token (an adversarial run). Any length of more
        # than 18 digits is more than is ever gathered; the parser, in a thread, refuses it
        digits = lengths[0].lstrip(b"0") or b"0"
        return (int(digits) if len(digits) <= 18 else GATHER_BYTES + 1) or None, awaits
    return None, awaits


def chunked_end(data, at: int, trailers: bool) -> tuple[bool, int, bool]:
    """Whether the chunked body in ``data`` has ended (after its trailers); ``at`` is where the next chunk (or, with
    ``trailers``, the next trailer line) begins. Returns that, and where to read on next time. Broken framing counts
    as ended: the parser refuses it in a thread, at once, its bytes being there. Each call reads on from where the
    last stopped, so a body sent a byte at a time costs no more than one sent whole."""
    while not trailers:
        eol = data.find(b"\r\n", at)
        if eol < 0:
            return len(data) - at > SIZE_LINE_BYTES, at, False  # a size line this long is broken
        size = bytes(data[at:eol]).split(b";", 1)[0].strip()
        if not size or size.strip(b"0123456789abcdefABCDEF"):  # any length: gunicorn reads 0000000001
            return True, at, False
        if int(size, 16) == 0:
            at, trailers = eol + 2, True
            break
        following = eol + 2 + int(size, 16) + 2
        if following > len(data):
            return False, at, False
        at = following
    while (eol := data.find(b"\r\n", at)) >= 0:  # trailer lines, up to a blank one
        if eol == at:
            return True, at, True
        at = eol + 2
    return False, at, True


class PartialRequest:
    """A connection's request being gathered: its bytes so far, when it is given up, its address, and once its head
    has come, where it ends and its body's length (or :data:`CHUNKED`, or None when only the head is gathered)."""

    __slots__ = ("buffer", "deadline", "queued", "address", "begun", "end", "until", "limit", "looked", "trailers",
                 "awaits")

    def __init__(self, buffer: bytearray, deadline: float, address):
        self.buffer = buffer
        self.deadline = deadline
        self.queued = float("inf")  # the deadline its entry in _Heads.deadlines has
        self.address = address
        self.begun = False  # its request line has begun (after any empty lines)
        self.end: int | None = None
        self.until: int | None = None  # the body's length, or CHUNKED, when it is gathered too
        self.limit = GATHER_BYTES  # bytes of the request gathered at most
        self.awaits = False  # the client awaits 100 Continue before sending its body
        self.looked = 0  # where the next look for the head's end, or the chunked body's next line, begins
        self.trailers = False

    def whole(self) -> str:
        """:data:`WHOLE` once a thread may take the request: its head and any small body it declared are here."""
        data = self.buffer
        if self.end is None:
            if not self.begun:  # empty lines before the request line are skipped, as gunicorn does
                while self.looked < len(data) and data[self.looked] in b"\r\n":
                    self.looked += 1
                if self.looked == len(data):
                    return TOO_LARGE if len(data) >= GATHER_BYTES else WAIT
                self.begun, self.looked = True, self.looked + 3
            self.end = head_end(data, max(0, self.looked - 3))
            if self.end is None:
                self.looked = len(data)
                return TOO_LARGE if len(data) >= GATHER_BYTES else WAIT
            self.looked = self.limit = self.end
            length, self.awaits = framing(bytes(data[:self.end]))
            room = max(GATHER_BYTES - self.end, BODY_BYTES_GATHERED)
            if length == CHUNKED or (length is not None and length <= room):
                self.until, self.limit = length, self.end + room
        if self.until is None:
            return WHOLE
        if self.until == CHUNKED:
            ended, self.looked, self.trailers = chunked_end(data, self.looked, self.trailers)
            return WHOLE if ended or len(data) >= self.limit else WAIT
        return WHOLE if len(data) >= self.end + self.until else WAIT
