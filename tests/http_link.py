"""An HTTP/1.1 link for browser tests that loses answers the way the world does, one request at a time.

Between a browser and the web, it reads each request (its head and a ``Content-Length`` body), and a policy
decides: pass it on, pass it on and lose the answer (the connection closes before the client hears anything, as
when a mobile link drops just after the request went out), or answer it itself as a front proxy does while the
web is away (``502``). Chunked bodies are not handled (the browser's tus uploads send lengths).
"""

from __future__ import annotations

import socket
import threading
from typing import Callable

#: a policy's verdicts
PASS, LOSE_ANSWER = "pass", "lose the answer"


def bad_gateway() -> bytes:
    return b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nBad Gateway"


class HttpLink:
    """``policy(method, path, answer_head)`` is asked twice a request: before it is passed on, with
    ``answer_head`` ``None`` (``PASS``, or the bytes of an answer to give instead), and with the web's answer's
    head (``PASS`` or ``LOSE_ANSWER``)."""

    def __init__(self, upstream: tuple[str, int], policy: Callable[[str, str, bytes | None], object]):
        self.upstream, self.policy = upstream, policy
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.seen: list[tuple[str, str, str]] = []  # (method, path, what happened)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        pending = bytearray()
        try:
            while (head := _head(client, pending)) is not None:
                method, path = head.split(b" ", 2)[:2]
                method, path = method.decode(), path.decode()
                body = _take(client, pending, _length(head))
                verdict = self.policy(method, path, None)
                if isinstance(verdict, bytes):
                    self.seen.append((method, path, "answered by the link"))
                    client.sendall(verdict)
                    continue
                if upstream is None:
                    upstream = socket.create_connection(self.upstream, timeout=60)
                upstream.sendall(head + body)
                back = bytearray()
                answer_head = _head(upstream, back)
                if answer_head is None:
                    return
                status = int(answer_head.split(b" ", 2)[1])
                answer_body = b"" if method == "HEAD" or status in (204, 304) else _take(upstream, back,
                                                                                        _length(answer_head))
                if self.policy(method, path, answer_head) == LOSE_ANSWER:
                    self.seen.append((method, path, "answer lost"))
                    return
                self.seen.append((method, path, str(status)))
                client.sendall(answer_head + answer_body)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    sock.close()


def _head(sock: socket.socket, pending: bytearray) -> bytes | None:
    while b"\r\n\r\n" not in pending:
        data = sock.recv(65536)
        if not data:
            return None
        pending += data
    end = pending.index(b"\r\n\r\n") + 4
    head = bytes(pending[:end])
    del pending[:end]
    return head


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def _take(sock: socket.socket, pending: bytearray, length: int) -> bytes:
    while len(pending) < length:
        data = sock.recv(65536)
        if not data:
            raise OSError("the connection closed mid-body")
        pending += data
    body = bytes(pending[:length])
    del pending[:length]
    return body
