"""BodyStream: the request body as the views read it (app/web/body.py), over a stand-in for the server's stream."""

from __future__ import annotations

import io
import random

import pytest
from werkzeug.exceptions import RequestEntityTooLarge

from app.web.body import READ_BLOCK_BYTES, BodyStream


class ServerStream(io.BytesIO):
    """The server's body stream: records the size of every read asked of it, and can break after some bytes."""

    def __init__(self, data: bytes, break_after: int | None = None):
        super().__init__(data)
        self.asked: list[int] = []
        self.break_after = break_after

    def read(self, size: int = -1) -> bytes:
        self.asked.append(size)
        if self.break_after is not None and self.tell() >= self.break_after:
            raise OSError("client went away")
        return super().read(size)


def test_small_reads_are_served_from_large_reads_of_the_server_stream() -> None:
    """gunicorn copies what it holds again for every read smaller than it (see the module): ask it in blocks."""
    body = random.Random(3).randbytes(5 * 1024 * 1024 + 123)
    server = ServerStream(body)
    stream = BodyStream(server, declared_length=len(body))
    got = bytearray()
    while chunk := stream.read(64 * 1024):  # what werkzeug's multipart parser asks for
        got += chunk
    assert bytes(got) == body
    assert not stream.incomplete and stream.received == len(body)
    assert len(server.asked) == len(body) // READ_BLOCK_BYTES + 1
    assert all(size == READ_BLOCK_BYTES for size in server.asked[:-1])
    assert sum(server.asked) == len(body), "never asked past the declared length"


def test_a_read_larger_than_a_block_is_passed_on_whole() -> None:
    body = bytes(3 * READ_BLOCK_BYTES)
    server = ServerStream(body)
    assert len(BodyStream(server, declared_length=len(body)).read(2 * READ_BLOCK_BYTES)) == 2 * READ_BLOCK_BYTES
    assert server.asked == [2 * READ_BLOCK_BYTES]


def test_a_body_cut_short_or_broken_is_incomplete_after_the_bytes_that_came() -> None:
    body = bytes(range(256)) * 10_000  # 2.56 MB
    short = BodyStream(ServerStream(body[:1_000_000]), declared_length=len(body))
    assert len(short.read()) == 1_000_000 and short.incomplete
    broken = BodyStream(ServerStream(body, break_after=READ_BLOCK_BYTES), declared_length=len(body))
    received = b"".join(iter(lambda: broken.read(64 * 1024), b""))
    assert received == body[:READ_BLOCK_BYTES]
    assert broken.incomplete and isinstance(broken.error, OSError)


def test_a_body_of_exactly_the_limit_is_whole_and_one_byte_more_is_413() -> None:
    """With or without a Content-Length; a longer body is refused one byte past the limit, not a block past it."""
    limit = READ_BLOCK_BYTES + 7
    for declared in (limit, None):
        server = ServerStream(bytes(limit))
        whole = BodyStream(server, declared_length=declared, max_length=limit)
        assert len(whole.read()) == limit and not whole.incomplete
        assert max(server.asked) <= READ_BLOCK_BYTES
    server = ServerStream(bytes(5 * READ_BLOCK_BYTES))
    over = BodyStream(server, declared_length=None, max_length=limit)
    with pytest.raises(RequestEntityTooLarge):
        over.read()
    assert server.tell() == limit + 1


def test_without_blocks_the_server_stream_is_asked_what_the_reader_asks() -> None:
    """The raw-body routes of resumable uploads keep the bytes of a body cut short (app.web.request)."""
    body = bytes(3 * 64 * 1024 + 5)
    server = ServerStream(body)
    stream = BodyStream(server, declared_length=len(body), block_bytes=0)
    assert b"".join(iter(lambda: stream.read(64 * 1024), b"")) == body
    assert server.asked == [64 * 1024] * 3 + [5]


def test_reads_of_any_size_mixed_with_readinto_give_the_body_in_order() -> None:
    """read() hands out pieces of the block without RawIOBase's two copies; what it hands out must not change."""
    body = random.Random(5).randbytes(3 * READ_BLOCK_BYTES + 777)
    stream = BodyStream(ServerStream(body), declared_length=len(body))
    rng = random.Random(6)
    got = bytearray()
    while len(got) < 2 * READ_BLOCK_BYTES:
        size = rng.choice([1, 100, 64 * 1024, READ_BLOCK_BYTES - 5, READ_BLOCK_BYTES, 2 * READ_BLOCK_BYTES])
        if rng.random() < 0.3:
            buffer = bytearray(size)
            got += buffer[:stream.readinto(buffer)]
        else:
            chunk = stream.read(size)
            assert isinstance(chunk, bytes) and 0 < len(chunk) <= size
            got += chunk
    got += stream.read()  # the rest
    assert bytes(got) == body and stream.read(10) == b"" and not stream.incomplete
