"""JPEG markers and PNG chunks before the pixels, a JPEG's scans, a TIFF's strips and a GIF's blocks: counted, and
bounded, before Pillow parses them.

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
import zlib
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from app.errors import CorruptImage, DecompressionBomb, UnsupportedFormat

#: segments before the pixels (JPEG markers before the first SOS, PNG chunks before the first IDAT)
MAX_SEGMENTS = 1000
#: scans of a JPEG read scan by scan (SOS markers before its EOI): a progressive one's, or a sequential one's whose
#: first scan holds fewer than all its components (libjpeg then reads every scan, a pass each)
MAX_SCANS = 100
#: scans times pixels of a progressive JPEG: each scan is a pass over the whole image's coefficients (99 scans of
#: an 8000x8000 photo took 4.3 s of CPU per decode, an adversarial run); 31 scans at 64 MP, 83 at 24 MP, and
#: MAX_SCANS below 20 MP. libjpeg's and mozjpeg's progressive photos have 10-12.
MAX_SCAN_PIXELS = 2_000_000_000
#: APP1 segments of a JPEG that start as Exif: Pillow joins each to the ones before (``info["exif"] += ...``), a
#: copy of all of them each time (760 in 50 MB took 12 s of CPU an open: a fourth adversarial run); a photo has one
MAX_EXIF_SEGMENTS = 16
#: bytes of a JPEG's quantization tables (its DQT segments'): Pillow reads each table in Python, a list made of it
#: (49.8 MB of 760 segments of 1,008 tables took 3 s of CPU an open, 28-35 s a job of pipeline v2: an adversarial
#: run); a photo has two to four of 65 bytes, 129 at 16 bits, and this is 64 of the larger
MAX_QUANTIZATION_BYTES = 64 * 129
#: image resource blocks in a JPEG's Photoshop segments (APP13 that start "Photoshop 3.0"): Pillow walks them in
#: Python, each kept (4.1 million took 2.8 s of CPU an open, 24 s a job: the same run); a photo has tens
MAX_PHOTOSHOP_RESOURCES = 4096
#: chunks of a WebP walked to tell its image from the rest (an animation of 3,000 frames has 3,000 ANMF chunks);
#: what lies past them is priced as metadata
MAX_WEBP_CHUNKS = 1 << 16
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

#: the start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC)
_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: the frames of a progressive JPEG (SOF2, SOF6, SOF10, SOF14): a pass over the image per scan
_PROGRESSIVE_FRAMES = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
#: JPEG markers without a length: TEM, RST0-7, SOI
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8), 0xD8})


#: numbers in a TIFF's first IFD, the one Pillow opens (its tags' values: strip and tile offsets and byte counts, a
#: colour map...): Pillow makes a Python object of each when it opens the file (some 36 bytes for 2 of the file's).
#: A 64 MP photo in strips of one row has 2 x 20,000 of them, four times that with its planes stored apart.
MAX_TIFF_VALUES = 1 << 20
#: strips (or tiles) a TIFF may list beyond those its size holds: Pillow builds a tile of some 270 bytes for each
#: one listed, and a 4 MB TIFF of 64x64 pixels listing 2,000,000 strips took 1.2 GB of the worker and 603 MB of
#: the web, 40 s a job (an adversarial run); a few more than the size holds are let through, as libtiff does
TIFF_SPARE_STRIPS = 1024
#: strips (or tiles) of a TIFF in all, however large its size: a tile of some 270 bytes each when Pillow opens it,
#: before any size is checked (a TIFF of 1 x 1,040,000 pixels in strips of a row took 311 MB to be refused as too
#: tall: an adversarial run); 35 MB at most. A 20,000-row photo in strips of a row with 4 planes apart lists 80,000
MAX_TIFF_STRIPS = 1 << 17
#: values of the directories Pillow reads whole when it loads a TIFF (Exif, GPS, Interop), and of its Orientation
#: (read whole to turn the image): some 45-185 bytes of the worker's each (an IFDRational is the most), 12 MB at
#: most. A camera's Exif and GPS hold a few hundred.
MAX_TIFF_DECODED_VALUES = 1 << 16
#: TIFF field types whose values Pillow reads as one ``bytes`` object (BYTE, ASCII, SBYTE, UNDEFINED), whatever
#: their count
_TIFF_BYTE_TYPES = frozenset({1, 2, 6, 7})
#: the size of a value of each TIFF field type Pillow reads (``ImageFileDirectory_v2._load_dispatch``; it skips a
#: tag of any other type, and keeps its next copy: SLONG8 and IFD8 copies first hid 2,000,000 strips, a review)
_TIFF_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 16: 8}
#: the tags naming strips or tiles: StripOffsets, StripByteCounts, TileOffsets, TileByteCounts
_TIFF_STRIP_TAGS = (273, 279, 324, 325)
#: data sub-blocks of a GIF in all (image data and extensions): Pillow walks them in Python, one ``read`` each,
#: when it counts or seeks frames; a 50 MB GIF of 255-byte sub-blocks has some 200,000
MAX_GIF_BLOCKS = 500_000
#: sub-blocks of a GIF's extensions: Pillow keeps each of a comment's (a 10 MB GIF comment of 2-byte sub-blocks
#: took 460 MB an open and a 64x64 job 1 GB of the worker: an adversarial run); an XMP packet of 1 MB, stored as
#: GIFs do, has some 12,000
MAX_GIF_EXTENSION_BLOCKS = 100_000
#: what may start a block of a GIF: an extension, an image, the trailer (Pillow skips any other byte, one at a time)
_GIF_INTRO = re.compile(rb"[\x21\x2c\x3b]")


def check(fp: BinaryIO, family: str) -> int:
    """Refuse ``fp`` (an open file of ``family``, as sniffed) if its structure is out of bounds; its
    :func:`metadata_bytes` (a GIF's from the same walk: it is the longest)."""
    if family == "GIF":
        return _gif(fp)
    if family == "JPEG":
        _jpeg(fp)
    elif family == "PNG":
        _png(fp)
    elif family == "BMP":
        _bmp(fp)
    elif family == "TIFF":
        _tiff(fp)
    return metadata_bytes(fp, family)


def _tiff(fp: BinaryIO) -> None:
    """The first IFD's values, and its strips or tiles against the size it declares (classic TIFF and BigTIFF); the
    values Pillow decodes whole when it loads the image."""
    directory = _tiff_directory(fp)
    if directory is None:
        return
    values = sum(tag.count for tag in directory.values() if tag.kind not in _TIFF_BYTE_TYPES)
    if values > MAX_TIFF_VALUES:
        raise DecompressionBomb(f"the TIFF's first directory has more than {MAX_TIFF_VALUES} values")
    expected = _tiff_strips(directory)
    listed = max((directory[tag].count for tag in _TIFF_STRIP_TAGS if tag in directory), default=0)
    if listed > MAX_TIFF_STRIPS:
        raise DecompressionBomb(f"the TIFF lists {listed} strips or tiles, more than {MAX_TIFF_STRIPS}")
    if expected is not None and listed > expected + TIFF_SPARE_STRIPS:
        raise CorruptImage(f"the TIFF lists {listed} strips or tiles where its size holds {expected}")
    raw = _tiff_raw_values(fp, _TIFF_COMPRESSION | _TIFF_OFFSET_TAGS)  # as libtiff reads them
    compressions = set(raw.get(259, ()))
    if compressions & _TIFF_JPEG_COMPRESSIONS:
        _tiff_jpeg_strips(fp, compressions, {start for tag in _TIFF_OFFSET_TAGS for start in raw.get(tag, ())})
    _tiff_layout_read_alike(fp)
    decoded = directory[274].count if 274 in directory else 0
    decoded += sum(tag.count for sub in _tiff_sub_directories(fp, directory) for tag in sub.values()
                   if tag.kind not in _TIFF_BYTE_TYPES)
    if decoded > MAX_TIFF_DECODED_VALUES:
        raise DecompressionBomb(f"the TIFF's Exif and GPS directories and Orientation have more than "
                                f"{MAX_TIFF_DECODED_VALUES} values")


#: TIFF compressions whose strips or tiles are JPEG streams: old-style (6, refused) and TIFF Technical Note 2's (7)
_TIFF_JPEG_COMPRESSIONS = frozenset({6, 7})
#: the frames libtiff's JPEG strips are read in one pass from: baseline and extended sequential, Huffman coded
_SEQUENTIAL_FRAMES = frozenset({0xC0, 0xC1})


def _tiff_jpeg_strips(fp: BinaryIO, compressions: set[int], starts: set[int]) -> None:
    """Every JPEG strip or tile of the first IFD one sequential scan of all its components, as TIFF writers make
    them. A progressive strip is a pass over its coefficients per scan, up to 100 each (libtiff's), held whole in
    memory meanwhile, and the scan limits a JPEG has (:data:`MAX_SCAN_PIXELS`) did not reach inside a TIFF: 62,500
    tiles of 32x32 pointing at one 2.9 KB JPEG of 99 scans, 503 KB in all, took 15 s of the worker's CPU a render,
    and progressive strips 350 MB over a budget that priced 81 MB (an adversarial run). Old-style JPEG (6), which
    names its own streams, is not processed.

    The strips are those of every StripOffsets and TileOffsets entry, of any integer type: libtiff decodes from
    the later of the two (one field to it), and reads BYTE, SBYTE, SLONG8 and IFD8 offsets Pillow skips (a
    re-attack hid 7,056 progressive tiles behind a baseline strip, and 62,500 behind IFD8 offsets). Each strip's
    header is walked only up to the next strip's start, so the walk reads each byte of the file once at most (a
    strip of 2,000 fill bytes before its next walked through every later one: 30 s of CPU for 2 MB); one whose
    header runs into the next strip is refused: TIFF writers never overlap them. The segments walked are
    :data:`TIFF_JPEG_SEGMENTS_PER_STRIP` a strip in all (990 restart markers before each of 21,024 strips took 8.7
    s of CPU a walk, in the probe and again in every render: a re-attack). ``compressions``: every Compression
    value of the first IFD, any copy, any integer type (libtiff takes the first copy, whatever its type; Pillow
    skipped an SBYTE 7 and a SLONG8 7 before a SHORT 5, and libtiff decoded the progressive tiles: a re-attack);
    ``starts``: the strips' and tiles' offsets, read so too."""
    if 6 in compressions:
        raise UnsupportedFormat("old-style JPEG compression in a TIFF is not processed")
    starts = sorted(starts)
    budget = [max(MAX_SEGMENTS, TIFF_JPEG_SEGMENTS_PER_STRIP * len(starts))]
    with mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for number, start in enumerate(starts):
            end = starts[number + 1] if number + 1 < len(starts) else len(data)
            head = _jpeg_stream_head(data, start, end, budget)
            if head is None:
                continue  # no JPEG stream there: libtiff's to refuse
            frame, components, first_scan = head
            if frame not in _SEQUENTIAL_FRAMES or first_scan < components:
                raise UnsupportedFormat("a TIFF whose JPEG strips are progressive or in several scans is not "
                                        "processed")


#: segments of a JPEG TIFF's strips walked, a strip, in all: a writer's strip has its SOI, frame and scan header
#: (and its tables, and a restart interval, when JPEGTables does not hold them): under 10
TIFF_JPEG_SEGMENTS_PER_STRIP = 16
#: every integer TIFF type libtiff reads a tag of (Pillow skips SLONG8 and IFD8, and reads BYTE and SBYTE as bytes)
_TIFF_ANY_INTEGERS = {1: "B", 3: "H", 4: "I", 6: "b", 8: "h", 9: "i", 13: "I", 16: "Q", 17: "q", 18: "Q"}
#: StripOffsets, TileOffsets
_TIFF_OFFSET_TAGS = frozenset({273, 324})
#: Compression
_TIFF_COMPRESSION = frozenset({259})


def _tiff_first_table(fp: BinaryIO) -> tuple[_TiffFile, int, bytes] | None:
    """The first IFD's entries as they are in the file: (its shape, where the entries start, their bytes)."""
    shape = _tiff_file(fp)
    if shape is None or shape.first >= shape.size:
        return None
    fp.seek(shape.first)
    raw = fp.read(struct.calcsize(shape.count_format))
    if len(raw) < struct.calcsize(shape.count_format):
        return None
    entries = min(struct.unpack(shape.count_format, raw)[0], 65535)
    return shape, shape.first + len(raw), fp.read(entries * shape.entry.size)


#: the tags that give the size of what libtiff decodes at once, and its layout: ImageWidth, ImageLength,
#: BitsPerSample, PhotometricInterpretation, SamplesPerPixel, RowsPerStrip, PlanarConfiguration, TileWidth,
#: TileLength, ExtraSamples, SampleFormat, YCbCrSubSampling
_TIFF_LAYOUT_TAGS = frozenset({256, 257, 258, 262, 277, 278, 284, 322, 323, 338, 339, 530})


def _tiff_layout_read_alike(fp: BinaryIO) -> None:
    """Each layout tag of the first IFD listed once at most, in an integer type Pillow reads. libtiff keeps a
    tag's first copy, of any integer type; Pillow skips SLONG8 and IFD8 copies and keeps the next, and the budget
    prices what Pillow read: TileWidth and TileLength typed SLONG8 made a 64x64 image of 16384x16384 tiles to
    libtiff, 1 GiB a render priced 8 MB, and a SLONG8 RowsPerStrip before a LONG 1 one strip of the whole image
    (an adversarial run). TIFF writers list each tag once. (The offsets and Compression are read in every copy,
    as libtiff may read them: :func:`_tiff_raw_values`.)"""
    found = _tiff_first_table(fp)
    if found is None:
        return
    shape, _, table = found
    seen: set[int] = set()
    for pos in range(0, len(table) - shape.entry.size + 1, shape.entry.size):
        tag, kind, _, _ = shape.entry.unpack_from(table, pos)
        if tag not in _TIFF_LAYOUT_TAGS:
            continue
        if tag in seen or kind not in _TIFF_INTEGERS:
            raise CorruptImage(f"the TIFF lists its layout tag {tag} twice, or in a type Pillow does not read")
        seen.add(tag)


def _tiff_raw_values(fp: BinaryIO, wanted: frozenset[int]) -> dict[int, list[int]]:
    """Every value of every entry of the ``wanted`` tags in the first IFD, as libtiff may read them: any integer
    type, every copy (their values joined, in the order of the entries)."""
    first = _tiff_first_table(fp)
    if first is None:
        return {}
    shape, table_at, table = first
    found: dict[int, list[int]] = {}
    for pos in range(0, len(table) - shape.entry.size + 1, shape.entry.size):
        tag, kind, count, field = shape.entry.unpack_from(table, pos)
        unit = _TIFF_ANY_INTEGERS.get(kind)
        if tag not in wanted or unit is None or not count:
            continue
        length = count * struct.calcsize(unit)
        where = (struct.unpack(shape.order + ("I" if len(field) == 4 else "Q"), field)[0] if length > len(field)
                 else table_at + pos + shape.entry.size - len(field))
        if where + length > shape.size:
            continue  # more values than the file holds: neither Pillow nor libtiff reads them (the file is corrupt)
        if count > MAX_TIFF_STRIPS:
            raise DecompressionBomb(f"the TIFF lists {count} values of its tag {tag}, more than {MAX_TIFF_STRIPS}")
        fp.seek(where)
        values = fp.read(length)
        count = len(values) // struct.calcsize(unit)
        unpacked = struct.unpack(f"{shape.order}{count}{unit}", values[:count * struct.calcsize(unit)])
        found.setdefault(tag, []).extend(value for value in unpacked if value >= 0)
    return found


def _jpeg_stream_head(data: mmap.mmap, start: int, end: int, budget: list[int]) -> tuple[int, int, int] | None:
    """The frame's marker, its components and its first scan's components of the JPEG stream at ``start``, read
    segment by segment (fill bytes skipped in C) to its first SOS before ``end``; None where no such stream is (no
    SOI, no frame before the scan, a marker where none may be). :class:`CorruptImage` if its header runs past
    ``end`` (into the next strip). ``budget``: the segments the caller's walk may still take, in a list (spent
    here; :class:`DecompressionBomb` when it runs out)."""
    size, frame = min(len(data), end), None
    if data[start:start + 2] != b"\xff\xd8":
        return None
    pos = start + 2
    for _ in range(MAX_SEGMENTS):
        budget[0] -= 1
        if budget[0] < 0:
            raise DecompressionBomb("the TIFF's JPEG strips have more segments before their pixels than "
                                    f"{TIFF_JPEG_SEGMENTS_PER_STRIP} a strip")
        if pos >= size:
            break
        if data[pos] != 0xFF:
            return None
        pos += 1
        while pos < size and data[pos] == 0xFF:  # fill bytes, 4 KiB at a time
            run = data[pos:min(size, pos + 4096)]
            pos += len(run) - len(run.lstrip(b"\xff"))
        if pos + 3 > size:
            break
        marker, pos = data[pos], pos + 1
        if marker in _FRAMES and pos + 8 <= size:
            frame = (marker, data[pos + 7])
        elif marker == 0xDA:
            return None if frame is None else (*frame, data[pos + 2])
        if marker not in _STANDALONE:
            pos += struct.unpack(">H", data[pos:pos + 2])[0]
    else:
        raise DecompressionBomb(f"a JPEG strip of the TIFF has more than {MAX_SEGMENTS} segments before its pixels")
    raise CorruptImage("a JPEG strip of the TIFF runs into the next one, or past the end of the file, before its "
                       "pixels")


def _tiff_metadata(fp: BinaryIO) -> int:
    directory = _tiff_directory(fp)
    if directory is None:
        return 0
    return sum(tag.count for ifd in (directory, *_tiff_sub_directories(fp, directory)) for tag in ifd.values()
               if tag.kind in _TIFF_BYTE_TYPES and tag.outside)


class _TiffTag(NamedTuple):
    kind: int
    count: int
    #: its first value, for an integer type: what Pillow reads a scalar tag (or a directory's offset) as
    first: int | None
    #: its values are stored outside the entry (their count is bytes Pillow reads)
    outside: bool


#: the integer TIFF types Pillow reads: SHORT, LONG, SSHORT, SLONG, IFD, LONG8
_TIFF_INTEGERS = {3: "H", 4: "I", 8: "h", 9: "i", 13: "I", 16: "Q"}
#: the directories Pillow reads whole when it loads a TIFF (``TiffImageFile.load_end``: ``TAGS_V2_GROUPS``), where
#: the first directory points to them: Exif, GPS (and Interop, pointed to from Exif's)
_TIFF_SUB_DIRECTORIES = (34665, 34853)
_TIFF_INTEROP = 40965


class _TiffFile(NamedTuple):
    order: str
    #: the count before a directory's entries, and an entry (tag, type, count, value field)
    count_format: str
    entry: struct.Struct
    first: int
    size: int


def _tiff_file(fp: BinaryIO) -> _TiffFile | None:
    """A TIFF's byte order, shapes and first IFD's offset, or None when the file is not as a TIFF is."""
    fp.seek(0)
    head = fp.read(16)
    order = {b"II": "<", b"MM": ">"}.get(head[:2])
    if order is None or len(head) < 8:
        return None
    magic = struct.unpack(order + "H", head[2:4])[0]
    size = fp.seek(0, 2)
    if magic == 42:
        return _TiffFile(order, order + "H", struct.Struct(order + "HHI4s"), struct.unpack(order + "I", head[4:8])[0],
                         size)
    if magic == 43 and len(head) == 16:
        return _TiffFile(order, order + "Q", struct.Struct(order + "HHQ8s"), struct.unpack(order + "Q", head[8:16])[0],
                         size)
    return None


def _tiff_directory(fp: BinaryIO) -> dict[int, _TiffTag] | None:
    """The tags of the first IFD that Pillow keeps (``ImageFileDirectory_v2.load``), or None when the file is not as
    a TIFF is (Pillow's to say)."""
    shape = _tiff_file(fp)
    return None if shape is None else _tiff_ifd(fp, shape, shape.first)


def _tiff_sub_directories(fp: BinaryIO, directory: dict[int, _TiffTag]) -> list[dict[int, _TiffTag]]:
    """The Exif, GPS and Interop directories Pillow reads whole when it loads the image (``load_end``; a 24 MB GPS
    directory of RATIONALs took 554 MB of the worker after its budget was taken: an adversarial run): each where
    the first directory's tag (Interop: Exif's) gives its offset: the tag's first value, as Pillow takes it
    whatever the count (a pointer of count 2 walked round the bound: 773 MB a render, a fourth adversarial run)."""
    shape = _tiff_file(fp)
    if shape is None:
        return []
    found = []
    for tag in _TIFF_SUB_DIRECTORIES:
        pointer = directory.get(tag)
        if pointer is not None and pointer.first is not None and pointer.first >= 0:
            found.append(_tiff_ifd(fp, shape, pointer.first) or {})
            interop = found[-1].get(_TIFF_INTEROP) if tag == 34665 and _TIFF_INTEROP in directory else None
            if interop is not None and interop.first is not None and interop.first >= 0:
                found.append(_tiff_ifd(fp, shape, interop.first) or {})
    return found


def _tiff_ifd(fp: BinaryIO, shape: _TiffFile, offset: int) -> dict[int, _TiffTag] | None:
    """The tags Pillow keeps of the IFD at ``offset``: of a known type, with values, the first such copy of each,
    and while the values stored outside the entries, in all, fit in the file (a copy skipped makes way for the
    next: a review hid 2,000,000 strips behind copies of count 0)."""
    order, size = shape.order, shape.size
    if offset >= size:
        return None
    fp.seek(offset)
    raw = fp.read(struct.calcsize(shape.count_format))
    if len(raw) < struct.calcsize(shape.count_format):
        return None
    entries = struct.unpack(shape.count_format, raw)[0]
    if entries > 65535:  # a classic IFD holds no more; a BigTIFF one so large is not a photo
        raise DecompressionBomb("a TIFF directory has more than 65535 tags")
    table = fp.read(entries * shape.entry.size)
    tags, outside_bytes = {}, 0
    for pos in range(0, len(table) - shape.entry.size + 1, shape.entry.size):
        tag, kind, count, field = shape.entry.unpack_from(table, pos)
        if tag in tags or kind not in _TIFF_TYPE_SIZES:
            continue
        length = count * _TIFF_TYPE_SIZES[kind]
        where = struct.unpack(order + ("I" if len(field) == 4 else "Q"), field)[0]
        outside = length > len(field)
        if outside:
            if where >= 1 << 63:
                continue
            outside_bytes += length  # Pillow counts a tag it then skips too
            if outside_bytes > size or where + length > size:
                continue  # more than the file holds: Pillow skips the tag
        if not length:
            continue
        first = None
        if kind in _TIFF_INTEGERS:
            unit = struct.Struct(order + _TIFF_INTEGERS[kind])
            if outside:
                fp.seek(where)
                first = unit.unpack(fp.read(unit.size))[0]
            else:
                first = unit.unpack_from(field)[0]
        tags[tag] = _TiffTag(kind, count, first, outside)
    return tags


def exif_orientation(fp: BinaryIO) -> int | None:
    """The Orientation (tag 274) of the TIFF structure in ``fp`` (a TIFF file, or an EXIF block's) as Pillow would
    make it: its first value if an integer of 1-8 (Pillow takes the first of several), else 1 (a fraction is no
    orientation), None if it is not there (Pillow skips it too); the position is restored. Pillow decodes
    every value of a tag it is asked for: an Orientation of 1,000,000 RATIONALs, 8 MB in a PNG's ``eXIf``, took
    165 MB of the web's probe."""
    position = fp.tell()
    try:
        directory = _tiff_directory(fp)
    except DecompressionBomb:
        return 1
    finally:
        fp.seek(position)
    tag = None if directory is None else directory.get(274)
    if tag is None:
        return None
    return tag.first if tag.first is not None and 1 <= tag.first <= 8 else 1


def _tiff_value(tags: dict[int, _TiffTag], tag: int, default: int | None = None) -> int | None:
    """A scalar tag's value (its first, as Pillow reads it), or ``default``."""
    found = tags.get(tag)
    return default if found is None or found.first is None else found.first


def _tiff_strips(tags: dict[int, _TiffTag]) -> int | None:
    """How many strips or tiles the first IFD's size holds (TIFF 6.0: StripsPerImage, TilesPerImage), or None."""
    width, height = _tiff_value(tags, 256), _tiff_value(tags, 257)
    if not width or not height:
        return None
    planes = _tiff_value(tags, 277, 1) if _tiff_value(tags, 284, 1) == 2 else 1
    tile_width, tile_length = _tiff_value(tags, 322), _tiff_value(tags, 323)
    if tile_width and tile_length and 273 not in tags:  # Pillow reads strips when StripOffsets is there
        return -(-width // tile_width) * -(-height // tile_length) * max(1, planes)
    rows = min(_tiff_value(tags, 278, height) or height, height)
    return -(-height // rows) * max(1, planes)


def _gif(fp: BinaryIO) -> int:
    """Every block to the trailer, as Pillow walks them: its sub-blocks counted, bytes between blocks too; the bytes
    of its extensions' sub-blocks (a comment's Pillow keeps, and joins)."""
    with mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as data:
        size = len(data)
        if size < 13:
            return 0
        pos = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)  # past the global colour table
        blocks = extension_blocks = extension_bytes = junk = frame = 0
        while pos < size:
            found = _GIF_INTRO.search(data, pos, min(size, pos + MAX_JUNK_BYTES - junk + 1))
            if found is None:
                if size - pos > MAX_JUNK_BYTES - junk:
                    raise CorruptImage(f"the GIF has more than {MAX_JUNK_BYTES} bytes outside its blocks")
                return extension_bytes
            junk += found.start() - pos
            pos, intro = found.start(), data[found.start()]
            if intro == 0x3B:
                return extension_bytes
            blocks += 1  # a block with no sub-block is walked too (an extension of none: 3 bytes)
            if blocks > MAX_GIF_BLOCKS:
                raise DecompressionBomb(f"the GIF has more than {MAX_GIF_BLOCKS} data blocks")
            extension = intro == 0x21
            if extension:
                label = data[pos + 1] if pos + 1 < size else 0
                pos += 2  # the introducer and the label
                for _ in range(_gif_sub_blocks_read(data, pos, label, frame)):
                    if pos >= size:
                        return extension_bytes
                    length = data[pos]
                    pos += 1 + length
                    blocks += length > 0
                    extension_blocks += length > 0
                    extension_bytes += length
            else:
                if pos + 10 > size:
                    return extension_bytes
                flags = data[pos + 9]
                pos += 10 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0) + 1  # the local colour table, LZW size
                frame += 1
            while pos < size:
                length = data[pos]
                pos += 1 + length
                if not length:
                    break
                blocks += 1
                extension_blocks += extension
                extension_bytes += length if extension else 0
                if blocks > MAX_GIF_BLOCKS:
                    raise DecompressionBomb(f"the GIF has more than {MAX_GIF_BLOCKS} data blocks")
                if extension_blocks > MAX_GIF_EXTENSION_BLOCKS:
                    raise DecompressionBomb(f"the GIF's extensions have more than {MAX_GIF_EXTENSION_BLOCKS} blocks")
        return extension_bytes


def _gif_sub_blocks_read(data: mmap.mmap, pos: int, label: int, frame: int) -> int:
    """How many sub-blocks of an extension at ``pos`` Pillow reads whether or not they are empty, before it reads
    the rest up to an empty one: none of a comment, the first of any other, the first two of a NETSCAPE2.0 loop in
    the first frame (``GifImageFile._seek``). An extension whose first sub-block is empty has the bytes after it
    read as its own: a walk that ended it there took a 3B after it for the trailer and missed the comment of
    countless sub-blocks behind it (679 MB an open, an adversarial run)."""
    if label == 0xFE:
        return 0
    first = data[pos] if pos < len(data) else 0
    if label == 0xFF and frame == 0 and first >= 11 and data[pos + 1:pos + 12] == b"NETSCAPE2.0":
        return 2
    return 1


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
        progressive, pixels, components, quantization, resources = False, 0, 0, 0, 0
        for marker, pos in _jpeg_segments(data):
            length = struct.unpack(">H", data[pos:pos + 2])[0] if pos + 2 <= len(data) else 0
            if marker == 0xDB:
                quantization += max(0, length - 2)
                if quantization > MAX_QUANTIZATION_BYTES:
                    raise DecompressionBomb(f"the JPEG has more than {MAX_QUANTIZATION_BYTES} bytes of "
                                            "quantization tables")
            elif marker == 0xED and data[pos + 2:pos + 16] == PHOTOSHOP:
                resources += _photoshop_resources(data[pos + 2:pos + length], MAX_PHOTOSHOP_RESOURCES - resources)
            if marker in _FRAMES and pos + 8 <= len(data):  # the largest, of any (libjpeg refuses two)
                progressive = progressive or marker in _PROGRESSIVE_FRAMES
                height, width = (side or 0xFFFF for side in struct.unpack(">HH", data[pos + 3:pos + 7]))  # 0: DNL
                pixels, components = max(pixels, width * height), max(components, data[pos + 7])
            # a sequential JPEG whose first scan holds every component has no other (2 ms of CPU saved per 5 MB
            # photo); one that holds fewer is read scan by scan to its EOI, a pass over the image each, however
            # many: 1,000 repeated scans in 42 KB of arithmetic coding took 14 s of CPU a render (a seventh run)
            if marker == 0xDA and (progressive or (pos + 3 <= len(data) and data[pos + 2] < components)):
                _scans(data, pos, min(MAX_SCANS, MAX_SCAN_PIXELS // max(1, pixels)), pixels,
                       _Progression() if progressive else _Sequence())


class JpegFrame(NamedTuple):
    """The frame libjpeg decodes, for the memory budget's price of its coefficients."""

    #: the SOF marker (None: no frame before the first scan)
    marker: int | None
    #: each component's (horizontal, vertical) sampling factors
    sampling: tuple[tuple[int, int], ...]
    #: the components the first scan sends
    first_scan: int


def jpeg_frame(fp: BinaryIO) -> JpegFrame:
    """The first frame and first scan of a JPEG, walked as :func:`_jpeg_segments` walks, as Pillow and libjpeg do
    (libjpeg refuses a second frame). The budget's walk of its own took ``FF 00`` for a marker with a length, where
    they skip two bytes, and stopped at the first byte between segments: a decoy baseline frame in a comment, or
    seven junk bytes before a progressive CMYK frame, priced 64 MP of full-size coefficients as none (1.1 GB a
    worker for a 1 MB file that its honest form had refused, an adversarial run)."""
    with mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as data:
        marker: int | None = None
        sampling: tuple[tuple[int, int], ...] = ()
        for found, pos in _jpeg_segments(data):
            if found == 0xDA:
                return JpegFrame(marker, sampling, data[pos + 2] if pos + 3 <= len(data) else 0)
            if found in _FRAMES and marker is None and pos + 8 <= len(data):
                marker, count = found, data[pos + 7]
                factors = data[pos + 9:pos + 8 + 3 * count:3]  # each component: id, sampling, table
                sampling = tuple((factor >> 4 or 1, factor & 15 or 1) for factor in factors)
    return JpegFrame(marker, sampling, 0)


PHOTOSHOP = b"Photoshop 3.0\x00"


def _photoshop_resources(segment: bytes, limit: int) -> int:
    """The image resource blocks of a Photoshop segment's payload, walked as Pillow walks them (``8BIM``, a code,
    a padded name, a size and padded data, until a block does not start so); more than ``limit`` is a bomb."""
    offset, count = len(PHOTOSHOP), 0
    while segment[offset:offset + 4] == b"8BIM" and offset + 7 <= len(segment):
        count += 1
        if count > limit:
            raise DecompressionBomb(f"the JPEG has more than {MAX_PHOTOSHOP_RESOURCES} Photoshop resources")
        offset += 6 + 1 + segment[offset + 6]  # the signature and code, the name's length and the name
        offset += offset & 1
        if offset + 4 > len(segment):
            break  # Pillow stops where the size cannot be read
        offset += 4 + struct.unpack(">I", segment[offset:offset + 4])[0]
        offset += offset & 1
    return count


def _jpeg_segments(data: mmap.mmap) -> Iterator[tuple[int, int]]:
    """(marker, where its segment's length is) of each segment before the first scan, as Pillow walks them: bytes
    between them skipped (and counted), the walk ends at the first SOS (yielded) or where the file does. An EOI is
    walked past, as Pillow walks past it (an EOI first hid 10,000,000 COM segments behind it: 708 MB an open, a
    fourth adversarial run)."""
    size, pos, segments, junk, exif = len(data), 2, 0, 0, 0
    while True:
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
            yield marker, pos
            return
        segments += 1
        if segments > MAX_SEGMENTS:
            raise DecompressionBomb(f"the JPEG has more than {MAX_SEGMENTS} segments before its pixels")
        if marker == 0xE1 and data[pos + 2:pos + 8] == b"Exif\x00\x00":
            exif += 1
            if exif > MAX_EXIF_SEGMENTS:
                raise DecompressionBomb(f"the JPEG has more than {MAX_EXIF_SEGMENTS} Exif segments")
        yield marker, pos
        if marker not in _STANDALONE and marker != 0xD9:
            if pos + 2 > size:
                return
            pos += struct.unpack(">H", data[pos:pos + 2])[0]


#: a marker in or after a scan's entropy-coded data: 0xFF then neither a stuffed 0x00, a restart marker nor fill
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


class _Sequence:
    """The components a sequential JPEG's scans have sent: each in one scan (ITU T.81, B.2.3). A component sent
    again is decoded again by libjpeg, a pass over the image each."""

    def __init__(self) -> None:
        self.sent: set[int] = set()

    def scan(self, header: bytes, number: int) -> None:
        components = header[1:1 + 2 * header[0]:2] if header else b""
        for component in components:
            if component in self.sent:
                raise CorruptImage(f"the JPEG's scan {number} sends a component an earlier scan sent")
            self.sent.add(component)


class _Progression:
    """The bits each coefficient of each component has been sent to by a progressive JPEG's scans, as libjpeg
    tracks them (``coef_bits``), held to ITU T.81 G.1.1.1: a band's first scan sends it once (``Ah`` 0), each later
    one refines it by one bit (``Ah`` the last ``Al``, ``Al`` one less), and nothing follows its last bit. libjpeg
    only warns, or not at all, where a scan breaks this, and decodes it: a 20 MP progressive photo whose ten scans
    were sent nine times (90, within the scan bounds) took 3.8-7.4 s of CPU a render where it took 0.6-1.0, twice
    over, as libvips gave up on its corrupt data and Pillow decoded it again (an adversarial run)."""

    def __init__(self) -> None:
        self.bits: dict[int, list[int]] = {}

    def scan(self, header: bytes, number: int) -> None:
        count = header[0] if header else 0
        if len(header) < 1 + 2 * count + 3:
            return  # cut short: libjpeg's to refuse
        start, end, approximation = header[1 + 2 * count:4 + 2 * count]
        high, low = approximation >> 4, approximation & 15
        for component in header[1:1 + 2 * count:2]:
            bits = self.bits.setdefault(component, [-1] * 64)
            for k in range(start, min(end, 63) + 1):
                first = high == 0 and bits[k] < 0
                refined = high > 0 and bits[k] == high and low == high - 1
                if not (first or refined) or (start > 0 and bits[0] < 0):
                    raise CorruptImage(f"the JPEG's scan {number} does not follow its progression (coefficient "
                                       f"{k} of component {component} sent again, or out of order)")
                bits[k] = low


def _scans(data: mmap.mmap, pos: int, limit: int, pixels: int, order: _Sequence | _Progression) -> None:
    """Count the scans from the first SOS's length field at ``pos``, up to ``limit`` for a frame of ``pixels``: the
    markers between scans are walked (each segment skipped by its length, as libjpeg does, so nothing hides in a
    COM), the entropy-coded data searched in C. Then each scan's header is held to the ``order`` of its frame."""
    headers = [_scan_header(data, pos)]
    markers, size, after = 0, len(data), pos
    while True:
        if pos is not None:  # a segment's length field: past the segment
            if pos + 2 > size:
                break
            pos += struct.unpack(">H", data[pos:pos + 2])[0]
        found = _MARKER.search(data, pos if pos is not None else after)
        if found is None:
            break
        marker, after = data[found.start() + 1], found.start() + 2
        if marker == 0xD9:
            break
        markers += 1
        if markers > MAX_SEGMENTS:
            raise DecompressionBomb(f"the JPEG has more than {MAX_SEGMENTS} segments between its scans")
        if marker == 0xDA:
            headers.append(_scan_header(data, after))
            if len(headers) > limit:
                raise DecompressionBomb(f"the JPEG has more than {limit} scans for its {pixels:,} pixels")
        pos = None if marker in _STANDALONE else after
    for number, header in enumerate(headers, 1):
        order.scan(header, number)


def _scan_header(data: mmap.mmap, pos: int) -> bytes:
    """An SOS segment's payload (its component count, selectors, spectral band and approximation bits), from its
    length field at ``pos``."""
    if pos + 2 > len(data):
        return b""
    return data[pos + 2:pos + struct.unpack(">H", data[pos:pos + 2])[0]]


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


#: chunks the PNG specification puts before the image data, which change what a render does with the pixels:
#: Pillow reads those after it too, when it loads the image (``load_end``), after the price was made from the
#: header. A grey 8000x8000 PNG whose ``tRNS`` came after its pixels was priced 132 MB as L and converted through
#: LA to RGBA: 1.1-1.2 GB a job in a worker, ``ready`` (an adversarial run). libpng ignores them there.
_PNG_BEFORE_DATA = frozenset({b"tRNS", b"iCCP"})


def _png(fp: BinaryIO) -> None:
    """Every chunk to IEND: Pillow walks those after the image data too, when it loads it (``load_end``)."""
    others = profiles = 0
    data_seen = False
    for count, (kind, _) in enumerate(_png_chunks(fp), 1):
        if count > MAX_PNG_CHUNKS:
            raise DecompressionBomb(f"the PNG has more than {MAX_PNG_CHUNKS} chunks")
        if kind in (b"IDAT", b"fdAT"):  # Pillow starts the image data at an APNG frame's too (a re-attack)
            data_seen = True
        elif data_seen and kind in _PNG_BEFORE_DATA:
            raise CorruptImage(f"the PNG's {kind.decode()} chunk comes after its image data; the PNG "
                               "specification puts it before")
        if kind == b"iCCP":
            profiles += 1
            if profiles > 1:  # Pillow inflates each (up to 1 MiB), to keep the last: 990 took 2.2 s of CPU an open
                raise CorruptImage("the PNG has more than one iCCP chunk; the PNG specification allows one")
        if kind not in _PNG_DATA:
            others += 1
            if others > MAX_SEGMENTS:
                raise DecompressionBomb(f"the PNG has more than {MAX_SEGMENTS} chunks besides its image data")


#: the characters of a PNG's text chunks (tEXt, zTXt, iTXt) Pillow keeps per open, all chunks together (Pillow's
#: default: 64 Mi; ``plugins`` sets it). Pillow counts characters, and a character of an iTXt can take 4 bytes: 255
#: iTXt chunks of 1 Mi emoji each, a 274 KB PNG of 1024x768, held 270 MB an open, 592 MB in the worker and 2 GB for
#: four at once, outside the memory budget (an adversarial run). A photo's text, XMP included, is a few KB to a few
#: hundred. More is refused as a decompression bomb (``_translate.is_text_chunk_bomb``).
PNG_TEXT_CHARACTERS = 4 * 1024 * 1024
#: what one compressed chunk (zTXt, iTXt, iCCP) may inflate to before Pillow refuses it (its ``MAX_TEXT_CHUNK``,
#: set by ``plugins`` to this, Pillow's own default)
PNG_INFLATED_CHUNK_BYTES = 1 << 20
#: the chunks whose bytes Pillow keeps otherwise than as they are in the file
_PNG_TEXT = frozenset({b"tEXt", b"zTXt", b"iTXt", b"iCCP"})
#: bytes that continue a UTF-8 character: a str holds one character for each other byte
_UTF8_CONTINUATION = bytes(range(0x80, 0xC0))
#: bytes below the first that leads a character of four bytes (U+10000 and up), and below the first that leads one
#: of U+0100 and up: what is left of a text once they are deleted says how wide its str is
_BELOW_4_BYTE_LEAD = bytes(range(0xF0))
_BELOW_U0100_LEAD = bytes(range(0xC4))
#: what a PNG's text and profile chunks may decode to in all: its text at four bytes a character, and a profile
PNG_TEXT_BYTES = 4 * PNG_TEXT_CHARACTERS + PNG_INFLATED_CHUNK_BYTES
_PNG_READ = 1 << 16


def _png_metadata(fp: BinaryIO) -> int:
    """The chunks besides the image data, as Pillow keeps them: a text's as the str it decodes, a compressed
    text's or profile's inflated. They had been priced as they are in the file: 16 compressed iTXt chunks of
    262,000 emoji each, a 17 KB PNG of 64x64, took 18 MB a render priced 8 (an adversarial run). Text and profiles
    that decode to more than :data:`PNG_TEXT_BYTES` in all are a bomb, refused before Pillow inflates them."""
    total = decoded = 0
    for kind, length in _png_chunks(fp):
        if kind in _PNG_DATA:
            continue
        if kind not in _PNG_TEXT:
            total += length
            continue
        kept, size = _png_text_kept(fp, kind, length, PNG_TEXT_BYTES - decoded)
        total += kept
        decoded += size
        if decoded > PNG_TEXT_BYTES:
            raise DecompressionBomb(f"the PNG's text and profile decode to more than {PNG_TEXT_BYTES >> 20} MiB")
    return total


def _png_text_kept(fp: BinaryIO, kind: bytes, length: int, most: int) -> tuple[int, int]:
    """Bytes a text or profile chunk is kept in by Pillow (its str: one to four bytes a character, by the widest
    one), and the bytes it decodes to (inflated, if compressed), read from ``fp`` at the chunk's data 64 KiB at
    a time, no more than ``most`` of them nor more than Pillow would inflate. A header that cannot be read is
    priced at four bytes a byte."""
    head = fp.read(min(length, _PNG_READ))
    keyword_end = head.find(b"\x00")
    if kind == b"iTXt":  # keyword, compression flag and method, language, translated keyword, text
        flag, method = head[keyword_end + 1:keyword_end + 2], head[keyword_end + 2:keyword_end + 3]
        if flag not in (b"", b"\x00") and method != b"\x00":  # compressed otherwise than zlib: Pillow skips it
            return length, 0
        compressed = flag not in (b"", b"\x00")  # as Pillow reads it: any flag but 0
        language_end = head.find(b"\x00", keyword_end + 3)
        text_at = head.find(b"\x00", language_end + 1) + 1 if language_end >= 0 else 0
    else:  # tEXt: keyword, text; zTXt and iCCP: keyword or name, compression method, compressed bytes
        compressed = kind != b"tEXt"
        text_at = keyword_end + (2 if compressed else 1)
    if keyword_end < 0 or not 0 < text_at <= len(head):
        return 4 * length, length
    header = 4 * text_at  # the keyword, language and translated keyword, decoded: four bytes a byte at most
    if kind == b"tEXt":  # Latin-1: a byte a character
        return header + length - text_at, length - text_at
    pieces = _png_chunk_pieces(fp, head[text_at:], length - text_at)
    if compressed:
        pieces = _inflated(pieces, min(PNG_INFLATED_CHUNK_BYTES, most))
    if kind != b"iTXt":  # Latin-1 text, or a profile's bytes: a byte each
        size = sum(len(piece) for piece in pieces)
        return header + size, size
    size = chars = 0
    width = 1
    for piece in pieces:
        size += len(piece)
        chars += len(piece.translate(None, _UTF8_CONTINUATION))
        if width < 4 and piece.translate(None, _BELOW_4_BYTE_LEAD):  # U+10000 and up: four bytes a character
            width = 4
        elif width < 2 and piece.translate(None, _BELOW_U0100_LEAD):  # U+0100 and up: two
            width = 2
        if size > most:
            break
    return header + chars * width, size


def _png_chunk_pieces(fp: BinaryIO, first: bytes, length: int) -> Iterator[bytes]:
    """``length`` bytes of a chunk's data, ``first`` already read, the rest from ``fp`` 64 KiB at a time."""
    yield first
    left = length - len(first)
    while left > 0:
        piece = fp.read(min(left, _PNG_READ))
        if not piece:
            return
        left -= len(piece)
        yield piece


def _inflated(pieces: Iterator[bytes], most: int) -> Iterator[bytes]:
    """The zlib stream of ``pieces`` inflated, 64 KiB at a time, up to one byte past ``most`` (where Pillow
    stops and refuses); a stream that breaks ends there."""
    inflate = zlib.decompressobj()
    made = 0
    try:
        for piece in pieces:
            while piece and made <= most:
                out = inflate.decompress(piece, min(_PNG_READ, most + 1 - made))
                made += len(out)
                yield out
                piece = inflate.unconsumed_tail
            if made > most or inflate.eof:
                return
    except zlib.error:
        return


def png_exif(fp: BinaryIO) -> bytes | None:
    """The payload of a PNG's first ``eXIf`` chunk, wherever it is, by walking the chunk headers (no pixel is
    decoded: Pillow's ``getexif()`` decodes every pixel to reach one after the image data); ``None`` if it has none,
    or if it is not found within :data:`MAX_PNG_CHUNKS` chunks."""
    for kind, length in _png_chunks(fp):
        if kind == b"eXIf":
            return fp.read(length)
    return None


#: JPEG markers whose segments Pillow keeps as metadata: APP0-APP15 and COM
_JPEG_METADATA = frozenset({*range(0xE0, 0xF0), 0xFE})
#: WebP chunks of the image itself; Pillow reads the whole file, so every other chunk is priced as metadata (an
#: unknown 60 MB chunk took 122 MB a render: an adversarial run)
_WEBP_IMAGE = frozenset({b"VP8 ", b"VP8L", b"VP8X", b"ALPH", b"ANIM", b"ANMF"})


def metadata_bytes(fp: BinaryIO, family: str) -> int:
    """Bytes of the metadata Pillow keeps while the image is open (a JPEG's APP and COM segments, a PNG's chunks
    before its pixels, a WebP's chunks besides its image, a TIFF's tag values stored as bytes, a GIF's extensions:
    a 25.5 MB comment rendered in 62 MB priced 8-11.5, a fourth adversarial run): held two to four
    times over (the segments, the profile joined from them, its parsed copy), alongside the pixels. 64x64 images
    carrying 45 MB of ICC profile or XMP took 92-189 MB a render, priced as 64x64 (an adversarial run). The file's
    position is restored; a file whose structure is not as expected counts what was found until then."""
    position = fp.tell()
    try:
        fp.seek(0)
        if family == "JPEG":
            return _jpeg_metadata(fp)
        if family == "PNG":
            return _png_metadata(fp)
        if family == "WEBP":
            return _webp_metadata(fp)
        if family == "TIFF":
            return _tiff_metadata(fp)
        if family == "GIF":
            return _gif(fp)
        return 0
    finally:
        fp.seek(position)


def _jpeg_metadata(fp: BinaryIO) -> int:
    """The APP and COM segments' bytes, walked as :func:`_jpeg` walks them (a byte of junk before them hid 45 MB
    of APP13 from a walk that stopped at it: a review)."""
    with mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return sum(struct.unpack(">H", data[pos:pos + 2])[0] for marker, pos in _jpeg_segments(data)
                   if marker in _JPEG_METADATA and pos + 2 <= len(data))


def _webp_metadata(fp: BinaryIO) -> int:
    """Every byte of the file but its image's chunks: Pillow reads the whole file into memory and keeps it while
    the image is open (a review: 60 MB after the RIFF's end, or after 1,000 empty chunks, walked as none)."""
    head = fp.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        return 0
    size = fp.seek(0, 2)
    image, pos, end = 0, 12, min(size, 8 + struct.unpack("<I", head[4:8])[0])
    for _ in range(MAX_WEBP_CHUNKS):
        fp.seek(pos)
        chunk = fp.read(8)
        if len(chunk) < 8 or pos >= end:
            break
        kind, length = chunk[:4], struct.unpack("<I", chunk[4:8])[0]
        if kind in _WEBP_IMAGE:
            image += min(8 + length + (length & 1), size - pos)
        pos += 8 + length + (length & 1)
    return max(0, size - 12 - image)
