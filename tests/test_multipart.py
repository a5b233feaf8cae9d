"""The upload's multipart body (app.web.multipart): what is taken, what is dropped, what is refused.

Through the real Flask app, PostgreSQL and filesystem, with bodies written
by hand: each test sends what a client, or a hostile one, could send.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
from pathlib import Path

import pytest

from app.web.body import READ_BLOCK_BYTES
from app.web.multipart import MAX_PART_HEADER_BYTES, MAX_PARTS, MAX_PREAMBLE_BYTES, receive_file
from tests.test_upload_api import counts, stored_files

BOUNDARY = "attache-multipart-test"


def part(name: str, body: bytes, filename: str | None = None, *, headers: str = "") -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
    return (f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n{headers}\r\n").encode() + body + b"\r\n"


def body_of(*parts: bytes, closed: bool = True) -> bytes:
    return b"".join(parts) + (f"--{BOUNDARY}--\r\n".encode() if closed else b"")


def send(client, payload: bytes, boundary: str | None = BOUNDARY):
    content_type = "multipart/form-data" + (f"; boundary={boundary}" if boundary else "")
    return client.post("/v1/attachments", data=payload, headers={"Content-Type": content_type})


def spools() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("attache-upload-*"))


@pytest.fixture(autouse=True)
def _own_temporary_directory(tmp_path, monkeypatch):
    """The spools of this file's uploads alone: another test process's upload in the shared /tmp, at the same
    moment, was taken for one of these left behind (seen under a loaded machine)."""
    own = tmp_path / "tmp"
    own.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own))


@pytest.fixture
def photo(data_file) -> bytes:
    return data_file("photos/chelsea.jpg").read_bytes()


def test_the_file_part_is_taken_and_every_other_part_dropped(client, engine, storage_dir, photo):
    before = spools()
    payload = body_of(part("note", b"a field before the file"),
                      part("other", b"not the upload", "other.jpg"),
                      part("file", photo, "chelsea.jpg", headers="Content-Type: image/jpeg\r\n"),
                      part("file", b"a second file part is not the upload", "second.jpg"),
                      part("after", b"a field after it"))
    response = send(client, payload)
    assert response.status_code == 202, response.json
    assert response.json["sha256"] == hashlib.sha256(photo).hexdigest()
    status = client.get(response.headers["Location"]).json
    assert status["filename"] == "chelsea.jpg" and status["size"] == len(photo)
    assert stored_files(storage_dir) == [f"staging/{response.json['id']}"]
    assert spools() <= before, "the other parts were never spooled, and the upload's spool became the staged object"


def test_bytes_like_the_boundary_inside_the_file_across_block_edges_are_kept(client, storage_dir):
    """A file whose bytes hold the boundary's start, a line break and dashes, where the body's blocks meet."""
    almost = f"\r\n--{BOUNDARY[:-1]}".encode()
    data = bytearray(b"\xff\xd8" + bytes(range(256)) * 20_000)  # not an image: refused after it is read whole
    for edge in (READ_BLOCK_BYTES, 2 * READ_BLOCK_BYTES, 3 * READ_BLOCK_BYTES):
        for offset in range(-len(almost), 8, 5):  # straddling the edge, and just after it
            at = edge + offset - 150  # the file part starts about 150 bytes into the body
            data[at:at + len(almost)] = almost
    data[-3:] = b"\r\n-"  # and its very end looks like the start of a boundary
    seen = {}
    spool = lambda: _Recording(seen)  # noqa: E731
    found = receive_file(io.BytesIO(body_of(part("file", bytes(data), "x.bin"))), BOUNDARY, spool)
    assert found is not None and seen["bytes"] == bytes(data)


class _Recording:
    """A spool that keeps what it is given (the parser hands it views of its blocks)."""

    def __init__(self, seen: dict):
        self.seen = seen
        seen["bytes"] = b""

    def write(self, data) -> int:
        self.seen["bytes"] += bytes(data)
        return len(data)


@pytest.mark.parametrize("payload,code", [
    (body_of(part("file", b"\xff\xd8 cut before its closing boundary", "a.jpg"), closed=False), "bad_request"),
    (body_of(part("file", b"\xff\xd8", "a.jpg")).replace(f"--{BOUNDARY}--".encode(), b"--"), "bad_request"),
    (b"p" * MAX_PREAMBLE_BYTES + b"\r\n" + body_of(part("file", b"\xff\xd8", "a.jpg")), "bad_request"),
    (b"not multipart at all", "bad_request"),
    (body_of(part("file", b"\xff\xd8", "a.jpg", headers=f"X-Long: {'x' * MAX_PART_HEADER_BYTES}\r\n")),
     "bad_request"),
    (body_of(part("file", b"\xff\xd8", "a.jpg", headers="X-A: 1\r\n" * 20)), "bad_request"),
    (body_of(part("file", b"a field named file, with no filename")), "missing_file"),
    (body_of(part("photo", b"\xff\xd8", "a.jpg")), "missing_file"),
    (body_of(), "missing_file"),
], ids=["no-closing-boundary", "closing-boundary-mangled", "preamble-too-long", "garbage", "header-too-long",
        "too-many-headers", "file-field-without-filename", "file-under-another-name", "no-parts"])
def test_bodies_that_do_not_carry_a_whole_file_part_are_refused(client, engine, storage_dir, payload, code):
    before = spools()
    response = send(client, payload)
    assert response.status_code == 400, response.json
    assert response.json["error"] == code, response.json
    assert counts(engine)["attachments"] == 0 and stored_files(storage_dir) == []
    assert spools() <= before, "a refused upload leaves no spool file"


@pytest.mark.parametrize("preamble", [b"This is a multi-part message in MIME format.\r\n", b"\r\n",
                                      b"a line\nthen --" + BOUNDARY.encode() + b"x not at a line's start\r\n",
                                      b"p" * (MAX_PREAMBLE_BYTES - 2) + b"\r\n"],
                         ids=["a-line", "a-line-break", "a-boundary-like-text", "the-longest"])
def test_a_preamble_before_the_first_boundary_is_skipped(client, storage_dir, photo, preamble):
    """RFC 2046 allows text before the first boundary; it was refused ``400`` (an adversarial run)."""
    response = send(client, preamble + body_of(part("file", photo, "chelsea.jpg")))
    assert response.status_code == 202, response.json
    assert response.json["sha256"] == hashlib.sha256(photo).hexdigest()
    seen = {}
    for sizes in (1, 7, 100):  # the body's blocks as short as a slow client's
        stream = _Trickle(preamble + body_of(part("file", b"\xff\xd8kept", "x.bin")), sizes)
        assert receive_file(stream, BOUNDARY, lambda: _Recording(seen)) is not None
        assert seen["bytes"] == b"\xff\xd8kept"


def test_a_body_of_more_parts_than_a_form_sends_is_refused_at_the_part_over_the_bound(client, engine, storage_dir,
                                                                                       photo):
    """Each part cost the parser some 10 us of CPU: 10 MiB of empty parts took the web 1-2.2 s, 300 times what the
    same bytes cost as one part (an adversarial run)."""
    fields = [part(f"field{number}", b"") for number in range(MAX_PARTS - 1)]
    at_the_bound = send(client, body_of(*fields, part("file", photo, "chelsea.jpg")))
    assert at_the_bound.status_code == 202, at_the_bound.json
    before = spools()
    over = send(client, body_of(part("file", photo, "chelsea.jpg"), *fields, part("one-more", b"")))
    assert over.status_code == 400 and over.json["error"] == "bad_request", over.json
    assert f"more than {MAX_PARTS} parts" in over.json["message"]
    assert counts(engine)["attachments"] == 1 and stored_files(storage_dir) == [f"staging/{at_the_bound.json['id']}"]
    assert spools() <= before, "the refused upload's spool is removed"


class _Trickle(io.BytesIO):
    def __init__(self, data: bytes, size: int):
        super().__init__(data)
        self.size = size

    def read(self, size=-1):
        return super().read(self.size)


def test_a_multipart_type_without_a_boundary_is_refused(client, engine, photo):
    response = send(client, body_of(part("file", photo, "a.jpg")), boundary=None)
    assert response.status_code == 400 and response.json["error"] == "bad_content_type"
    assert counts(engine)["attachments"] == 0


def test_an_rfc_5987_filename_is_decoded(client, photo):
    payload = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"fallback.jpg\"; "
               f"filename*=UTF-8''%D1%84%D0%BE%D1%82%D0%BE.jpg\r\n\r\n").encode() + photo + f"\r\n--{BOUNDARY}--\r\n".encode()
    response = send(client, payload)
    assert response.status_code == 202, response.json
    assert client.get(response.headers["Location"]).json["filename"] == "фото.jpg"
