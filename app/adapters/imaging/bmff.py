"""HEIF and AVIF containers (ISO base media file format): brands and declared sizes.

HEIC and AVIF are the same container, boxes of ``size, type, payload``,
holding different codecs (HEVC, AV1). Two questions are answered here,
from the container alone, before libheif or libavif see the bytes:

* :func:`family` - which of the two a file is, from its ``ftyp`` box (the
  major brand, or for the generic ``mif1``/``msf1``/``miaf`` brands the
  compatible brands that follow), for :func:`~app.adapters.imaging.sniff.sniff`.
* :func:`read_layout` - every image size the file declares (each ``ispe``
  property: the primary image, grid tiles, thumbnails, auxiliary images;
  and the largest frame each AV1 item's own sequence header allows, which
  is what libavif decodes whatever ``ispe`` says),
  whether the top-level boxes run past the end of the file, and how large
  the codec's decoded pictures are (bit depth and chroma subsampling from
  each ``hvcC``/``av1C`` property), for
  :func:`~app.adapters.imaging.probe.open_checked` and the memory budget.
  libavif refuses an image larger than its own limit as a generic parse
  failure and libheif only at decode time; reading the sizes here holds
  both to attache's limits, and refuses them as the bombs they are,
  whatever the library would say.

Only box headers and the few bytes of those properties are read, a few
hundred bytes for a phone photo; at most :data:`MAX_BOXES` boxes are
looked at.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

#: Brands that name the codec: an HEVC-coded HEIF still image or sequence, an AV1 one.
HEIF_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs"})
AVIF_BRANDS = frozenset({b"avif", b"avis"})
#: Structural brands that say "HEIF" without saying which codec; the compatible brands decide.
GENERIC_BRANDS = frozenset({b"mif1", b"msf1", b"miaf"})

#: The most boxes walked in one file (a phone photo has a few dozen).
MAX_BOXES = 4096
#: Bytes a pixel of a decoded picture takes when no codec configuration says
#: (the worst case: more than 8 bits, stored in 16, at 4:4:4).
UNKNOWN_PICTURE_BYTES = 6.0
#: The most bytes of an ``iloc`` box read (a phone photo's holds a few dozen items: some 16 bytes each).
MAX_ILOC_BYTES = 1 << 16
#: The most extents of all items read from an ``iloc`` box (a phone photo's items have one each).
MAX_EXTENTS = 1 << 16
#: The bytes read at the start of an item's data to find an AV1 sequence header (a temporal delimiter, then a
#: sequence header of some 10-20 bytes, come first).
SEQUENCE_HEADER_BYTES = 256
# Boxes whose payload is more boxes (after a 4-byte version/flags for ``meta``).
_CONTAINERS = {b"meta": 4, b"iprp": 0, b"ipco": 0}


def family(head: bytes) -> str | None:
    """``"HEIF"``, ``"AVIF"`` or ``None``, from the ``ftyp`` box at the start of *head*."""
    if len(head) < 16 or head[4:8] != b"ftyp":
        return None
    size = int.from_bytes(head[:4], "big")
    major = head[8:12]
    compatible = [head[i:i + 4] for i in range(16, min(size, len(head)) - 3, 4)]
    for brand in (major, *compatible) if major in GENERIC_BRANDS else (major,):
        if brand in AVIF_BRANDS:
            return "AVIF"
        if brand in HEIF_BRANDS:
            return "HEIF"
    return None


@dataclass(frozen=True)
class Layout:
    """What :func:`read_layout` found."""

    #: (width, height) of every ``ispe`` property, in file order.
    sizes: tuple[tuple[int, int], ...]
    #: a top-level box runs past the end of the file (a cut-off upload).
    truncated: bool
    #: bytes per pixel of the largest decoded picture the codec configurations
    #: describe (Y plus subsampled Cb/Cr, 1 byte a sample at 8 bits, 2 above),
    #: or :data:`UNKNOWN_PICTURE_BYTES` when there is none.
    picture_bytes: float
    #: the size of the file (libheif and libavif read all of it into memory).
    file_bytes: int
    #: (width, height) of the largest frame an AV1 item's own sequence header allows (its ``max_frame_width`` and
    #: ``max_frame_height``), or None: what libavif decodes, whatever ``ispe`` says. A 1,953-byte AVIF whose
    #: ``ispe`` said 256x256 held a 12000x12000 frame: 520 MB a render, priced as 256x256 (an adversarial run).
    coded: tuple[int, int] | None = None


def read_layout(fp: BinaryIO) -> Layout:
    """Walk the top-level boxes and the ``meta`` box; the file position is restored.

    A box that cannot be parsed stops the walk (libheif or libavif will say
    what is wrong with it); what was found until then is returned.
    """
    position = fp.tell()
    try:
        end = fp.seek(0, os.SEEK_END)
        found = _Found([], [], [], None)
        truncated = _walk(fp, 0, end, end, found, budget=[MAX_BOXES])
        picture = max(found.pictures, default=UNKNOWN_PICTURE_BYTES)
        frames = [size for item in found.items if (size := _coded_size(fp, item, found.idat)) is not None]
        coded = max(frames, key=lambda size: size[0] * size[1], default=None)
        return Layout(tuple(found.sizes) + tuple(frames), truncated, picture, end, coded)
    finally:
        fp.seek(position)


@dataclass
class _Found:
    sizes: list[tuple[int, int]]
    pictures: list[float]
    #: where each item's data starts (``iloc``): (construction method, offset of its first extent)
    items: list[tuple[int, int]]
    #: where the ``idat`` box's data starts (items of construction method 1 are in it), or None
    idat: int | None


def picture_bytes(kind: bytes, config: bytes) -> float | None:
    """Bytes per pixel of the pictures an ``hvcC`` or ``av1C`` configuration decodes to.

    ``hvcC``: ``chroma_format_idc`` (0 grey, 1 4:2:0, 2 4:2:2, 3 4:4:4) in
    byte 16, the luma bit depth minus 8 in byte 17 (ISO/IEC 14496-15).
    ``av1C``: byte 2 holds ``high_bitdepth``, ``twelve_bit``, ``monochrome``
    and the two subsampling flags (AV1 ISOBMFF binding, section 2.3).
    """
    if kind == b"hvcC" and len(config) >= 19:
        chroma = config[16] & 0x03
        deep = (config[17] & 0x07) > 0 or (config[18] & 0x07) > 0
        planes = {0: 1.0, 1: 1.5, 2: 2.0, 3: 3.0}[chroma]
    elif kind == b"av1C" and len(config) >= 3:
        flags = config[2]
        deep = bool(flags & 0x40)
        if flags & 0x10:
            planes = 1.0
        else:
            sub_x, sub_y = bool(flags & 0x08), bool(flags & 0x04)
            planes = 1 + 2 / ((1 + sub_x) * (1 + sub_y))
    else:
        return None
    return planes * (2 if deep else 1)


_CONFIG_READ = {b"hvcC": 19, b"av1C": 3}


def _walk(fp: BinaryIO, start: int, stop: int, file_end: int, found: _Found, budget: list[int]) -> bool:
    """Read the boxes in ``[start, stop)``; return whether one runs past *file_end*."""
    offset = start
    while offset + 8 <= stop and budget[0] > 0:
        budget[0] -= 1
        fp.seek(offset)
        header = fp.read(16)
        if len(header) < 8:
            return False
        size, kind = struct.unpack(">I4s", header[:8])
        header_size = 8
        if size == 1:  # a 64-bit size follows
            if len(header) < 16:
                return False
            (size,) = struct.unpack(">Q", header[8:16])
            header_size = 16
        elif size == 0:  # to the end of the enclosing box
            size = stop - offset
        if size < header_size:
            return False  # malformed: let the decoder report it
        box_end = offset + size
        if box_end > file_end:
            return True
        if kind == b"ispe":
            fp.seek(offset + header_size)
            payload = fp.read(12)
            if len(payload) == 12:
                found.sizes.append(struct.unpack(">II", payload[4:12]))
        elif kind in _CONFIG_READ:
            fp.seek(offset + header_size)
            bpp = picture_bytes(kind, fp.read(_CONFIG_READ[kind]))
            if bpp is not None:
                found.pictures.append(bpp)
        elif kind == b"iloc":
            fp.seek(offset + header_size)
            found.items.extend(_item_locations(fp.read(min(size - header_size, MAX_ILOC_BYTES))))
        elif kind == b"idat":
            found.idat = offset + header_size
        elif kind in _CONTAINERS:
            inner = offset + header_size + _CONTAINERS[kind]
            if _walk(fp, inner, min(box_end, stop), file_end, found, budget):
                return True
        offset = box_end
    return False


def _item_locations(payload: bytes) -> list[tuple[int, int]]:
    """(construction method, offset of the first extent) of each item an ``iloc`` box lists (ISO/IEC 14496-12,
    8.11.3); what cannot be read ends the list."""
    reader, located = _Bytes(payload), []
    try:
        version = reader.int(1)
        reader.int(3)
        sizes = reader.int(1)
        offset_size, length_size = sizes >> 4, sizes & 0x0F
        sizes = reader.int(1)
        base_offset_size, index_size = sizes >> 4, (sizes & 0x0F if version in (1, 2) else 0)
        count = reader.int(4 if version == 2 else 2)
        extents_left = MAX_EXTENTS  # field sizes of 0 never run out of bytes: 4096 x 65535 extents took 178 s
        for _ in range(min(count, MAX_BOXES)):
            reader.int(4 if version == 2 else 2)  # item_ID
            method = reader.int(2) & 0x0F if version in (1, 2) else 0
            reader.int(2)  # data_reference_index
            base = reader.int(base_offset_size)
            extents = reader.int(2)
            extents_left -= extents
            if extents_left < 0:
                return located
            first = None
            for _ in range(extents):
                reader.int(index_size)
                extent_offset = reader.int(offset_size)
                reader.int(length_size)
                first = base + extent_offset if first is None else first
            if first is not None:
                located.append((method, first))
        return located
    except IndexError:
        return located


def _coded_size(fp: BinaryIO, item: tuple[int, int], idat: int | None) -> tuple[int, int] | None:
    """The largest frame the AV1 sequence header at the start of an item's data allows, or None (not AV1, or
    not there: items built from other items, construction method 2, are left to libavif)."""
    method, offset = item
    if method == 1:
        if idat is None:
            return None
        offset += idat
    elif method != 0:
        return None
    if offset >= fp.seek(0, os.SEEK_END):  # past the end (or past what a seek can take): libavif's to refuse
        return None
    fp.seek(offset)
    return sequence_header_size(fp.read(SEQUENCE_HEADER_BYTES))


def sequence_header_size(data: bytes) -> tuple[int, int] | None:
    """``max_frame_width`` and ``max_frame_height`` of the first sequence header OBU in ``data`` (AV1, 5.3 and
    5.5), or None if the OBUs before it cannot be read."""
    reader = _Bits(data)
    try:
        while True:
            header = reader.bits(8)
            kind, extended, sized = (header >> 3) & 0x0F, header & 0x04, header & 0x02
            if header & 0x80:
                return None  # the forbidden bit: not an OBU
            if extended:
                reader.bits(8)
            size = reader.leb128() if sized else None
            if kind == 1:
                return _sequence_header(reader)
            if size is None:
                return None
            reader.skip(8 * size)
    except IndexError:
        return None


def _sequence_header(reader: "_Bits") -> tuple[int, int]:
    reader.bits(3)  # seq_profile
    reader.bits(1)  # still_picture
    if reader.bits(1):  # reduced_still_picture_header
        reader.bits(5)  # seq_level_idx[0]
    else:
        model = False
        if reader.bits(1):  # timing_info_present_flag
            reader.bits(32)
            reader.bits(32)
            if reader.bits(1):  # equal_picture_interval
                reader.uvlc()
            model = bool(reader.bits(1))  # decoder_model_info_present_flag
            if model:
                delay = reader.bits(5) + 1  # buffer_delay_length_minus_1
                reader.bits(32)
                reader.bits(5)
                reader.bits(5)
        display_delay = reader.bits(1)  # initial_display_delay_present_flag
        for _ in range(reader.bits(5) + 1):  # operating_points_cnt_minus_1
            reader.bits(12)  # operating_point_idc
            if reader.bits(5) > 7:  # seq_level_idx
                reader.bits(1)  # seq_tier
            if model and reader.bits(1):  # decoder_model_present_for_this_op
                reader.bits(delay)
                reader.bits(delay)
                reader.bits(1)
            if display_delay and reader.bits(1):
                reader.bits(4)
    width_bits, height_bits = reader.bits(4) + 1, reader.bits(4) + 1
    return reader.bits(width_bits) + 1, reader.bits(height_bits) + 1


class _Bytes:
    """Big-endian unsigned integers of 0-8 bytes read in turn; IndexError past the end."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def int(self, size: int) -> int:
        if self.pos + size > len(self.data):
            raise IndexError("past the end")
        value = int.from_bytes(self.data[self.pos:self.pos + size], "big")
        self.pos += size
        return value


class _Bits:
    """AV1's bit reader (most significant bit first; ``leb128``, ``uvlc``); IndexError past the end."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def bits(self, count: int) -> int:
        value = 0
        for _ in range(count):
            byte = self.data[self.pos >> 3]
            value = (value << 1) | ((byte >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return value

    def skip(self, count: int) -> None:
        if (self.pos + count) >> 3 > len(self.data):
            raise IndexError("past the end")
        self.pos += count

    def leb128(self) -> int:
        value = 0
        for index in range(8):
            byte = self.bits(8)
            value |= (byte & 0x7F) << (7 * index)
            if not byte & 0x80:
                break
        return value

    def uvlc(self) -> int:
        zeros = 0
        while not self.bits(1):
            zeros += 1
            if zeros >= 32:
                return (1 << 32) - 1
        return self.bits(zeros) + (1 << zeros) - 1
