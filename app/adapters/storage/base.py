"""The storage interface every backend implements.

Callers only ever see :class:`Storage`, :class:`ObjectInfo`, ``ValueError``
(for a bad key or argument) and the storage branch of :mod:`app.errors`.
Each backend translates its vendor's exceptions at its own edge.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import ContextManager

MAX_KEY_LENGTH = 512
_KEY_RE = re.compile(r"[a-z0-9][a-z0-9._/-]*")
_PREFIX_RE = re.compile(r"(?:[a-z0-9][a-z0-9._/-]*)?")


def validate_key(key: object) -> str:
    """Return ``key`` if it is a well-formed object key, else raise ``ValueError``.

    A key is lower-case ASCII letters, digits and ``. _ / -``, starts with a
    letter or digit, is at most 512 characters, and has no empty, ``.``,
    ``..`` or otherwise dot-leading path segment (so it can never escape a
    filesystem root, alias another key, or collide with a ``.tmp-`` file).
    """
    if not isinstance(key, str):
        raise ValueError("storage key must be a string")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"storage key longer than {MAX_KEY_LENGTH} characters")
    if not _KEY_RE.fullmatch(key):
        raise ValueError(f"invalid storage key {key!r}")
    if key.endswith("/") or "//" in key or ".." in key:
        raise ValueError(f"invalid storage key {key!r}")
    if any(segment.startswith(".") for segment in key.split("/")):
        raise ValueError(f"invalid storage key {key!r}: a segment starts with '.'")
    return key


def is_valid_key(key: object) -> bool:
    """True when :func:`validate_key` accepts ``key`` (used to skip foreign objects)."""
    try:
        validate_key(key)
    except ValueError:
        return False
    return True


def validate_prefix(prefix: object) -> str:
    """Return ``prefix`` if it could begin a valid key ("" and a trailing ``/`` allowed)."""
    if not isinstance(prefix, str):
        raise ValueError("storage prefix must be a string")
    if prefix == "":
        return prefix
    if len(prefix) > MAX_KEY_LENGTH or not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"invalid storage prefix {prefix!r}")
    if "//" in prefix or ".." in prefix or "/." in prefix:
        raise ValueError(f"invalid storage prefix {prefix!r}")
    return prefix


def validate_range(chunk_size: int, start: int, length: int | None) -> None:
    """Reject nonsensical ``open_stream`` arguments with ``ValueError``."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    if start < 0:
        raise ValueError("start must be >= 0")
    if length is not None and length < 0:
        raise ValueError("length must be >= 0 or None")


@dataclass(frozen=True)
class ObjectInfo:
    """What a backend knows about a stored object.

    ``last_modified`` is a timezone-aware UTC datetime when the backend
    reported one (``stat`` and ``list_objects`` always do; ``put_*`` and
    ``copy`` may not). It takes no part in equality: two infos for the same
    key and size compare equal whatever their timestamps.
    """

    key: str
    size: int
    last_modified: datetime | None = field(default=None, compare=False)


def utc_datetime(value: datetime | float | None) -> datetime | None:
    """A timezone-aware UTC datetime from a POSIX timestamp or a (naive = UTC) datetime."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, tz=timezone.utc)
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


class ChunkStream(Iterator[bytes]):
    """An iterator of byte chunks over an already opened object.

    ``read(n)`` returns at most ``n`` bytes (``b""`` at the end) and must
    raise only :mod:`app.errors` exceptions; ``release()`` frees the
    underlying file or connection. It runs exactly once: when the data is
    exhausted, when reading fails, on :meth:`close`, on ``with`` exit, or
    when the iterator is garbage collected.
    """

    def __init__(
        self,
        read: Callable[[int], bytes],
        release: Callable[[], None],
        chunk_size: int,
        length: int | None = None,
    ):
        self._read = read
        self._release: Callable[[], None] | None = release
        self._chunk_size = chunk_size
        self._remaining = length

    def __iter__(self) -> "ChunkStream":
        return self

    def __next__(self) -> bytes:
        if self._release is None:
            raise StopIteration
        want = self._chunk_size if self._remaining is None else min(self._chunk_size, self._remaining)
        if want <= 0:
            self.close()
            raise StopIteration
        try:
            data = self._read(want)
        except BaseException:
            self.close()
            raise
        if not data:
            self.close()
            raise StopIteration
        if self._remaining is not None:
            self._remaining -= len(data)
        return data

    @classmethod
    def empty(cls) -> "ChunkStream":
        """A stream with no bytes (an empty range) that still has ``close()``."""
        return cls(lambda n: b"", lambda: None, 1, 0)

    @property
    def closed(self) -> bool:
        """True once the underlying resource has been released."""
        return self._release is None

    def close(self) -> None:
        """Release the underlying resource (idempotent)."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> "ChunkStream":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


@dataclass(frozen=True)
class FreeSpace:
    """What may still be written where the objects are, for an unprivileged writer."""

    bytes: int
    #: the files that may still be made; ``None`` where the filesystem counts none (btrfs, some network ones)
    files: int | None


class Storage(ABC):
    """A flat namespace of immutable-by-convention objects addressed by key."""

    @abstractmethod
    def put_file(self, key: str, path: str | os.PathLike, content_type: str | None = None) -> ObjectInfo:
        """Store the bytes of the local file ``path`` under ``key``, atomically."""

    def adopt_file(self, key: str, path: str | os.PathLike, content_type: str | None = None) -> ObjectInfo:
        """Store the local file ``path`` under ``key``, atomically; the caller gives the file up.

        The caller has made the file's bytes durable (fsynced) and will not
        use it again, so a store on the same filesystem may move it in
        instead of writing the bytes a second time. By default: :meth:`put_file`.
        """
        return self.put_file(key, path, content_type=content_type)

    @abstractmethod
    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> ObjectInfo:
        """Store ``data`` under ``key``, atomically."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """Return the object's info, or ``None`` when it does not exist."""

    @abstractmethod
    def open_stream(
        self, key: str, chunk_size: int = 65536, start: int = 0, length: int | None = None
    ) -> Iterator[bytes]:
        """Open the object and return an iterator of chunks of at most ``chunk_size`` bytes.

        ``start``/``length`` select a byte range (``length=None``: to the end;
        a range past the end yields fewer or no bytes). Raises
        :class:`~app.errors.ObjectNotFound` at call time when the key is
        missing. The iterator releases its resources when exhausted or
        closed; it also supports ``with``.
        """

    @abstractmethod
    def fetch_to_path(self, key: str) -> ContextManager[Path]:
        """Context manager giving a local, seekable file holding the object's bytes.

        Treat the file as read-only. Raises :class:`~app.errors.ObjectNotFound`.
        """

    @abstractmethod
    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        """Copy ``src_key`` to ``dst_key`` (atomic replace); raises ``ObjectNotFound``.

        The copy is a new object: its ``last_modified`` is the time of the
        copy, never the source's (the object GC's grace period relies on it).
        """

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Delete ``key``; return True if something was deleted (idempotent)."""

    @abstractmethod
    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield an :class:`ObjectInfo` (with ``last_modified``) for every valid key starting with ``prefix``.

        String prefix, recursive, unsorted; ``ValueError`` for a bad prefix.
        """

    def remove_leftovers(self, older_than_seconds: float, *, dry_run: bool = False) -> dict[str, int]:
        """Remove what crashes and deletes left behind, untouched for ``older_than_seconds``; counts by kind.

        ``abandoned_writes``: what a write cut short left (never an object:
        no key lists or opens it); ``empty_directories``: what deletes left.
        With ``dry_run``, count and remove nothing. A backend that leaves
        neither returns zeros.
        """
        return {"abandoned_writes": 0, "empty_directories": 0}

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        """Yield every valid key starting with ``prefix`` (string prefix, recursive, unsorted)."""
        for info in self.list_objects(prefix):
            yield info.key

    @abstractmethod
    def check(self) -> None:
        """Raise :class:`~app.errors.StorageUnavailable` unless the store is usable."""

    def free_space(self) -> FreeSpace | None:
        """What may still be written where the objects are, for an unprivileged writer (one ``statvfs``); ``None``
        where the store reports none (a bucket)."""
        return None

    def free_bytes(self) -> int | None:
        """The room left where the objects are written (:meth:`free_space`'s bytes)."""
        space = self.free_space()
        return None if space is None else space.bytes

    def free_inodes(self) -> int | None:
        """The files that may still be made where the objects are written (:meth:`free_space`'s files)."""
        space = self.free_space()
        return None if space is None else space.files

    @abstractmethod
    def ensure_bucket(self) -> None:
        """Create the container (bucket or root directory) if missing; idempotent."""

    def presigned_url(self, key: str, expires_seconds: int, *, content_type: str | None = None,
                      content_disposition: str | None = None) -> str | None:
        """A short-lived URL that serves the object without attache in between, or None.

        ``content_type`` and ``content_disposition``, when given, are what the
        store answers with (S3's ``response-content-type`` and
        ``response-content-disposition``, signed into the URL). Backends that
        cannot sign (the filesystem) return None and the web streams the
        bytes itself.
        """
        validate_key(key)
        return None

    @abstractmethod
    def describe(self) -> str:
        """A credential-free location string such as ``file:///srv/x`` or ``s3://bucket``."""
