"""Tests for app.adapters.storage: one suite run against both backends.

The S3 backend talks real HTTP, through minio and urllib3, to moto's
``ThreadedMotoServer`` started here on 127.0.0.1 and an ephemeral port.
Error-path tests use a closed port, a socket that never answers, and a tiny
HTTP server that answers with fixed S3 error documents.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import http.server
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from app.adapters.storage import ObjectInfo, Storage, storage_from_url, validate_key
from app.adapters.storage import filesystem as fs_module
from app.adapters.storage.filesystem import FilesystemStorage
from app.adapters.storage.s3 import S3Storage, make_http_client
from app.errors import ConfigError, ObjectNotFound, StorageError, StorageUnavailable
from tests.s3server import moto_server

REPO = Path(__file__).resolve().parents[1]

ACCESS_KEY = "AKIATESTACCESSKEY"
SECRET_KEY = "s3cr3t-never-in-messages"
KEY = "staging/3f1c2a9e-0d7b-4f59-9a52-7c1b2e4d5f60"


# --- fixtures ---------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_endpoint():
    with moto_server() as endpoint:
        yield endpoint


def _s3(moto_endpoint: str, bucket: str | None = None) -> S3Storage:
    bucket = bucket or f"attache-test-{uuid.uuid4().hex[:12]}"
    return storage_from_url(f"s3://{bucket}?endpoint={moto_endpoint}",
                            access_key=ACCESS_KEY, secret_key=SECRET_KEY)


@pytest.fixture(params=["filesystem", "s3"])
def storage(request, tmp_path) -> Storage:
    """Each backend, empty: a fresh root directory or a fresh moto bucket."""
    if request.param == "filesystem":
        store = storage_from_url(f"file://{tmp_path / 'objects'}")
    else:
        store = _s3(request.getfixturevalue("moto_endpoint"))
    store.ensure_bucket()
    return store


def _read(store: Storage, key: str, **kwargs) -> bytes:
    return b"".join(store.open_stream(key, **kwargs))


def _tmp_leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".tmp-")]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- key validation ---------------------------------------------------------

GOOD_KEYS = [
    "staging/3f1c2a9e-0d7b-4f59-9a52-7c1b2e4d5f60",
    "attachments/3f1c2a9e-0d7b-4f59-9a52-7c1b2e4d5f60/original/" + "a" * 64,
    "attachments/3f1c2a9e-0d7b-4f59-9a52-7c1b2e4d5f60/v1/thumbnail-0af3.jpg",
    "x",
    "a" * 512,
]
BAD_KEYS = [
    "../etc/passwd", "staging/../x", "/abs", "a//b", "Staging/x", "staging/X.jpg",
    "a\x00b", "staging/x\n", "", "a/", "-a", ".hidden", "a/./b", "a/.tmp-x",
    "a b", "a\\b", "a" * 513, "staging/é",
]


@pytest.mark.parametrize("key", GOOD_KEYS)
def test_validate_key_accepts_server_keys(key):
    assert validate_key(key) == key


@pytest.mark.parametrize("key", BAD_KEYS)
def test_validate_key_rejects(key):
    with pytest.raises(ValueError):
        validate_key(key)


def test_validate_key_rejects_non_strings():
    with pytest.raises(ValueError):
        validate_key(b"staging/x")


@pytest.mark.parametrize("key", ["../etc/passwd", "staging/../x", "/abs", "a//b", "Upper", "a\x00b"])
def test_every_method_validates_keys(storage, key, tmp_path):
    storage.put_bytes("staging/ok", b"ok")
    calls = [
        lambda: storage.put_bytes(key, b"x"),
        lambda: storage.put_file(key, __file__),
        lambda: storage.stat(key),
        lambda: storage.open_stream(key),
        lambda: storage.fetch_to_path(key).__enter__(),
        lambda: storage.copy(key, "staging/dst"),
        lambda: storage.copy("staging/ok", key),
        lambda: storage.delete(key),
    ]
    for call in calls:
        with pytest.raises(ValueError):
            call()
    assert sorted(storage.list_keys()) == ["staging/ok"]
    assert not (tmp_path / "etc").exists() and not Path("/abs").exists()


# --- round trip -------------------------------------------------------------


def test_round_trip(storage, tmp_path):
    data = b"photo bytes " * 1000
    assert storage.put_bytes(KEY, data, content_type="image/jpeg") == ObjectInfo(KEY, len(data))
    assert storage.stat(KEY) == ObjectInfo(KEY, len(data))
    assert _read(storage, KEY) == data

    with storage.fetch_to_path(KEY) as path:
        with open(path, "rb") as fh:
            fh.seek(-4, os.SEEK_END)
            assert fh.read() == b"tes "
            fh.seek(0)
            assert fh.read() == data

    dst = "attachments/3f1c2a9e-0d7b-4f59-9a52-7c1b2e4d5f60/original/" + hashlib.sha256(data).hexdigest()
    assert storage.copy(KEY, dst) == ObjectInfo(dst, len(data))
    assert _read(storage, dst) == data
    assert sorted(storage.list_keys()) == sorted([KEY, dst])

    assert storage.delete(KEY) is True
    assert storage.delete(KEY) is False
    assert storage.stat(KEY) is None
    assert list(storage.list_keys()) == [dst]
    assert _read(storage, dst) == data


def test_put_file_and_replace(storage, tmp_path):
    src = tmp_path / "upload.bin"
    src.write_bytes(b"first version")
    assert storage.put_file(KEY, src) == ObjectInfo(KEY, 13)
    src.write_bytes(b"second")
    assert storage.put_file(KEY, str(src), content_type="image/png") == ObjectInfo(KEY, 6)
    assert _read(storage, KEY) == b"second"
    assert storage.put_bytes(KEY, b"") == ObjectInfo(KEY, 0)
    assert storage.stat(KEY) == ObjectInfo(KEY, 0)
    assert _read(storage, KEY) == b""


def test_an_adopted_file_is_stored_and_given_up(storage, tmp_path):
    src = tmp_path / "spool.bin"
    src.write_bytes(b"spooled bytes")
    assert storage.adopt_file(KEY, src) == ObjectInfo(KEY, 13)
    assert _read(storage, KEY) == b"spooled bytes"


def test_the_filesystem_adopts_a_file_by_moving_it_in(tmp_path):
    """No second write of the bytes: the same inode, readable by others like every stored file."""
    store = FilesystemStorage(tmp_path / "store")
    src = tmp_path / "spool.bin"
    src.write_bytes(b"spooled bytes")
    os.chmod(src, 0o600)
    inode = src.stat().st_ino
    assert store.adopt_file(KEY, src) == ObjectInfo(KEY, 13)
    stored = tmp_path / "store" / KEY
    assert not src.exists() and stored.stat().st_ino == inode
    assert stat.S_IMODE(stored.stat().st_mode) == 0o644


def test_across_filesystems_an_adopted_file_is_copied(tmp_path, monkeypatch):
    store = FilesystemStorage(tmp_path / "store")
    src = tmp_path / "spool.bin"
    src.write_bytes(b"spooled bytes")
    replace = os.replace

    def cross_device(a, b):
        if Path(a) == src:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return replace(a, b)

    monkeypatch.setattr(os, "replace", cross_device)
    assert store.adopt_file(KEY, src) == ObjectInfo(KEY, 13)
    assert (tmp_path / "store" / KEY).read_bytes() == b"spooled bytes"


def test_copy_is_independent_of_later_writes(storage):
    storage.put_bytes("staging/src", b"original")
    storage.copy("staging/src", "attachments/u/original/abc")
    storage.put_bytes("staging/src", b"overwritten")
    storage.delete("staging/src")
    assert _read(storage, "attachments/u/original/abc") == b"original"
    assert storage.copy("attachments/u/original/abc", "attachments/u/original/abc").size == 8


def test_copy_overwrites_destination(storage):
    storage.put_bytes("a/src", b"new")
    storage.put_bytes("a/dst", b"old and longer")
    assert storage.copy("a/src", "a/dst") == ObjectInfo("a/dst", 3)
    assert _read(storage, "a/dst") == b"new"


def test_a_copy_carries_its_own_creation_time(storage):
    """A copy is a new object: its age starts now, whatever the source's age (object GC relies on it)."""
    storage.put_bytes("staging/src", b"original")
    past = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)
    _set_mtime(storage, "staging/src", past)
    storage.copy("staging/src", "attachments/u/original/abc")
    _assert_recent(storage.stat("attachments/u/original/abc").last_modified)
    listed = {info.key: info.last_modified for info in storage.list_objects()}
    _assert_recent(listed["attachments/u/original/abc"])
    assert storage.stat("staging/src").last_modified == past, "copying must not touch the source"
    assert listed["staging/src"] == past


def test_filesystem_copy_is_a_new_file_not_a_link(tmp_path):
    store = FilesystemStorage(tmp_path)
    store.put_bytes("staging/src", b"original")
    store.copy("staging/src", "attachments/u/original/abc")
    src, dst = os.stat(tmp_path / "staging/src"), os.stat(tmp_path / "attachments/u/original/abc")
    assert (src.st_dev, src.st_ino) != (dst.st_dev, dst.st_ino) and src.st_nlink == dst.st_nlink == 1
    assert _tmp_leftovers(tmp_path) == []


@pytest.mark.parametrize("refusal", ["exdev", "zero"])
def test_filesystem_copy_falls_back_to_chunks(tmp_path, monkeypatch, refusal):
    """Where the kernel will not copy (across filesystems, or a filesystem that reports 0 bytes), user space does."""
    def copy_file_range(*args):
        if refusal == "exdev":
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return 0

    monkeypatch.setattr(fs_module.os, "copy_file_range", copy_file_range, raising=False)
    store = FilesystemStorage(tmp_path)
    data = os.urandom(3 * fs_module.COPY_CHUNK + 7)
    store.put_bytes("staging/src", data)
    assert store.copy("staging/src", "a/dst") == ObjectInfo("a/dst", len(data))
    assert _read(store, "a/dst") == data


def test_missing_objects(storage):
    assert storage.stat("staging/nope") is None
    with pytest.raises(ObjectNotFound):
        storage.open_stream("staging/nope")  # raised at call time, not on first next()
    with pytest.raises(ObjectNotFound):
        storage.open_stream("staging/nope", length=0)
    with pytest.raises(ObjectNotFound):
        with storage.fetch_to_path("staging/nope"):
            pass
    with pytest.raises(ObjectNotFound):
        storage.copy("staging/nope", "staging/dst")
    assert storage.stat("staging/dst") is None
    assert storage.delete("staging/nope") is False


def test_a_prefix_of_keys_is_not_an_object(storage):
    storage.put_bytes("attachments/u/v1/thumb.jpg", b"x")
    assert storage.stat("attachments/u") is None
    assert storage.delete("attachments/u") is False
    with pytest.raises(ObjectNotFound):
        storage.open_stream("attachments/u")
    with pytest.raises(ObjectNotFound):
        storage.copy("attachments/u", "staging/x")


def test_not_found_is_a_storage_error_and_not_transient():
    assert issubclass(ObjectNotFound, StorageError)
    assert not issubclass(ObjectNotFound, StorageUnavailable)


# --- streaming --------------------------------------------------------------

BLOB = bytes(range(100))


@pytest.mark.parametrize(
    ("start", "length", "expected"),
    [
        (0, None, BLOB),
        (10, None, BLOB[10:]),
        (0, 10, BLOB[:10]),
        (5, 5, BLOB[5:10]),
        (33, 50, BLOB[33:83]),
        (95, 10, BLOB[95:]),
        (99, None, BLOB[99:]),
        (100, None, b""),
        (150, 5, b""),
        (10, 0, b""),
    ],
    ids=lambda v: f"{len(v)}bytes" if isinstance(v, bytes) else repr(v),
)
def test_stream_ranges(storage, start, length, expected):
    storage.put_bytes(KEY, BLOB)
    stream = storage.open_stream(KEY, chunk_size=7, start=start, length=length)
    chunks = list(stream)
    stream.close()  # every stream, even an empty one, can be closed
    assert b"".join(chunks) == expected
    assert all(0 < len(chunk) <= 7 for chunk in chunks)


@pytest.mark.parametrize("kwargs", [{"chunk_size": 0}, {"start": -1}, {"length": -1}])
def test_stream_rejects_bad_ranges(storage, kwargs):
    storage.put_bytes(KEY, BLOB)
    with pytest.raises(ValueError):
        storage.open_stream(KEY, **kwargs)


def test_large_object_streams_in_chunks(storage, tmp_path):
    src = tmp_path / "big.bin"
    block = os.urandom(1024 * 1024)
    with open(src, "wb") as fh:
        for i in range(20):
            fh.write(bytes([i]) + block[1:])
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    size = 20 * 1024 * 1024
    assert storage.put_file(KEY, src, content_type="image/jpeg") == ObjectInfo(KEY, size)

    chunk_size = 256 * 1024
    hasher, count, biggest, total = hashlib.sha256(), 0, 0, 0
    for chunk in storage.open_stream(KEY, chunk_size=chunk_size):
        hasher.update(chunk)
        count += 1
        biggest = max(biggest, len(chunk))
        total += len(chunk)
    assert total == size and hasher.hexdigest() == digest
    assert count > 1 and biggest <= chunk_size

    with storage.fetch_to_path(KEY) as path:
        assert path.stat().st_size == size
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_closing_a_stream_early_leaves_the_store_usable(storage):
    storage.put_bytes(KEY, os.urandom(512 * 1024))
    for _ in range(15):  # more than the pool size: a leaked connection would show
        stream = storage.open_stream(KEY, chunk_size=1024)
        assert len(next(stream)) == 1024
        stream.close()
        with pytest.raises(StopIteration):
            next(stream)
    assert len(_read(storage, KEY)) == 512 * 1024


def _open_fds_for(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_filesystem_stream_releases_file(tmp_path):
    store = FilesystemStorage(tmp_path)
    store.put_bytes(KEY, b"x" * 100)
    path = tmp_path / KEY

    stream = store.open_stream(KEY, chunk_size=10)
    assert _open_fds_for(path) == 1
    next(stream)
    stream.close()
    assert _open_fds_for(path) == 0

    stream = store.open_stream(KEY, chunk_size=10)
    assert len(list(stream)) == 10
    assert _open_fds_for(path) == 0  # exhausted -> closed

    with store.open_stream(KEY, chunk_size=10) as stream:
        next(stream)
    assert _open_fds_for(path) == 0


def test_readers_never_see_a_partial_object(storage):
    size = 256 * 1024
    versions = [b"a" * size, b"b" * size]
    storage.put_bytes(KEY, versions[0])
    done = threading.Event()
    errors: list[BaseException] = []

    def writer():
        try:
            for i in range(40):
                storage.put_bytes(KEY, versions[i % 2])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    seen = set()
    while not done.is_set() or not seen:
        data = _read(storage, KEY, chunk_size=8192)
        assert data in versions, f"partial or mixed object: {len(data)} bytes"
        seen.add(data[:1])
    thread.join()
    assert not errors
    assert _read(storage, KEY) in versions


def test_a_write_makes_its_directory_again_when_the_sweep_takes_it_empty(tmp_path, monkeypatch):
    """The object GC removes empty directories untouched for its grace; one taken between a write's mkdir and
    its temp file is made again (before the sweep existed, that mkstemp's ENOENT was a StorageError)."""
    store = FilesystemStorage(tmp_path)
    real = fs_module.tempfile.mkstemp
    swept = []

    def mkstemp_after_a_sweep(**kwargs):
        if not swept:
            swept.append(kwargs["dir"])
            os.rmdir(kwargs["dir"])  # what the sweep does, at the worst moment
        return real(**kwargs)

    monkeypatch.setattr(fs_module.tempfile, "mkstemp", mkstemp_after_a_sweep)
    assert store.put_bytes("partial/u1/0", b"part").size == 4
    assert swept and (tmp_path / "partial" / "u1" / "0").read_bytes() == b"part"


# --- fetch_to_path ----------------------------------------------------------


def test_filesystem_fetch_yields_the_real_file(tmp_path):
    store = FilesystemStorage(tmp_path)
    store.put_bytes(KEY, b"abc")
    with store.fetch_to_path(KEY) as path:
        assert path == tmp_path / KEY
    assert (tmp_path / KEY).exists()


def test_s3_fetch_removes_its_temp_file(moto_endpoint, tmp_path):
    store = S3Storage(f"attache-test-{uuid.uuid4().hex[:12]}", endpoint=moto_endpoint,
                      access_key=ACCESS_KEY, secret_key=SECRET_KEY, tmp_dir=str(tmp_path))
    store.ensure_bucket()
    store.put_bytes(KEY, b"abc")
    with store.fetch_to_path(KEY) as path:
        assert path.read_bytes() == b"abc"
        assert list(tmp_path.iterdir()) == [], "the local copy has no name in the temp directory"
        with open(path, "rb") as again:
            assert again.read() == b"abc", "each open reads from the start"

    with pytest.raises(RuntimeError):
        with store.fetch_to_path(KEY) as path:
            raise RuntimeError("caller failed")

    with pytest.raises(ObjectNotFound):
        with store.fetch_to_path("staging/nope"):
            pass
    assert list(tmp_path.iterdir()) == []


def test_s3_fetch_leaves_nothing_behind_when_its_process_is_killed(moto_endpoint, tmp_path):
    """A worker SIGKILLed while it renders from a fetched original (the OOM killer) left that copy in the temp
    directory for good, one per kill; now the copy has no name and the kernel frees it with the process."""
    bucket = f"attache-test-{uuid.uuid4().hex[:12]}"
    store = S3Storage(bucket, endpoint=moto_endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    store.ensure_bucket()
    store.put_bytes(KEY, b"x" * 300_000)
    local = tmp_path / "tmp"
    local.mkdir()
    child = textwrap.dedent(f"""
        import os, signal
        from app.adapters.storage.s3 import S3Storage
        store = S3Storage({bucket!r}, endpoint={moto_endpoint!r}, access_key={ACCESS_KEY!r},
                          secret_key={SECRET_KEY!r}, tmp_dir={str(local)!r})
        with store.fetch_to_path({KEY!r}) as path:
            assert len(open(path, "rb").read()) == 300_000
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    assert list(local.iterdir()) == []


# --- listing ----------------------------------------------------------------


def test_list_keys_by_prefix(storage):
    keys = [
        "staging/a", "staging/b",
        "attachments/u1/original/x", "attachments/u1/v1/thumbnail-1.jpg",
        "attachments/u10/original/y",
    ]
    for key in keys:
        storage.put_bytes(key, b"k")
    assert sorted(storage.list_keys()) == sorted(keys)
    assert sorted(storage.list_keys("staging/")) == ["staging/a", "staging/b"]
    assert sorted(storage.list_keys("attachments/u1/")) == keys[2:4]
    assert sorted(storage.list_keys("attachments/u1")) == keys[2:]
    assert sorted(storage.list_keys("staging/a")) == ["staging/a"]
    assert list(storage.list_keys("nothing/")) == []
    with pytest.raises(ValueError):
        list(storage.list_keys("../"))


def _assert_recent(when: datetime | None) -> None:
    assert when is not None and when.tzinfo is not None
    assert when.utcoffset() == timedelta(0), "last_modified must be UTC"
    assert abs(datetime.now(timezone.utc) - when) < timedelta(minutes=1), when


def _set_mtime(store: Storage, key: str, when: datetime) -> None:
    """Backdate an object: ``os.utime`` on disk, the object's record inside the in-process moto server."""
    if isinstance(store, FilesystemStorage):
        os.utime(store.root / key, (when.timestamp(), when.timestamp()))
        return
    from moto.s3.models import s3_backends

    for regions in s3_backends.values():
        for backend in regions.values():
            bucket = backend.buckets.get(store.bucket)
            if bucket is not None:
                bucket.keys[key].last_modified = when.replace(tzinfo=None)  # moto keeps naive UTC
                return
    raise AssertionError(f"bucket {store.bucket} not found in moto")


def test_list_objects_reports_size_and_age(storage):
    objects = {"staging/a": b"a" * 10, "staging/b": b"", "attachments/u1/original/x": b"x" * 1000}
    for key, data in objects.items():
        storage.put_bytes(key, data)
    listed = {info.key: info for info in storage.list_objects()}
    assert sorted(listed) == sorted(objects)
    for key, info in listed.items():
        assert isinstance(info, ObjectInfo)
        assert info.size == len(objects[key])
        _assert_recent(info.last_modified)
    assert sorted(i.key for i in storage.list_objects("staging/")) == ["staging/a", "staging/b"]
    assert sorted(storage.list_keys()) == sorted(objects)  # list_keys agrees with list_objects
    assert list(storage.list_objects("nothing/")) == []
    with pytest.raises(ValueError):
        list(storage.list_objects("../"))


def test_stat_reports_last_modified(storage):
    storage.put_bytes(KEY, b"photo")
    info = storage.stat(KEY)
    assert info == ObjectInfo(KEY, 5)  # equality ignores the timestamp
    _assert_recent(info.last_modified)
    listed = next(iter(storage.list_objects(KEY)))
    assert abs(listed.last_modified - info.last_modified) < timedelta(seconds=2)


def test_backdated_object_appears_older(storage):
    storage.put_bytes("staging/old", b"old")
    storage.put_bytes("staging/new", b"new")
    past = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=25)
    _set_mtime(storage, "staging/old", past)

    old = storage.stat("staging/old")
    assert old.last_modified == past
    _assert_recent(storage.stat("staging/new").last_modified)
    listed = {info.key: info.last_modified for info in storage.list_objects("staging/")}
    assert listed["staging/old"] == past
    assert listed["staging/new"] - listed["staging/old"] > timedelta(hours=24)
    cutoff = datetime.now(timezone.utc) - timedelta(hours=24)
    assert [i.key for i in storage.list_objects() if i.last_modified < cutoff] == ["staging/old"]


def test_filesystem_list_objects_skips_vanishing_and_odd_files(tmp_path):
    store = FilesystemStorage(tmp_path)
    store.put_bytes("staging/a", b"a")
    (tmp_path / "staging" / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "staging" / ".tmp-abandoned").write_bytes(b"partial")
    assert [(i.key, i.size) for i in store.list_objects()] == [("staging/a", 1)]
    assert list(FilesystemStorage(tmp_path / "missing").list_objects()) == []


def test_filesystem_list_skips_temp_and_foreign_files(tmp_path):
    store = FilesystemStorage(tmp_path)
    store.put_bytes("staging/a", b"a")
    (tmp_path / "staging" / ".tmp-abandoned").write_bytes(b"partial")
    (tmp_path / "README.TXT").write_bytes(b"not a key")
    assert list(store.list_keys()) == ["staging/a"]
    assert list(FilesystemStorage(tmp_path / "missing").list_keys()) == []


# --- filesystem atomicity and failures ---------------------------------------


class _FailingReader:
    """A source file that delivers one chunk, then an I/O error."""

    def __init__(self, real):
        self._real = real
        self._reads = 0

    def read(self, n=-1):
        self._reads += 1
        if self._reads > 1:
            raise OSError(errno.EIO, "simulated I/O error mid-copy")
        return self._real.read(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()


def _fail_reads(monkeypatch):
    monkeypatch.setattr(fs_module, "open", lambda *a, **kw: _FailingReader(builtins.open(*a, **kw)),
                        raising=False)


def _fail_fsync(monkeypatch):
    def fsync(fd):
        raise OSError(errno.EIO, "simulated fsync failure")

    monkeypatch.setattr(fs_module.os, "fsync", fsync)


@pytest.mark.parametrize("inject", [_fail_reads, _fail_fsync])
def test_filesystem_interrupted_write_leaves_nothing(tmp_path, monkeypatch, inject):
    root = tmp_path / "objects"
    store = FilesystemStorage(root)
    store.put_bytes(KEY, b"version one")
    src = tmp_path / "upload.bin"
    src.write_bytes(os.urandom(3 * fs_module.COPY_CHUNK))

    inject(monkeypatch)
    with pytest.raises(StorageUnavailable):
        store.put_file(KEY, src)
    with pytest.raises(StorageUnavailable):
        store.put_file("staging/new", src)
    monkeypatch.undo()

    assert _read(store, KEY) == b"version one"
    assert store.stat("staging/new") is None
    assert sorted(store.list_keys()) == [KEY]
    assert _tmp_leftovers(root) == []


def test_put_from_a_directory_or_missing_file_fails_cleanly(storage, tmp_path):
    with pytest.raises(StorageError):
        storage.put_file(KEY, tmp_path)
    with pytest.raises(StorageError):
        storage.put_file(KEY, tmp_path / "does-not-exist")
    assert storage.stat(KEY) is None
    assert list(storage.list_keys()) == []
    assert _tmp_leftovers(tmp_path) == []


def test_filesystem_key_colliding_with_directory_is_a_storage_error(tmp_path):
    store = FilesystemStorage(tmp_path)
    store.put_bytes("a/b", b"x")
    with pytest.raises(StorageError):
        store.put_bytes("a", b"y")
    with pytest.raises(StorageError):
        store.put_bytes("a/b/c", b"y")
    assert _tmp_leftovers(tmp_path) == []


def test_filesystem_root_created_on_first_write(tmp_path):
    root = tmp_path / "deep" / "root"
    store = FilesystemStorage(root)
    assert store.stat(KEY) is None and not root.exists()
    store.put_bytes(KEY, b"x")
    assert (root / KEY).read_bytes() == b"x"
    assert store.describe() == root.as_uri()


def test_filesystem_check(tmp_path):
    FilesystemStorage(tmp_path / "new").check()
    assert (tmp_path / "new").is_dir() and list((tmp_path / "new").iterdir()) == []
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageUnavailable):
        FilesystemStorage(tmp_path / "file").check()
    with pytest.raises(StorageUnavailable):
        FilesystemStorage(tmp_path / "file" / "sub").check()


# --- S3 specifics -----------------------------------------------------------


def test_s3_check_and_missing_bucket(moto_endpoint):
    store = _s3(moto_endpoint)
    with pytest.raises(StorageUnavailable):
        store.check()
    assert store.stat(KEY) is None
    with pytest.raises(ObjectNotFound):
        store.open_stream(KEY)
    with pytest.raises(StorageUnavailable):
        store.put_bytes(KEY, b"x")
    with pytest.raises(StorageUnavailable):
        list(store.list_keys())
    store.ensure_bucket()
    store.ensure_bucket()  # idempotent
    store.check()
    assert store.describe().startswith("s3://attache-test-")


def _assert_clean(exc: BaseException) -> None:
    text = f"{exc} {exc!r}"
    assert SECRET_KEY not in text and ACCESS_KEY not in text
    assert "http://" not in text and "?" not in text
    assert exc.__cause__ is None and exc.__suppress_context__


def test_s3_unreachable_endpoint_fails_fast_without_secrets():
    store = storage_from_url(f"s3://attache-test?endpoint=http://127.0.0.1:{_closed_port()}",
                             access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    calls = [
        store.check,
        lambda: store.stat(KEY),
        lambda: store.put_bytes(KEY, b"x"),
        lambda: store.open_stream(KEY),
        lambda: list(store.list_keys()),
        lambda: list(store.list_objects()),
        lambda: store.delete(KEY),
        lambda: store.copy(KEY, "staging/y"),
    ]
    for call in calls:
        began = time.monotonic()
        with pytest.raises(StorageUnavailable) as info:
            call()
        assert time.monotonic() - began < 5
        _assert_clean(info.value)


def test_s3_silent_endpoint_times_out():
    with socket.socket() as listener:  # accepts connections in the backlog, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        store = S3Storage("attache-test", endpoint=f"http://127.0.0.1:{port}", region="us-east-1",
                          access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                          http_client=make_http_client(connect_timeout=1, read_timeout=0.3))
        began = time.monotonic()
        with pytest.raises(StorageUnavailable) as info:
            store.stat(KEY)
        assert time.monotonic() - began < 5
        _assert_clean(info.value)


class _Drip:
    """An endpoint that answers every request a byte every 0.1 s, for ever: each read is within any read timeout."""

    def __init__(self, body: bool):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.body = body
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn):
        # an answer that ends its connection: http.client lets the connection go and reads the body from its socket
        # (a re-attack: the streamed GET was never cut), as moto answers
        whole = b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\nETag: \"x\"\r\nConnection: close\r\n\r\n"
        head = whole if self.body else b"HTTP/1.1 200 OK\r\n"
        try:
            conn.settimeout(1)
            try:
                conn.recv(1 << 20)  # the request (its body, if any, is left unread)
            except OSError:
                pass
            conn.sendall(head)
            while True:
                conn.sendall(b"a")
                time.sleep(0.1)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.server.close()


def test_a_call_to_an_endpoint_that_answers_a_byte_at_a_time_has_a_deadline(monkeypatch):
    """An adversarial run: an S3 answering at a byte a second was never cut (urllib3's read timeout bounds one
    read): uploads were held 200-240 s, then committed after their clients had given up, and a worker's step ran
    past its limit and its process was lost. A call now has a deadline on the whole of it. A re-attack: a streamed
    GET answered ``Connection: close`` and a listing (a tus upload's last PATCH lists its parts) were not cut."""
    from app.adapters.storage import s3

    monkeypatch.setattr(s3, "CALL_SECONDS", 2.0, raising=False)
    for body, call in ((False, lambda store: store.stat(KEY)),
                       (False, lambda store: store.put_bytes(KEY, b"x" * 1000)),
                       (True, lambda store: b"".join(store.open_stream(KEY, chunk_size=1 << 20))),
                       (True, lambda store: list(store.list_objects("staging/")))):  # a tus upload's last PATCH
        drip = _Drip(body)
        store = S3Storage("attache-test", endpoint=f"http://127.0.0.1:{drip.port}", region="us-east-1",
                          access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                          http_client=make_http_client(connect_timeout=1, read_timeout=1, retries=1))
        outcome: list = []

        def run():
            try:
                call(store)
                outcome.append("answered")
            except StorageError as exc:
                outcome.append(exc)

        began = time.monotonic()
        caller = threading.Thread(target=run, daemon=True)
        caller.start()
        caller.join(timeout=20)
        drip.close()
        assert outcome, "the call was still waiting after 20 s"
        assert isinstance(outcome[0], StorageUnavailable), outcome
        assert time.monotonic() - began < 2.0 * 2 + 4  # its deadline, a retry's new connection cut within a second
        _assert_clean(outcome[0])


class _FixedAnswer(http.server.BaseHTTPRequestHandler):
    """Answers every request with the class's status and S3 error code."""

    status = 503
    code = "SlowDown"
    hits: list[str] = []

    def _answer(self):
        type(self).hits.append(self.command)
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{self.code}</Code>'
                f"<Message>{SECRET_KEY} must not leak</Message></Error>").encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def fixed_answer_server():
    def start(status: int, code: str) -> str:
        handler = type("Handler", (_FixedAnswer,), {"status": status, "code": code, "hits": []})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", handler

    servers: list[http.server.ThreadingHTTPServer] = []
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("status", "code", "expected", "attempts"),
    [(503, "SlowDown", StorageUnavailable, 3), (500, "InternalError", StorageUnavailable, 3),
     (403, "AccessDenied", StorageError, 1)],
)
def test_s3_http_errors_are_translated(fixed_answer_server, status, code, expected, attempts):
    endpoint, handler = fixed_answer_server(status, code)
    store = S3Storage("attache-test", endpoint=endpoint, region="us-east-1",
                      access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    with pytest.raises(StorageError) as info:
        store.open_stream(KEY)
    assert type(info.value) is expected
    assert code in str(info.value)
    assert len(handler.hits) == attempts  # 5xx retried twice by the pool, 4xx not at all
    _assert_clean(info.value)


class _LateDelete(http.server.BaseHTTPRequestHandler):
    """Says every object is there; takes a DELETE and answers it too late (S3 carrying it out after the client
    gave up)."""

    deletes: list[str] = []

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.send_header("ETag", '"0"')
        self.send_header("Last-Modified", "Sun, 06 Dec 2026 12:00:00 GMT")
        self.end_headers()

    def do_DELETE(self):
        type(self).deletes.append(self.path)
        time.sleep(1.5)  # past the client's read timeout
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_s3_a_delete_whose_answer_is_lost_is_sent_once_and_raises():
    """A DELETE whose answer never came may still be carried out. The pool sent it again; the retry's answer said
    the removal was done, the object GC forgot its decision, a replay wrote the key again, and the first DELETE,
    landing late, removed it under a ready attachment (an adversarial run). Sent once, the removal raises: the GC's
    decision stays on record. Before: sent three times, the last one's answer taken."""
    handler = type("Handler", (_LateDelete,), {"deletes": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        store = S3Storage("attache-test", endpoint=f"http://127.0.0.1:{server.server_address[1]}",
                          region="us-east-1", access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                          http_client=make_http_client(connect_timeout=1, read_timeout=0.3))
        with pytest.raises(StorageUnavailable):
            store.delete(KEY)
        assert len(handler.deletes) == 1
    finally:
        server.shutdown()
        server.server_close()


# --- configuration ----------------------------------------------------------


def test_storage_from_url_filesystem(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = storage_from_url("file://./var/storage")
    assert isinstance(relative, FilesystemStorage)
    assert relative.describe() == (tmp_path / "var" / "storage").as_uri()
    absolute = storage_from_url(f"file://{tmp_path}/abs")
    assert absolute.describe() == f"file://{tmp_path}/abs"


def test_storage_from_url_s3():
    store = storage_from_url("s3://photos?endpoint=http://127.0.0.1:9000&region=eu-west-1",
                             access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    assert isinstance(store, S3Storage)
    assert store.describe() == "s3://photos"
    assert isinstance(storage_from_url("s3://photos"), S3Storage)


@pytest.mark.parametrize("url", [
    "http://example.com/x", "s3://AKIA:s3cr3t-never-in-messages@photos", "s3://photos?endpont=x",
    "s3://photos?endpoint=ftp://host", "s3://photos/sub", "s3://Bad_Bucket", "file://",
    "s3://photos?endpoint=http://user:s3cr3t-never-in-messages@host",
])
def test_storage_from_url_rejects(url):
    with pytest.raises(ConfigError) as info:
        storage_from_url(url)
    assert SECRET_KEY not in str(info.value)


def test_an_error_names_the_store_to_the_operator_and_only_storage_to_the_uploader(tmp_path):
    """A job's ``error_reason`` is shown to its uploader: it read ``file:///srv/...: put ... failed: No space left on
    device`` (an adversarial run; docs/retries.md promises no paths). The error's text keeps the store's name for
    the logs; its reason, the stored one, says ``storage``."""
    from app.adapters.storage.filesystem import FilesystemStorage
    from app.errors import StorageError, sanitized_reason

    (tmp_path / "a-file").write_bytes(b"")
    store = FilesystemStorage(tmp_path / "a-file" / "store")  # its root cannot be made: every put fails
    with pytest.raises(StorageError) as raised:
        store.put_bytes("attachments/x", b"data")
    assert str(tmp_path) in str(raised.value), "the operator's log names the store"
    reason = sanitized_reason(raised.value)
    assert str(tmp_path) not in reason and "file:" not in reason, reason
    assert reason.startswith("storage: put 'attachments/x' failed"), reason
