"""Small webhook receivers for the tests: http.server threads that record what they got.

``fail_first``: answer 500 to the first N calls; ``delay``: wait this long
before answering (longer than the deliverer's timeout: a hanging endpoint);
``status`` and ``headers``: the answer to the other calls (204, none).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook


class Receiver:
    def __init__(self, *, fail_first: int = 0, delay: float = 0.0, status: int = 204,
                 headers: dict[str, str] | None = None, host: str = "127.0.0.1", port: int = 0):
        self.fail_first, self.delay, self.status, self.headers = fail_first, delay, status, headers or {}
        self.calls: list[tuple[dict[str, str], str]] = []  # every request, answered or not
        self.times: list[float] = []  # when each arrived (time.monotonic())
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
                with receiver.lock:
                    receiver.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    receiver.times.append(time.monotonic())
                    failing = len(receiver.calls) <= receiver.fail_first
                if receiver.delay:
                    time.sleep(receiver.delay)
                try:
                    self.send_response(500 if failing else receiver.status)
                    for name, value in ({} if failing else receiver.headers).items():
                        self.send_header(name, value)
                    self.end_headers()
                except OSError:  # the deliverer gave up waiting
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/hook"

    def verified(self, secret: str) -> list[tuple[dict[str, str], dict]]:
        """Every call, verified with the Standard Webhooks reference library as a receiver would."""
        hook = Webhook(secret)
        with self.lock:
            calls = list(self.calls)
        return [(headers, hook.verify(body, headers)) for headers, body in calls]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
