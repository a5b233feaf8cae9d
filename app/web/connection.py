"""A connection whose request body was not read to its end is closed after the answer, and the answer says so.

A refusal often comes before the body is read (``413`` from
``Content-Length``, a full temporary directory's ``503``, a bad token).
gunicorn then drains at most 64 KiB of what is left and closes the
connection, yet its answer had said ``Connection: keep-alive``: a client
that sent its next request on that connection met a reset instead of an
answer (an adversarial run: 2 of 8 concurrent uploads, ``RemoteDisconnected``,
which ``requests`` does not retry for a POST). A WSGI application may not
send hop-by-hop headers (PEP 3333: gunicorn drops them), so
:class:`CloseUnreadBodies` asks the server itself: gunicorn's
``start_response`` is a method of its response object, whose
``force_close()`` makes it answer ``Connection: close`` and close. Under
another server this does nothing, and that server's own handling stands.

:func:`client_waits` tells whether the client of a request still waits for
its answer, as nginx asks before it gives up on a request (``499``): a
client that closed its connection, or its sending side, does not.
"""

from __future__ import annotations

import select
import socket

#: the environ key a request sets when it answers without having read its body to the end
UNREAD_BODY = "attache.unread_body"


class CloseUnreadBodies:
    """WSGI middleware: the connection of a request that set :data:`UNREAD_BODY` is closed after its answer."""

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        def start(status, headers, exc_info=None):
            server_response = getattr(start_response, "__self__", None)
            if environ.get(UNREAD_BODY) and callable(getattr(server_response, "force_close", None)):
                server_response.force_close()
            return start_response(status, headers, exc_info)

        return self.wsgi_app(environ, start)


#: poll events that say the peer has closed (its sending side at least) or the connection broke
_PEER_CLOSED = select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0)


def client_waits(environ) -> bool:
    """Whether the request's client still has its connection open to read the answer (``True`` under a server
    that does not give the WSGI application its socket). Looks without waiting: one ``poll``."""
    sock = environ.get("gunicorn.socket")
    if sock is None:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN | _PEER_CLOSED)
    events = sum(event for _, event in poller.poll(0))
    if events & _PEER_CLOSED:
        return False
    if events & select.POLLIN and not hasattr(select, "POLLRDHUP"):  # readable: a next request, or the end
        try:
            return sock.recv(1, socket.MSG_PEEK) != b""
        except ValueError:  # a TLS socket, which cannot peek
            return True
        except OSError:  # reset
            return False
    return True
