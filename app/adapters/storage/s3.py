"""Object storage in an S3 bucket, through the ``minio`` client.

The client runs on a urllib3 pool with short timeouts and a small retry
budget, so an unreachable endpoint fails in seconds rather than minutes.
Every minio/urllib3/socket exception is translated by :meth:`S3Storage._errors`
into :mod:`app.errors`; messages name the bucket, the operation, the key and
an S3 error code or exception class, never credentials or request URLs.
The bucket is never created implicitly; call :meth:`S3Storage.ensure_bucket`.

Each call has a deadline on the whole of it (:class:`CallDeadlines`): urllib3's read timeout bounds one read,
and an endpoint answering a byte every few seconds was never cut (an adversarial run: uploads held 200-240 s,
then committed after their clients had given up; a worker's step past its limit, the process then lost).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import certifi
import urllib3
import urllib3.connection
from minio import Minio
from minio.commonconfig import CopySource
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError
from minio.helpers import check_bucket_name

from app.adapters import watchdog
from app.errors import ObjectNotFound, StorageError, StorageUnavailable

from .base import (
    ChunkStream,
    ObjectInfo,
    Storage,
    is_valid_key,
    utc_datetime,
    validate_key,
    validate_prefix,
    validate_range,
)

DEFAULT_ENDPOINT = "https://s3.amazonaws.com"
DEFAULT_CONTENT_TYPE = "application/octet-stream"
DOWNLOAD_CHUNK = 1024 * 1024

_MISSING_CODES = {"NoSuchKey", "NoSuchObject", "NoSuchVersion"}
_TRANSIENT_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout",
                    "RequestTimeTooSkewed", "OperationAborted"}
_VENDOR_ERRORS = (MinioException, urllib3.exceptions.HTTPError, OSError)


#: the methods the pool sends again after a 5xx or a lost answer: not DELETE. A DELETE whose answer was lost may still
#: be carried out later; sent again and answered, it told the object GC the removal was done, which cleared its
#: decision; the key, written again by a replay, was then removed by the first DELETE landing late under a
#: ``ready`` attachment (an adversarial run). Unanswered, the removal raises and its decision stays on record
#: (``app.core.objects``: the key is tainted before it is written again).
RETRIED_METHODS = frozenset({"GET", "HEAD", "PUT", "OPTIONS"})


log = logging.getLogger("attache.storage")

#: a call's deadline: what three attempts of a read timed out at 30 s took before
CALL_SECONDS = 90.0
#: a transfer's slowest pace, on top of :data:`CALL_SECONDS`: a put or a read of n bytes may take n / this longer
SLOWEST_BYTES_PER_SECOND = 256 * 1024


class _Call:
    """One call to the store: when it began, its deadline, whether the watchdog cut it."""

    def __init__(self, seconds: float):
        self.began, self.seconds, self.cut = time.monotonic(), seconds, False


class CallDeadlines:
    """The calls to the store in flight in this process, and the connections each thread has from the pool: the
    watchdog (:mod:`app.adapters.watchdog`) shuts down the connections of a thread whose call is past its deadline,
    every second until the call ends (a retry's new connection too), and the call fails, whatever it read (a cut
    mid-answer can read as an answer ended: a HEAD's headers cut short)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, _Call] = {}  # by thread
        self._connections: dict[int, weakref.WeakSet] = {}
        #: the sockets each thread connected while it had their connection: an answer with ``Connection: close``
        #: is read from its socket after http.client has let its connection go (``sock`` None: a re-attack's
        #: streamed GET was never cut)
        self._sockets: dict[int, weakref.WeakSet] = {}
        watchdog.watch(self)

    @contextlib.contextmanager
    def call(self, seconds: float) -> Iterator[_Call]:
        thread, call = threading.get_ident(), _Call(seconds)
        with self._lock:
            outer = self._calls.get(thread)
            self._calls[thread] = call
        try:
            yield call
        finally:
            with self._lock:
                if outer is None:
                    self._calls.pop(thread, None)
                else:
                    self._calls[thread] = outer

    def checked_out(self, connection) -> None:
        with self._lock:
            self._connections.setdefault(threading.get_ident(), weakref.WeakSet()).add(connection)

    def connected(self, sock) -> None:
        with self._lock:
            self._sockets.setdefault(threading.get_ident(), weakref.WeakSet()).add(sock)

    def returned(self, connection) -> None:
        sock = getattr(connection, "sock", None)
        with self._lock:
            for held in self._connections.values():
                held.discard(connection)
            if sock is not None:  # back in the pool, for any thread: no longer this one's (a closed one is passed by)
                for held in self._sockets.values():
                    held.discard(sock)

    def cut_the_late(self) -> None:
        now, cut = time.monotonic(), []
        with self._lock:
            for thread, call in self._calls.items():
                if now - call.began < call.seconds:
                    continue
                socks = {getattr(conn, "sock", None) for conn in self._connections.get(thread, ())}
                socks.update(self._sockets.get(thread, ()))
                cut += [sock for sock in socks if sock is not None]
                if not call.cut:
                    call.cut = True
                    log.warning("a call to the store has taken %.0f s, its deadline: its connection is cut",
                                call.seconds)
            for sock in cut:  # by the socket, not its number: one closed meanwhile is passed by, not another's
                with contextlib.suppress(OSError):  # the plain socket's shutdown, whatever TLS wraps it
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)


DEADLINES = CallDeadlines()


class _Watched:
    """A connection pool whose connections are counted as their thread's while it has them (:class:`CallDeadlines`)."""

    def _get_conn(self, timeout=None):
        conn = super()._get_conn(timeout)
        DEADLINES.checked_out(conn)
        return conn

    def _put_conn(self, conn) -> None:
        if conn is not None:
            DEADLINES.returned(conn)
        super()._put_conn(conn)


class _Connected:
    """A connection whose socket is counted as its thread's once connected (:meth:`CallDeadlines.connected`)."""

    def connect(self) -> None:
        super().connect()
        DEADLINES.connected(self.sock)


class _WatchedHTTPConnection(_Connected, urllib3.connection.HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Connected, urllib3.connection.HTTPSConnection):
    pass


class _WatchedHTTPConnectionPool(_Watched, urllib3.HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSConnectionPool(_Watched, urllib3.HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


def make_http_client(connect_timeout: float = 3.0, read_timeout: float = 30.0,
                     retries: int = 2) -> urllib3.PoolManager:
    """A connection pool that gives up quickly and retries 5xx answers a little (:data:`RETRIED_METHODS`), its
    connections watched for their calls' deadlines."""
    manager = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
        retries=urllib3.Retry(total=retries, backoff_factor=0.2, allowed_methods=RETRIED_METHODS,
                              status_forcelist=[500, 502, 503, 504], raise_on_status=False),
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
    )
    manager.pool_classes_by_scheme = {"http": _WatchedHTTPConnectionPool, "https": _WatchedHTTPSConnectionPool}
    return manager


class S3Storage(Storage):
    """Objects in one bucket of an S3-compatible service."""

    def __init__(self, bucket: str, *, endpoint: str = DEFAULT_ENDPOINT, access_key: str = "",
                 secret_key: str = "", region: str | None = None,
                 http_client: urllib3.PoolManager | None = None, tmp_dir: str | None = None):
        """Raise ``ValueError`` for a malformed bucket name or endpoint (no network I/O)."""
        check_bucket_name(bucket, strict=True)
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("S3 endpoint must be http://HOST[:PORT] or https://HOST[:PORT]")
        if parts.username or parts.password or parts.path not in ("", "/") or parts.query:
            raise ValueError("S3 endpoint must not carry credentials, a path or a query")
        self.bucket = bucket
        self._region = region or None
        self._tmp_dir = tmp_dir
        self._client = Minio(
            parts.netloc,
            access_key=access_key or None,
            secret_key=secret_key or None,
            secure=parts.scheme == "https",
            region=self._region,
            http_client=http_client or make_http_client(),
        )

    def describe(self) -> str:
        return f"s3://{self.bucket}"

    def presigned_url(self, key: str, expires_seconds: int, *, content_type: str | None = None,
                      content_disposition: str | None = None) -> str | None:
        """A presigned GET, with the response headers signed in: computed locally once the bucket's region is
        known (``region=`` in ``STORAGE_URL``); without one, the client asks the store for it first (and again
        until it answers)."""
        from datetime import timedelta

        validate_key(key)
        overrides = {name: value for name, value in (("response-content-type", content_type),
                                                     ("response-content-disposition", content_disposition)) if value}
        with self._errors("presign", key):
            return self._client.presigned_get_object(self.bucket, key, expires=timedelta(seconds=expires_seconds),
                                                     response_headers=overrides or None)

    # --- writing -----------------------------------------------------------

    def put_file(self, key: str, path: str | os.PathLike, content_type: str | None = None) -> ObjectInfo:
        """Upload with a known length (multipart above 5 MiB); visible only when complete."""
        validate_key(key)
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise StorageError(f"put {key!r}: cannot read source file: {exc.strerror or type(exc).__name__}",
                               where=self.describe()) from None
        size = os.fstat(src.fileno()).st_size
        with src, self._errors("put", key, reading=False, size=size):
            self._client.put_object(self.bucket, key, src, size,
                                    content_type=content_type or DEFAULT_CONTENT_TYPE,
                                    num_parallel_uploads=1)
        return ObjectInfo(key, size)

    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> ObjectInfo:
        validate_key(key)
        data = bytes(data)
        with self._errors("put", key, reading=False, size=len(data)):
            self._client.put_object(self.bucket, key, io.BytesIO(data), len(data),
                                    content_type=content_type or DEFAULT_CONTENT_TYPE,
                                    num_parallel_uploads=1)
        return ObjectInfo(key, len(data))

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        """Server-side copy (``CopyObject``); the source is stat'ed by minio first."""
        validate_key(src_key)
        validate_key(dst_key)
        if src_key != dst_key:
            with self._errors("copy", src_key):
                self._client.copy_object(self.bucket, dst_key, CopySource(self.bucket, src_key))
        info = self.stat(dst_key)
        if info is None:
            raise ObjectNotFound(f"no object {dst_key!r}", where=self.describe())
        return info

    def delete(self, key: str) -> bool:
        """Stat then delete (S3's DeleteObject cannot say whether anything was there)."""
        validate_key(key)
        if self.stat(key) is None:
            return False
        with self._errors("delete", key, reading=False):
            self._client.remove_object(self.bucket, key)
        return True

    # --- reading -----------------------------------------------------------

    def stat(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        try:
            with self._errors("stat", key):
                obj = self._client.stat_object(self.bucket, key)
        except ObjectNotFound:
            return None
        return ObjectInfo(key, int(obj.size or 0), utc_datetime(obj.last_modified))

    def open_stream(
        self, key: str, chunk_size: int = 65536, start: int = 0, length: int | None = None
    ) -> Iterator[bytes]:
        """GET with a ``Range`` header; the response is closed when the iterator is."""
        validate_key(key)
        validate_range(chunk_size, start, length)
        if length == 0:
            if self.stat(key) is None:
                raise ObjectNotFound(f"no object {key!r}", where=self.describe())
            return ChunkStream.empty()
        with self._errors("get", key):
            try:
                resp = self._client.get_object(self.bucket, key, offset=start, length=length or 0)
            except S3Error as exc:
                if exc.code != "InvalidRange":
                    raise
                return ChunkStream.empty()  # the object exists, but ``start`` is at or past its end
        if start and resp.status != 206:
            _release(resp)
            raise StorageError(f"get {key!r}: server ignored the byte range", where=self.describe())

        def read(n: int) -> bytes:
            with self._errors("read", key, size=n):
                return resp.read(n, decode_content=False)

        return ChunkStream(read, lambda: _release(resp), chunk_size, length)

    @contextlib.contextmanager
    def fetch_to_path(self, key: str) -> Iterator[Path]:
        """Download into a temp file with no name, yield a path this process can open it by.

        The file is unlinked from its creation (``O_TMPFILE`` where the
        filesystem has it), so a worker killed while it renders (SIGKILL, the
        OOM killer) leaves nothing in the temp directory: the kernel frees the
        bytes with the process's last descriptor. Before, each such kill left
        a copy of an original there for good. The path is ``/proc/self/fd/N``
        (Linux): valid in this process, until the block ends.
        """
        stream = self.open_stream(key, chunk_size=DOWNLOAD_CHUNK)
        try:
            with contextlib.closing(stream):
                local = tempfile.TemporaryFile(prefix=".tmp-attache-", dir=self._tmp_dir)  # noqa: SIM115
                try:
                    for chunk in stream:
                        local.write(chunk)
                    local.flush()
                except BaseException:
                    local.close()
                    raise
        except OSError as exc:  # the local temp file, not the network
            raise StorageUnavailable(f"fetch {key!r}: local temp file failed: {exc.strerror or type(exc).__name__}",
                                     where=self.describe()) from None
        with local:
            yield Path(f"/proc/self/fd/{local.fileno()}")

    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """``ListObjectsV2`` (recursive, paged by minio): each entry carries size and LastModified."""
        validate_prefix(prefix)
        with self._errors("list", prefix, reading=False):  # no request yet: minio's listing fetches as it is read
            objects = iter(self._client.list_objects(self.bucket, prefix=prefix or None, recursive=True))
        while True:
            with self._errors("list", prefix, reading=False):  # a deadline for each page's fetch, not its reader's
                obj = next(objects, None)
            if obj is None:
                return
            name = obj.object_name
            if not obj.is_dir and name and name.startswith(prefix) and is_valid_key(name):
                yield ObjectInfo(name, int(obj.size or 0), utc_datetime(obj.last_modified))

    # --- health ------------------------------------------------------------

    def check(self) -> None:
        """HEAD the bucket: missing, forbidden or unreachable all mean unavailable."""
        try:
            with self._errors("check", "", reading=False):
                exists = self._client.bucket_exists(self.bucket)
        except StorageError as exc:
            raise StorageUnavailable(exc.detail, where=exc.where) from None
        if not exists:
            raise StorageUnavailable("bucket does not exist", where=self.describe())

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (for ``make up`` and tests)."""
        with self._errors("create bucket", "", reading=False):
            if self._client.bucket_exists(self.bucket):
                return
            try:
                self._client.make_bucket(self.bucket, location=self._region)
            except S3Error as exc:
                if exc.code != "BucketAlreadyOwnedByYou":
                    raise

    # --- errors ------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, op: str, key: str, *, reading: bool = True, size: int = 0) -> Iterator[None]:
        """Translate vendor exceptions raised inside the block, which has a deadline (:data:`CALL_SECONDS`, and
        ``size`` bytes at :data:`SLOWEST_BYTES_PER_SECOND`; a streamed read's each chunk, a listing's each page).

        With ``reading`` a missing bucket reads as a missing object; otherwise
        it means the store is unavailable.
        """
        seconds = CALL_SECONDS + size / SLOWEST_BYTES_PER_SECOND
        error: StorageError | None = None
        try:
            with DEADLINES.call(seconds) as call:
                yield
        except _VENDOR_ERRORS as exc:
            error = self._translate(exc, f"{op} {key!r} failed", self.describe(), reading)
        if call.cut:  # cut by the watchdog: whatever it raised or read (an answer may read as ended)
            error = StorageUnavailable(f"{op} {key!r} failed: no answer within {seconds:.0f} s", where=self.describe())
        if error is not None:
            raise error from None

    @staticmethod
    def _translate(exc: BaseException, what: str, where: str, reading: bool) -> StorageError:
        if isinstance(exc, S3Error):
            status = getattr(exc.response, "status", None) or 0
            detail = f"{what}: {exc.code} (HTTP {status})"
            if exc.code in _MISSING_CODES or (reading and exc.code == "NoSuchBucket"):
                err: StorageError = ObjectNotFound(detail, where=where)
            elif exc.code == "NoSuchBucket" or exc.code in _TRANSIENT_CODES or status >= 500:
                err = StorageUnavailable(detail, where=where)
            else:
                err = StorageError(detail, where=where)
            return err
        if isinstance(exc, (ServerError, InvalidResponseError)):
            status = exc.status_code if isinstance(exc, ServerError) else exc._code  # noqa: SLF001
            cls = StorageUnavailable if (status or 0) >= 500 else StorageError
            return cls(f"{what}: HTTP {status} from server", where=where)
        if isinstance(exc, urllib3.exceptions.MaxRetryError):
            reason = type(exc.reason).__name__ if exc.reason else "MaxRetryError"
            return StorageUnavailable(f"{what}: endpoint unreachable ({reason})", where=where)
        if isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)):
            return StorageUnavailable(f"{what}: connection failed ({type(exc).__name__})", where=where)
        if isinstance(exc, OSError):
            return StorageError(f"{what}: {exc.strerror or type(exc).__name__}", where=where)
        return StorageError(f"{what}: {type(exc).__name__}", where=where)


def _release(resp: urllib3.BaseHTTPResponse) -> None:
    """Close a streamed response and hand its connection back to the pool."""
    resp.close()
    resp.release_conn()
