"""The upload route's ``multipart/form-data`` body: python-multipart's push parser, fed the request's blocks.

Flask's ``request.files`` (werkzeug's parser) copies each byte of a file
part four or five times (into its buffer, out of it as a slice, into
``bytes``, the buffer's own shifts) and compiles two regular expressions
per request, its boundary's. Measured on a 5.2 MB upload, fed the same
blocks: 7.6 ms of CPU for werkzeug, 0.8 ms for python-multipart, which
hands out views of the block it was given, written to the spool without a
copy (``docs/performance.md``). Every other route keeps werkzeug's form
parsing (``request.form``).

What the upload takes from the body is what ``request.files.get("file")``
took: the first part named ``file`` whose ``Content-Disposition`` has a
``filename`` goes to a :class:`~app.web.spool.HashingSpool`; every other
part is read and dropped (werkzeug kept fields in memory and spooled the
other files). A part is taken only once its closing boundary has arrived:
a body that ends before the closing boundary is refused, ``incomplete_body``
when it is shorter than it declared (the view checks that first), else
``bad_request``. So is a body that is not multipart at all (no boundary
where one must be). A preamble before the first boundary (RFC 2046 allows
one; mail-style generators write "This is a multi-part message in MIME
format.") is skipped, up to :data:`MAX_PREAMBLE_BYTES`: it was refused. A
body has at most :data:`MAX_PARTS` parts, a
part at most :data:`MAX_PART_HEADERS` headers of at most
:data:`MAX_PART_HEADER_BYTES` each, a boundary at most 256 bytes
(python-multipart's); the body's limit is the
:class:`~app.web.body.BodyStream`'s and the file's the spool's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Callable

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser
from werkzeug.http import parse_options_header

from app.errors import UploadRejected
from app.web.body import READ_BLOCK_BYTES
from app.web.spool import HashingSpool

#: the form field the upload's file is sent in
FILE_FIELD = "file"
#: one header line of a part at most (python-multipart's default, 4 KiB, refused a long filename werkzeug took)
MAX_PART_HEADER_BYTES = 64 * 1024
#: headers of one part at most (clients send two or three)
MAX_PART_HEADERS = 16
#: text before the first boundary at most (a line or two where one is sent at all); more is ``400``
MAX_PREAMBLE_BYTES = 16 * 1024
#: parts of one body at most (the upload takes one, ``file``; a form sends a few fields beside it); more is ``400``.
#: Each part costs the parser some 10 us of CPU: 10 MiB of empty parts took the web 1-2.2 s, 300 times what the same
#: bytes cost as one part (an adversarial run). werkzeug's own bound, for the other routes' forms, is 1,000.
MAX_PARTS = 100


@dataclass
class FilePart:
    spool: HashingSpool
    #: the part's ``filename`` as sent (``Content-Disposition``), not yet sanitized
    filename: str


class _Parts:
    """python-multipart's callbacks: each part's headers gathered, the file part's bytes written to a spool."""

    def __init__(self, new_spool: Callable[[], HashingSpool]):
        self.new_spool = new_spool
        self.file: FilePart | None = None
        self.file_complete = False
        self.ended = False
        self.parts = 0
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition: bytes | None = None
        self._writing: HashingSpool | None = None

    def callbacks(self) -> dict:
        return {"on_part_begin": self.part_begin, "on_header_field": self.header_name,
                "on_header_value": self.header_value, "on_header_end": self.header_end,
                "on_headers_finished": self.headers_finished, "on_part_data": self.part_data,
                "on_part_end": self.part_end, "on_end": self.end}

    def part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise UploadRejected(f"the multipart body has more than {MAX_PARTS} parts")
        self._disposition = None
        self._header_name.clear()
        self._header_value.clear()

    def header_name(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def header_end(self) -> None:
        if self._header_name.strip().lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def headers_finished(self) -> None:
        if self.file is not None or self._disposition is None:
            return
        kind, options = parse_options_header(self._disposition.decode("utf-8", "replace"))
        filename = options.get("filename")
        if kind.lower() == "form-data" and options.get("name") == FILE_FIELD and filename is not None:
            self.file = FilePart(self.new_spool(), filename)
            self._writing = self.file.spool

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self._writing is not None:
            self._writing.write(memoryview(data)[start:end])  # a view of the block: the spool copies it once

    def part_end(self) -> None:
        if self._writing is not None:
            self._writing = None
            self.file_complete = True

    def end(self) -> None:
        self.ended = True


def receive_file(stream: IO[bytes], content_type_boundary: str | None,
                 new_spool: Callable[[], HashingSpool]) -> FilePart | None:
    """Read the whole body from ``stream``; the ``file`` part (spooled, complete) or None if there is none.

    Returns once the body has ended, whether or not it was whole: the caller
    refuses a body shorter than it declared first. Raises
    :class:`~app.errors.UploadRejected` for a body that is not
    ``multipart/form-data`` with this boundary or ended before its closing
    boundary, and whatever the spool raises (too large, no room).
    """
    if not content_type_boundary:
        raise UploadRejected("multipart/form-data needs a boundary parameter", error_code="bad_content_type")
    parts = _Parts(new_spool)
    try:
        parser = MultipartParser(content_type_boundary.encode("latin-1"), parts.callbacks(),
                                 max_header_count=MAX_PART_HEADERS, max_header_size=MAX_PART_HEADER_BYTES)
        block = _from_first_boundary(stream, b"--" + content_type_boundary.encode("latin-1"))
        while block:
            parser.write(block)
            block = stream.read(READ_BLOCK_BYTES)
        parser.finalize()
    except (FormParserError, UnicodeEncodeError) as exc:
        raise UploadRejected(f"malformed multipart body: {exc}") from None
    if not parts.ended or (parts.file is not None and not parts.file_complete):
        raise UploadRejected("the multipart body ends before its closing boundary")
    return parts.file


def _from_first_boundary(stream: IO[bytes], delimiter: bytes) -> bytes:
    """The body's first bytes, from its first boundary line on: a preamble before it is dropped (the parser refuses
    one). The boundary opens the body, as every client sends it, or follows a line break; what has none within
    :data:`MAX_PREAMBLE_BYTES` is returned as it is, for the parser to refuse."""
    seen = stream.read(READ_BLOCK_BYTES)
    while True:
        if seen.startswith(delimiter):
            return seen
        at = seen.find(b"\n" + delimiter, 0, MAX_PREAMBLE_BYTES + len(delimiter))  # a preamble of at + 1 bytes
        if at >= 0:
            return seen[at + 1:]
        if len(seen) >= MAX_PREAMBLE_BYTES + len(delimiter):
            return seen
        more = stream.read(READ_BLOCK_BYTES)
        if not more:
            return seen
        seen += more
