"""Receiving an upload: stream to a spool file, hash on the way, enforce the size limit.

The body is never held in memory: it is written to a temporary file in
chunks while SHA-256 and MD5 are computed, and the limit is enforced as
bytes arrive, so an oversized upload is refused without reading it all.
Digest headers (RFC 9530 ``Content-Digest`` with ``sha-256``, and
``Content-MD5``) are checked against the bytes received.

A spool never takes its filesystem below ``min_free_bytes`` free
(``ATTACHE_SPOOL_MIN_FREE_BYTES``): a body that would is refused as a full
disk is (``503`` + ``Retry-After``), before its first byte when its
declared length alone would. On the filesystem backend the spool shares
its disk with the storage (the staged original is the spool file, moved in
by rename), so a client trickling a large body, or many at once, could
otherwise fill the disk the workers write the accepted uploads' variants
to, and hold it full for as long as they keep sending.

On that disk the floor alone was not enough: the room the unfinished jobs
hold (:mod:`app.core.room`, checked at the upload's commit, after its
body) was the spool's to take. Two raw POSTs of one uploader, sized to the
free space less the floor and trickled a byte every 4 s, held it while
five jobs accepted before them waited: 3 of the 5 ended ``failed
storage_unavailable`` (an adversarial run, twice). A spool whose directory
is on the storage's filesystem (:func:`same_disk`) leaves free the floor
and that room, as its process read it last (``held``: no query on a
write); with ``min_free_bytes`` 0, neither.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
import time
from pathlib import Path
from typing import IO, Callable

from app.core.intake import SPOOL_REMOVED, Received
from app.errors import DigestMismatch, SpoolUnavailable, UploadRejected, UploadTooLarge

CHUNK = 64 * 1024
SPOOL_PREFIX = "attache-upload-"


NEARLY_FULL = "the server's disk is nearly full; retry later"
HELD = "the server's disk is keeping its room for the uploads already accepted; retry later"


def _keep_free(filesystem: os.statvfs_result, more: int, min_free_bytes: int, held: int = 0) -> None:
    """Refuse ``more`` bytes that would leave less than ``min_free_bytes`` free (what an unprivileged writer may
    still use: a web running as root would otherwise eat the reserved blocks too), or less than that and ``held``,
    the room the unfinished jobs hold on this disk."""
    free = filesystem.f_bavail * filesystem.f_frsize - more
    if free < min_free_bytes:
        raise SpoolUnavailable(NEARLY_FULL)
    if free < min_free_bytes + held:
        raise SpoolUnavailable(HELD)


def _device(path) -> int | None:
    """The device of ``path``, or of its nearest ancestor there (a storage root not made yet is made there)."""
    path = Path(os.path.abspath(path))
    for each in (path, *path.parents):
        try:
            return os.stat(each).st_dev
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return None
    return None


def same_disk(directory: str, root) -> bool:
    """``directory`` (a spool's) is on the filesystem of ``root`` (the file storage's): two ``stat`` calls."""
    device = _device(directory)
    return device is not None and device == _device(root)


def _spool_file(directory: str, min_free_bytes: int, expected_bytes: int, held: int = 0) -> tuple[int, str]:
    """A new spool file in ``directory``, made again if it is gone: a temporary directory a cleaner removed (the
    object GC removed an empty one under the storage root, a tmp cleaner may too) failed every upload with 503 until
    the web restarted, ``/readyz`` ready all along (an adversarial run)."""
    for again in (True, False):
        try:
            if min_free_bytes:
                _keep_free(os.statvfs(directory), expected_bytes, min_free_bytes, held)
            return tempfile.mkstemp(prefix=SPOOL_PREFIX, dir=directory)
        except FileNotFoundError:
            if not again:
                raise
            os.makedirs(directory, mode=0o700, exist_ok=True)
    raise AssertionError("unreachable")


def check_directory(directory: str | None = None) -> None:
    """Prove the spool's directory takes a file (made again if it is gone), for ``/readyz``: a temporary directory
    replaced by a file, or by a symlink to nothing, refused every upload with 503 while the web said it was ready
    (an adversarial run)."""
    try:
        fd, name = _spool_file(directory or tempfile.gettempdir(), 0, 0)
    except OSError as exc:
        raise SpoolUnavailable(f"the temporary directory cannot hold an upload ({exc.strerror})") from None
    os.close(fd)
    os.unlink(name)


class HashingSpool:
    """A write-only file object that spools to disk, hashes and counts.

    Werkzeug's multipart parser writes the ``file`` part straight into it
    (see :class:`app.web.request.UploadRequest`), and raw bodies are copied
    into it by :func:`spool_stream`.
    """

    def __init__(self, max_bytes: int, directory: str | None = None, *, md5: bool = False,
                 min_free_bytes: int = 0, expected_bytes: int = 0, held: Callable[[], int] | None = None):
        """``md5``: also compute the MD5 digest, for a ``Content-MD5`` to check (it costs twice the
        SHA-256 here: 7 ms of CPU for 5 MB, against 3.6 ms), else ``Received.md5`` is ``None``.
        ``min_free_bytes``: the free space every write leaves on the spool's filesystem (0: none);
        ``expected_bytes``: what the body says it will bring, refused at once if that alone would cross it;
        ``held``: the room the unfinished jobs hold on this filesystem (the storage's), left free with the floor
        (asked on each write: it must cost no query)."""
        self.max_bytes = max_bytes
        self.min_free_bytes = min_free_bytes
        self._held = held if min_free_bytes else None
        directory = directory or tempfile.gettempdir()
        try:
            fd, name = _spool_file(directory, min_free_bytes, min(expected_bytes, max_bytes),
                                   self._held() if self._held is not None else 0)
        except OSError as exc:
            raise SpoolUnavailable(f"cannot hold the upload right now ({exc.strerror}); retry later") from None
        self.path = Path(name)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: never waits. Held while the file is open,
        self._file = os.fdopen(fd, "w+b")  # and by nothing once its process is gone (remove_abandoned_spools)
        self._sha256 = hashlib.sha256()
        self._md5 = hashlib.md5(usedforsecurity=False) if md5 else None
        self.size = 0
        self.head = b""

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.max_bytes:
            raise UploadTooLarge(f"the upload is larger than the limit of {self.max_bytes} bytes")
        if len(self.head) < 64:
            self.head += data[: 64 - len(self.head)]
        self._sha256.update(data)
        if self._md5 is not None:
            self._md5.update(data)
        try:
            if self.min_free_bytes:
                _keep_free(os.fstatvfs(self._file.fileno()), len(data), self.min_free_bytes,
                           self._held() if self._held is not None else 0)
            return self._file.write(data)
        except OSError as exc:  # the temporary directory is full: nothing is wrong with the upload
            raise SpoolUnavailable(f"cannot hold the upload right now ({exc.strerror}); retry later") from None

    # werkzeug treats the stream as a file object
    def seek(self, *args):
        return self._file.seek(*args)

    def read(self, *args):
        return self._file.read(*args)

    def tell(self):
        return self._file.tell()

    def flush(self):
        self._file.flush()

    def finish(self) -> "Received":
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            removed = os.fstat(self._file.fileno()).st_nlink == 0
            self._file.close()
        except OSError as exc:
            raise SpoolUnavailable(f"cannot hold the upload right now ({exc.strerror}); retry later") from None
        if removed:  # a process paused for ten idle periods: another one took the spool for abandoned
            raise SpoolUnavailable(SPOOL_REMOVED)
        return Received(self.path, self.size, self._sha256.hexdigest(),
                        self._md5.digest() if self._md5 is not None else None, self.head)

    def discard(self) -> None:
        """Close and remove the file. A buffered tail that cannot be written (a full disk) is dropped with it:
        closing raised ``ENOSPC`` out of the request's end, and the client got a dropped connection, not the
        ``503`` of the write that failed first."""
        try:
            with contextlib.suppress(OSError):
                self._file.close()
        finally:
            self.path.unlink(missing_ok=True)

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        # werkzeug may close the part stream; the spool is finished explicitly
        pass


def remove_abandoned_spools(older_than_seconds: float, directory: str | None = None) -> int:
    """Remove spool files nobody has written to for ``older_than_seconds`` and no process holds; returns how many.

    A request removes its own spools when it ends, but a process killed
    mid-upload (SIGKILL, the OOM killer, gunicorn's graceful timeout) leaves
    its spool behind; several web processes may share the directory. A
    spool's request holds a lock on it (``flock``) for as long as it has it
    open, and the kernel drops the lock with the process: a spool untouched
    for many ``ATTACHE_BODY_IDLE_SECONDS`` whose lock can be taken belongs to
    no request. By its age alone, a live upload's spool went too: the body
    is read a block (1 MiB) at a time, and the spool written only when a
    block is whole, so a client sending steadily at under a block per ten
    idle periods (1.7 KB/s with the defaults) saw its spool removed while
    it sent, and its whole body answered ``503`` (an adversarial run). A
    process paused for that long (SIGSTOP, a frozen VM) keeps its lock,
    and its spool, too. A spool its request has closed (finished, to be
    moved into storage) is held by nobody: one removed then is a ``503`` to
    retry (:func:`app.core.intake.stage`), as it always was.
    """
    root = Path(directory or tempfile.gettempdir())
    now = time.time()
    removed = 0
    for path in root.glob(SPOOL_PREFIX + "*"):
        try:
            if now - path.stat().st_mtime >= older_than_seconds and _unheld_removed(path):
                removed += 1
        except FileNotFoundError:  # its request, or another process, removed it first
            continue
    return removed


def _unheld_removed(path: Path) -> bool:
    """Remove ``path`` if no open spool holds its lock; whether it did."""
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its request's, alive (or paused)
            return False
        path.unlink()
        return True
    finally:
        os.close(fd)


def spool_stream(stream: IO[bytes], spool: HashingSpool) -> None:
    while True:
        chunk = stream.read(CHUNK)
        if not chunk:
            return
        spool.write(chunk)


#: a member's parameter (RFC 8941 3.1.2): ``;key`` or ``;key=`` a token, number, byte sequence or string without
#: a comma (a comma inside a string would split the member; no digest parameter is registered)
_PARAMETER = (r';\s*[a-z*][a-z0-9_.*-]*'  # its key, then its value: a token, a number, bytes, a boolean, a string
              r'(?:=(?:[A-Za-z*][!#$%&\'*+.^_`|~:/A-Za-z0-9-]*|-?[0-9.]+|:[A-Za-z0-9+/=]*:|\?[01]|"[^",]*"))?')
_DIGEST_ITEM = re.compile(rf"\s*([a-z0-9-]+)\s*=\s*:([A-Za-z0-9+/=]*):(?:{_PARAMETER})*\s*")


def parse_content_digest(header: str, name: str = "Content-Digest") -> dict[str, bytes]:
    """RFC 9530 ``Content-Digest`` or ``Repr-Digest`` (``name``): a structured-field dictionary of byte sequences.
    A member's parameters are allowed and ignored (``sha-256=:...:;x=1`` was refused, an adversarial run)."""
    result: dict[str, bytes] = {}
    for item in header.split(","):
        match = _DIGEST_ITEM.fullmatch(item)
        if not match:
            raise UploadRejected(f"malformed {name} header", error_code="bad_digest_header")
        try:
            value = base64.b64decode(match.group(2), validate=True)
        except ValueError:
            raise UploadRejected(f"malformed {name} value", error_code="bad_digest_header") from None
        algorithm = match.group(1).lower()
        if result.setdefault(algorithm, value) != value:  # the header sent twice: the last one alone was checked
            raise UploadRejected(f"{name} names {algorithm} twice, with two values", error_code="bad_digest_header")
    return result


def sha256_of(header: str, name: str) -> str:
    """The ``sha-256`` an RFC 9530 digest header (``name``) carries, as hex; the only algorithm checked."""
    digests = parse_content_digest(header, name)
    if "sha-256" not in digests:
        raise UploadRejected(f"{name} carries no supported algorithm (sha-256)", error_code="unsupported_digest")
    if len(digests["sha-256"]) != 32:
        raise UploadRejected(f"{name} sha-256 is not 32 bytes long", error_code="bad_digest_header")
    return digests["sha-256"].hex()


def verify_digests(received: Received, *, content_digest: str | None, content_md5: str | None,
                   repr_digest: str | None = None) -> None:
    """A header sent is checked, an empty one too (refused as malformed: it was taken for no header, when a
    Content-Digest naming only another algorithm is refused); an MD5 that is not 16 bytes is malformed, not a
    mismatch (a hex MD5 was answered ``422 digest_mismatch``: an adversarial run). ``repr_digest``: a
    ``Repr-Digest``, the whole file's (the bytes are stored as sent, no content coding), which a resumable upload's
    creation checked and a POST ignored (an adversarial run)."""
    for name, header in (("Content-Digest", content_digest), ("Repr-Digest", repr_digest)):
        if header is not None and sha256_of(header, name) != received.sha256:
            raise DigestMismatch(f"{name} sha-256 does not match the bytes received")
    if content_md5 is not None:
        try:
            expected = base64.b64decode(content_md5.strip(), validate=True)
        except ValueError:  # binascii.Error, and non-ASCII text
            raise UploadRejected("malformed Content-MD5 header", error_code="bad_digest_header") from None
        if len(expected) != 16:
            raise UploadRejected("Content-MD5 is not the base64 of 16 bytes", error_code="bad_digest_header")
        if received.md5 is None:  # the spool was made without it: a bug, never a pass
            raise RuntimeError("Content-MD5 to check, but the spool computed no MD5")
        if expected != received.md5:
            raise DigestMismatch("Content-MD5 does not match the bytes received")
