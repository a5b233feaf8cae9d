"""Filesystems that refuse writes the way real ones do, for tests of what attache does then (root only).

Each is a real mount, undone when the ``with`` block ends whatever happens;
without the right to mount, the test is skipped with the reason printed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


@contextlib.contextmanager
def _mounted(*args: str, prefix: str):
    point = Path(tempfile.mkdtemp(prefix=prefix))
    mounted = subprocess.run(["mount", *args, str(point)], capture_output=True)
    if mounted.returncode != 0:
        point.rmdir()
        pytest.skip(f"a mount is needed (root): {mounted.stderr.decode().strip()}")
    try:
        yield point
    finally:
        _unmount(point)
        point.rmdir()


def _unmount(point: Path, patience: float = 10) -> None:
    """``umount``, tried again while a process that used the filesystem is still exiting ("target is busy")."""
    deadline = time.monotonic() + patience
    while (done := subprocess.run(["umount", str(point)], capture_output=True)).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"umount {point}: {done.stderr.decode().strip()}")
        time.sleep(0.1)


@contextlib.contextmanager
def read_only_view(root):
    """``root`` seen through a read-only bind mount (as the soak's storage fault: every write is EROFS)."""
    with _mounted("--bind", str(root), prefix="attache-ro-") as view:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True, capture_output=True)
        yield view


@contextlib.contextmanager
def small_filesystem(size_bytes: int, *, inodes: int | None = None):
    """An empty tmpfs of ``size_bytes`` (whole pages): a write past it is ENOSPC, as on a full disk; with
    ``inodes``, a file past that many is ENOSPC too, as on a disk out of inodes."""
    options = f"size={size_bytes}" + (f",nr_inodes={inodes}" if inodes is not None else "")
    with _mounted("-t", "tmpfs", "-o", options, "tmpfs", prefix="attache-small-") as root:
        yield root


def fill(path) -> None:
    """Write zeros to ``path`` until its filesystem is full (ENOSPC), down to the last byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, bytes(size))
    finally:
        os.close(fd)
