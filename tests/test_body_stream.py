"""BodyStream: the request body as the views read it (app/web/body.py), over a stand-in for the server's stream."""

from __future__ import annotations

import io
import random

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
    assert len(server.asked) <= len(body) // READ_BLOCK_BYTES + 2
    assert all(size >= READ_BLOCK_BYTES for size in server.asked)


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
