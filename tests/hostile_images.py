"""Small files that decode to a lot of memory, written deterministically.

The PNG and the TIFF are built by hand, row by row through a streaming
compressor, so making one costs kilobytes of memory, not the hundreds of
megabytes it decodes to, and the same arguments always give the same bytes. Used by the imaging tests
and by ``make bench`` (see tests/data/README.md, "Hostile files").

* :func:`palette_png` - 8000x8000 palette PNG with a ``tRNS`` chunk (75 KB;
  the issue's copy was 63 KB): one byte a pixel decoded, but the renderer
  expands it to RGBA (4 B/px), reads its alpha and converts it to RGB.
* :func:`float_tiff` - 8000x8000 32-bit float TIFF, deflate-compressed in
  two-row strips (375 KB, the layout Pillow itself writes): 4 B/px
  decoded, then a scaled copy and 8 bits.
* :func:`progressive_jpeg` - a progressive JPEG; libjpeg keeps the whole
  image's DCT coefficients (2 B per sample) whatever the draft scale.
* :func:`jpeg_tiff` - a tiled TIFF whose tiles all name one small JPEG
  stream, sequential or progressive.
* :func:`vp8l_groups` - a lossless WebP stream whose entropy image names
  one group of prefix codes per pixel (65,536 at 1024x1024, 295 KB):
  libwebp builds every group's tables before a pixel; :func:`webp_file`
  puts it in a file (a still VP8L, an ``ALPH`` chunk, a first frame).
* :func:`avif_split_grid` - an AVIF grid whose tiles all share one small AV1
  payload, every second one tagged with another operating point (``a1op``):
  libavif opens a dav1d decoder, and its threads, for each tile.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib
from pathlib import Path

from PIL import Image

HOSTILE_SIDE = 8000


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def palette_png(path: Path, side: int = HOSTILE_SIDE, *, interlaced: bool = False) -> Path:
    """A ``side`` x ``side`` palette PNG: index 1 everywhere, index 0 transparent.

    Every pixel is opaque, but the ``tRNS`` chunk makes Pillow report
    transparency, which is the expensive path (P -> RGBA -> RGB). With
    ``interlaced`` the file is Adam7-interlaced (7 passes).
    """
    width = height = side
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 1 if interlaced else 0)
    plte = bytes([0, 0, 0, 40, 120, 200])
    trns = bytes([0])
    deflate = zlib.compressobj(9)
    idat = bytearray()
    if interlaced:
        passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
        for x0, y0, dx, dy in passes:
            cols = (width - x0 + dx - 1) // dx if width > x0 else 0
            rows = (height - y0 + dy - 1) // dy if height > y0 else 0
            row = b"\x00" + b"\x01" * cols
            for _ in range(rows if cols else 0):
                idat += deflate.compress(row)
    else:
        row = b"\x00" + b"\x01" * width
        for _ in range(height):
            idat += deflate.compress(row)
    idat += deflate.flush()
    data = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"PLTE", plte)
            + _png_chunk(b"tRNS", trns) + _png_chunk(b"IDAT", bytes(idat)) + _png_chunk(b"IEND", b""))
    path.write_bytes(data)
    return path


def float_tiff(path: Path, side: int = HOSTILE_SIDE, *, rows_per_strip: int = 2) -> Path:
    """A ``side`` x ``side`` little-endian TIFF of 32-bit floats (all 0.5).

    Baseline tags plus ``SampleFormat=3`` (IEEE float), Adobe deflate
    compression, ``rows_per_strip`` rows a strip. Pillow opens it as mode
    ``F``.
    """
    width = height = side
    strip = struct.pack("<f", 0.5) * (width * rows_per_strip)
    nstrips = (height + rows_per_strip - 1) // rows_per_strip
    strips = []
    for index in range(nstrips):
        rows = min(rows_per_strip, height - index * rows_per_strip)
        strips.append(zlib.compress(strip[: rows * width * 4], 9))
    entries = [  # tag, type, count, value (type 3 SHORT, 4 LONG)
        (256, 4, 1, width), (257, 4, 1, height), (258, 3, 1, 32), (259, 3, 1, 8), (262, 3, 1, 1),
        (273, 4, nstrips, None), (277, 3, 1, 1), (278, 4, 1, rows_per_strip), (279, 4, nstrips, None),
        (284, 3, 1, 1), (339, 3, 1, 3),
    ]
    ifd_offset = 8
    ifd_size = 2 + 12 * len(entries) + 4
    offsets_at = ifd_offset + ifd_size
    counts_at = offsets_at + 4 * nstrips
    data_at = counts_at + 4 * nstrips
    offsets, position = [], data_at
    for blob in strips:
        offsets.append(position)
        position += len(blob)
    out = io.BytesIO()
    out.write(b"II*\x00" + struct.pack("<I", ifd_offset))
    out.write(struct.pack("<H", len(entries)))
    for tag, kind, count, value in entries:
        if tag == 273:
            value = offsets_at if nstrips > 1 else offsets[0]
        elif tag == 279:
            value = counts_at if nstrips > 1 else len(strips[0])
        packed = struct.pack("<I", value) if kind == 4 else struct.pack("<HH", value, 0)
        out.write(struct.pack("<HHI", tag, kind, count) + packed)
    out.write(struct.pack("<I", 0))
    out.write(struct.pack(f"<{nstrips}I", *offsets))
    out.write(struct.pack(f"<{nstrips}I", *(len(b) for b in strips)))
    for blob in strips:
        out.write(blob)
    path.write_bytes(out.getvalue())
    return path


def progressive_jpeg(path: Path, size: tuple[int, int] = (HOSTILE_SIDE, HOSTILE_SIDE)) -> Path:
    """A flat grey progressive JPEG of *size*.

    Pillow cannot write a progressive JPEG row by row, so the image is built
    at full size; at 8000x8000 L that is 64 MB in the calling process.
    """
    Image.new("L", size, 128).save(path, "JPEG", quality=50, progressive=True)
    return path


def jpeg_tiff(side: int, tile: int = 32, *, progressive: bool, compression: int = 7) -> bytes:
    """A tiled grey ``side`` x ``side`` TIFF whose tiles are JPEG streams (``compression`` 7, TIFF Technical Note 2),
    every tile's offset naming the same ``tile`` x ``tile`` JPEG, sequential or progressive: the shape of an
    adversarial run's 503 KB TIFF (progressive, its scans repeated to 99) that took 15 s of CPU a render."""
    out = io.BytesIO()
    Image.linear_gradient("L").resize((tile, tile)).save(out, "JPEG", quality=90, progressive=progressive)
    jpeg = out.getvalue() + b"\0" * (len(out.getvalue()) & 1)
    tiles = (-(-side // tile)) ** 2
    offsets_at = 8 + len(jpeg)
    counts_at = offsets_at + 4 * tiles
    tags = [(256, 4, 1, side), (257, 4, 1, side), (258, 3, 1, 8), (259, 3, 1, compression), (262, 3, 1, 1),
            (277, 3, 1, 1), (284, 3, 1, 1), (322, 3, 1, tile), (323, 3, 1, tile), (324, 4, tiles, offsets_at),
            (325, 4, tiles, counts_at)]
    ifd = struct.pack("<H", len(tags)) + b"".join(
        struct.pack("<HHII", *tag) if tag[1] == 4 else struct.pack("<HHIHH", *tag, 0) for tag in tags) + bytes(4)
    return (b"II*\0" + struct.pack("<I", counts_at + 4 * tiles) + jpeg + struct.pack(f"<{tiles}I", *[8] * tiles)
            + struct.pack(f"<{tiles}I", *[len(jpeg)] * tiles) + ifd)


class _BitWriter:
    """Bits packed least significant first, as VP8L reads them."""

    def __init__(self) -> None:
        self.value, self.count = 0, 0

    def put(self, value: int, count: int) -> None:
        self.value |= value << self.count
        self.count += count

    def bytes(self) -> bytes:
        return self.value.to_bytes((self.count + 7) // 8, "little")


def _one_symbol_code(out: _BitWriter, symbol: int = 0) -> None:
    out.put(0b0001 | (symbol & 1) << 3, 4)  # simple, one symbol, of 1 bit: it takes no bits to read


def _flat_code(out: _BitWriter, symbols: int) -> None:
    """A normal code giving the first ``symbols`` (256) of its alphabet 8 bits each, the rest none."""
    out.put(0, 1)
    out.put(12 - 4, 4)  # code-length code lengths for 17, 18, 0..5, 16, 6, 7, 8: only 8 is used
    for i in range(12):
        out.put(1 if i == 11 else 0, 3)
    out.put(1, 1)  # a count of lengths: 2 + (254 in 8 bits)
    out.put(3, 3)
    out.put(symbols - 2, 8)


@functools.lru_cache(maxsize=4)  # written bit by bit in Python: 4 s a stream, asked for by several tests
def vp8l_groups(width: int = 1024, height: int = 1024, *, header: bool = True) -> bytes:
    """A VP8L stream of ``width`` x ``height`` (with its 5-byte header, or without for an ``ALPH`` chunk): no
    transform, an entropy image of 4x4 blocks whose every pixel names a group of its own (at most 65,536), each
    group five one-symbol codes, so every pixel of the image is the group's colour and costs no bits."""
    out = _BitWriter()
    if header:
        out.put(0x2F, 8)
        out.put(width - 1, 14)
        out.put(height - 1, 14)
        out.put(0, 4)  # no alpha, version 0
    out.put(0, 1)  # no transform
    out.put(0, 1)  # no colour cache
    out.put(1, 1)  # meta prefix codes: an entropy image of 4x4 blocks
    out.put(0, 3)
    side_w, side_h = (width + 3) // 4, (height + 3) // 4
    out.put(0, 1)  # the entropy image: no colour cache
    _flat_code(out, 256)  # green (of 280 symbols: its first 256), red, then one symbol for blue, alpha, distance
    _flat_code(out, 256)
    for _ in range(3):
        _one_symbol_code(out)
    for i in range(side_w * side_h):
        group = i & 0xFFFF
        out.put((group & 0xFF) | (group >> 8) << 8, 16)  # green then red, 8 bits each (bit-reversed codes: any)
    for _ in range(min(side_w * side_h, 1 << 16)):
        for symbol in (0, 0, 0, 0, 0):
            _one_symbol_code(out, symbol)
    return out.bytes()


def _riff_chunk(kind: bytes, data: bytes) -> bytes:
    return kind + struct.pack("<I", len(data)) + data + b"\0" * (len(data) & 1)


def webp_file(path: Path, kind: str = "still", width: int = 1024, height: int = 1024,
              frame_header: tuple[int, int] | None = None) -> Path:
    """:func:`vp8l_groups` as a still lossless WebP (``still``), as the ``ALPH`` chunk of a lossy one (``alpha``),
    as the first frame of an animation (``frame``), or as the ``ALPH`` chunk of a lossy first frame
    (``frame-alpha``), whose ``ANMF`` header may give another size (``frame_header``: libwebp decodes the alpha at
    the ``VP8 `` frame's size, an adversarial run)."""
    canvas = struct.pack("<I", width - 1)[:3] + struct.pack("<I", height - 1)[:3]
    lossy = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 150)).save(lossy, "WEBP", quality=50)
    vp8 = lossy.getvalue()[12:]  # the VP8 chunk of a simple lossy file
    if kind == "still":
        body = _riff_chunk(b"VP8L", vp8l_groups(width, height))
    elif kind == "alpha":
        body = (_riff_chunk(b"VP8X", bytes([0x10, 0, 0, 0]) + canvas)
                + _riff_chunk(b"ALPH", b"\x01" + vp8l_groups(width, height, header=False)) + vp8)
    else:
        said = frame_header or (width, height)
        frame = bytes(6) + struct.pack("<I", said[0] - 1)[:3] + struct.pack("<I", said[1] - 1)[:3] + b"\x64\0\0\0"
        image = (_riff_chunk(b"VP8L", vp8l_groups(width, height)) if kind == "frame" else
                 _riff_chunk(b"ALPH", b"\x01" + vp8l_groups(width, height, header=False)) + vp8)
        body = (_riff_chunk(b"VP8X", bytes([0x12 if kind == "frame-alpha" else 0x02, 0, 0, 0]) + canvas)
                + _riff_chunk(b"ANIM", bytes(4) + b"\0\0") + _riff_chunk(b"ANMF", frame + image))
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body)
    return path


def icc_lut8(grid: int, *, inputs: int = 3, declared: int | None = None, kind: bytes = b"mft1") -> bytes:
    """Pillow's sRGB profile with an ``A2B0`` tag added: a ``lut8Type`` (``mft1``) of identity curves around a colour
    lookup table of ``grid`` points a side, 3 bytes each (``grid`` 255: 49.7 MB), which LittleCMS holds some nine
    times over when it links a transform from it (an adversarial run of 2026-12-07). ``inputs``: its input
    channels; ``declared``: the size the tag table gives it (LittleCMS reads the table whole whatever it says);
    ``kind``: another type written over ``mft1`` (``mpet``: a float pipeline's)."""
    from PIL import ImageCms

    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    count = struct.unpack(">I", srgb[128:132])[0]
    entries = [struct.unpack(">4sII", srgb[132 + 12 * i:144 + 12 * i]) for i in range(count)]
    tags = [(signature, srgb[offset:offset + size]) for signature, offset, size in entries]
    identity = struct.pack(">9i", 65536, 0, 0, 0, 65536, 0, 0, 0, 65536)
    ramp = bytes(range(256))
    tags.append((b"A2B0", kind + bytes(4) + bytes([inputs, 3, grid, 0]) + identity + ramp * inputs
                 + bytes(grid ** inputs * 3) + ramp * 3))
    at, table, body = 128 + 4 + 12 * len(tags), b"", b""
    for signature, data in tags:
        body += bytes(-(at + len(body)) % 4)
        size = declared if declared is not None and signature == b"A2B0" else len(data)
        table += struct.pack(">4sII", signature, at + len(body), size)
        body += data
    profile = bytearray(srgb[:128] + struct.pack(">I", len(tags)) + table + body)
    profile[0:4] = struct.pack(">I", len(profile))
    return bytes(profile)


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def _full_box(kind: bytes, payload: bytes, version: int = 0) -> bytes:
    return _box(kind, bytes([version, 0, 0, 0]) + payload)


def _child_box(data: bytes, start: int, end: int, kind: bytes) -> bytes:
    """The first box of ``kind`` among the boxes from ``start`` to ``end``."""
    while start + 8 <= end:
        size, found = struct.unpack(">I4s", data[start:start + 8])
        if found == kind:
            return data[start:start + size]
        start += size
    raise ValueError(f"no {kind!r} box")


def heif_metadata_item(kind: bytes, size: int, *, extents: int = 1, references: int = 1) -> bytes:
    """A 64x64 HEIC with one more item, of type ``kind`` and ``size`` bytes, that describes the primary image
    (``cdsc``) ``references`` times, its data listed ``extents`` times over the same bytes. libheif reads every
    item a ``cdsc`` reference names, whatever its type, joins its extents, and attaches it once a reference;
    pillow-heif copies each into the image's info (helper 136: 40 MB of a ``uri `` item took 160 MB a probe, a
    4 MB file whose item listed the same bytes 32 times 388 MB)."""
    import pillow_heif

    pillow_heif.register_heif_opener()
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (9, 9, 9)).save(buf, "HEIF", quality=50)
    made = buf.getvalue()
    ftyp = made[:struct.unpack(">I", made[:4])[0]]
    meta = _child_box(made, len(ftyp), len(made), b"meta")
    inside = len(ftyp) + 12  # past the meta box's header, version and flags
    end = len(ftyp) + len(meta)
    hdlr, pitm, iprp = (_child_box(made, inside, end, name) for name in (b"hdlr", b"pitm", b"iprp"))
    iinf = _child_box(made, inside, end, b"iinf")
    picture_entry = _child_box(iinf, 14, len(iinf), b"infe")  # past iinf's header, version, flags and count
    picture = _child_box(made, end, len(made), b"mdat")[8:]  # the one coded picture
    payload = (b"\0\0\0\0Exif\0\0" if kind == b"Exif" else b"") + b"m" * size
    entry = _full_box(b"infe", struct.pack(">HH4s", 2, 0, kind) + b"\0" + (b"urn:x\0" if kind == b"uri " else b""),
                      version=2)
    items = _full_box(b"iinf", struct.pack(">H", 2) + picture_entry + entry)
    refs = _full_box(b"iref", _box(b"cdsc", struct.pack(">HH", 2, references) + struct.pack(">H", 1) * references))

    def located(picture_at: int, payload_at: int) -> bytes:
        layout = bytes([0x44, 0x40]) + struct.pack(">H", 2)
        layout += struct.pack(">HHIH", 1, 0, 0, 1) + struct.pack(">II", picture_at, len(picture))
        layout += struct.pack(">HHIH", 2, 0, 0, extents) + struct.pack(">II", payload_at, len(payload)) * extents
        return _full_box(b"iloc", layout)

    def meta_box(picture_at: int) -> bytes:
        return _full_box(b"meta", hdlr + located(picture_at, picture_at + len(picture)) + items + pitm + iprp + refs)

    data_at = len(ftyp) + len(meta_box(0)) + 8
    return ftyp + meta_box(data_at) + _box(b"mdat", picture + payload)


def deflate_tiff(entries: list[tuple[int, int, list[int]]], pixels: bytes) -> bytes:
    """A little-endian TIFF of ``entries`` (tag, type, values; TileOffsets or StripOffsets 0 point at the pixels),
    the deflated ``pixels`` after its directory."""
    data = zlib.compress(pixels, 9)
    units = {1: "B", 3: "H", 4: "I", 7: "B", 11: "f", 16: "Q", 17: "q", 18: "Q"}
    outside_at = 8 + 2 + 12 * len(entries) + 4
    packed = [struct.pack(f"<{len(values)}{units[kind]}", *values) for _, kind, values in entries]
    data_at = outside_at + sum(len(raw) for raw in packed if len(raw) > 4)
    table, outside = b"", b""
    for (tag, kind, values), raw in zip(entries, packed):
        if tag in (273, 324):
            raw = struct.pack(f"<{len(values)}{units[kind]}", *([data_at] * len(values)))
        if tag in (279, 325):
            raw = struct.pack(f"<{len(values)}{units[kind]}", *([len(data)] * len(values)))
        field = raw.ljust(4, b"\0") if len(raw) <= 4 else struct.pack("<I", outside_at + len(outside))
        outside += raw if len(raw) > 4 else b""
        table += struct.pack("<HHI", tag, kind, len(values)) + field
    return b"II*\0" + struct.pack("<IH", 8, len(entries)) + table + bytes(4) + outside + data



def _one_code_of(out: _BitWriter, symbol: int) -> None:
    """A normal code whose one symbol, ``symbol`` (under 420, as a cache index is), has length 1: its lengths are
    zeros repeated (code-length symbol 18, 11-138 at a time) and a 1."""
    out.put(0, 1)
    out.put(0, 4)  # four code-length code lengths, for 17, 18, 0 and 1: 18 and 1 of one bit each
    for length in (0, 1, 0, 1):
        out.put(length, 3)
    repeats = []
    while symbol - sum(repeats):
        left = symbol - sum(repeats)
        repeats.append(left if left <= 138 else min(138, left - 11))
    out.put(1, 1)  # a count of lengths read: the repeats and the 1
    out.put(0, 3)
    out.put(len(repeats) + 1 - 2, 2)
    for repeat in repeats:
        out.put(1, 1)  # 18: zeros
        out.put(repeat - 11, 7)
    out.put(0, 1)  # 1: length 1 for the symbol


def vp8l_free_subimage(width: int = 2896, height: int = 2896, *, cache_hits: bool = False) -> bytes:
    """A lossless WebP file of ``width`` x ``height`` with a predictor transform of 4x4 blocks whose sub-image
    (524,176 pixels at 2896 px) is coded in no bits: every code of one symbol, a literal, or a colour-cache hit
    (``cache_hits``). 40-odd bytes; decoded pixel by pixel, the web spent 0.2 s of CPU on each (an adversarial
    run)."""
    out = _BitWriter()
    for value, count in ((0x2F, 8), (width - 1, 14), (height - 1, 14), (0, 4), (1, 1), (0, 2), (0, 3)):
        out.put(value, count)
    if cache_hits:
        out.put(1, 1)
        out.put(1, 4)  # a cache of one bit; green: the single symbol 280, its first entry
        _one_code_of(out, 280)
    else:
        out.put(0, 1)
        _one_symbol_code(out)
    for _ in range(4):
        _one_symbol_code(out)
    out.put(0, 3)  # no more transforms, no colour cache, no entropy image
    for _ in range(5):
        _one_symbol_code(out)
    stream = out.bytes() + bytes(4)
    body = _riff_chunk(b"VP8L", stream)
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


@functools.lru_cache(maxsize=None)
def _avif_tile(width: int, height: int, *, grain: bool = False,
               subsampling: str = "4:2:0") -> tuple[bytes, bytes, bytes, bytes]:
    """The ``av1C``, ``pixi`` and ``colr`` boxes and the AV1 payload of a ``width`` x ``height`` AVIF Pillow writes;
    ``grain``: with film grain (libaom's test table), which dav1d applies to a copy of the picture."""
    buf = io.BytesIO()
    extra = {"advanced": [("film-grain-test", "1")]} if grain else {}
    Image.radial_gradient("L").resize((width, height)).convert("RGB").save(
        buf, "AVIF", quality=50, max_threads=1, subsampling=subsampling, **extra)
    made = buf.getvalue()

    def whole(kind: bytes) -> bytes:
        at = made.index(kind) - 4
        return made[at:at + struct.unpack(">I", made[at:at + 4])[0]]

    return whole(b"av1C"), whole(b"pixi"), whole(b"colr"), whole(b"mdat")[8:]


def avif_split_grid(rows: int, cols: int, *, split: bool = True, side: int = 64, height: int | None = None,
                    grain: bool = False, subsampling: str = "4:2:0") -> bytes:
    """An AVIF grid of ``rows`` x ``cols`` tiles of ``side`` x ``side``, all one item's AV1 payload; with ``split``,
    every second tile has an essential ``a1op`` property of operating point 1, so libavif cannot share one decoder
    across them and opens one per tile, each with Pillow's threads (an adversarial run: 3,072 tiles of 64x64, 134 KB, took
    3.2 GB of a worker priced 122 MB; 1,024 tiles 684-703 MB priced 46 and 2,050 threads; unsplit, 39 MB).
    ``height``: tiles of ``side`` x ``height``; ``grain`` and ``subsampling``: the tile's (:func:`_avif_tile`; a
    re-attack: 22 tiles of 130x8192 at 4:4:4 with grain, 1,969 bytes, took 537 MB a render priced 268)."""
    height = height or side
    av1c, pixi, colr, payload = _avif_tile(side, height, grain=grain, subsampling=subsampling)
    tiles = rows * cols
    grid = tiles + 1
    grid_data = struct.pack(">BBBBHH", 0, 0, rows - 1, cols - 1, cols * side, rows * height)
    ftyp = _box(b"ftyp", b"avif" + bytes(4) + b"avifmif1miaf")
    hdlr = _full_box(b"hdlr", bytes(4) + b"pict" + bytes(13))
    pitm = _full_box(b"pitm", struct.pack(">H", grid))
    entries = b"".join(_full_box(b"infe", struct.pack(">HH4s", item, 0, b"av01") + b"\0", version=2)
                       for item in range(1, tiles + 1))
    entries += _full_box(b"infe", struct.pack(">HH4s", grid, 0, b"grid") + b"\0", version=2)
    iinf = _full_box(b"iinf", struct.pack(">H", tiles + 1) + entries)
    iref = _full_box(b"iref", _box(b"dimg", struct.pack(">HH", grid, tiles) + b"".join(
        struct.pack(">H", item) for item in range(1, tiles + 1))))
    # properties: 1 the tile's ispe, 2 av1C, 3 pixi, 4 the grid's ispe, 5 a1op (operating point 1), 6 colr
    ipco = _box(b"ipco", _full_box(b"ispe", struct.pack(">II", side, height)) + av1c + pixi
                + _full_box(b"ispe", struct.pack(">II", cols * side, rows * height)) + _box(b"a1op", b"\x01") + colr)
    associated = b""
    for item in range(1, tiles + 1):
        properties = [1, 0x80 | 2, 3] + ([0x80 | 5] if split and item % 2 == 0 else [])
        associated += struct.pack(">HB", item, len(properties)) + bytes(properties)
    associated += struct.pack(">HB", grid, 3) + bytes([4, 3, 6])
    iprp = _box(b"iprp", ipco + _full_box(b"ipma", struct.pack(">I", tiles + 1) + associated))

    def meta_box(data_at: int) -> bytes:
        located = b"".join(struct.pack(">HHHII", item, 0, 1, data_at, len(payload)) for item in range(1, tiles + 1))
        located += struct.pack(">HHHII", grid, 0, 1, data_at + len(payload), len(grid_data))
        iloc = _full_box(b"iloc", bytes([0x44, 0x00]) + struct.pack(">H", tiles + 1) + located)
        return _full_box(b"meta", hdlr + pitm + iloc + iinf + iref + iprp)

    data_at = len(ftyp) + len(meta_box(0)) + 8
    return ftyp + meta_box(data_at) + _box(b"mdat", payload + grid_data)
