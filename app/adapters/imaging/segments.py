"""JPEG markers and PNG chunks before the pixels, and a JPEG's scans: counted, and bounded, before Pillow parses them.

Pillow reads the segments before an image's pixels in Python, one at a
time, and keeps an object for each (``JpegImageFile.applist``,
``PngImageFile.private_chunks``); a file made of nothing else costs that
for every open, in the web's probe and in every step that opens it. A 40 MB
JPEG of 10,000,000 empty COM segments took 7 s and 430-720 MB an open, and
its 64x64 job 44 s and 1.46 GB of worker memory; a 42 MB PNG of 3,500,000
empty private chunks, 74 s and 881 MB; four at once held the web 23-29 s
per upload with 2.7 GB, and a normal photo behind them waited 150 s (an
adversarial review). A progressive JPEG's decode is a pass over the image
per scan: 20,000 scans in 1.19 MB of a 4096x4096 photo took 175-190 s of
CPU per variant, in 73 MB, out of reach of the memory budget.

A photo has a few dozen segments before its pixels, and a progressive
JPEG 10-12 scans (libjpeg's and mozjpeg's defaults). More than
:data:`MAX_SEGMENTS`, or than :data:`MAX_SCANS` (fewer for a large image:
:data:`MAX_SCAN_PIXELS`) is refused as a decompression
bomb, as is a run-length-encoded BMP of more than :data:`MAX_RLE_BMP_PIXELS`
(Pillow decodes those in Python, at some 0.12 s a megapixel); more than
:data:`MAX_JUNK_BYTES` of bytes that belong to no JPEG
segment (libjpeg's "extraneous bytes", which Pillow also walks one by one)
as a corrupt image. The walk is as cheap as the file is honest: it stops
at the limits, and a JPEG's scans are found with ``mmap.find``.
"""

from __future__ import annotations

import mmap
import re
import struct
from typing import BinaryIO

from app.errors import CorruptImage, DecompressionBomb

#: segments before the pixels (JPEG markers before the first SOS, PNG chunks before the first IDAT)
MAX_SEGMENTS = 1000
#: scans of a progressive JPEG (SOS markers before its EOI; a sequential one has a scan per component at most)
MAX_SCANS = 100
#: scans times pixels of a progressive JPEG: each scan is a pass over the whole image's coefficients (99 scans of
#: an 8000x8000 photo took 4.3 s of CPU per decode, an adversarial run); 31 scans at 64 MP, 83 at 24 MP, and
#: MAX_SCANS below 20 MP. libjpeg's and mozjpeg's progressive photos have 10-12.
MAX_SCAN_PIXELS = 2_000_000_000
#: bytes between a JPEG's segments that belong to none (fill bytes included)
MAX_JUNK_BYTES = 1 << 20
#: chunks of a PNG in all (a 50 MB PNG of libpng's 8 KiB IDAT chunks has some 6,000)
MAX_PNG_CHUNKS = 100_000
#: pixels of a run-length-encoded BMP (RLE8, RLE4): Pillow decodes those in Python, some 0.12 s of CPU per
#: megapixel with the GIL held whatever the file's size (a 33 KB BMP of 8000x8000 end-of-line codes took 8 s a
#: decode, 22-33 s a job; four at once held every upload behind them: an adversarial run)
MAX_RLE_BMP_PIXELS = 4_000_000
#: BITMAPINFOHEADER (and its successors): width, height, planes, bits per pixel, compression, after the file header
_BMP_INFO = struct.Struct("<IiiHHI")
#: BMP compressions Pillow decodes in Python
_BMP_RLE = frozenset({1, 2})

#: the frames of a progressive JPEG (SOF2, SOF6, SOF10, SOF14): a pass over the image per scan
_PROGRESSIVE_FRAMES = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
#: JPEG markers without a length: TEM, RST0-7, SOI
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8), 0xD8})


def check(fp: BinaryIO, family: str) -> None:
    """Refuse ``fp`` (an open file of ``family``, as sniffed) if its structure is out of bounds."""
    if family == "JPEG":
        _jpeg(fp)
    elif family == "PNG":
        _png(fp)
    elif family == "BMP":
        _bmp(fp)


def _bmp(fp: BinaryIO) -> None:
    fp.seek(14)
    header = fp.read(_BMP_INFO.size)
    if len(header) < _BMP_INFO.size or _BMP_INFO.unpack(header)[0] < 40:
        return  # an OS/2 header (no compression), or cut short: Pillow's to say
    _, width, height, _, _, compression = _BMP_INFO.unpack(header)
    if compression in _BMP_RLE and abs(width) * abs(height) > MAX_RLE_BMP_PIXELS:
        raise DecompressionBomb(f"a run-length-encoded BMP of more than {MAX_RLE_BMP_PIXELS} pixels")


def _jpeg(fp: BinaryIO) -> None:
    with mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as data:
        size, pos, segments, junk, progressive, pixels = len(data), 2, 0, 0, False, 0
        while True:  # the segments before the first scan, as Pillow walks them
            start = pos
            while pos < size and data[pos] != 0xFF:  # extraneous bytes: skipped in C, counted
                found = data.find(b"\xff", pos, min(size, pos + MAX_JUNK_BYTES + 1))
                pos = found if found >= 0 else min(size, pos + MAX_JUNK_BYTES + 1)
            while pos < size and data[pos] == 0xFF:
                run = data[pos:pos + 65536]
                pos += len(run) - len(run.lstrip(b"\xff"))
            junk += max(0, pos - start - 1)
            if junk > MAX_JUNK_BYTES:
                raise CorruptImage(f"the JPEG has more than {MAX_JUNK_BYTES} bytes outside its segments")
            if pos >= size:
                return  # cut off before its pixels: Pillow's to say
            marker, pos = data[pos], pos + 1
            if marker == 0x00:  # a stuffed 0xFF: junk to Pillow, which walks on past it
                junk += 2
                continue
            if marker == 0xDA:
                break
            if marker == 0xD9:
                return
            if marker in _PROGRESSIVE_FRAMES and pos + 7 <= size:  # the largest, of any (libjpeg refuses a second)
                progressive = True
                height, width = (side or 0xFFFF for side in struct.unpack(">HH", data[pos + 3:pos + 7]))  # 0: DNL
                pixels = max(pixels, width * height)
            segments += 1
            if segments > MAX_SEGMENTS:
                raise DecompressionBomb(f"the JPEG has more than {MAX_SEGMENTS} segments before its pixels")
            if marker not in _STANDALONE:
                if pos + 2 > size:
                    return
                pos += struct.unpack(">H", data[pos:pos + 2])[0]
        if progressive:  # a sequential JPEG has a scan per component at most (2 ms of CPU saved per 5 MB photo)
            _scans(data, pos, min(MAX_SCANS, MAX_SCAN_PIXELS // max(1, pixels)), pixels)


#: a marker in or after a scan's entropy-coded data: 0xFF then neither a stuffed 0x00, a restart marker nor fill
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _scans(data: mmap.mmap, pos: int, limit: int, pixels: int) -> None:
    """Count the scans from the first SOS's length field at ``pos``, up to ``limit`` for a frame of ``pixels``: the
    markers between scans are walked (each segment skipped by its length, as libjpeg does, so nothing hides in a
    COM), the entropy-coded data searched in C."""
    scans, markers, size, after = 1, 0, len(data), pos
    while True:
        if pos is not None:  # a segment's length field: past the segment
            if pos + 2 > size:
                return
            pos += struct.unpack(">H", data[pos:pos + 2])[0]
        found = _MARKER.search(data, pos if pos is not None else after)
        if found is None:
            return
        marker, after = data[found.start() + 1], found.start() + 2
        if marker == 0xD9:
            return
        markers += 1
        if markers > MAX_SEGMENTS:
            raise DecompressionBomb(f"the JPEG has more than {MAX_SEGMENTS} segments between its scans")
        if marker == 0xDA:
            scans += 1
            if scans > limit:
                raise DecompressionBomb(f"the JPEG has more than {limit} scans for its {pixels:,} pixels")
        pos = None if marker in _STANDALONE else after


#: PNG chunks that are the image's data, which Pillow decodes in C: counted only in :data:`MAX_PNG_CHUNKS`
_PNG_DATA = frozenset({b"IDAT", b"fdAT", b"fcTL"})


def _png_chunks(fp: BinaryIO):
    """``(kind, length)`` of each chunk before IEND, at most :data:`MAX_PNG_CHUNKS` + 1 of them; ``fp`` is at the
    chunk's data while the caller holds it (the walk reads only the chunk headers)."""
    pos = 8
    for _ in range(MAX_PNG_CHUNKS + 1):
        fp.seek(pos)
        head = fp.read(8)
        if len(head) < 8:
            return
        length, kind = struct.unpack(">I4s", head)
        if kind == b"IEND":
            return
        yield kind, length
        pos += 12 + length


def _png(fp: BinaryIO) -> None:
    """Every chunk to IEND: Pillow walks those after the image data too, when it loads it (``load_end``)."""
    others = 0
    for count, (kind, _) in enumerate(_png_chunks(fp), 1):
        if count > MAX_PNG_CHUNKS:
            raise DecompressionBomb(f"the PNG has more than {MAX_PNG_CHUNKS} chunks")
        if kind not in _PNG_DATA:
            others += 1
            if others > MAX_SEGMENTS:
                raise DecompressionBomb(f"the PNG has more than {MAX_SEGMENTS} chunks besides its image data")


def png_exif(fp: BinaryIO) -> bytes | None:
    """The payload of a PNG's first ``eXIf`` chunk, wherever it is, by walking the chunk headers (no pixel is
    decoded: Pillow's ``getexif()`` decodes every pixel to reach one after the image data); ``None`` if it has none,
    or if it is not found within :data:`MAX_PNG_CHUNKS` chunks."""
    for kind, length in _png_chunks(fp):
        if kind == b"eXIf":
            return fp.read(length)
    return None
