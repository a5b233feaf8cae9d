"""The encoders' memory files (app/adapters/imaging/encode_files.py): the same bytes, the GIL released, no leak."""

from __future__ import annotations

import io
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from app.adapters.imaging import encode_files
from app.adapters.imaging.render import (
    AVIF_QUALITY,
    AVIF_SPEED,
    AVIF_THREADS,
    JPEG_QUALITY,
    WEBP_METHOD,
    WEBP_QUALITY,
)
from tests.test_imaging import path_of

#: what the renderer writes (render._encode): format and options
ENCODINGS = {
    "jpeg": ("JPEG", dict(quality=JPEG_QUALITY, optimize=True, progressive=False)),
    "jpeg progressive": ("JPEG", dict(quality=JPEG_QUALITY, optimize=True, progressive=True)),
    "png": ("PNG", dict(optimize=True)),
    "webp": ("WEBP", dict(quality=WEBP_QUALITY, method=WEBP_METHOD)),
    "avif": ("AVIF", dict(quality=AVIF_QUALITY, speed=AVIF_SPEED, max_threads=AVIF_THREADS)),
}


def _photo(size: int) -> Image.Image:
    with Image.open(path_of("photos/rocket_12mp_4241x2830.jpg")) as img:
        img.draft("RGB", (size, size))
        photo = img.convert("RGB")
    photo.thumbnail((size, size))
    return photo


def _bytesio(img: Image.Image, fmt: str, options: dict) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **options)
    return buffer.getvalue()


def _memory_files() -> int:
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:attache-encode")
               for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_bytes_are_those_bytesio_gets(encoding: str) -> None:
    fmt, options = ENCODINGS[encoding]
    img = _photo(512)
    if fmt == "PNG":
        img = img.convert("RGBA")
    assert encode_files.encode(img, fmt, options) == _bytesio(img, fmt, options)


def test_a_smaller_image_after_a_larger_one_carries_none_of_its_bytes() -> None:
    fmt, options = ENCODINGS["jpeg progressive"]
    large, small = _photo(2048), _photo(256)
    first = encode_files.encode(large, fmt, options)
    files = list(encode_files._free)
    second = encode_files.encode(small, fmt, options)
    assert encode_files._free == files  # the same memory file served both
    assert len(second) < len(first) // 10
    assert second == _bytesio(small, fmt, options)


def test_threads_encoding_at_once_each_get_their_own_image() -> None:
    fmt, options = ENCODINGS["jpeg"]
    images = [_photo(256).rotate(angle) for angle in range(0, 360, 30)]
    expected = [_bytesio(img, fmt, options) for img in images]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(5):
            assert list(pool.map(lambda img: encode_files.encode(img, fmt, options), images)) == expected


def test_short_lived_threads_reuse_the_files_instead_of_leaking_one_each() -> None:
    # the worker makes each job's variants on a new pool of two threads
    fmt, options = ENCODINGS["jpeg"]
    img = _photo(256)
    before = _memory_files()
    for _ in range(20):
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda _: encode_files.encode(img, fmt, options), range(2)))
    assert _memory_files() - before <= 2


def test_a_file_grown_past_the_limit_is_emptied_when_given_back(monkeypatch) -> None:
    monkeypatch.setattr(encode_files, "KEEP_BYTES", 10_000)
    fmt, options = ENCODINGS["jpeg"]
    data = encode_files.encode(_photo(2048), fmt, options)
    used = encode_files._free[-1]  # given back last
    assert len(data) > 10_000
    assert os.fstat(used).st_size == 0
    small = encode_files.encode(_photo(64), fmt, options)
    assert encode_files._free[-1] == used
    assert os.fstat(used).st_size == len(small) < 10_000


def test_a_forked_child_writes_into_files_of_its_own() -> None:
    fmt, options = ENCODINGS["jpeg"]
    img = _photo(256)
    encode_files.encode(img, fmt, options)
    parents = list(encode_files._free)
    files = {os.fstat(fd).st_ino for fd in parents}
    assert parents
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        ok = encode_files._free == [] and encode_files.encode(img, fmt, options) == _bytesio(img, fmt, options)
        os._exit(0 if ok and {os.fstat(fd).st_ino for fd in encode_files._free}.isdisjoint(files) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert encode_files._free == parents
    assert all(os.fstat(fd) for fd in parents)  # the parent's stay open


def test_a_jpeg_encode_leaves_the_gil_to_other_threads() -> None:
    """With BytesIO, Pillow's JPEG encoder held the GIL for the whole encode: no other thread ran meanwhile."""
    fmt, options = ENCODINGS["jpeg progressive"]
    img = _photo(4096)
    began = time.perf_counter()
    encode_files.encode(img, fmt, options)
    alone = time.perf_counter() - began
    assert alone > 0.05, "the image is too small to tell"

    longest_pauses = []
    for _ in range(3):
        done = threading.Event()
        thread = threading.Thread(target=lambda: (encode_files.encode(img, fmt, options), done.set()))
        last, longest = time.perf_counter(), 0.0
        thread.start()
        while not done.is_set():
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
        thread.join()
        longest_pauses.append(longest)
    # holding the GIL, the encode stopped this loop for about its whole length
    assert sorted(longest_pauses)[1] < alone / 2, (longest_pauses, alone)
