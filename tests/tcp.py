"""A TCP listener for tests: silent (accepts and never answers) or a proxy that can freeze, counting connections.

The proxy hangs up on one side when the other hangs up (unless frozen); before, a server that closed a
connection left its client connected to the proxy, waiting for an answer for ever.

Used to stand in for a broker that stalls, without touching the shared
RabbitMQ, and to count the connections a process opens.
"""

from __future__ import annotations

import socket
import threading


class Listener:
    """Accepts TCP connections; a silent one never answers, a proxy forwards until frozen."""

    def __init__(self, upstream: tuple[str, int] | None = None, *, host: str = "127.0.0.1", port: int = 0):
        """``port``: one a closed listener had, to stand in for a server that comes back."""
        self.upstream = upstream
        self.frozen = threading.Event()
        self.server = socket.create_server((host, port))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.accepted = 0
        #: bytes that vanished while frozen
        self.swallowed = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.sockets.append(client)
            self.accepted += 1
            if self.upstream is not None:
                upstream = socket.create_connection(self.upstream)
                self.sockets.append(upstream)
                threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
                threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket):
        try:
            while data := source.recv(65536):
                if not self.frozen.is_set():  # frozen: bytes vanish, nobody hangs up
                    target.sendall(data)
                else:
                    self.swallowed += len(data)
        except OSError:
            pass
        if not self.frozen.is_set():  # one side hung up: so does the proxy to the other, as a real one does
            for sock in (source, target):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.server.close()
        for sock in self.sockets:
            sock.close()

    def cut(self):
        """Every connection hung up on, and new ones refused (a closed socket another thread reads, or accepts on,
        stays open)."""
        for sock in (self.server, *self.sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class SlowLink:
    """A proxy at ``bytes_per_second`` each way, like a phone's uplink, that hangs up both sides when either does.

    When the server behind it dies, its clients see their connection drop (as
    through any real proxy), and a new connection while the server is down is
    accepted and closed at once.
    """

    CHUNK = 8192

    def __init__(self, upstream: tuple[str, int], bytes_per_second: int):
        self.upstream = upstream
        self.delay = self.CHUNK / bytes_per_second
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        #: cleared, no byte passes either way while the connections stay up (a train in a tunnel)
        self.flowing = threading.Event()
        self.flowing.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:  # the server is down: the client sees a dropped connection
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self.sockets += [client, upstream]
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket):
        import time

        try:
            while data := source.recv(self.CHUNK):
                self.flowing.wait()
                target.sendall(data)
                time.sleep(self.delay * len(data) / self.CHUNK)
        except OSError:
            pass
        for sock in (source, target):  # one side is gone: so is the other
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.server.close()
        with self._lock:
            for sock in self.sockets:
                sock.close()
