"""Resampled images shared by the renders of one process.

Two variants can need the very same pixels and differ only in how they
are encoded: pipeline v2's ``optimized`` (JPEG) and ``webp`` are both the
upright sRGB image bounded by 2048 px. The workflow renders each variant
in a call of its own, so without this module each of them decodes and
resamples the original again: on a 12 MP photo that is 75-220 ms of a
250-450 ms render.

:data:`SHARED` keeps the last resampled images, keyed by the original's
content (its SHA-256: the worker passes the attachment's, taken at upload;
:func:`content_key` hashes the file otherwise) and the geometry asked for,
so the second render only encodes. Renders of the same key that run at the same time (worker
threads) make it once: the first makes it, the others wait for it.

The entries are few and bounded in bytes (:data:`CAPACITY_BYTES`): they
are on top of the memory budget of :mod:`app.adapters.imaging.budget`,
which prices one render at a time. An image is never modified once
shared: the encoder gets an ``Image`` object of its own over the same
pixels, which encoding only reads (no 11 MB copy of a 2048 px image).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from PIL import Image

#: At most this many bytes of resampled images are kept: two 2048x1536 RGB
#: images (Pillow keeps RGB at 4 bytes a pixel), or one 2048x2048 RGBA.
CAPACITY_BYTES = 24 * 1024 * 1024


def content_key(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of the file's bytes: the same original under any path (an S3 download is a new file)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def image_bytes(img: Image.Image) -> int:
    return img.width * img.height * (1 if img.mode in ("L", "P", "1") else 4)


class _Flight:
    """One image being made: those waiting for it get it from here, kept in the LRU or not."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.image: Image.Image | None = None
        self.waiters = 0


class SharedImages:
    """A small LRU of images with single-flight making (see the module doc)."""

    def __init__(self, capacity_bytes: int = CAPACITY_BYTES):
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, Image.Image] = OrderedDict()
        self._making: dict[Hashable, _Flight] = {}

    def get_or_make(self, key: Hashable, make: Callable[[], Image.Image],
                    share: Callable[[Image.Image], None] | None = None) -> Image.Image:
        """The image for *key*: kept, being made by another thread (waited for), or made here.

        A thread that waited gets the image made for it even when the LRU
        did not keep it (too large, or pushed out by other renders' images
        in the meantime, as happens with several jobs at once). If the
        thread making it fails, a waiting one makes it itself (and meets
        the same error). *share*, if given, is called when the image is
        there to be taken (kept, or made by the thread waited for), outside
        the lock and before it is returned, with the image: the renderer
        reserves the encoding's memory there. A thread waits for another's making
        holding none of the budget: the maker reserves its decode's price
        in ``make``, and a waiter that had reserved its encoding's first
        could leave it short for ever, both waiting on each other, and
        every later render of the process queued behind them (an
        adversarial run, with 12 MP WebPs). While its encoding waits for
        the budget, the image it will take is held (the LRU may have let
        it go): at most one bounded image per waiting thread, which costs
        less than making it again.
        """
        while True:
            with self._lock:
                flight = self._making.get(key)
                if key in self._entries:
                    self._entries.move_to_end(key)
                    image = self._entries[key]
                elif flight is None:
                    flight = self._making[key] = _Flight()
                    break
                else:
                    flight.waiters += 1
                    image = None
            if image is None:
                flight.done.wait()
                if flight.image is None:
                    continue  # its maker failed: look again (and make it here, or wait for another)
                image = flight.image
            if share is not None:
                share(image)
            return image
        try:
            flight.image = make()
            self._keep(key, flight.image)
            return flight.image
        finally:
            with self._lock:
                del self._making[key]
            flight.done.set()

    def _keep(self, key: Hashable, image: Image.Image) -> None:
        size = image_bytes(image)
        if size > self.capacity_bytes:
            return
        with self._lock:
            self._entries[key] = image
            while sum(image_bytes(i) for i in self._entries.values()) > self.capacity_bytes:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


#: The process's shared images.
SHARED = SharedImages()
