"""A request's head read within a deadline, and a new connection's first byte awaited without a thread.

gunicorn 27's gthread worker gives a new connection a thread, waits up to
5 s there for its first byte (``DEFAULT_WORKER_DATA_TIMEOUT``), then reads
the request's head from a blocking socket with no deadline. An adversarial
run: 100 connections that each sent one byte (``G``) and nothing more held
every thread of both web processes for as long as they stayed open, no
token needed, and 100 connections that sent nothing, reopened as the server
closed them, held threads 5 s each.

:func:`install` bounds both: the head (with the drain of a previous body
left unread on a kept-alive connection) must arrive within
:data:`HEAD_SECONDS`, or the connection is closed as one the client
abandoned; and a connection whose first byte has not come within
:data:`FIRST_BYTE_SECONDS` waits for it on the worker's poller, without a
thread, for gunicorn's ``--keep-alive`` (5 s in the Procfile: with its
default of 2 a connection opened ahead, as browsers and pools do, and used
3 s later found itself closed, where gunicorn's own 5 s first-byte wait had
kept it 7 s; a review). A client can still take every thread by opening connections faster
than that (some 64 every :data:`HEAD_SECONDS` for two processes of 32
threads): before clients you do not trust, a buffering proxy belongs in
front (``docs/deploy.md``). Under another server or worker class this does
nothing.
"""

from __future__ import annotations

import socket
import sys
import time

#: seconds a request's head has, from its connection's turn in a thread: a client sends it in one or two packets
HEAD_SECONDS = 5.0
#: seconds a new connection holds a thread waiting for its first byte before it waits on the poller (gunicorn: 5)
FIRST_BYTE_SECONDS = 0.5


def install() -> bool:
    """Patch gunicorn's HTTP/1 parser and gthread worker, if this process is one of its gthread workers."""
    gthread = sys.modules.get("gunicorn.workers.gthread")
    if gthread is None or not hasattr(gthread, "DEFAULT_WORKER_DATA_TIMEOUT"):
        return False
    from gunicorn.http import errors, parser, unreader

    if getattr(parser.Parser.__next__, "attache_head_deadline", False):
        return False
    next_request, receive = parser.Parser.__next__, unreader.SocketUnreader.chunk

    def next_within_deadline(self):
        reader = self.unreader
        if not isinstance(reader, unreader.SocketUnreader):
            return next_request(self)
        reader.attache_head_deadline = time.monotonic() + HEAD_SECONDS
        try:
            return next_request(self)
        finally:
            reader.attache_head_deadline = None
            try:
                reader.sock.settimeout(None)  # blocking again, as gthread reads and writes the rest
            except OSError:
                pass

    def chunk(self, size_hint=None):
        deadline = getattr(self, "attache_head_deadline", None)
        if deadline is None:
            return receive(self, size_hint)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise errors.NoMoreData(b"")  # gthread closes it quietly, as a client gone
        self.sock.settimeout(remaining)
        try:
            return receive(self, size_hint)
        except socket.timeout:
            raise errors.NoMoreData(b"") from None

    next_within_deadline.attache_head_deadline = True
    parser.Parser.__next__ = parser.Parser.next = next_within_deadline
    unreader.SocketUnreader.chunk = chunk
    gthread.DEFAULT_WORKER_DATA_TIMEOUT = min(gthread.DEFAULT_WORKER_DATA_TIMEOUT, FIRST_BYTE_SECONDS)
    return True
