"""Memory files the encoders write into, so that JPEG encoding releases the GIL.

Pillow encodes into a Python file object (``io.BytesIO``) holding the GIL
for the whole encode, but into a real file descriptor with the GIL released
(``ImageFile._save`` hands libjpeg's and zlib's loop the descriptor). The
worker makes a job's variants on several threads, so with ``BytesIO`` two
2048 px JPEGs were encoded one after the other (77 ms for the pair on the
AMD EPYC machine, 37 ms through a descriptor); the small photo's job took
33-35 ms in one process instead of 29-30 (``docs/performance.md``).

A descriptor here is a ``memfd``: anonymous memory with a file's interface,
never on a disk. Each is taken from a free list for one encode and put
back, so the worker's short-lived render threads do not make (and leak) one
each, and its pages, once touched, serve the next encode (a page taken for
the first time costs a fault in the host on a virtual machine). One that
grew past :data:`KEEP_BYTES` is emptied when put back. A process made by
``fork`` starts with an empty list: the parent's descriptors are the same
files, which two processes must never write at once.

The bytes are the encoder's, whatever the path: ``tests/test_encode_files.py``
compares them with ``BytesIO``'s for every format the renderer writes.
"""

from __future__ import annotations

import io
import os
from typing import Any

from PIL import Image

#: A memory file that held more than this is emptied when given back (the
#: largest variant of a 12 MP photo, its 2048 px WebP, is about 1 MB).
KEEP_BYTES = 8 * 1024 * 1024

_free: list[int] = []
_AVAILABLE = hasattr(os, "memfd_create")


def _forget_parents_files() -> None:
    for fd in _free:
        os.close(fd)
    _free.clear()


if _AVAILABLE:
    os.register_at_fork(after_in_child=_forget_parents_files)


def encode(img: Image.Image, fmt: str, options: dict[str, Any]) -> bytes:
    """``img.save(…, fmt, **options)``'s bytes, encoded into a memory file."""
    if not _AVAILABLE:
        buffer = io.BytesIO()
        img.save(buffer, fmt, **options)
        return buffer.getvalue()
    try:
        fd = _free.pop()  # atomic under the GIL: no two threads get the same file
    except IndexError:
        fd = os.memfd_create("attache-encode", os.MFD_CLOEXEC)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        with io.FileIO(fd, "w", closefd=False) as file:  # unbuffered: every write reaches fd at once
            img.save(file, fmt, **options)
            size = file.tell()
        return os.pread(fd, size, 0)
    finally:
        if os.fstat(fd).st_size > KEEP_BYTES:
            os.ftruncate(fd, 0)
        _free.append(fd)
