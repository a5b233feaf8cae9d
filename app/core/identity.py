"""Who is acting: the name written into job history and lease owners."""

from __future__ import annotations

import os
import socket
import threading


def identity(process: str) -> str:
    """``process:host:pid:thread``, unique among the processes and threads working on jobs."""
    return f"{process}:{socket.gethostname()}:{os.getpid()}:{threading.get_ident() % 100000}"
