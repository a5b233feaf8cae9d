"""The request body as the application reads it: counted, so a body cut short is noticed.

When a client's connection drops mid-body, gunicorn hands the application a
stream that simply ends early (with ``Content-Length``) or raises (a broken
chunked framing); werkzeug's own stream raises ``ClientDisconnected``. Read
through a :class:`BodyStream`, all of these look the same: the stream ends,
and :attr:`BodyStream.incomplete` says the body that was declared did not
arrive whole. Readers (the raw-body spool, the multipart parser) stop at the
end; the upload view then refuses the request with ``400 incomplete_body``
(:class:`app.errors.IncompleteBody`).
"""

from __future__ import annotations

import io
from typing import IO

from werkzeug.exceptions import RequestEntityTooLarge


class BodyStream(io.RawIOBase):
    def __init__(self, stream: IO[bytes], declared_length: int | None):
        super().__init__()
        self._stream = stream
        self.declared_length = declared_length
        self.received = 0
        self.ended = False
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.ended or not len(buffer):
            return 0
        try:
            data = self._stream.read(len(buffer))
        except RequestEntityTooLarge:  # the body is too long, not too short: the 413 stands
            raise
        except Exception as exc:  # the server's reader: the client went away, or broke the chunked framing
            self.error = exc
            data = b""
        if not data:
            self.ended = True
            return 0
        size = len(data)
        buffer[:size] = data
        self.received += size
        return size

    @property
    def incomplete(self) -> bool:
        """The body ended before the bytes it declared (or its chunked framing broke)."""
        if self.error is not None:
            return True
        return self.ended and self.declared_length is not None and self.received < self.declared_length
