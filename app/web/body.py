"""The request body as the application reads it: counted, so a body cut short is noticed.

When a client's connection drops mid-body, gunicorn hands the application a
stream that simply ends early (with ``Content-Length``) or raises (a broken
chunked framing); werkzeug's own stream raises ``ClientDisconnected``. Read
through a :class:`BodyStream`, all of these look the same: the stream ends,
and :attr:`BodyStream.incomplete` says the body that was declared did not
arrive whole. Readers (the raw-body spool, the multipart parser) stop at the
end; the upload view then refuses the request with ``400 incomplete_body``
(:class:`app.errors.IncompleteBody`).

It also reads the server's stream in blocks of :data:`READ_BLOCK_BYTES`,
whatever its readers ask for, and hands those out. gunicorn reads ahead
up to 1 MiB and, asked for less than it holds, copies what it holds again
for every read: a multipart parser reading 64 KiB at a time made it copy
each byte of a 5 MB upload some 30 times, under the GIL (half the web's
GIL time while uploads came in). The price: a read that fails (a client
silent for ``ATTACHE_BODY_IDLE_SECONDS``, a connection reset, chunked
framing cut off) loses what gunicorn held of it, up to a block. Where a
body cut short is refused whole that costs nothing; where its bytes are
kept (tus PATCH, ``block_bytes=0``) the stream asks what its reader asks.
:meth:`BodyStream.read` copies what it hands out once (``io.RawIOBase``'s
copies it twice, into a new buffer and then to bytes), and not at all
when a read takes a whole block.

It enforces the route's body limit itself (``max_length``): a body of
exactly the limit is whole, one byte more is ``413``. werkzeug's
max-length stream refused a body that reached the limit exactly, when a
reader asked once more to see it end; this stream never asks past a
declared ``Content-Length``, and asks a chunked body at the limit for one
byte to tell its end from a byte too many.
"""

from __future__ import annotations

import io
import time
from typing import IO

from werkzeug.exceptions import RequestEntityTooLarge

from app.errors import UnsupportedContentEncoding

#: What one read asks of the server's stream: gunicorn's largest recv() (its ``max_body_chunk``)
READ_BLOCK_BYTES = 1024 * 1024


class BodyStream(io.RawIOBase):
    def __init__(self, stream: IO[bytes], declared_length: int | None, *, max_length: int | None = None,
                 block_bytes: int = READ_BLOCK_BYTES, deadline: float | None = None):
        super().__init__()
        self._stream = stream
        self.declared_length = declared_length
        self.max_length = max_length
        self.block_bytes = block_bytes
        self.deadline = deadline  # time.monotonic() past which the body is not waited for: it ends incomplete
        self.received = 0
        self.ended = False
        self.error: BaseException | None = None
        self._block = memoryview(b"")  # read from the server, not yet handed out

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes, copied once (``RawIOBase.read`` copies twice: into a new buffer, then to bytes)."""
        if size is None or size < 0:
            return self.readall()
        if not size:
            return b""
        if not self._fill(size):
            return b""
        block = self._block
        if size >= len(block):  # the rest of the block: bytes of its own when the block is all there is
            self._block = memoryview(b"")
            whole = block.obj
            return whole if type(whole) is bytes and len(whole) == len(block) else bytes(block)
        self._block = block[size:]
        return bytes(block[:size])

    def readinto(self, buffer) -> int:
        if not len(buffer) or not self._fill(len(buffer)):
            return 0
        size = min(len(buffer), len(self._block))
        buffer[:size] = self._block[:size]
        self._block = self._block[size:]
        return size

    def _fill(self, wanted: int) -> bool:
        """Hold bytes to hand out: a block read from the server if none are left. False at the end."""
        if self._block:
            return True
        if self.ended:
            return False
        size = max(wanted, self.block_bytes)
        if self.declared_length is not None:  # never past the declared end: the body is whole there
            size = min(size, self.declared_length - self.received)
        if self.max_length is not None:  # one byte past the limit tells a longer body from one ending there
            size = min(size, self.max_length + 1 - self.received)
        if size <= 0:
            self.ended = True
            return False
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.error, self.ended = TimeoutError("the body took longer than its route allows"), True
            return False
        try:
            data = self._stream.read(size)
        except Exception as exc:  # the server's reader: the client went away, or broke the chunked framing
            self.error = exc
            data = b""
        if not data:
            self.ended = True
            return False
        self.received += len(data)
        if self.max_length is not None and self.received > self.max_length:
            raise RequestEntityTooLarge()  # the body is too long, not too short: the 413 stands
        self._block = memoryview(data)
        return True

    @property
    def incomplete(self) -> bool:
        """The body ended before the bytes it declared (or its chunked framing broke)."""
        if self.error is not None:
            return True
        return self.ended and self.declared_length is not None and self.received < self.declared_length


def refuse_content_coding(headers) -> None:
    """:class:`UnsupportedContentEncoding` for a body in a content coding other than ``identity``, or a transfer
    coding other than ``chunked``: its bytes would be stored as sent, the coding's, not the file's (gunicorn undoes
    ``chunked`` alone: ``Transfer-Encoding: gzip, chunked`` went past the first check, a re-attack)."""
    for name, understood in (("Content-Encoding", {"identity"}), ("Transfer-Encoding", {"identity", "chunked"})):
        coding = ",".join(headers.getlist(name)).strip().lower()
        if {part.strip() for part in coding.split(",") if part.strip()} - understood:
            raise UnsupportedContentEncoding(f"{name} {coding[:40]!r} is not taken: send the file's bytes as they "
                                             "are")
