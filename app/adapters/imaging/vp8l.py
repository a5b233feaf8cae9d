"""A WebP's lossless (VP8L) streams, read as far as libwebp's header: what its prefix-code tables will cost.

A VP8L image may name many groups of prefix codes ("Huffman" codes) through its entropy image (the meta prefix
codes of RFC 9649, section 3.7.2.2), and libwebp builds the tables of every group when it reads the main image's
header (``ReadHuffmanCodes`` in ``src/dec/vp8l_dec.c``), before a pixel is decoded: some 12-20 KB a group. A 295 KB
1024x1024 VP8L naming 65,536 groups rendered in 367 MB, priced 28-39 MB from its size alone (a review). libwebp's
own encoder keeps the entropy image to at most 2,600 pixels (``MAX_HUFF_IMAGE_SIZE``), so a photo names a few
hundred groups at most.

:func:`read` decodes the header, the transforms' sub-images (predictor, cross-colour, colour-indexing; they stand
between the header and the entropy image, so they are decoded to be skipped) and the entropy image, in Python, and
counts the groups libwebp 1.6 allocates tables for: every index up to the largest, or, when that is over 1,000 or
over the image's pixels, only those the entropy image uses. The main image's codes and pixels are not read. The
work is bounded by :data:`MAX_SUBIMAGE_PIXELS` and :data:`MAX_STREAM_BYTES` (refused beyond them as a decompression
bomb; libwebp's files have half of the first at most, at 64 MP), whatever sizes the file declares; a stream libwebp
would refuse as malformed (a bad prefix code, a copy before the start, reading past the end) is
:class:`CorruptImage`.
An ``ALPH`` chunk of compression 1 is the same stream without the 5-byte header, and libwebp decodes its header the
same way (``VP8LDecodeAlphaHeader``), so :func:`alpha` reads it too. :func:`webp_table_bytes` finds the streams of a
WebP's still image or first frame (what attache renders) and prices them.
"""

from __future__ import annotations

import struct
from array import array
from typing import BinaryIO, NamedTuple

from app.errors import CorruptImage, DecompressionBomb

#: pixels of the sub-images (transforms' and entropy image) decoded in Python for one stream, whatever the image's
#: size. libwebp 1.6 (Pillow 13's), lossless, method 6 (the most): 59,518 for a 4000x3000 photo (0.06 s), 266,649 at
#: 8000x8000 (0.29 s); methods 0 and 4 fewer, screenshots some hundreds. The worst streams an adversarial run made at
#: the bound (15-bit codes for every literal, copies of one pixel coded in no bits) took 0.75-1.5 s of the web's CPU.
#: A bound that grew with the declared size let an animation frame's header of 65535x65535 over a 64x64 canvas cost
#: 20 s (an adversarial run).
MAX_SUBIMAGE_PIXELS = 1 << 19
#: bytes of a stream read to find its groups: within :data:`MAX_SUBIMAGE_PIXELS` the sub-images take at most some
#: 4 MB (60 bits a pixel, and their codes); a stream read on past this is a bomb. Reading a 50 MB chunk whole, and
#: two copies of it, cost the web 150 MB (an adversarial run).
MAX_STREAM_BYTES = 8 << 20
#: table entries (4 bytes each) libwebp allocates per group, by colour-cache bits (``kTableSize``: the largest
#: tables of the five codes' alphabets, 8-bit root)
_TABLE_ENTRIES = tuple(630 * 3 + 410 + extra for extra in (654, 656, 658, 662, 670, 686, 718, 782, 912, 1168, 1680,
                                                          2704))
#: a ``HuffmanCode`` (bits, value) and an ``HTreeGroup`` (five table pointers, flags, a 64-entry packed table)
_CODE_BYTES = 4
_GROUP_BYTES = 568
#: over this many groups (or over the image's pixels) libwebp maps the used indices only (``ReadHuffmanCodes``)
_MAPPED_GROUPS = 1000
_MAX_CACHE_BITS = 11
_LITERALS = 256
_LENGTH_CODES = 24
_DISTANCE_CODES = 40
_MAX_CODE_LENGTH = 15
_CODE_LENGTH_ORDER = (17, 18, 0, 1, 2, 3, 4, 5, 16, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
_PREDICTOR, _CROSS_COLOUR, _SUBTRACT_GREEN, _COLOUR_INDEXING = range(4)
#: (dy << 4) | (8 - dx) of the 120 distance codes for nearby pixels (``kCodeToPlane``)
_CODE_TO_PLANE = bytes.fromhex(
    "1807171928062729161a262a38053739151b363a252b48044749141c353b464a242c58454b343c035759131d565a232d"
    "444c555b333d68026769121e666a222e545c434d656b323e78017779535d111f646c424e767a212f757b313f636d525e"
    "00747c414f1020626e30737d515f40727e616f50717f6070")
#: the 5-byte header of a VP8L chunk: signature, then 14-bit width - 1, 14-bit height - 1, alpha, 3-bit version
_SIGNATURE = 0x2F


class Stream(NamedTuple):
    """What libwebp's header of one VP8L stream holds that costs memory."""

    width: int
    height: int
    #: groups of prefix codes libwebp builds tables for
    groups: int
    cache_bits: int
    #: transforms in the order read (0 predictor, 1 cross-colour, 2 subtract-green, 3 colour-indexing)
    transforms: tuple[int, ...]
    #: pixels of the sub-images decoded (transforms' and the entropy image), each kept by libwebp at 4 bytes
    subimage_pixels: int

    @property
    def table_bytes(self) -> int:
        """The groups' tables at their largest (libwebp allocates that much; a crafted code fills it)."""
        return self.groups * (_TABLE_ENTRIES[self.cache_bits] * _CODE_BYTES + _GROUP_BYTES) + 4 * self.subimage_pixels


class _Bits:
    """Bits of ``data`` read least significant first, as VP8L packs them; reading past the end is corrupt, or a bomb
    when ``data`` is the first :data:`MAX_STREAM_BYTES` of a longer stream (``cut``)."""

    __slots__ = ("data", "pos", "end", "cut")

    def __init__(self, data: bytes | memoryview, *, cut: bool = False) -> None:
        self.data = data  # a slice short of its 4 bytes at the end reads as zeros above it: no padded copy
        self.pos = 0
        self.end = 8 * len(data)
        self.cut = cut

    def past_the_end(self) -> Exception:
        if self.cut:
            return DecompressionBomb(f"the WebP's lossless stream goes on past {MAX_STREAM_BYTES:,} bytes before its "
                                     "pixels")
        return CorruptImage("the WebP's lossless stream is cut short")

    def read(self, count: int) -> int:
        pos = self.pos
        if pos + count > self.end:
            raise self.past_the_end()
        self.pos = pos + count
        i = pos >> 3
        return (int.from_bytes(self.data[i:i + 4], "little") >> (pos & 7)) & ((1 << count) - 1)


class _Code:
    """A prefix code as a table of ``1 << longest`` entries, each (symbol, length), indexed by the next bits."""

    __slots__ = ("longest", "table")

    def __init__(self, lengths: list[int]) -> None:
        used = [(length, symbol) for symbol, length in enumerate(lengths) if length]
        if not used:
            raise CorruptImage("a prefix code of the WebP's lossless stream has no symbol")
        if len(used) == 1:  # one symbol takes no bits, whatever its length
            self.longest, self.table = 0, [(used[0][1], 0)]
            return
        if sum(1 << (_MAX_CODE_LENGTH - length) for length, _ in used) != 1 << _MAX_CODE_LENGTH:
            raise CorruptImage("a prefix code of the WebP's lossless stream is not complete")
        used.sort()
        longest = used[-1][0]
        table: list[tuple[int, int]] = [(0, 0)] * (1 << longest)
        code, previous = 0, used[0][0]
        for length, symbol in used:  # canonical codes, then bit-reversed: VP8L reads them from the low bit
            code <<= length - previous
            previous = length
            reversed_code = int(f"{code:0{length}b}"[::-1], 2)
            table[reversed_code::1 << length] = [(symbol, length)] * (1 << (longest - length))
            code += 1
        self.longest, self.table = longest, table

    def read(self, bits: _Bits) -> int:
        if not self.longest:
            return self.table[0][0]
        pos = bits.pos
        i = pos >> 3
        window = (int.from_bytes(bits.data[i:i + 3], "little") >> (pos & 7)) & ((1 << self.longest) - 1)
        symbol, length = self.table[window]
        if pos + length > bits.end:
            raise bits.past_the_end()
        bits.pos = pos + length
        return symbol


def _read_code(bits: _Bits, alphabet: int) -> _Code:
    """One prefix code (``ReadHuffmanCode``): simple (one or two symbols given whole) or normal (its code lengths
    coded by a code of their own, then run-length coded)."""
    lengths = [0] * alphabet
    if bits.read(1):
        count = bits.read(1) + 1
        symbols = [bits.read(8 if bits.read(1) else 1)]
        if count == 2:
            symbols.append(bits.read(8))
        for symbol in symbols:
            if symbol < alphabet:  # libwebp builds the code from the alphabet's lengths only
                lengths[symbol] = 1
        return _Code(lengths)
    length_lengths = [0] * len(_CODE_LENGTH_ORDER)
    for i in range(bits.read(4) + 4):
        length_lengths[_CODE_LENGTH_ORDER[i]] = bits.read(3)
    length_code = _Code(length_lengths)
    limit = alphabet
    if bits.read(1):
        limit = 2 + bits.read(2 + 2 * bits.read(3))
        if limit > alphabet:
            raise CorruptImage("a prefix code of the WebP's lossless stream has too many lengths")
    symbol, previous = 0, 8
    while symbol < alphabet and limit:
        limit -= 1
        length = length_code.read(bits)
        if length < 16:
            lengths[symbol] = length
            symbol += 1
            previous = length or previous
            continue
        repeat = bits.read((2, 3, 7)[length - 16]) + (3, 3, 11)[length - 16]
        if symbol + repeat > alphabet:
            raise CorruptImage("a prefix code of the WebP's lossless stream repeats past its alphabet")
        lengths[symbol:symbol + repeat] = [previous if length == 16 else 0] * repeat
        symbol += repeat
    return _Code(lengths)


def _copy_value(symbol: int, bits: _Bits) -> int:
    """A copy's length or distance code from its prefix symbol and extra bits (``GetCopyDistance``)."""
    if symbol < 4:
        return symbol + 1
    extra = (symbol - 2) >> 1
    return ((2 + (symbol & 1)) << extra) + bits.read(extra) + 1


def _distance(width: int, code: int) -> int:
    """The distance in pixels of a copy's distance code (``PlaneCodeToDistance``)."""
    if code > len(_CODE_TO_PLANE):
        return code - len(_CODE_TO_PLANE)
    plane = _CODE_TO_PLANE[code - 1]
    return max(1, (plane >> 4) * width + 8 - (plane & 0xF))


def _cache_bits(bits: _Bits) -> int:
    if not bits.read(1):
        return 0
    cache_bits = bits.read(4)
    if not 1 <= cache_bits <= _MAX_CACHE_BITS:
        raise CorruptImage(f"the WebP's lossless stream has a colour cache of {cache_bits} bits")
    return cache_bits


def _subimage(bits: _Bits, width: int, height: int) -> array:
    """The ARGB pixels of a sub-image (``DecodeImageStream`` below level 0): a colour cache, one group of five
    codes, then literals, copies and cache hits. Kept 4 bytes a pixel, as libwebp keeps them.

    Codes of one symbol each are read in no bits, so such a sub-image is one pixel repeated, made at once: read
    pixel by pixel, a 40-byte WebP whose sub-image of 524,176 pixels took no bits cost the web 0.16-0.21 s of CPU
    per upload, refused (``413``) or not, and a few connections slowed everyone's uploads 10-100 times (an
    adversarial run). (A copy, the one symbol, reaches before the start at once: corrupt.) What the loop still
    reads costs its stream bits, though not a bit a pixel: a copy of up to 4,096 pixels, or a cache hit that hashes
    the pixels since the last, is one symbol; a re-attack's costliest streams took the web 46 ms for 232 bytes and
    0.34 s for 64 KB, within :data:`MAX_SUBIMAGE_PIXELS`."""
    cache_bits = _cache_bits(bits)
    green, red, blue, alpha, distance = (
        _read_code(bits, alphabet)
        for alphabet in (_LITERALS + _LENGTH_CODES + (1 << cache_bits if cache_bits else 0), _LITERALS, _LITERALS,
                         _LITERALS, _DISTANCE_CODES))
    total = width * height
    if not green.longest:  # every pixel's green symbol is read in no bits: the whole sub-image is known now
        symbol = green.table[0][0]
        if symbol < _LITERALS and not (red.longest or blue.longest or alpha.longest):  # one literal, every pixel
            a, r, b = (code.table[0][0] for code in (alpha, red, blue))
            return array("I", [a << 24 | r << 16 | symbol << 8 | b]) * total
        if symbol >= _LITERALS + _LENGTH_CODES:  # a cache hit, every pixel: the cache only ever holds zeros
            return array("I", [0]) * total
    pixels = array("I")
    cache = [0] * (1 << cache_bits)
    shift, cached = 32 - cache_bits, 0
    while len(pixels) < total:
        code = green.read(bits)
        if code < _LITERALS:
            r = red.read(bits)
            b = blue.read(bits)
            pixels.append(alpha.read(bits) << 24 | r << 16 | code << 8 | b)
        elif code < _LITERALS + _LENGTH_CODES:
            length = _copy_value(code - _LITERALS, bits)
            dist = _distance(width, _copy_value(distance.read(bits), bits))
            done = len(pixels)
            if dist > done or length > total - done:
                raise CorruptImage("a copy in the WebP's lossless stream reaches outside its image")
            if dist >= length:
                pixels.extend(pixels[done - dist:done - dist + length])
            else:  # overlapping: the last ``dist`` pixels repeated
                pixels.extend((pixels[done - dist:] * (length // dist + 1))[:length])
        else:
            for pixel in pixels[cached:]:
                cache[((0x1E35A7BD * pixel) & 0xFFFFFFFF) >> shift] = pixel
            cached = len(pixels)
            pixels.append(cache[code - _LITERALS - _LENGTH_CODES])
    return pixels


def _subsample(size: int, bits: int) -> int:
    return (size + (1 << bits) - 1) >> bits


def _image(bits: _Bits, width: int, height: int) -> Stream:
    """The main image's header (``DecodeImageStream`` at level 0): transforms, colour cache, entropy image."""
    xsize, transforms, decoded = width, [], 0

    def budgeted(sub_width: int, sub_height: int) -> array:
        nonlocal decoded
        decoded += sub_width * sub_height
        if decoded > MAX_SUBIMAGE_PIXELS:
            raise DecompressionBomb(f"the WebP's lossless stream has sub-images of more than {MAX_SUBIMAGE_PIXELS:,} "
                                    "pixels")
        return _subimage(bits, sub_width, sub_height)

    while bits.read(1):
        kind = bits.read(2)
        if kind in transforms:
            raise CorruptImage("the WebP's lossless stream repeats a transform")
        transforms.append(kind)
        if kind in (_PREDICTOR, _CROSS_COLOUR):
            block = 2 + bits.read(3)
            budgeted(_subsample(xsize, block), _subsample(height, block))
        elif kind == _COLOUR_INDEXING:
            colours = bits.read(8) + 1
            budgeted(colours, 1)
            xsize = _subsample(xsize, 0 if colours > 16 else 1 if colours > 4 else 2 if colours > 2 else 3)
    cache_bits = _cache_bits(bits)
    groups = 1
    if bits.read(1):
        precision = 2 + bits.read(3)
        used = {(pixel >> 8) & 0xFFFF for pixel in budgeted(_subsample(xsize, precision),
                                                            _subsample(height, precision))}
        groups = max(used) + 1
        if groups > _MAPPED_GROUPS or groups > xsize * height:
            groups = len(used)
    return Stream(width, height, groups, cache_bits, tuple(transforms), decoded)


def read(payload: bytes | memoryview, *, cut: bool = False) -> Stream:
    """The header of a VP8L chunk's ``payload`` (the 5-byte image header, then the stream; ``cut``: the first
    :data:`MAX_STREAM_BYTES` of a longer one).

    :raises CorruptImage: not a VP8L stream, or one libwebp would refuse before its pixels.
    :raises DecompressionBomb: its sub-images hold more than :data:`MAX_SUBIMAGE_PIXELS` pixels, or are read on past
        :data:`MAX_STREAM_BYTES`.
    """
    bits = _Bits(payload, cut=cut)
    if len(payload) < 5 or bits.read(8) != _SIGNATURE:
        raise CorruptImage("the WebP's lossless chunk has no VP8L signature")
    width, height = bits.read(14) + 1, bits.read(14) + 1
    bits.read(1)  # alpha is used
    if bits.read(3):
        raise CorruptImage("the WebP's lossless chunk has an unknown version")
    return _image(bits, width, height)


def alpha(payload: bytes | memoryview, width: int, height: int, *, cut: bool = False) -> Stream | None:
    """The header of an ``ALPH`` chunk's stream for an image of ``width`` x ``height`` (its ``VP8 `` frame's), if it
    is compressed losslessly (compression 1: a VP8L stream without the 5-byte header); None if it is stored raw."""
    if not payload or payload[0] & 3 != 1 or width < 1 or height < 1:
        return None  # stored raw, or no size known for it: libwebp's to refuse
    return _image(_Bits(memoryview(payload)[1:], cut=cut), width, height)


#: chunks of a WebP walked to find its image (as :data:`.segments.MAX_WEBP_CHUNKS`)
_MAX_CHUNKS = 1 << 16


def webp_table_bytes(fp: BinaryIO) -> int:
    """The prefix-code tables (and sub-images) libwebp allocates for the still image or first frame of the WebP in
    ``fp``: its VP8L stream's, its ``ALPH`` chunk's; 0 for a lossy image without alpha, or a file that is not a
    WebP. The position of ``fp`` is restored.

    :raises CorruptImage: a lossless stream libwebp would refuse.
    :raises DecompressionBomb: a stream's sub-images are over :data:`MAX_SUBIMAGE_PIXELS`.
    """
    position = fp.tell()
    try:
        return sum(stream.table_bytes for stream in _first_frame(fp) if stream is not None)
    finally:
        fp.seek(position)


def _chunks(fp: BinaryIO, pos: int, end: int):
    """``(kind, length, where its payload is)`` of the chunks from ``pos`` to ``end`` in file order, as libwebp's
    demuxer reads them: an ``ANMF``'s chunks right after its 16-byte frame header, whatever length it declares and
    however deep frames nest (a walk that went by that length, four frames deep, priced a 1x1 frame after a 64x64
    one libwebp decoded first: a review); :data:`_MAX_CHUNKS` at most."""
    for _ in range(_MAX_CHUNKS):
        if pos + 8 > end:
            return
        fp.seek(pos)
        kind, length = struct.unpack("<4sI", fp.read(8))
        yield kind, length, pos + 8
        pos += 24 if kind == b"ANMF" and length >= 16 else 8 + length + (length & 1)


def _first_frame(fp: BinaryIO) -> list[Stream | None]:
    """The streams of the image libwebp decodes first: in file order, whatever frame holds them, the first
    ``VP8L``, or the first ``ALPH`` at the size of the first ``VP8 `` after it. The order of frames is not
    followed: libwebp's demuxer drops a frame without an image (an empty ``ANMF``, or one whose first chunk it does
    not know) and decodes the next, where a walk that took the first ``ANMF``'s chunks priced nothing of the next
    frame's 65,536 groups (365 MB a render priced 26-48: an adversarial run). An ``ALPH`` is read at its ``VP8 ``
    frame's size, as libwebp decodes it (an animation frame's header of 16x16 over a 1024x1024 picture had its
    alpha's 65,536 groups counted as 241, an adversarial run)."""
    fp.seek(0)
    head = fp.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        return []
    size = fp.seek(0, 2)
    alpha_at: tuple[int, int] | None = None
    for kind, length, where in _chunks(fp, 12, min(size, 8 + struct.unpack("<I", head[4:8])[0])):
        if kind == b"ALPH" and alpha_at is None:
            alpha_at = (where, length)
        elif kind == b"VP8L":
            payload, cut = _payload(fp, where, length)
            return [read(payload, cut=cut)]
        elif kind == b"VP8 ":
            fp.seek(where)
            frame_size = _vp8_size(fp.read(10))
            if alpha_at is None or frame_size is None:
                return []
            payload, cut = _payload(fp, *alpha_at)
            return [alpha(payload, *frame_size, cut=cut)]
    return []


def _payload(fp: BinaryIO, where: int, length: int) -> tuple[bytes, bool]:
    """A chunk's payload, at most its first :data:`MAX_STREAM_BYTES`, and whether it was cut there (a chunk that
    says it is longer but ends with the file is cut short: corrupt, not a bomb)."""
    fp.seek(where)
    payload = fp.read(min(length, MAX_STREAM_BYTES))
    return payload, length > MAX_STREAM_BYTES and len(payload) == MAX_STREAM_BYTES


def _vp8_size(header: bytes) -> tuple[int, int] | None:
    """A lossy ``VP8 `` key frame's width and height (RFC 6386, 9.1), or None if it is not one (libwebp refuses it)."""
    if len(header) < 10 or header[0] & 1 or header[3:6] != b"\x9d\x01\x2a":
        return None
    return int.from_bytes(header[6:8], "little") & 0x3FFF, int.from_bytes(header[8:10], "little") & 0x3FFF
