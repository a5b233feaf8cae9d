"""``100 Continue`` sent when the application first reads the body, as PEP 3333 suggests, not before it runs.

A client that sends ``Expect: 100-continue`` (curl does for a body over
1 MiB) waits for that answer before it sends its body, so that a request
refused on its head (``401``, ``413`` from its ``Content-Length``, ``429``)
costs it no upload. gunicorn sends ``100 Continue`` as soon as it has parsed
the head, before the application has looked at it: the client then sent
the whole body to be refused, and gunicorn, which drains at most 64 KiB
of a body left unread, closed the connection under it.

``app/web/request_head.py`` tells gunicorn the request expects nothing
(its parser) and :func:`owe` records the socket; :class:`ContinueOnFirstRead`
sends ``100 Continue`` on the first read of ``wsgi.input``, and never for a
request answered without reading its body. A body gathered on the poller
was invited there (the client had to send it for the request to be
whole), so nothing is owed for it. Under another server this does nothing.
"""

from __future__ import annotations

import weakref

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

#: sockets whose current request awaits ``100 Continue`` not yet sent
_owed: weakref.WeakSet = weakref.WeakSet()


def owe(sock) -> None:
    """The request being parsed on ``sock`` awaits ``100 Continue``: send it when its body is first read."""
    _owed.add(sock)


def forgive(sock) -> None:
    """A new request on ``sock``: nothing is owed for the previous one."""
    _owed.discard(sock)


class _Invited:
    """``wsgi.input``, sending ``100 Continue`` before its first read."""

    def __init__(self, stream, sock):
        self._stream = stream
        self._sock = sock

    def _invite(self) -> None:
        if self._sock is not None:
            sock, self._sock = self._sock, None
            if sock in _owed:
                _owed.discard(sock)
                sock.sendall(CONTINUE)

    def read(self, *args):
        self._invite()
        return self._stream.read(*args)

    def readline(self, *args):
        self._invite()
        return self._stream.readline(*args)

    def readlines(self, *args):
        self._invite()
        return self._stream.readlines(*args)

    def __iter__(self):
        self._invite()
        return iter(self._stream)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class ContinueOnFirstRead:
    """WSGI middleware: a request that awaits ``100 Continue`` (:func:`owe`) is told to send its body when the
    application first reads it."""

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        sock = environ.get("gunicorn.socket")
        if sock is not None and sock in _owed:
            environ["wsgi.input"] = _Invited(environ["wsgi.input"], sock)
        return self.wsgi_app(environ, start_response)
