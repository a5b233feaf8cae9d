"""Object storage in a local directory (the default backend).

An object ``a/b/c`` is the regular file ``<root>/a/b/c``. Writes go to a
``.tmp-*`` file in the destination directory, are flushed and fsynced,
renamed into place with :func:`os.replace` and the directory is fsynced, so
a reader sees either the old object or the whole new one, and a crash leaves
at most a ``.tmp-*`` file that :meth:`FilesystemStorage.list_objects` ignores
and :meth:`FilesystemStorage.remove_leftovers` removes, with the empty
directories that deletes leave.
``OSError`` never leaves this module: it becomes a :mod:`app.errors` error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_mod
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from app import faults
from app.errors import ObjectNotFound, StorageError, StorageUnavailable

from .base import (
    ChunkStream,
    FreeSpace,
    ObjectInfo,
    Storage,
    is_valid_key,
    utc_datetime,
    validate_key,
    validate_prefix,
    validate_range,
)

TMP_PREFIX = ".tmp-"
T = TypeVar("T")
COPY_CHUNK = 1024 * 1024
COPY_RANGE_CHUNK = 64 * 1024 * 1024
FILE_MODE = 0o644

# errnos after which the same call may well succeed later (or after an operator fix)
_TRANSIENT_ERRNOS = {
    errno.EAGAIN, errno.EINTR, errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EROFS,
    errno.EACCES, errno.EPERM, errno.ESTALE, errno.ETIMEDOUT, errno.EMFILE,
    errno.ENFILE, errno.ENOMEM, errno.EBUSY,
}
_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)
# copy_file_range cannot copy between these files: copy in user space instead
_NO_COPY_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}


class FilesystemStorage(Storage):
    """Objects as files under ``root`` (created on first write or :meth:`check`)."""

    def __init__(self, root: str | os.PathLike):
        self._root = Path(os.path.abspath(os.fspath(root)))

    @property
    def root(self) -> Path:
        """The absolute root directory."""
        return self._root

    def describe(self) -> str:
        return self._root.as_uri()

    # --- writing -----------------------------------------------------------

    def put_file(self, key: str, path: str | os.PathLike, content_type: str | None = None) -> ObjectInfo:
        """Copy the local file ``path`` in 1 MiB chunks; ``content_type`` is not stored."""
        validate_key(key)
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise StorageError(f"put {key!r}: cannot read source file: {exc.strerror or type(exc).__name__}",
                               where=self.describe()) from None
        with src:
            return self._write_atomic(key, lambda dst: _copy_chunks(src, dst))

    def adopt_file(self, key: str, path: str | os.PathLike, content_type: str | None = None) -> ObjectInfo:
        """Move the caller's fsynced file in by ``rename`` (one directory fsync, no second write).

        On another filesystem (``EXDEV``) the bytes are copied as :meth:`put_file` does.
        """
        validate_key(key)
        target = self._path(key)
        with self._errors("put", key):
            size = os.stat(path).st_size
            os.chmod(path, FILE_MODE)  # a spool file is private to its process (mkstemp: 0600)
            try:
                self._in_directory(target.parent, lambda: os.replace(path, target))
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                return self.put_file(key, path, content_type=content_type)
            fsync_dir(target.parent)
        return ObjectInfo(key, size)

    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> ObjectInfo:
        """Store ``data``; ``content_type`` is not stored."""
        validate_key(key)
        view = memoryview(data).cast("B")

        def write(dst: BinaryIO) -> int:
            dst.write(view)
            return view.nbytes

        return self._write_atomic(key, write)

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        """Copy the bytes into a new file, fsync it, then rename it over ``dst_key``.

        Never a hard link: a link shares the source's inode and so its mtime,
        and a copy made now of a two-hour-old staged file would look two
        hours old to the object GC (and a ``utime`` on the link would age
        the source too). The new file's mtime is the time of the copy. The
        kernel copies (``copy_file_range``, which may share extents on a
        reflink filesystem) where it can, else 1 MiB chunks.
        """
        validate_key(src_key)
        validate_key(dst_key)
        if src_key == dst_key:
            return self._require(src_key)
        with self._open(src_key) as src:
            return self._write_atomic(dst_key, lambda dst: _clone(src, dst))

    def delete(self, key: str) -> bool:
        validate_key(key)
        path = self._path(key)
        with self._errors("delete", key):
            try:
                os.unlink(path)
            except _MISSING:
                return False
            fsync_dir(path.parent)
        return True

    # --- reading -----------------------------------------------------------

    def stat(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        with self._errors("stat", key):
            try:
                st = os.stat(self._path(key))
            except _MISSING:
                return None
        if not stat_mod.S_ISREG(st.st_mode):
            return None
        return ObjectInfo(key, st.st_size, utc_datetime(st.st_mtime))

    def open_stream(
        self, key: str, chunk_size: int = 65536, start: int = 0, length: int | None = None
    ) -> Iterator[bytes]:
        validate_key(key)
        validate_range(chunk_size, start, length)
        fh = self._open(key)
        with self._errors("open", key):
            try:
                fh.seek(start)
            except BaseException:
                fh.close()
                raise

        def read(n: int) -> bytes:
            with self._errors("read", key):
                return fh.read(n)

        return ChunkStream(read, fh.close, chunk_size, length)

    @contextlib.contextmanager
    def fetch_to_path(self, key: str) -> Iterator[Path]:
        """Yield the object's real path: read it, never write, rename or delete it."""
        self._require(key)
        yield self._path(key)

    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Walk the tree below ``prefix``; ``last_modified`` is the file's mtime.

        Dot-files (``.tmp-*`` leftovers), foreign names and anything that is
        not a regular file are skipped, as is a file removed mid-walk.
        """
        validate_prefix(prefix)
        base, _, first = prefix.rpartition("/")
        top = self._root / base if base else self._root
        with self._errors("list", prefix):
            for dirpath, dirnames, filenames in os.walk(top, onerror=_raise_unless_missing):
                at_top = dirpath == os.fspath(top)
                dirnames[:] = [d for d in dirnames
                               if not d.startswith(".") and (not at_top or d.startswith(first))]
                rel = Path(dirpath).relative_to(self._root).as_posix()
                for name in filenames:
                    key = name if rel == "." else f"{rel}/{name}"
                    if not key.startswith(prefix) or name.startswith(".") or not is_valid_key(key):
                        continue
                    try:
                        st = os.stat(os.path.join(dirpath, name))
                    except _MISSING:
                        continue
                    if stat_mod.S_ISREG(st.st_mode):
                        yield ObjectInfo(key, st.st_size, utc_datetime(st.st_mtime))

    def remove_leftovers(self, older_than_seconds: float, *, dry_run: bool = False) -> dict[str, int]:
        """Remove ``.tmp-*`` files (writes cut short) and empty directories, each untouched for ``older_than_seconds``.

        A live write touches its temp file until it renames it; a directory
        untouched for as long has had nothing added or removed. Only
        directories whose names could be part of a key are entered, never
        through a symlink, and every name is checked and removed relative to
        its open directory (``os.fwalk``), so nothing outside the root is
        reached even while the tree changes. A write that finds its
        directory gone makes it again (:meth:`_in_directory`).
        """
        cutoff = time.time() - older_than_seconds
        counts = {"abandoned_writes": 0, "empty_directories": 0}

        def old(name: str, dir_fd: int, kind: Callable[[int], bool]) -> bool:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except _MISSING:
                return False
            return kind(st.st_mode) and st.st_mtime <= cutoff

        with self._errors("remove leftovers", ""):
            if not self._root.is_dir():
                return counts
            for _, dirnames, filenames, dir_fd in os.fwalk(os.path.realpath(self._root),
                                                           onerror=_raise_unless_missing):
                for name in filenames:
                    if name.startswith(TMP_PREFIX) and old(name, dir_fd, stat_mod.S_ISREG) \
                            and (dry_run or _gone(os.unlink, name, dir_fd)):
                        counts["abandoned_writes"] += 1
                entered = []
                for name in dirnames:
                    if name.startswith(".") or not is_valid_key(name):  # lost+found, snapshots: not ours
                        continue
                    if old(name, dir_fd, stat_mod.S_ISDIR) and (
                            _empty(name, dir_fd) if dry_run else _gone(os.rmdir, name, dir_fd)):
                        counts["empty_directories"] += 1
                        continue
                    entered.append(name)
                dirnames[:] = entered
        return counts

    # --- health ------------------------------------------------------------

    def free_space(self) -> FreeSpace | None:
        """The root's filesystem's free space and inodes, as an unprivileged writer may use them; ``None`` if they
        cannot be read (the root is not there yet: nothing is refused for that)."""
        try:
            found = os.statvfs(self._root)
        except OSError:
            return None
        return FreeSpace(found.f_bavail * found.f_frsize, found.f_favail if found.f_files else None)

    def check(self) -> None:
        """Create the root if needed and prove it writable with a probe file (no fsync: /readyz calls this)."""
        try:
            self._makedirs(self._root)
            fd, probe = tempfile.mkstemp(prefix=f"{TMP_PREFIX}check-", dir=self._root)
            try:
                os.write(fd, b"ok")
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            raise StorageUnavailable(f"not writable: {exc.strerror or type(exc).__name__}",
                                     where=self.describe()) from None

    def ensure_bucket(self) -> None:
        """Create the root directory if missing."""
        with self._errors("create root", ""):
            self._makedirs(self._root)

    # --- helpers -----------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self._root / key

    def _require(self, key: str) -> ObjectInfo:
        info = self.stat(key)
        if info is None:
            raise ObjectNotFound(f"no object {key!r}", where=self.describe())
        return info

    def _open(self, key: str) -> BinaryIO:
        """Open a regular file for unbuffered reading, or raise ObjectNotFound."""
        with self._errors("open", key):
            try:
                fh = open(self._path(key), "rb", buffering=0)  # noqa: SIM115
            except _MISSING:
                raise ObjectNotFound(f"no object {key!r}", where=self.describe()) from None
            if not stat_mod.S_ISREG(os.fstat(fh.fileno()).st_mode):
                fh.close()
                raise ObjectNotFound(f"no object {key!r}", where=self.describe())
        return fh

    def _write_atomic(self, key: str, write: Callable[[BinaryIO], int]) -> ObjectInfo:
        """Run ``write`` into a fresh temp file next to the key, then publish it."""
        path = self._path(key)
        with self._errors("put", key):
            fd, tmp = self._in_directory(path.parent, lambda: tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent))
            try:
                with os.fdopen(fd, "wb") as dst:
                    os.fchmod(dst.fileno(), FILE_MODE)
                    size = write(dst)
                    dst.flush()
                    faults.point("during_object_write")
                    os.fsync(dst.fileno())
                try:
                    os.replace(tmp, path)
                except FileNotFoundError:  # not a bad request: the same write will work
                    raise StorageUnavailable(
                        f"put {key!r}: its temp file was removed before the rename (a writer paused for longer "
                        f"than the leftovers' grace); retry", where=self.describe()) from None
            except BaseException:
                _unlink_quietly(tmp)
                raise
            fsync_dir(path.parent)
        return ObjectInfo(key, size)

    def _in_directory(self, directory: Path, place: Callable[[], T]) -> T:
        """``place()`` (a new file or a rename into ``directory``), after making the directory if missing; made
        again if the leftovers' sweep took it, empty, in between."""
        for _ in range(3):
            self._makedirs(directory)
            try:
                return place()
            except FileNotFoundError:
                continue
        raise StorageUnavailable(f"directory {directory.relative_to(self._root).as_posix()!r} keeps disappearing; "
                                 "retry", where=self.describe())

    def _makedirs(self, directory: Path) -> None:
        """Create ``directory`` and missing parents, fsyncing each new entry's parent."""
        if directory.is_dir():
            return
        missing = []
        while not directory.exists() and directory != directory.parent:
            missing.append(directory)
            directory = directory.parent
        for new in reversed(missing):
            try:
                os.mkdir(new)
            except FileExistsError:
                continue
            fsync_dir(new.parent)

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Translate ``OSError`` raised inside the block into an :mod:`app.errors` error."""
        try:
            yield
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            cls = StorageUnavailable if exc.errno in _TRANSIENT_ERRNOS else StorageError
            raise cls(f"{op} {key!r} failed: {reason}", where=self.describe()) from None


def _copy_chunks(src: BinaryIO, dst: BinaryIO) -> int:
    """Copy ``src`` to ``dst`` in bounded chunks; return the byte count."""
    size = 0
    while chunk := src.read(COPY_CHUNK):
        dst.write(chunk)
        size += len(chunk)
    return size


def _clone(src: BinaryIO, dst: BinaryIO) -> int:
    """Copy the rest of ``src`` (unbuffered) into ``dst`` (nothing buffered yet); return the byte count.

    ``copy_file_range`` keeps the bytes in the kernel. Both files' offsets
    advance with it, so whatever it did not copy (a filesystem pair that
    cannot: EXDEV, ENOSYS, EINVAL...; or one that reports 0 bytes early)
    is then copied in user space by :func:`_copy_chunks`.
    """
    copied = 0
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        try:
            while n := copy_range(src.fileno(), dst.fileno(), COPY_RANGE_CHUNK):
                copied += n
        except OSError as exc:
            if exc.errno not in _NO_COPY_RANGE:
                raise
    return copied + _copy_chunks(src, dst)


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (a rename, link, unlink or mkdir) durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # fs without directory fsync
            raise
    finally:
        os.close(fd)


def _gone(remove: Callable[..., None], name: str, dir_fd: int) -> bool:
    """``remove(name, dir_fd=dir_fd)``; False if it was already gone or (a directory) is not empty."""
    try:
        remove(name, dir_fd=dir_fd)
    except _MISSING:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    return True


def _empty(name: str, dir_fd: int) -> bool:
    """Whether the directory ``name`` has no entries (False if it is gone)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except _MISSING:
        return False
    try:
        return not os.listdir(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str | os.PathLike) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _raise_unless_missing(exc: OSError) -> None:
    """``os.walk`` error hook: a missing directory is empty, anything else fails."""
    if not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        raise exc
