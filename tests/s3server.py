"""A real S3-speaking server for tests: moto's, on 127.0.0.1 and a port the kernel picks.

moto accepts any credentials and ignores presigned-URL expiry, so no test may
claim to prove either against it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from moto.server import ThreadedMotoServer


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """Yields the endpoint URL (``http://127.0.0.1:PORT``)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
