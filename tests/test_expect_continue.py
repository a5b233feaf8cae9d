"""``Expect: 100-continue`` against real gunicorn: a body is invited only once the route reads it.

curl sends ``Expect: 100-continue`` for a body over 1 MiB and waits for the
server's ``100 Continue`` before sending it. gunicorn said it as soon as it
had parsed the head, so a request the route refuses on its head (``413``
from its ``Content-Length``, ``401``) had its client send the body anyway.
"""

from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.processes

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _head(web, *, token: str, length: int) -> bytes:
    return (f"POST /v1/attachments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: image/jpeg\r\nContent-Length: {length}\r\nExpect: 100-continue\r\n\r\n").encode()


def _first_answer(sock: socket.socket) -> bytes:
    """What the server sends before the client has sent any of its body, up to the end of an answer's head."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


@pytest.mark.parametrize("refusal", ["413 too_large", "401 unknown token"])
def test_a_body_refused_on_its_head_is_never_invited(web, refusal):
    """The refusal comes first, with no ``100 Continue`` before it: the client sends no byte of its body."""
    status = refusal.split()[0]
    token = web.token if status == "413" else "not-a-token"
    length = 60 * 1024 * 1024 if status == "413" else 2 * 1024 * 1024
    with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
        sock.sendall(_head(web, token=token, length=length))
        answer = _first_answer(sock)
    assert not answer.startswith(CONTINUE), answer[:200]
    assert answer.split(b"\r\n", 1)[0].split()[1] == status.encode(), answer[:200]


def test_a_body_the_route_reads_is_invited_once(web, data_file):
    """A body larger than what is gathered on the poller: ``100 Continue`` once the route reads it, then ``202``;
    the ``100`` is said once."""
    photo = data_file("photos/hubble_deep_field.jpg").read_bytes()  # 265 KB
    with socket.create_connection(("127.0.0.1", web.port), timeout=30) as sock:
        sock.sendall(_head(web, token=web.token, length=len(photo)))
        assert _first_answer(sock) == CONTINUE
        sock.sendall(photo)
        answer = _first_answer(sock)
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"202", answer[:300]
    assert CONTINUE not in answer


def test_a_later_http_1_client_awaiting_100_with_a_small_body_is_invited(web, data_file):
    """gunicorn takes HTTP/1.2 as 1.1 (chunked bodies, ``Expect``), the poller only 1.1: an HTTP/1.2 client
    awaiting 100 with a body small enough to be gathered was never invited, and was answered after the body's
    idle bound, 60 s, with a refusal (a re-attack)."""
    photo = data_file("photos/chelsea.jpg").read_bytes()[:6000]  # gathered on the poller: 16 KiB at most
    head = _head(web, token=web.token, length=len(photo)).replace(b"HTTP/1.1", b"HTTP/1.2", 1)
    with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
        sock.sendall(head)
        assert _first_answer(sock) == CONTINUE
