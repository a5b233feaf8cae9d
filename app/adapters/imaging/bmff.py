"""HEIF and AVIF containers (ISO base media file format): brands and declared sizes.

HEIC and AVIF are the same container, boxes of ``size, type, payload``,
holding different codecs (HEVC, AV1). Two questions are answered here,
from the container alone, before libheif or libavif see the bytes:

* :func:`family` - which of the two a file is, from its ``ftyp`` box (the
  major brand, or for the generic ``mif1``/``msf1``/``miaf`` brands the
  compatible brands that follow), for :func:`~app.adapters.imaging.sniff.sniff`.
* :func:`read_layout` - every image size the file declares (each ``ispe``
  property: the primary image, grid tiles, thumbnails, auxiliary images),
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


def read_layout(fp: BinaryIO) -> Layout:
    """Walk the top-level boxes and the ``meta`` box; the file position is restored.

    A box that cannot be parsed stops the walk (libheif or libavif will say
    what is wrong with it); what was found until then is returned.
    """
    position = fp.tell()
    try:
        end = fp.seek(0, os.SEEK_END)
        found = _Found([], [])
        truncated = _walk(fp, 0, end, end, found, budget=[MAX_BOXES])
        picture = max(found.pictures, default=UNKNOWN_PICTURE_BYTES)
        return Layout(tuple(found.sizes), truncated, picture, end)
    finally:
        fp.seek(position)


@dataclass
class _Found:
    sizes: list[tuple[int, int]]
    pictures: list[float]


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
        elif kind in _CONTAINERS:
            inner = offset + header_size + _CONTAINERS[kind]
            if _walk(fp, inner, min(box_end, stop), file_end, found, budget):
                return True
        offset = box_end
    return False
