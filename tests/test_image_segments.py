"""Files made of what Pillow walks in Python before the pixels, and JPEGs of too many scans, are refused at probe.

An adversarial review: a 40 MB JPEG of 10,000,000 empty COM segments around a
64x64 image took 7 s and 430-720 MB an open and 1.46 GB in the worker; a PNG of
3,500,000 empty private chunks 881 MB; a progressive JPEG of 20,000 scans
175-190 s of CPU per variant (``app/adapters/imaging/segments.py``). The files
here are the same shapes, smaller: each was taken before (the header is valid).
"""

from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image

from app.adapters.imaging import Limits, probe, segments
from app.errors import CorruptImage, DecompressionBomb, ImageTooLarge, UnsupportedFormat
from tests import hostile_images


def encoded(fmt: str, **params) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 10, 10)).save(out, fmt, **params)
    return out.getvalue()


def png_chunk(kind: bytes, data: bytes = b"") -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def probed(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return probe(path, Limits())


def test_a_jpeg_of_countless_segments_before_its_pixels_is_a_bomb(tmp_path):
    jpeg = encoded("JPEG")
    with pytest.raises(DecompressionBomb, match="segments"):
        probed(tmp_path, "com.jpg", jpeg[:2] + b"\xff\xfe\x00\x02" * 200_000 + jpeg[2:])
    limit = segments.MAX_SEGMENTS - jpeg[:jpeg.index(b"\xff\xda")].count(b"\xff") + 1  # its own, plus COMs
    assert probed(tmp_path, "some.jpg", jpeg[:2] + b"\xff\xfe\x00\x02" * limit + jpeg[2:]).width == 64


def test_a_png_of_countless_chunks_before_its_pixels_is_a_bomb(tmp_path):
    png = encoded("PNG")
    with pytest.raises(DecompressionBomb, match="chunks"):
        probed(tmp_path, "chunks.png", png[:33] + png_chunk(b"abCd") * 200_000 + png[33:])
    assert probed(tmp_path, "text.png", png[:33] + png_chunk(b"tEXt", b"k\x00v") * 500 + png[33:]).width == 64


def test_a_progressive_jpeg_of_too_many_scans_is_a_bomb(tmp_path):
    jpeg = encoded("JPEG", progressive=True)
    assert 2 < jpeg.count(b"\xff\xda") <= segments.MAX_SCANS and probed(tmp_path, "ok.jpg", jpeg).width == 64
    last = jpeg.rindex(b"\xff\xda")  # its last scan, again and again
    with pytest.raises(DecompressionBomb, match="scans"):
        probed(tmp_path, "scans.jpg", jpeg[:-2] + jpeg[last:-2] * segments.MAX_SCANS + jpeg[-2:])


def test_a_large_progressive_jpeg_gets_fewer_scans(tmp_path):
    """An adversarial run: 99 scans (under MAX_SCANS) of an 8000x8000 photo took 4.3 s of CPU per decode, each scan a
    pass over the whole image. The header here says 10000x6000; the walk reads no pixel. A height of 0 (a DNL
    marker's, which libjpeg refuses) counts as the largest."""
    jpeg = encoded("JPEG", progressive=True)
    sof = jpeg.index(b"\xff\xc2")
    large = jpeg[:sof + 5] + struct.pack(">HH", 6000, 10000) + jpeg[sof + 9:]  # height, then width
    last = large.rindex(b"\xff\xda")
    allowed = segments.MAX_SCAN_PIXELS // (6000 * 10000)
    assert 12 <= allowed < segments.MAX_SCANS

    def with_scans(n: int) -> bytes:
        return large[:-2] + large[last:-2] * (n - large.count(b"\xff\xda")) + large[-2:]

    path = tmp_path / "scans.jpg"
    for scans, refused in ((allowed, False), (allowed + 1, True)):
        path.write_bytes(with_scans(scans))
        with open(path, "rb") as fp:
            if refused:
                with pytest.raises(DecompressionBomb, match="60,000,000 pixels"):
                    segments.check(fp, "JPEG")
            else:  # within the bound; its last scan sent again and again is refused for what it is
                with pytest.raises(CorruptImage, match="does not follow its progression"):
                    segments.check(fp, "JPEG")
    with pytest.raises(DecompressionBomb, match="scans"):
        probed(tmp_path, "probed.jpg", with_scans(allowed + 1))
    unknown = jpeg[:sof + 5] + struct.pack(">HH", 0, 8000) + jpeg[sof + 9:]  # up to 65535 x 8000: 3 scans
    assert 3 < unknown.count(b"\xff\xda") < segments.MAX_SCANS
    path.write_bytes(unknown)
    with open(path, "rb") as fp, pytest.raises(DecompressionBomb, match="scans"):
        segments.check(fp, "JPEG")


def test_megabytes_outside_a_jpegs_segments_are_corrupt(tmp_path):
    jpeg = encoded("JPEG")
    app0_end = 4 + struct.unpack(">H", jpeg[4:6])[0]
    with pytest.raises(CorruptImage, match="outside its segments"):
        probed(tmp_path, "junk.jpg", jpeg[:app0_end] + b"\x00" * (segments.MAX_JUNK_BYTES + 10) + jpeg[app0_end:])
    assert probed(tmp_path, "fill.jpg", jpeg[:app0_end] + b"\xff" * 1000 + jpeg[app0_end:]).width == 64


def test_a_pngs_trailing_exif_is_read_without_decoding_its_pixels(tmp_path):
    """``stripped_metadata`` (each variant's provenance) called Pillow's ``getexif()``, which for a PNG decodes every
    pixel to reach an ``eXIf`` chunk after the image data: outside the memory budget, after the render gave its
    reservation back (an adversarial review). The image data here is broken, so a decode fails and the record
    said nothing at all; the chunk walk reads the tags."""
    from app.adapters.imaging.provenance import stripped_metadata

    exif = Image.Exif()
    exif[0x010F], exif[0x8825] = "Camera", {1: "N", 2: (1.0, 2.0, 3.0)}
    png = encoded("PNG")
    pixels, end = png.index(b"IDAT") - 4, png.rindex(b"IEND") - 4
    path = tmp_path / "trailing.png"
    path.write_bytes(png[:pixels] + png_chunk(b"IDAT", b"x\x9c\x00\x01") + png_chunk(b"eXIf", exif.tobytes()[6:])
                     + png[end:])
    found = stripped_metadata(path)
    assert found["exif_tags"] == ["GPSInfo", "Make"] and found["gps"] is True


def test_the_limits_are_not_walked_around(tmp_path):
    """An adversarial review of the limits: a stuffed ``FF 00`` before a block of COM segments made the walk jump
    over them by a false length, though Pillow walks each; an EOI inside a COM between scans stopped the count of
    scans, though libjpeg skips the COM and decodes on; private chunks after a PNG's image data went uncounted,
    though Pillow keeps each when it loads the pixels."""
    jpeg = encoded("JPEG")
    block = b"\xff\x00" + b"\xff\xfe\x00\x02" * 2000
    with pytest.raises(DecompressionBomb, match="segments"):
        probed(tmp_path, "stuffed.jpg", jpeg[:2] + block + jpeg[2:])
    progressive = encoded("JPEG", progressive=True)
    second, last = progressive.index(b"\xff\xda", progressive.index(b"\xff\xda") + 2), progressive.rindex(b"\xff\xda")
    hidden = (progressive[:second] + b"\xff\xfe\x00\x04\xff\xd9" + progressive[second:-2]
              + progressive[last:-2] * segments.MAX_SCANS + progressive[-2:])
    with pytest.raises(DecompressionBomb, match="scans"):
        probed(tmp_path, "hidden.jpg", hidden)
    png = encoded("PNG")
    end = png.rindex(b"IEND") - 4
    with pytest.raises(DecompressionBomb, match="chunks"):
        probed(tmp_path, "after.png", png[:end] + png_chunk(b"abCd") * (segments.MAX_SEGMENTS + 1) + png[end:])


def _itxt(text: str) -> bytes:
    """An iTXt chunk, compressed: keyword, compression flag and method, language and translated keyword, text."""
    return png_chunk(b"iTXt", b"Comment\x00\x01\x00\x00\x00" + zlib.compress(text.encode(), 9))


def test_a_png_whose_text_inflates_to_hundreds_of_megabytes_is_a_bomb(tmp_path):
    """An adversarial run: 255 iTXt chunks of 1 Mi emoji each (a 274 KB PNG of 1024x768) held 270 MB an open
    (Pillow counts characters, an emoji takes 4 bytes), 592 MB in the worker and 2 GB for four at once, outside
    the memory budget. Pillow's limit on a PNG's text is now 4 Mi characters (``plugins.PNG_TEXT_CHARACTERS``)."""
    png = encoded("PNG")
    chunk = _itxt("\U0001F600" * 200_000)  # 800 KB inflated, under Pillow's 1 MiB a chunk; 800 KB in memory
    bomb = png[:33] + chunk * 30 + png[33:]
    assert len(bomb) < 100_000
    with pytest.raises(DecompressionBomb):
        probed(tmp_path, "text.png", bomb)
    # a photo's XMP, a few hundred KB of text, is not one
    xmp = png[:33] + _itxt("<x:xmpmeta>" + "x" * 300_000 + "</x:xmpmeta>") + png[33:]
    assert probed(tmp_path, "xmp.png", xmp).width == 64


def _rle8_bmp(width: int, height: int, rows: bytes) -> bytes:
    palette = b"".join(bytes((i, i, i, 0)) for i in range(256))
    offset = 14 + 40 + len(palette)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 8, 1, len(rows), 2835, 2835, 256, 0)
    return b"BM" + struct.pack("<IHHI", offset + len(rows), 0, 0, offset) + info + palette + rows


def test_a_run_length_encoded_bmp_of_many_megapixels_is_a_bomb(tmp_path):
    """An adversarial run: a 33 KB BMP of 8000x8000 made of RLE8 end-of-line codes took 8 s of CPU a decode with
    the GIL held (Pillow decodes RLE in Python), 22-33 s a job; four at once held every upload behind them. More
    than ``segments.MAX_RLE_BMP_PIXELS`` pixels of RLE is refused at probe; a small RLE BMP is read."""
    with pytest.raises(DecompressionBomb):
        probed(tmp_path, "rle.bmp", _rle8_bmp(8000, 8000, b"\x01\x07\x00\x00" * 8000 + b"\x00\x01"))
    small = probed(tmp_path, "small.bmp", _rle8_bmp(100, 100, b"\x64\x07\x00\x00" * 100 + b"\x00\x01"))
    assert (small.width, small.height) == (100, 100)


def tiff_of_strips(strips: int, *, rows_per_strip: int = 1, side: int = 64, width: int | None = None) -> bytes:
    """An uncompressed grey TIFF of ``width`` (``side``) x ``side`` whose StripOffsets and StripByteCounts list
    ``strips`` strips (the later ones point at the first rows again), after an adversarial run's file."""
    pixels = bytes(k % 256 for k in range(side)) * (width or side)
    tags = [(256, 4, 1, width or side), (257, 4, 1, side), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (273, 4, strips, None), (277, 3, 1, 1), (278, 4, 1, rows_per_strip), (279, 4, strips, None)]
    start = 8 + 2 + 12 * len(tags) + 4
    offsets_at = start + len(pixels)
    counts_at = offsets_at + 4 * strips
    rows = [(k * rows_per_strip) % side for k in range(strips)]
    offsets = b"".join(struct.pack("<I", start + row * (width or side)) for row in rows)
    counts = b"".join(struct.pack("<I", min(rows_per_strip, side - row) * (width or side)) for row in rows)
    fields = {273: offsets_at if strips > 1 else start, 279: counts_at if strips > 1 else len(pixels)}
    ifd = struct.pack("<H", len(tags)) + b"".join(
        struct.pack("<HHII", tag, kind, count, fields.get(tag, value) if value is None else value)
        for tag, kind, count, value in tags) + struct.pack("<I", 0)
    return b"II*\x00" + struct.pack("<I", 8) + ifd + pixels + offsets + counts


def test_a_tiff_listing_more_strips_than_its_size_holds_is_corrupt(tmp_path):
    """An adversarial run: a 4 MB TIFF of 64x64 pixels listing 2,000,000 strips took 603 MB of the web's probe and
    1.2 GB of the worker, 40 s a job; 8,000,000 strips, 2.2 and 4.6 GB."""
    assert probed(tmp_path, "rows.tif", tiff_of_strips(64)).width == 64, "a strip a row, as the size holds"
    assert probed(tmp_path, "spare.tif", tiff_of_strips(64 + segments.TIFF_SPARE_STRIPS)).width == 64
    with pytest.raises(CorruptImage, match="strips"):
        probed(tmp_path, "strips.tif", tiff_of_strips(64 + segments.TIFF_SPARE_STRIPS + 1))
    with pytest.raises(DecompressionBomb, match="values"):
        probed(tmp_path, "values.tif", tiff_of_strips(segments.MAX_TIFF_VALUES // 2 + 1))


def test_a_tiffs_values_are_counted_whatever_their_tag(tmp_path):
    """A colour map or a private tag of millions of SHORTs costs Pillow an object each, as strips do."""
    tiff = tiff_of_strips(1, rows_per_strip=64)
    count = struct.unpack_from("<H", tiff, 8)[0]
    def with_private_tag(values: int, present: bool) -> bytes:
        private = struct.pack("<HHII", 65000, 3, values, len(tiff) + 12)  # SHORTs after the file's end, if present
        return (tiff[:8] + struct.pack("<H", count + 1) + tiff[10:10 + 12 * count] + private
                + tiff[10 + 12 * count:] + bytes(2 * values if present else 0))

    with pytest.raises(DecompressionBomb, match="values"):
        probed(tmp_path, "private.tif", with_private_tag(segments.MAX_TIFF_VALUES, present=True))
    assert probed(tmp_path, "absent.tif", with_private_tag(segments.MAX_TIFF_VALUES, present=False)).width == 64, \
        "values past the end of the file are skipped by Pillow, so not counted"
    assert probed(tmp_path, "one.tif", tiff).width == 64


def gif_with_comment(blocks: int, block: bytes = b"ab") -> bytes:
    gif = encoded("GIF")
    comment = b"\x21\xfe" + (bytes([len(block)]) + block) * blocks + b"\x00"
    screen = 13 + (3 << ((gif[10] & 7) + 1) if gif[10] & 0x80 else 0)
    return gif[:screen] + comment + gif[screen:]


def test_a_gif_comment_of_countless_sub_blocks_is_a_bomb(tmp_path):
    """An adversarial run: a 10 MB comment of 2-byte sub-blocks took 460 MB an open (Pillow keeps each one), and a
    64x64 job 1 GB of the worker."""
    assert probed(tmp_path, "comment.gif", gif_with_comment(1000)).width == 64
    with pytest.raises(DecompressionBomb, match="extensions"):
        probed(tmp_path, "blocks.gif", gif_with_comment(segments.MAX_GIF_EXTENSION_BLOCKS + 1))


def test_a_gif_is_walked_to_its_trailer_and_bytes_between_its_blocks_are_counted(tmp_path):
    gif = encoded("GIF")
    assert gif.endswith(b"\x3b")
    with pytest.raises(CorruptImage, match="outside its blocks"):
        probed(tmp_path, "junk.gif", gif[:-1] + b"\x01" * (segments.MAX_JUNK_BYTES + 1) + b"\x3b")
    descriptor = gif.index(b"\x2c", 13)  # an image of 64x64 whose data comes in 1-byte sub-blocks
    crumbs = gif[descriptor:descriptor + 10] + b"\x02" + b"\x01\x00" * (segments.MAX_GIF_BLOCKS + 1) + b"\x00\x3b"
    with pytest.raises(DecompressionBomb, match="data blocks"):
        probed(tmp_path, "crumbs.gif", gif[:descriptor] + crumbs)


def test_tile_tags_and_empty_blocks_do_not_walk_around_the_limits(tmp_path):
    """An adversarial run's files: tile tags on a striped TIFF made the walk expect a tile per pixel (Pillow reads
    the strips), and a 50 MB GIF of empty comment extensions took 14.6 s a probe."""
    tiff = tiff_of_strips(64 + segments.TIFF_SPARE_STRIPS + 1)
    count = struct.unpack_from("<H", tiff, 8)[0]
    tiles = struct.pack("<HHII", 322, 4, 1, 1) + struct.pack("<HHII", 323, 4, 1, 1)
    tiled = (tiff[:8] + struct.pack("<H", count + 2) + tiff[10:10 + 12 * count] + tiles + tiff[10 + 12 * count:])
    shift = 24  # the two entries moved everything after the directory
    tiled = _moved(tiled, 10 + 12 * (count + 2) + 4, shift)
    with pytest.raises(CorruptImage, match="strips"):
        probed(tmp_path, "tiles.tif", tiled)
    gif = encoded("GIF")
    screen = 13 + (3 << ((gif[10] & 7) + 1) if gif[10] & 0x80 else 0)
    with pytest.raises(DecompressionBomb, match="blocks"):
        probed(tmp_path, "empty.gif", gif[:screen] + b"\x21\xfe\x00" * (segments.MAX_GIF_BLOCKS + 1) + gif[screen:])


def _moved(tiff: bytes, start: int, shift: int) -> bytes:
    """``tiff`` with every LONG offset of its strips (and the strip arrays' own offsets) moved by ``shift`` bytes."""
    count = struct.unpack_from("<H", tiff, 8)[0]
    out = bytearray(tiff)
    for pos in range(10, 10 + 12 * count, 12):
        tag, kind, n, value = struct.unpack_from("<HHII", out, pos)
        if tag in (273, 279) and n > 1:
            struct.pack_into("<I", out, pos + 8, value + shift)
    offsets_entry = next(pos for pos in range(10, 10 + 12 * count, 12) if struct.unpack_from("<H", out, pos)[0] == 273)
    n, at = struct.unpack_from("<II", out, offsets_entry + 4)
    for k in range(n):
        struct.pack_into("<I", out, at + 4 * k, struct.unpack_from("<I", out, at + 4 * k)[0] + shift)
    return bytes(out)


def test_an_avif_item_table_of_empty_fields_or_offsets_past_the_file_is_read_quickly():
    """4096 items of 65535 extents whose fields are 0 bytes wide took 178 s a probe; an extent offset of 2**63 made
    the seek raise a ValueError out of the probe (an adversarial run)."""
    import time

    from app.adapters.imaging import bmff

    payload = bytes([0, 0, 0, 0, 0x00, 0x00]) + struct.pack(">H", 4096) + (b"\x00\x01\x00\x00\xff\xff") * 4096
    started = time.monotonic()
    with pytest.raises(DecompressionBomb):
        bmff._item_locations(payload, [bmff.MAX_EXTENTS])
    assert time.monotonic() - started < 1
    assert bmff._placed(0, [(2**63, 10)], None, 100) == []


def test_a_gif_extension_is_walked_as_pillow_walks_it_past_an_empty_first_sub_block(tmp_path):
    """Pillow reads an extension's first sub-block, then every one up to an empty one: an extension whose first
    sub-block is empty has the bytes after it read as its own sub-blocks (but for a comment). An adversarial run hid
    a comment of countless sub-blocks behind ``21 F9 00 3B``: the walk took the 3B for the trailer and stopped, and
    Pillow read the comment (679 MB an open, priced 16 MB)."""
    gif = encoded("GIF")
    screen = 13 + (3 << ((gif[10] & 7) + 1) if gif[10] & 0x80 else 0)
    hidden = (b"\x21\xf9\x00" + b"\x3b" + bytes(59) + b"\x00"
              + b"\x21\xfe" + b"\x01A" * (segments.MAX_GIF_EXTENSION_BLOCKS + 1) + b"\x00")
    with Image.open(io.BytesIO(gif[:screen] + hidden + gif[screen:])) as image:
        assert len(image.info["comment"]) == segments.MAX_GIF_EXTENSION_BLOCKS + 1, "Pillow reads the comment"
    with pytest.raises(DecompressionBomb, match="extensions"):
        probed(tmp_path, "hidden.gif", gif[:screen] + hidden + gif[screen:])
    netscape = b"\x21\xff\x0bNETSCAPE2.0\x00" + b"\x3b" + bytes(59) + b"\x00"  # its second read is empty too
    with pytest.raises(DecompressionBomb, match="extensions"):
        probed(tmp_path, "netscape.gif", gif[:screen] + netscape + hidden[3 + 61:] + gif[screen:])
    quiet = b"\x21\xfe\x00" + b"\x21\xf9\x04\x00\x00\x00\x00\x00"  # an empty comment ends at its empty sub-block
    assert probed(tmp_path, "quiet.gif", gif[:screen] + quiet + gif[screen:]).width == 64


def tiff_with_gps(values: int, pointers: int = 1) -> bytes:
    """A 64x64 TIFF whose GPS directory holds one tag of ``values`` RATIONALs (8 bytes each in the file), pointed
    to by a tag of ``pointers`` LONGs (Pillow takes the first)."""
    tiff = bytearray(encoded("TIFF"))
    ifd = struct.unpack_from("<I", tiff, 4)[0]
    count = struct.unpack_from("<H", tiff, ifd)[0]
    entries = [bytes(tiff[pos:pos + 12]) for pos in range(ifd + 2, ifd + 2 + 12 * count, 12)]
    rationals_at = len(tiff)
    gps_at = rationals_at + 8 * values
    gps = struct.pack("<HHHII", 1, 2, 5, values, rationals_at) + struct.pack("<I", 0)
    pointer_at = gps_at + len(gps)
    field = gps_at if pointers == 1 else pointer_at
    entries = sorted(entries + [struct.pack("<HHII", 0x8825, 4, pointers, field)])
    directory = struct.pack("<H", count + 1) + b"".join(entries) + struct.pack("<I", 0)
    listed = struct.pack("<I", gps_at) * pointers if pointers > 1 else b""
    out = tiff + struct.pack("<II", 1, 1) * values + gps + listed + directory
    struct.pack_into("<I", out, 4, pointer_at + len(listed))
    return bytes(out)


def test_a_gps_directory_is_not_read_to_say_the_source_had_one(tmp_path):
    """``stripped_metadata`` read a TIFF's GPS directory whole to say whether there was one: 24 MB of RATIONALs
    there took 554 MB of the worker (an IFDRational of some 180 bytes for each 8 of the file), after the render
    gave its reservation back (an adversarial run). The tag that points to it is enough."""
    import tracemalloc

    from app.adapters.imaging.provenance import stripped_metadata

    path = tmp_path / "gps.tif"
    path.write_bytes(tiff_with_gps(100_000))
    tracemalloc.start()
    try:
        found = stripped_metadata(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found["gps"] is True and "GPSInfo" in found["exif_tags"]
    assert peak < 2_000_000, f"{peak:,} bytes to read the metadata of a 64x64 TIFF"


def test_a_tiff_of_countless_strips_is_a_bomb_whatever_its_size(tmp_path):
    """Pillow builds a tile for each strip when it opens a TIFF, before its size is checked: a TIFF of 1 x 1,040,000
    pixels in strips of a row took 311 MB to be refused as too tall (an adversarial run)."""
    import tracemalloc

    assert probed(tmp_path, "tall.tif", tiff_of_strips(20_000, side=20_000, width=1)).height == 20_000
    path = tmp_path / "taller.tif"
    path.write_bytes(tiff_of_strips(segments.MAX_TIFF_STRIPS + 1, side=segments.MAX_TIFF_STRIPS + 1, width=1))
    tracemalloc.start()
    try:
        with pytest.raises(DecompressionBomb, match="strips"):
            probe(path, Limits())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000, f"{peak:,} bytes to refuse it"


def test_a_tiff_tag_pillow_skips_makes_way_for_its_next_copy(tmp_path):
    """Pillow keeps the first copy of a tag it can read: one of count 0 (no values), or one whose values would
    take the directory's past the file's size, is skipped and the next copy read. A review hid 2,000,000 strips
    (541 MB an open) behind copies of count 0; and a scalar tag of two LONGs was read from its entry, where it
    holds their offset, as Pillow does not (it takes the first value)."""
    def tiff(strips: int, *, empty_copies: bool = False, length_entry: tuple[int, int, bytes] | None = None,
             unread_copies: bool = False) -> bytes:
        entries = []
        pixels = b"\x80" * 64
        offsets_at = 8 + len(pixels)
        counts_at = offsets_at + 4 * strips
        extra_at = counts_at + 4 * strips
        extra = struct.pack("<II", 64, 64)  # two LONGs, for a length stored outside its entry
        ifd_at = extra_at + len(extra)

        def entry(tag: int, kind: int, count: int, value: bytes) -> None:
            entries.append(struct.pack("<HHI4s", tag, kind, count, value))

        entry(256, 3, 1, struct.pack("<HH", 64, 0))
        kind, count, value = length_entry or (3, 1, struct.pack("<HH", 64, 0))
        entry(257, kind, count, value if value else struct.pack("<I", extra_at))
        entry(258, 3, 1, struct.pack("<HH", 8, 0))
        entry(262, 3, 1, struct.pack("<HH", 1, 0))
        if empty_copies:
            entry(273, 4, 0, bytes(4))
            entry(279, 4, 0, bytes(4))
        if unread_copies:  # IFD8 (18): a type Pillow 13 does not read
            entry(273, 18, 1, bytes(4))
            entry(279, 18, 1, bytes(4))
        entry(273, 4, strips, struct.pack("<I", offsets_at))
        entry(278, 4, 1, struct.pack("<I", 1))
        entry(279, 4, strips, struct.pack("<I", counts_at))
        ifd = struct.pack("<H", len(entries)) + b"".join(entries) + bytes(4)
        return (b"II*\x00" + struct.pack("<I", ifd_at) + pixels + struct.pack("<I", 8) * strips
                + struct.pack("<I", 1) * strips + extra + ifd)

    many = 64 + segments.TIFF_SPARE_STRIPS + 1
    with pytest.raises(CorruptImage, match="strips"):
        probed(tmp_path, "plain.tif", tiff(many))
    with pytest.raises(CorruptImage, match="strips"):
        probed(tmp_path, "hidden.tif", tiff(many, empty_copies=True))
    with Image.open(io.BytesIO(tiff(many, empty_copies=True))) as image:
        assert len(image.tile) == many, "Pillow reads the second copies"
    assert probed(tmp_path, "rows.tif", tiff(64, empty_copies=True)).height == 64
    with pytest.raises(CorruptImage, match="strips"):  # a review: copies of a type Pillow skips hid them too
        probed(tmp_path, "unread.tif", tiff(many, unread_copies=True))
    # ImageLength as two LONGs stored outside the entry: the entry holds their offset, Pillow takes the first (64)
    assert probed(tmp_path, "length.tif", tiff(64, length_entry=(4, 2, b""))).height == 64
    with pytest.raises(CorruptImage, match="strips"):
        probed(tmp_path, "length_many.tif", tiff(many, length_entry=(4, 2, b"")))


def test_metadata_is_walked_past_junk_and_a_webp_is_priced_whole(tmp_path):
    """A review: one byte of junk before a JPEG's APP segments stopped the metadata walk (Pillow skips it and keeps
    them all: 45 MB of APP13 at 44 MB an open, priced as none); a WebP's bytes after its RIFF, or after 1,000 empty
    chunks, were not walked, though Pillow reads the whole file and keeps it (57.6 MB an open)."""
    jpeg = encoded("JPEG")
    app0_end = 4 + struct.unpack(">H", jpeg[4:6])[0]
    app13 = (b"\xff\xed" + struct.pack(">H", 65535) + b"A" * 65533) * 50
    for junk in (b"", b"\x00"):
        path = tmp_path / "app13.jpg"
        path.write_bytes(jpeg[:app0_end] + junk + app13 + jpeg[app0_end:])
        with open(path, "rb") as fp:
            assert segments.metadata_bytes(fp, "JPEG") >= 50 * 65535, f"junk {junk!r}"
    webp = encoded("WEBP")
    padded = webp + b"\x00" * 3_000_000
    riff = struct.unpack("<I", webp[4:8])[0]
    junk_chunks = b"JUNK" + bytes(4)
    stuffed = (b"RIFF" + struct.pack("<I", riff + len(junk_chunks) * 1000 + 8 + 3_000_000) + webp[8:]
               + junk_chunks * 1000 + b"JUNK" + struct.pack("<I", 3_000_000) + bytes(3_000_000))
    for name, data in (("padded.webp", padded), ("stuffed.webp", stuffed)):
        path = tmp_path / name
        path.write_bytes(data)
        with Image.open(path) as image:
            assert image.size == (64, 64), "Pillow opens it"
        with open(path, "rb") as fp:
            assert segments.metadata_bytes(fp, "WEBP") >= 3_000_000, name
    path = tmp_path / "plain.webp"
    path.write_bytes(webp)
    with open(path, "rb") as fp:
        assert segments.metadata_bytes(fp, "WEBP") < 100


def test_what_pillow_decodes_whole_when_it_loads_a_tiff_is_bounded(tmp_path):
    """Pillow 13 reads a TIFF's Exif and GPS directories whole, and its Orientation, when it loads the pixels
    (``TiffImageFile.load_end``): 24 MB of RATIONALs in a GPS directory took 554 MB of the worker, after its budget
    was taken for a 64x64 image (an adversarial run)."""
    assert probed(tmp_path, "few.tif", tiff_with_gps(100)).width == 64
    with pytest.raises(DecompressionBomb, match="GPS"):
        probed(tmp_path, "many.tif", tiff_with_gps(segments.MAX_TIFF_DECODED_VALUES + 1))
    # a pointer of two LONGs: Pillow takes the first, and reads the directory (a fourth adversarial run)
    with Image.open(io.BytesIO(tiff_with_gps(10, pointers=2))) as image:
        assert len(image.getexif().get_ifd(0x8825)[2]) == 10
    with pytest.raises(DecompressionBomb, match="GPS"):
        probed(tmp_path, "pointers.tif", tiff_with_gps(segments.MAX_TIFF_DECODED_VALUES + 1, pointers=2))


def exif_with_orientation(kind: int, values: int, value: int = 6) -> bytes:
    """An EXIF block (little-endian TIFF structure) whose first directory holds only Orientation."""
    if values == 1 and kind == 3:
        entry = struct.pack("<HHIHH", 274, 3, 1, value, 0)
        return b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + entry + bytes(4)
    entry = struct.pack("<HHII", 274, kind, values, 26)
    values_bytes = struct.pack("<II", 6, 1) * values
    return b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + entry + bytes(4) + values_bytes


def _metadata_of(tmp_path, png: bytes) -> int:
    path = tmp_path / "priced.png"
    path.write_bytes(png)
    with open(path, "rb") as fp:
        return segments.metadata_bytes(fp, "PNG")


def test_a_pngs_text_is_priced_as_pillow_keeps_it_inflated(tmp_path):
    """An adversarial run: 16 compressed iTXt chunks of 262,000 emoji each, a 17 KB PNG of 64x64 under the text
    limit, took 18 MB a render priced 8: a chunk was priced as it is in the file. Each text is now priced as the
    str Pillow keeps: a byte a character of Latin-1, four for every character of a text one of whose characters
    takes four; a profile as its inflated bytes."""
    png = encoded("PNG")
    emoji = png[:33] + _itxt("\U0001F600" * 262_000) * 16 + png[33:]
    assert len(emoji) < 20_000
    assert _metadata_of(tmp_path, emoji) >= 16 * 262_000 * 4
    # any flag but 0 is compressed to Pillow, not only 1 (a re-attack: flag 2 was priced as it is in the file)
    flagged = _itxt("\U0001F600" * 262_000).replace(b"Comment\x00\x01", b"Comment\x00\x02")
    flagged = flagged[:-4] + struct.pack(">I", zlib.crc32(flagged[4:-4]))
    assert _metadata_of(tmp_path, png[:33] + flagged + png[33:]) >= 262_000 * 4
    ascii_text = _metadata_of(tmp_path, png[:33] + _itxt("a" * 100_000) + png[33:])
    assert 100_000 <= ascii_text < 101_000
    assert _metadata_of(tmp_path, png[:33] + _itxt("a" * 100_000 + "\U0001F600") + png[33:]) >= 400_000
    latin = png_chunk(b"zTXt", b"Comment\x00\x00" + zlib.compress(b"\xe9" * 100_000, 9))
    assert 100_000 <= _metadata_of(tmp_path, png[:33] + latin + png[33:]) < 101_000
    profile = png_chunk(b"iCCP", b"icc\x00\x00" + zlib.compress(b"\x00" * 500_000, 9))
    assert _metadata_of(tmp_path, png[:33] + profile + png[33:]) >= 500_000


def test_a_pngs_text_is_walked_quickly_and_no_more_than_pillow_may_keep(tmp_path):
    """990 iTXt chunks that each inflate to 1 MiB of bytes that continue a UTF-8 character (no character at all),
    a 1 MB PNG: the walk inflated every one, 13-14 s of CPU an open, and Pillow's own open 4 s (a re-attack). What
    a PNG's text and profile decode to in all is bounded by what Pillow may keep, and past it the file is a bomb,
    found by the walk before Pillow inflates anything."""
    import time

    png = encoded("PNG")
    nothing = zlib.compress(b"\x80" * (1 << 20), 9)
    chunks = b"".join(png_chunk(b"iTXt", b"k%d\x00\x01\x00\x00\x00" % i + nothing) for i in range(990))
    began = time.process_time()
    with pytest.raises(DecompressionBomb, match="decode to more than"):
        probed(tmp_path, "nothing.png", png[:33] + chunks + png[33:])
    assert time.process_time() - began < 1.0


def test_a_png_of_more_than_one_profile_is_refused(tmp_path):
    """Pillow inflates every iCCP chunk, up to 1 MiB each, to keep the last: 990 of them, a 1 MB PNG, took 2.2 s
    of CPU an open. The PNG specification allows one."""
    png = encoded("PNG")
    profile = png_chunk(b"iCCP", b"icc\x00\x00" + zlib.compress(b"\x00" * 1000, 9))
    assert probed(tmp_path, "one.png", png[:33] + profile + png[33:]).width == 64
    with pytest.raises(CorruptImage, match="more than one iCCP"):
        probed(tmp_path, "two.png", png[:33] + profile * 2 + png[33:])


def test_a_raw_exif_profile_of_countless_lines_is_read_without_a_str_a_line(tmp_path):
    """ImageMagick keeps a PNG's EXIF as hex text over many lines (``Raw profile type exif``). The orientation's
    read split it into a str a line, as Pillow's ``getexif()`` does, and then Pillow split it again: 349,000 lines
    of "ab", a 14 KB PNG, took 38 MB a render priced 8 (an adversarial run)."""
    png = encoded("PNG")
    lines = png_chunk(b"zTXt", b"Raw profile type exif\x00\x00" + zlib.compress(b"ab\n" * 349_000, 9))
    path = tmp_path / "lines.png"
    path.write_bytes(png[:33] + lines + png[33:])
    assert probed_cheaply(path, 8_000_000).orientation == 1


def probed_cheaply(path, most: int = 4_000_000):
    """``probe(path)``, asserting it allocated less than ``most`` bytes in Python at its peak."""
    import tracemalloc

    tracemalloc.start()
    try:
        found = probe(path, Limits())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < most, f"{peak:,} bytes to probe {path.name}"
    return found


def test_an_orientation_of_countless_values_is_not_decoded(tmp_path):
    """Pillow decodes every value of a tag it is asked for: an Orientation of 1,000,000 RATIONALs in a PNG's eXIf
    (8 MB) took 165 MB of the web's probe; the tag is read by the walk, and such a tag is no orientation, as it is
    none to Pillow (a tuple)."""
    png = encoded("PNG")
    at = png.index(b"IDAT") - 4
    path = tmp_path / "turned.png"
    path.write_bytes(png[:at] + png_chunk(b"eXIf", exif_with_orientation(3, 1)) + png[at:])
    assert probe(path, Limits()).orientation == 6
    path = tmp_path / "many.png"
    path.write_bytes(png[:at] + png_chunk(b"eXIf", exif_with_orientation(5, 100_000)) + png[at:])
    assert probed_cheaply(path).orientation == 1
    webp = io.BytesIO()
    Image.new("RGB", (64, 64)).save(webp, "WEBP", exif=b"Exif\x00\x00" + exif_with_orientation(3, 1, 8))
    path = tmp_path / "turned.webp"
    path.write_bytes(webp.getvalue())
    assert probe(path, Limits()).orientation == 8
    exif = b"II*\x00" + struct.pack("<IH", 8, 1) + struct.pack("<HHIHH", 274, 3, 2, 3, 8) + bytes(4)
    two = png[:at] + png_chunk(b"eXIf", exif) + png[at:]
    path = tmp_path / "two.png"
    path.write_bytes(two)
    assert probe(path, Limits()).orientation == 3, "the first of two, as Pillow takes it"
    # Pillow puts an "Exif\0\0" before an eXIf chunk's, and takes off two (a review: the walk took one)
    path = tmp_path / "twice.png"
    path.write_bytes(png[:at] + png_chunk(b"eXIf", b"Exif\x00\x00" + exif_with_orientation(5, 100_000)) + png[at:])
    assert probed_cheaply(path).orientation == 1


def test_a_jpeg_is_walked_past_an_early_eoi_and_its_exif_segments_are_counted(tmp_path):
    """A fourth adversarial run: an EOI right after the SOI hid 10,000,000 COM segments from the walk, which
    stopped there while Pillow reads on (708 MB and 10 s an open); 760 APP1 Exif segments took 12 s of CPU an open,
    Pillow joining each to all before it."""
    jpeg = encoded("JPEG")
    com = b"\xff\xfe\x00\x02" * (segments.MAX_SEGMENTS + 1)
    with pytest.raises(DecompressionBomb, match="segments"):
        probed(tmp_path, "eoi.jpg", b"\xff\xd8\xff\xd9" + com + jpeg[2:])
    exif = b"\xff\xe1" + struct.pack(">H", 2 + 6 + 8) + b"Exif\x00\x00" + b"II*\x00\x08\x00\x00\x00"
    assert probed(tmp_path, "two.jpg", jpeg[:2] + exif * 2 + jpeg[2:]).width == 64
    with pytest.raises(DecompressionBomb, match="Exif"):
        probed(tmp_path, "many.jpg", jpeg[:2] + exif * (segments.MAX_EXIF_SEGMENTS + 1) + jpeg[2:])


def test_a_gif_s_extensions_are_priced_as_metadata(tmp_path):
    """A fourth adversarial run: a 25.5 MB comment of 99,999 sub-blocks, inside the limits, rendered in 62 MB
    priced 8-11.5 MB: Pillow keeps the comment (its blocks and their join)."""
    path = tmp_path / "comment.gif"
    path.write_bytes(gif_with_comment(10_000, b"x" * 255))
    with open(path, "rb") as fp:
        assert segments.metadata_bytes(fp, "GIF") == 10_000 * 255
    path.write_bytes(encoded("GIF"))
    with open(path, "rb") as fp:
        assert segments.metadata_bytes(fp, "GIF") < 100


def test_an_animation_s_frames_are_not_priced_as_metadata(tmp_path):
    """A review: the WebP walk stopped at 1,000 chunks and priced the rest as metadata, four times over: an
    animation of 3,000 frames went from 11 to 145 MiB."""
    frames = [Image.new("RGB", (16, 16), (k % 256, 0, 0)) for k in range(1500)]
    path = tmp_path / "animation.webp"
    frames[0].save(path, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    with open(path, "rb") as fp:
        assert segments.metadata_bytes(fp, "WEBP") < 100


def test_the_tiles_pillow_keeps_for_a_tiff_are_priced(tmp_path):
    """Pillow keeps a tile for each strip a TIFF lists (131,072 tiles of 1x1 pixels cost 37 MB a render, unpriced:
    a fifth adversarial run)."""
    from app.adapters.imaging import budget
    from app.adapters.imaging.probe import open_checked

    priced = {}
    for strips in (64, 64 + segments.TIFF_SPARE_STRIPS):
        path = tmp_path / f"{strips}.tif"
        path.write_bytes(tiff_of_strips(strips))
        with open_checked(path, Limits()) as opened:
            priced[strips] = dict(opened.priced.parts)["decode"]
    assert priced[64 + segments.TIFF_SPARE_STRIPS] - priced[64] >= segments.TIFF_SPARE_STRIPS * budget.TIFF_TILE_BYTES


def test_a_sequential_jpeg_of_countless_scans_is_a_bomb(data_file):
    """libjpeg reads a sequential JPEG scan by scan when its first scan holds fewer than all its components, a
    pass over the image each: 1,000 repeats of its three scans in 42 KB of arithmetic coding (SOF9) took 14 s of
    CPU a render (a seventh adversarial run; the walk counted only a progressive JPEG's scans)."""
    with pytest.raises(DecompressionBomb, match="scans"):
        probe(data_file("hostile/jpeg_arith_4096_1000_scans.jpg"), Limits())


def test_a_tiff_whose_jpeg_tiles_are_progressive_is_not_processed(tmp_path):
    """The scan limits of a JPEG did not reach inside a TIFF: 62,500 tiles of 32x32 naming one 2.9 KB progressive
    JPEG of 99 scans, 503 KB in all, took 15 s of the worker's CPU a render, and a progressive strip's coefficients
    350 MB over a budget that priced 81 MB (an adversarial run). A TIFF writer's JPEG tiles are one sequential scan
    each; anything else is refused at the probe, whatever the tile or offset it hides in."""
    from PIL import Image as PILImage

    from app.adapters.imaging import render
    from app.core.pipeline import VariantSpec

    sequential = probed(tmp_path, "sequential.tif", hostile_images.jpeg_tiff(512, progressive=False))
    assert (sequential.width, sequential.format) == (512, "TIFF")
    path = tmp_path / "sequential.tif"
    made = render(path, VariantSpec("thumb", "fit", 64, 64), Limits())
    assert (made.width, made.height) == (64, 64)
    with PILImage.open(path) as img:
        img.load()  # libtiff decodes it: the shape is a TIFF's, not a refusal's
    with pytest.raises(UnsupportedFormat, match="progressive"):
        probed(tmp_path, "progressive.tif", hostile_images.jpeg_tiff(512, progressive=True))
    one_of_many = bytearray(hostile_images.jpeg_tiff(512, progressive=False))
    progressive = hostile_images.jpeg_tiff(32, progressive=True)
    last_tile_at = len(one_of_many)
    one_of_many += progressive[8:progressive.index(b"\xff\xd9") + 2]
    tiles = (512 // 32) ** 2
    offsets_at = struct.unpack_from("<I", one_of_many, 4)[0] - 8 * tiles  # the offsets, then the counts, then the IFD
    struct.pack_into("<I", one_of_many, offsets_at + 4 * (tiles - 1), last_tile_at)
    with pytest.raises(UnsupportedFormat, match="progressive"):
        probed(tmp_path, "one_of_many.tif", bytes(one_of_many))
    with pytest.raises(UnsupportedFormat, match="old-style"):
        probed(tmp_path, "old.tif", hostile_images.jpeg_tiff(64, progressive=False, compression=6))


def _jpeg(progressive: bool, side: int = 32) -> bytes:
    out = io.BytesIO()
    Image.linear_gradient("L").resize((side, side)).save(out, "JPEG", quality=90, progressive=progressive)
    return out.getvalue()


def _jpeg_tiff(side: int, tile: int, data: bytes, entries: list[tuple[int, int, list[int]]],
               compression: list[tuple[int, int]] = ((3, 7),)) -> bytes:
    """A grey JPEG-compressed TIFF of ``side`` with ``data`` after its header and the offset entries given as
    ``(tag, type, values)``, each value an offset into ``data`` (written as that type); ``compression``: the
    Compression entries, ``(type, value)`` each (one SHORT 7: TIFF Technical Note 2's JPEG)."""
    units = {1: "B", 3: "H", 4: "I", 6: "b", 16: "Q", 17: "q", 18: "Q"}
    tags = [(256, 4, [side]), (257, 4, [side]), (258, 3, [8]), (262, 3, [1]), (277, 3, [1]),
            (322, 3, [tile]), (323, 3, [tile]), (278, 3, [tile])]
    tags += [(259, kind, [value]) for kind, value in compression]
    tags += [(tag, kind, [8 + value for value in values]) for tag, kind, values in entries]
    tags += [(279 if tag == 273 else 325, 4, [len(data)] * len(values)) for tag, _, values in entries]
    tags.sort(key=lambda entry: entry[0])  # stable: copies of a tag stay in the order given
    arrays, at = b"", 8 + len(data) + 2 + 12 * len(tags) + 4
    ifd = struct.pack("<H", len(tags))
    for tag, kind, values in tags:
        packed = struct.pack(f"<{len(values)}{units[kind]}", *values)
        if len(packed) <= 4:
            ifd += struct.pack("<HHI", tag, kind, len(values)) + packed.ljust(4, b"\0")
        else:
            ifd += struct.pack("<HHII", tag, kind, len(values), at + len(arrays))
            arrays += packed
    return b"II*\0" + struct.pack("<I", 8 + len(data)) + data + ifd + bytes(4) + arrays


def test_every_offsets_entry_libtiff_may_decode_from_is_checked(tmp_path):
    """A re-attack of the check above: libtiff decodes from the later of StripOffsets and TileOffsets (one field
    to it) and reads offsets typed BYTE, SBYTE, SLONG8 or IFD8, which Pillow skips: a baseline strip named by
    StripOffsets hid 7,056 progressive tiles of 99 scans (14.8 s of CPU a render), and 62,500 behind IFD8 offsets."""
    baseline, progressive = _jpeg(False), _jpeg(True)
    data = baseline + progressive
    tiles = [len(baseline)] * 4  # a 64x64 image of four 32x32 tiles, each the progressive JPEG
    decoy = _jpeg_tiff(64, 32, data, [(273, 4, [0] * 2), (324, 4, tiles)])
    with pytest.raises(UnsupportedFormat, match="progressive"):
        probed(tmp_path, "decoy.tif", decoy)
    for kind in (1, 6, 17, 18):  # offsets past 127 do not fit SBYTE: the progressive JPEG goes first
        small = _jpeg_tiff(64, 32, progressive + baseline, [(324, kind, [0] * 4)])
        with pytest.raises(UnsupportedFormat, match="progressive"):
            probed(tmp_path, f"type{kind}.tif", small)
    assert probed(tmp_path, "plain.tif", _jpeg_tiff(64, 32, baseline, [(324, 4, [0] * 4)])).width == 64


def test_a_jpeg_tiffs_strips_are_walked_once_each_however_they_are_laid_out(tmp_path):
    """A re-attack of the check above: each strip an SOI and 2,000 fill bytes, the next strip's SOI after them;
    each strip's walk, a fill byte a turn, went on through every later strip: 30 s of CPU for 2 MB, in the web and
    again in every render. A strip's header is walked up to the next strip at most, and one that runs into it is
    refused."""
    import time

    strip = b"\xff\xd8" + b"\xff" * 2000
    data = strip * 990
    began = time.process_time()
    with pytest.raises(CorruptImage, match="runs into the next"):
        probed(tmp_path, "fill.tif", _jpeg_tiff(64, 64, data, [(273, 4, [i * len(strip) for i in range(990)])]))
    assert time.process_time() - began < 1


def test_a_jpeg_tiffs_compression_is_read_as_libtiff_reads_it(tmp_path):
    """A second re-attack: Compression 7 typed SBYTE, or a SLONG8 7 before a SHORT 5, was not JPEG to the walk
    (Pillow skips or reads them otherwise) while libtiff took the first copy, whatever its type, and decoded the
    progressive tiles: 20 s of CPU a job for 1 MB, and 415 MB for a strip priced 81."""
    progressive = _jpeg(True)
    for compression in ([(6, 7)], [(17, 7), (3, 5)], [(1, 7)], [(16, 7)]):
        with pytest.raises(UnsupportedFormat, match="progressive"):
            probed(tmp_path, "typed.tif", _jpeg_tiff(64, 32, progressive, [(324, 4, [0] * 4)], compression))


def test_a_jpeg_tiffs_strips_may_have_a_writers_few_segments_each(tmp_path):
    """A second re-attack: 21,024 strips of 990 restart markers each before the scan, under the 1,000 a strip, a
    Python turn a marker: 8.7 s of CPU a walk, in the probe and in every render. The segments walked are 16 a
    strip in all; a writer's have under 10."""
    import time

    baseline = _jpeg(False)
    scan = baseline.index(b"\xff\xda")
    padded = baseline[:scan] + b"\xff\xd0" * 990 + baseline[scan:]
    starts = [i * len(padded) for i in range(64)]
    began = time.process_time()
    with pytest.raises(DecompressionBomb, match="segments"):
        probed(tmp_path, "markers.tif", _jpeg_tiff(64, 1, padded * 64, [(273, 4, starts)]))
    assert time.process_time() - began < 1
    assert probed(tmp_path, "plain.tif", _jpeg_tiff(64, 1, baseline * 64,
                                                    [(273, 4, [i * len(baseline) for i in range(64)])])).width == 64


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def test_a_jpeg_of_countless_quantization_tables_is_a_bomb(tmp_path):
    """Pillow reads each quantization table in Python: 49.8 MB of 760 DQT segments of 1,008 tables each took 3 s of
    CPU an open, 28-35 s a job of pipeline v2, ``ready`` (an adversarial run)."""
    jpeg = encoded("JPEG")
    tables = b"".join(bytes([i % 4]) + bytes([1]) * 64 for i in range(1008))  # 8-bit tables, 65 bytes each
    with pytest.raises(DecompressionBomb, match="quantization"):
        probed(tmp_path, "dqt.jpg", jpeg[:2] + _segment(0xDB, tables) + jpeg[2:])
    own = sum(struct.unpack(">H", jpeg[at + 2:at + 4])[0] - 2 for at in range(len(jpeg)) if jpeg[at:at + 2] == b"\xff\xdb")
    room = (segments.MAX_QUANTIZATION_BYTES - own) // 129  # 16-bit tables up to the bound, with its own
    sixteen_bit = b"".join(bytes([0x10 | i % 4]) + b"\x00\x01" * 64 for i in range(room))
    assert probed(tmp_path, "ok.jpg", jpeg[:2] + _segment(0xDB, sixteen_bit) + jpeg[2:]).width == 64


def test_a_jpeg_of_countless_photoshop_resources_is_a_bomb(tmp_path):
    """Pillow walks a Photoshop segment's image resource blocks in Python, keeping each: 4.1 million empty ones
    took 2.8 s of CPU an open, 24 s a job (an adversarial run). They are counted as Pillow walks them."""
    jpeg = encoded("JPEG")
    empty = b"8BIM" + b"\x04\x04" + b"\x00\x00" + b"\x00\x00\x00\x00"  # a code, an empty name (padded), no data
    named = b"8BIM" + b"\x04\x04" + b"\x01a" + b"\x00\x00\x00\x03xyz\x00"  # a name of 1, data of 3 (padded)
    def photoshop(blocks: list[bytes]) -> bytes:  # in segments of at most 2,048 blocks
        return jpeg[:2] + b"".join(_segment(0xED, segments.PHOTOSHOP + b"".join(blocks[at:at + 2048]))
                                   for at in range(0, len(blocks), 2048)) + jpeg[2:]
    with pytest.raises(DecompressionBomb, match="Photoshop"):
        probed(tmp_path, "many.jpg", photoshop([empty] * (segments.MAX_PHOTOSHOP_RESOURCES + 1)))
    with pytest.raises(DecompressionBomb, match="Photoshop"):
        probed(tmp_path, "named.jpg", photoshop([named] * (segments.MAX_PHOTOSHOP_RESOURCES + 1)))
    with Image.open(io.BytesIO(photoshop([named, empty]))) as image:  # walked as Pillow walks them
        assert image.info["photoshop"] == {0x0404: b""}
    assert probed(tmp_path, "some.jpg", photoshop([empty, named] * (segments.MAX_PHOTOSHOP_RESOURCES // 2))).width == 64


def test_the_provenance_read_of_the_metadata_waits_for_its_share_of_the_budget(tmp_path):
    """Each variant's provenance reads the source's header again after its render gave its reservation back: four
    renders of 64x64 images carrying tens of MB of metadata held their copies there at once, unreserved (an
    adversarial run). It reserves what Pillow keeps of them first, as a render does."""
    import threading

    from app.adapters.imaging import budget
    from app.adapters.imaging.provenance import stripped_metadata

    jpeg = encoded("JPEG")
    path = tmp_path / "comments.jpg"
    path.write_bytes(jpeg[:2] + _segment(0xFE, b"c" * 60_000) * 100 + jpeg[2:])  # 6 MB of comments
    capacity = 32 * 2**20  # four copies fit; the rest of the budget is held by a render
    found = []
    with budget.RESERVATIONS.scope(capacity) as render:
        render(capacity - 2**20)
        reader = threading.Thread(target=lambda: found.append(stripped_metadata(path, capacity)))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not found, "it waits while the budget is held"
    reader.join(10)
    assert found and found[0]["comment"] is True


def test_the_probe_waits_for_its_share_of_the_budget_before_it_opens_the_file(tmp_path):
    """The web's probe of an upload and the inspect step's opened it unreserved: a 50 MB upload that is mostly
    metadata cost the web three to four times that while it was probed, 951 MB for 8 at once (an adversarial run).
    What the open copies is reserved from the process's budget first, as a render reserves its price."""
    jpeg = encoded("JPEG")
    path = tmp_path / "comments.jpg"
    path.write_bytes(jpeg[:2] + _segment(0xFE, b"c" * 60_000) * 100 + jpeg[2:])  # 6 MB of comments
    limits = Limits(max_decode_bytes=64 * 2**20)  # four copies fit; the rest of the budget is held by a render
    assert _probed_once_the_budget_is_free(path, limits).width == 64


@pytest.mark.parametrize("mode", ["L", "RGB", "P"])
def test_a_png_whose_transparency_comes_after_its_pixels_is_refused(tmp_path, mode):
    """Pillow reads the chunks after a PNG's image data when it loads it, after the price was made from the header:
    a grey 8000x8000 PNG whose tRNS came after its pixels was priced 132 MB as L, then converted through LA to RGBA
    (1.1-1.2 GB a job in a worker, ``ready``: an adversarial run). The specification puts tRNS before the data."""
    buf = io.BytesIO()
    colour = (7, 7, 7) if mode == "RGB" else 7
    Image.new(mode, (64, 64), colour).save(buf, "PNG", transparency=colour)
    data = buf.getvalue()
    start = data.index(b"tRNS") - 4
    end = start + 12 + struct.unpack(">I", data[start:start + 4])[0]
    assert data.index(b"IDAT") > start  # Pillow wrote it where it belongs: accepted
    assert probed(tmp_path, "before.png", data).width == 64
    late = data[:start] + data[end:-12] + data[start:end] + data[-12:]  # moved to just before IEND
    with Image.open(io.BytesIO(late)) as img:
        assert "transparency" not in img.info  # what the header says, and what was priced
        img.load()
        assert "transparency" in img.info  # what the render would have converted
    with pytest.raises(CorruptImage, match="tRNS chunk comes after its image data"):
        probed(tmp_path, "late.png", late)


def test_a_jpeg_whose_scans_send_again_what_was_sent_is_corrupt(tmp_path, data_file):
    """libjpeg decodes, with a warning at most, scans that send again what earlier scans sent: a 20 MP progressive
    photo whose ten scans were sent nine times (90 scans, within the scan bounds) took 3.8-7.4 s of CPU a render
    where it took 0.6-1.0, twice over, as libvips gave up on its corrupt data and Pillow decoded it all again (an
    adversarial run). A progression follows ITU T.81; a sequential JPEG sends each component once."""
    photo = Image.open(io.BytesIO(encoded("JPEG"))).resize((256, 256))

    def scans_twice(**params) -> bytes:
        buf = io.BytesIO()
        photo.save(buf, "JPEG", **params)
        data = buf.getvalue()
        first = data.index(b"\xff\xda")
        return data[:-2] + data[first:-2] + data[-2:]

    for params in ({"progressive": True}, {"progressive": True, "subsampling": 0}, {"progressive": True,
                                                                                   "quality": 95}):
        once = io.BytesIO()
        photo.save(once, "JPEG", **params)
        assert probed(tmp_path, "once.jpg", once.getvalue()).width == 256  # the encoder's own progression
        with pytest.raises(CorruptImage, match="does not follow its progression"):
            probed(tmp_path, "twice.jpg", scans_twice(**params))
    repeated = data_file("hostile/jpeg_arith_4096_1000_scans.jpg").read_bytes()  # sequential, a scan a component
    fourth, fifth = [i for i in range(len(repeated) - 1) if repeated[i:i + 2] == b"\xff\xda"][3:5]
    assert probed(tmp_path, "sequential.jpg", repeated[:fourth] + b"\xff\xd9").width == 4096
    with pytest.raises(CorruptImage, match="sends a component an earlier scan sent"):
        probed(tmp_path, "again.jpg", repeated[:fifth] + b"\xff\xd9")


def test_a_png_whose_pixels_begin_with_an_animation_frame_and_transparency_follows_is_refused(tmp_path):
    """Pillow begins a PNG's image data at an APNG frame's ``fdAT`` too (after an ``fcTL``, with no ``acTL`` or
    ``IDAT``), and reads a ``tRNS`` after it at load: an 8000x8000 grey one priced 132 MB took 1.26-1.29 GB of
    a worker, ``ready`` (a re-attack of the check that looked for ``IDAT`` only)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress((b"\x00" + b"\x07" * 64) * 64)
    head = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 0, 0, 0, 0))
    frame = chunk(b"fcTL", struct.pack(">IIIIIHHBB", 0, 64, 64, 0, 0, 1, 1, 0, 0))
    frame += chunk(b"fdAT", struct.pack(">I", 1) + rows)
    late = head + frame + chunk(b"tRNS", b"\x00\x07") + chunk(b"IEND", b"")
    with Image.open(io.BytesIO(late)) as img:
        assert "transparency" not in img.info
        img.load()
        assert "transparency" in img.info  # read at load: what the render converts
    with pytest.raises(CorruptImage, match="tRNS chunk comes after its image data"):
        probed(tmp_path, "late.png", late)
    assert probed(tmp_path, "early.png", head + chunk(b"tRNS", b"\x00\x07") + frame + chunk(b"IEND", b"")).width == 64


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_a_heifs_exif_and_xmp_items_are_reserved_before_the_open(tmp_path, fmt):
    """pillow-heif copies a HEIF's or AVIF's Exif and XMP when it opens the file, before any price: a 40 MB Exif
    item took 241 MB a probe with nothing reserved, eight such uploads at once 1.5 GB of the web (a re-attack of
    the probe's reservation, which counted their colour profiles only). Their items are read from the container."""
    import pillow_heif

    from app.adapters.imaging import bmff

    pillow_heif.register_heif_opener()
    exif = Image.Exif()
    exif[0x010E] = "x" * (6 * 2**20)  # ImageDescription
    path = tmp_path / f"exif.{fmt.lower()}"
    Image.new("RGB", (64, 64), (9, 9, 9)).save(path, fmt, exif=exif.tobytes(), xmp=b"<x:xmpmeta/>" * 1000,
                                              quality=50)
    with open(path, "rb") as fp:
        items = bmff.read_layout(fp).metadata_bytes
    assert 6 * 2**20 < items < 6 * 2**20 + 20_000
    limits = Limits(max_decode_bytes=64 * 2**20)  # the items' copies fit; the rest of the budget is held
    assert _probed_once_the_budget_is_free(path, limits).width == 64


def _probed_once_the_budget_is_free(path, limits: Limits):
    """The probe of ``path``, which waits while a render holds all but 1 MiB of the budget and goes on once it
    gives it back."""
    import threading

    from app.adapters.imaging import budget

    found = []
    with budget.RESERVATIONS.scope(limits.max_decode_bytes) as render:
        render(limits.max_decode_bytes - 2**20)
        prober = threading.Thread(target=lambda: found.append(probe(path, limits)))
        prober.start()
        prober.join(0.5)
        assert prober.is_alive() and not found, "it waits while the budget is held"
    prober.join(10)
    assert found and budget.RESERVATIONS.in_use == 0
    return found[0]


@pytest.mark.parametrize(("kind", "extents", "references"), [(b"uri ", 1, 1), (b"abcd", 8, 1), (b"Exif", 1, 8)])
def test_every_metadata_item_a_heif_describes_its_image_with_is_reserved_as_often_as_it_is_copied(
        tmp_path, kind, extents, references):
    """libheif reads every item a ``cdsc`` reference names, whatever its type, joins its extents (which may list the
    same bytes again) and attaches it once a reference; pillow-heif copies each into the image's info. A 40 MB
    ``uri `` item took 160 MB a probe and a render priced 88; a 4 MB file whose item listed its bytes 32 times 388
    MB; a 10 MB Exif item named 32 times 370 MB, priced 68 (a re-attack of the reservation of Exif and XMP)."""
    from app.adapters.imaging import bmff, budget

    path = tmp_path / "described.heic"
    path.write_bytes(hostile_images.heif_metadata_item(kind, 2**20, extents=extents, references=references))
    with open(path, "rb") as fp:
        assert bmff.read_layout(fp).metadata_bytes >= extents * references * 2**20
    reserved = budget.HEIF_METADATA_COPIES * extents * references * 2**20
    # the probe waits for its share (one more MiB of the budget than the rest holds would not do)
    assert _probed_once_the_budget_is_free(path, Limits(max_decode_bytes=reserved + 2**20 + 8 * 2**20)).width == 64
    with pytest.raises(ImageTooLarge, match="metadata"):
        probe(path, Limits(max_decode_bytes=reserved - 2**20))


@pytest.mark.parametrize("hidden", ["tiles", "rows"])
def test_a_tiffs_layout_is_read_alike_by_pillow_and_libtiff_or_refused(tmp_path, hidden):
    """Pillow skips a tag typed SLONG8 or IFD8 and keeps its next copy, libtiff keeps the first copy of any integer
    type, and the budget prices what Pillow read: TileWidth and TileLength typed SLONG8 made a 64x64 deflate image
    of 16384x16384 tiles to libtiff (1 GiB a render, priced 8 MB, ``ready``), and a SLONG8 RowsPerStrip of the
    whole height before a LONG 1 one strip of the whole image (517 MB a worker; an adversarial run)."""
    side, tile = 64, 256
    head = [(256, 4, [side]), (257, 4, [side]), (258, 3, [8]), (259, 3, [8]), (262, 3, [1]), (277, 3, [1])]
    if hidden == "tiles":
        def laid(kind):
            return hostile_images.deflate_tiff(head + [(284, 3, [1]), (322, kind, [tile]), (323, kind, [tile]),
                                               (324, kind, [0]), (325, kind, [0])], b"\x40" * tile * tile)
    else:
        def laid(kind):
            rows = [(278, kind, [side]), (278, 4, [1])] if kind != 4 else [(278, 4, [side])]
            return hostile_images.deflate_tiff(head + [(273, 4, [0])] + rows + [(279, 4, [0]), (284, 3, [1])],
                                 b"\x40" * side * side)
    assert probed(tmp_path, "honest.tif", laid(4)).width == side  # the same layout in LONGs is read alike
    for kind in (17, 18):
        with pytest.raises(CorruptImage, match="layout"):
            probed(tmp_path, f"type{kind}.tif", laid(kind))
