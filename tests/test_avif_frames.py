"""The AV1 frames an AVIF decodes to are found wherever libavif finds them, whatever the file says of its size.

libavif decodes the frame the AV1 sequence header allows, not the one ``ispe``
or a track header names (``app/adapters/imaging/bmff.py``). An adversarial run
found the ways round a walk that read the first sequence header at the start
of each item: an image sequence (``avis``) whose frames live in a track and
not in items (a 4 KB file, 921 MB a decode); a small sequence header before
the real one (the decoder takes the last); an item whose first extent is short,
read on past it into a decoy; ``av1C`` saying monochrome over a colour stream.
The files here are those shapes, made from Pillow's own AVIFs.
"""

from __future__ import annotations

import io
import struct
import time

import pytest
from PIL import Image

from app.adapters.imaging import Limits, bmff, probe
from app.adapters.imaging.probe import open_checked
from app.errors import CorruptImage, DecompressionBomb, ImageTooLarge

SMALL = Limits(max_pixels=1_000_000)  # the frames here are 2048x2048: 4.2 MP


def avif(side: int, *, frames: int = 1) -> bytes:
    images = [Image.new("RGB", (side, side), (40 * k, 120, 200)) for k in range(frames)]
    out = io.BytesIO()
    images[0].save(out, "AVIF", save_all=frames > 1, append_images=images[1:], quality=10, speed=10, max_threads=1)
    return out.getvalue()


def boxes(data: bytes, start: int = 0, end: int | None = None) -> dict[bytes, tuple[int, int]]:
    """The first box of each type in ``[start, end)``: (offset, size)."""
    found, offset, end = {}, start, len(data) if end is None else end
    while offset + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, offset)
        found.setdefault(kind, (offset, size))
        offset += size
    return found


def item_data(data: bytes) -> bytes:
    """The only item's data in a still AVIF of Pillow's (an ``iloc`` of version 0, 4-byte offsets and lengths)."""
    at = data.index(b"iloc") + 4
    assert data[at:at + 6] == bytes([0, 0, 0, 0, 0x44, 0x00]) and struct.unpack_from(">H", data, at + 6)[0] == 1
    offset, length = struct.unpack_from(">II", data, at + 14)
    return data[offset:offset + length]


def with_item(data: bytes, extents: list[bytes], between: bytes = b"", *, side: int = 64) -> bytes:
    """``data`` (a still AVIF of Pillow's) whose item is ``extents`` (with ``between`` after each in the file, not
    part of the item) in an ``mdat`` at the end, and whose ``ispe`` says ``side`` x ``side``."""
    meta_at, meta_size = boxes(data)[b"meta"]
    meta = bytearray(data[meta_at:meta_at + meta_size])
    ispe = meta.index(b"ispe") + 8
    struct.pack_into(">II", meta, ispe, side, side)
    iloc_at = meta.index(b"iloc") - 4
    iloc_size = struct.unpack_from(">I", meta, iloc_at)[0]
    iloc_len = 8 + 4 + 2 + 2 + 6 + 8 * len(extents)
    head_len = meta_at + meta_size - iloc_size + iloc_len
    tail = data[meta_at + meta_size:]
    placed, payload, offset = [], b"", head_len + len(tail) + 8
    for extent in extents:
        placed.append((offset + len(payload), len(extent)))
        payload += extent + between
    iloc = (struct.pack(">I4s", iloc_len, b"iloc") + bytes([0, 0, 0, 0, 0x44, 0x00])
            + struct.pack(">HHHH", 1, 1, 0, len(extents)) + b"".join(struct.pack(">II", *extent) for extent in placed))
    meta = meta[:iloc_at] + iloc + meta[iloc_at + iloc_size:]
    struct.pack_into(">I", meta, 0, len(meta))
    out = data[:meta_at] + bytes(meta) + tail + struct.pack(">I4s", 8 + len(payload), b"mdat") + payload
    assert len(data[:meta_at] + bytes(meta)) == head_len
    return out


def obus(data: bytes) -> list[bytes]:
    """The OBUs of an item's data, each whole (every one of Pillow's has its size)."""
    found, pos = [], 0
    while pos < len(data):
        used, size, shift = 1, 0, 0
        while True:
            byte = data[pos + used]
            size |= (byte & 0x7F) << shift
            used, shift = used + 1, shift + 7
            if not byte & 0x80:
                break
        found.append(data[pos:pos + used + size])
        pos += used + size
    return found


@pytest.fixture(scope="module")
def large() -> bytes:
    return avif(2048)


@pytest.fixture(scope="module")
def small_header() -> bytes:
    """The sequence header OBU of a 64x64 AVIF."""
    return next(obu for obu in obus(item_data(avif(64))) if (obu[0] >> 3) & 0x0F == 1)


def decodes(tmp_path, name: str, data: bytes) -> tuple[int, int]:
    """What Pillow (libavif) makes of ``data``: it is a file libavif decodes."""
    path = tmp_path / name
    path.write_bytes(data)
    with Image.open(path) as image:
        image.load()
        return image.size


def test_an_image_sequence_is_priced_by_its_first_sample_s_frame(tmp_path):
    """A sequence with no items at all, whose track header and sample entry say 64x64 over 2048x2048 frames: Pillow
    says 64x64 and libavif decodes the frames (an 8000x8000 one took 130 MB from a 2.5 KB file)."""
    data = bytearray(avif(2048, frames=2))
    meta_at = boxes(data)[b"meta"][0]
    data[meta_at + 4:meta_at + 8] = b"free"  # no items: the track alone
    data[16:24] = b"avisavis"  # nor the brands that call for them
    tkhd = data.index(b"tkhd") + 4
    struct.pack_into(">II", data, tkhd + (88 if data[tkhd] == 1 else 76), 64 << 16, 64 << 16)
    entry = data.index(b"av01", data.index(b"stsd")) + 4
    struct.pack_into(">HH", data, entry + 24, 64, 64)
    assert decodes(tmp_path, "sequence.avif", bytes(data)) == (64, 64)
    layout = bmff.read_layout(io.BytesIO(bytes(data)))
    assert layout.coded == (2048, 2048) and (64, 64) in layout.sizes
    with pytest.raises(DecompressionBomb):
        probe(tmp_path / "sequence.avif", SMALL)


def test_every_sequence_header_of_an_item_counts_not_the_first(tmp_path, large, small_header):
    data = item_data(large)
    assert data[:2] == b"\x12\x00", "Pillow's items start with a temporal delimiter"
    decoy = with_item(large, [data[:2] + small_header + data[2:]])
    assert decodes(tmp_path, "decoy.avif", decoy) == (64, 64)
    assert bmff.read_layout(io.BytesIO(decoy)).coded == (2048, 2048)
    with pytest.raises(DecompressionBomb):
        probe(tmp_path / "decoy.avif", SMALL)


def test_an_item_is_read_across_its_extents_not_past_its_first(tmp_path, large, small_header):
    """The first extent is the temporal delimiter alone; a decoy sequence header follows it in the file, outside the
    item; the real one starts the second extent."""
    data = item_data(large)
    split = with_item(large, [data[:2], data[2:]], between=small_header)
    assert decodes(tmp_path, "split.avif", split) == (64, 64)
    assert bmff.read_layout(io.BytesIO(split)).coded == (2048, 2048)
    assert bmff.read_layout(io.BytesIO(with_item(large, [data[:2], data[2:]]))).coded == (2048, 2048)


def test_the_decoded_picture_is_priced_by_the_stream_not_by_av1c(large):
    """``av1C`` said monochrome (1 byte a pixel) over a 4:2:0 stream (1.5): the decoder allocates by the stream."""
    data = bytearray(large)
    config = data.index(b"av1C") + 4
    assert bmff.read_layout(io.BytesIO(bytes(data))).picture_bytes == 1.5
    data[config + 2] |= 0x10
    assert bmff.picture_bytes(b"av1C", bytes(data[config:config + 3])) == 1.0
    assert bmff.read_layout(io.BytesIO(bytes(data))).picture_bytes == 1.5


def test_countless_obus_are_a_bomb_and_countless_item_tables_are_read_quickly(large):
    data = item_data(large)
    padding = b"\x7a\x00"  # OBU_PADDING, size 0
    with pytest.raises(DecompressionBomb, match="OBUs"):
        bmff.read_layout(io.BytesIO(with_item(large, [data[:2] + padding * bmff.MAX_OBUS + data[2:]])))
    assert bmff.read_layout(io.BytesIO(with_item(large, [data[:2] + padding * 100 + data[2:]]))).coded == (2048, 2048)
    # 4,095 iloc boxes of 65,535 extents whose fields are 0 bytes wide took 169 s (an adversarial review)
    iloc = bytes([0, 0, 0, 0, 0x00, 0x00]) + struct.pack(">HHHH", 1, 1, 0, 0xFFFF)
    many = large[:boxes(large)[b"meta"][0]] + (struct.pack(">I4s", 8 + len(iloc), b"iloc") + iloc) * 4095
    started = time.monotonic()
    bmff.read_layout(io.BytesIO(many))
    assert time.monotonic() - started < 2


def with_items(data: bytes, count: int) -> bytes:
    """``data`` (a still AVIF of Pillow's) with ``count`` AV1 items, each the first one's data and properties, the
    first derived from the others (``dimg``): as a grid's tiles are, for the walk."""
    meta_at, meta_size = boxes(data)[b"meta"]
    meta = data[meta_at:meta_at + meta_size]

    def box(kind: bytes) -> tuple[int, bytes]:
        at = meta.index(kind) - 4
        return at, meta[at:at + struct.unpack_from(">I", meta, at)[0]]

    iinf_at, iinf = box(b"iinf")
    infe = iinf[14:]  # version 0: a 2-byte count, then the one infe
    assert struct.unpack_from(">H", iinf, 12)[0] == 1 and infe[4:8] == b"infe" and infe[8] == 2
    iinf_new = iinf[8:12] + struct.pack(">H", count) + infe + b"".join(
        infe[:12] + struct.pack(">H", k) + infe[14:] for k in range(2, count + 1))
    ipma_at, ipma = box(b"ipma")
    assert ipma[8:16] == bytes(4) + struct.pack(">I", 1)  # version 0, flags 0: one entry, 2-byte item IDs
    ipma_new = ipma[8:12] + struct.pack(">I", count) + b"".join(
        struct.pack(">H", k) + ipma[18:] for k in range(1, count + 1))
    iloc_at, iloc = box(b"iloc")
    assert iloc[8:14] == bytes([0, 0, 0, 0, 0x44, 0x00])
    entry = iloc[16:]
    dimg = struct.pack(">I4sHH", 8 + 4 + 2 * (count - 1), b"dimg", 1, count - 1) + b"".join(
        struct.pack(">H", k) for k in range(2, count + 1))
    iref = struct.pack(">I4s", 12 + len(dimg), b"iref") + bytes(4) + dimg
    grown = (len(iinf_new) - len(iinf) + 8) + (len(ipma_new) - len(ipma) + 8) + (count - 1) * len(entry) + len(iref)
    offset = struct.unpack_from(">I", entry, 6)[0] + grown
    iloc_new = iloc[8:14] + struct.pack(">H", count) + b"".join(
        struct.pack(">HHH", k, 0, 1) + struct.pack(">I", offset) + entry[10:] for k in range(1, count + 1))
    out = bytearray(meta)
    for at, old, kind, payload in sorted([(iinf_at, iinf, b"iinf", iinf_new), (ipma_at, ipma, b"ipma", ipma_new),
                                          (iloc_at, iloc, b"iloc", iloc_new)], reverse=True):
        out[at:at + len(old)] = struct.pack(">I4s", 8 + len(payload), kind) + payload
    out += iref  # at the end of meta
    iprp = out.index(b"iprp") - 4
    struct.pack_into(">I", out, iprp, struct.unpack_from(">I", out, iprp)[0] + len(ipma_new) + 8 - len(ipma))
    struct.pack_into(">I", out, 0, len(out))
    assert len(out) - meta_size == grown
    return data[:meta_at] + bytes(out) + data[meta_at + meta_size:]


def test_every_av1_item_s_frame_is_priced_as_a_grid_s_tiles_are_held(large):
    """libavif decodes each of a grid's tiles with a decoder of its own and holds them together: a one-row grid of
    tall tiles under a small ``ispe`` was priced as one tile (an adversarial run). Items the primary image is not
    made of (a thumbnail, a depth map) are not decoded, and not priced."""
    one = bmff.read_layout(io.BytesIO(large))
    assert one.coded_pixels == 2048 * 2048
    four = with_items(large, 4)
    unreferenced = four.replace(b"dimg", b"thmb")
    assert bmff.read_layout(io.BytesIO(unreferenced)).coded_pixels == 2048 * 2048
    # (libavif would refuse these items as a grid: it takes a grid item's tiles; the walk follows dimg from the
    # primary whatever its type, as the real grids of tests/data/hostile/heic_grid1_t8000.heic show for libheif)
    layout = bmff.read_layout(io.BytesIO(four))
    assert layout.coded == (2048, 2048) and layout.coded_pixels == 4 * 2048 * 2048


HOSTILE = {  # tests/data/hostile: an 8000x8000 frame under a 64x64 ispe and track, and a decoy 64x64 one
    "avif_idat_decoy.avif": "the item in meta's idat, a decoy idat at the top level after meta (libavif never reads)",
    "avif_two-stco.avif": "two stco in the sample table: libavif's first chunk is the first box's",
    "avif_co64-stco.avif": "a co64, then a decoy stco",
    "avif_entry.avif": "a decoy stco inside the av01 sample entry (an unknown property to libavif)",
    "avif_stsz.avif": "a second stsz of a 2-byte sample (libavif keeps the first's constant size)",
    "avif_forbidden_bit.avif": "a first OBU that sets the forbidden bit (dav1d decodes on past it)",
    "avif_control.avif": "the same sequence without a decoy",
    "avif_track_meta_idat.avif": "a decoy idat in a track's own meta, before the file's meta (a review)",
    "avif_stbl_in_entry.avif": "an empty stbl inside the av01 sample entry (a fifth run): libavif reads the minf's",
}

HEIC = {  # tests/data/hostile: an 8000x8000 HEVC picture (a fifth adversarial run), 341-361 MB a render before
    "heic_clap8000_to1.heic": "cropped (clap) to 1x1",
    "heic_grid1_t8000.heic": "a 1x1 grid of one 8000x8000 tile",
    "heic_ovl5_t8000.heic": "a 64x64 overlay (iovl) of five 8000x8000 items",
    "heic_alpha8000.heic": "a 64x64 image with an 8000x8000 alpha item",
    "heic_grid_decoy_type.heic": "the 1x1 grid, its tile's item declared again as mime after (a sixth run)",
}


@pytest.mark.parametrize("name", sorted(HEIC))
def test_a_heic_is_priced_by_every_picture_libheif_decodes_not_by_what_it_makes(name, data_file):
    """libheif decodes each coded picture at its own size (its ispe), whatever image the crop, grid, overlay or
    alpha makes of it; pillow-heif reports that image's size, which the budget priced (8-11 MB)."""
    path = data_file(f"hostile/{name}")
    with open(path, "rb") as fp:
        assert bmff.read_layout(fp).item_pixels >= 8000 * 8000, HEIC[name]
    try:
        with open_checked(path, Limits()) as opened:
            assert opened.priced.total >= 8000 * 8000 * 4, f"{opened.priced.total:,} bytes priced"
    except ImageTooLarge:
        pass
    with open_checked(data_file("phones/card_p3_orientation6.heic"), Limits()) as opened:
        assert opened.priced.total < 20 * 2**20, "a photo's grid tiles are priced as the picture they make"


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_decoys_where_libavif_does_not_read_are_not_read(name, data_file):
    """An adversarial run's files (its fourth): each made the walk read a 64x64 decoy where libavif decodes an
    8000x8000 frame (133 MB an open, priced 8-11.5 MB)."""
    path = data_file(f"hostile/{name}")
    with open(path, "rb") as fp:
        assert bmff.read_layout(fp).coded == (8000, 8000), HOSTILE[name]
    with pytest.raises(DecompressionBomb):
        probe(path, SMALL)


def test_where_the_walk_would_stop_short_the_file_is_a_bomb(large):
    """A walk that stopped at its limits left libavif reading on: 4,096 empty boxes before meta hid every size (a
    12000x12000 frame rendered in 298 MB, priced 8-11 MB); 1,000 items of 65,535 extents of fields 0 bytes wide
    (10.7 KB) took libavif 1 GB, 100,000 items 11 s of CPU (an adversarial run)."""
    ftyp_end = boxes(large)[b"ftyp"][1]
    with pytest.raises(DecompressionBomb, match="boxes"):
        bmff.read_layout(io.BytesIO(large[:ftyp_end] + b"\x00\x00\x00\x08free" * bmff.MAX_BOXES + large[ftyp_end:]))
    assert bmff.read_layout(io.BytesIO(large + b"\x00\x00\x00\x08free" * 100)).coded == (2048, 2048)
    meta_at, meta_size = boxes(large)[b"meta"]
    for items, extents in ((1000, 0xFFFF), (bmff.MAX_BOXES + 1, 0)):
        iloc = bytes([2, 0, 0, 0, 0x00, 0x00]) + struct.pack(">I", items) + b"".join(
            struct.pack(">IHHH", k + 1, 0, 0, extents) for k in range(items))
        meta = large[meta_at:meta_at + 12] + struct.pack(">I4s", 8 + len(iloc), b"iloc") + iloc
        meta = struct.pack(">I", len(meta)) + meta[4:]
        with pytest.raises(DecompressionBomb):
            bmff.read_layout(io.BytesIO(large[:meta_at] + meta + large[meta_at + meta_size:]))


def test_an_image_sequence_of_countless_samples_is_a_bomb():
    """One sample size in stsz serves any count of samples, and libavif keeps 56 bytes for each: 2,569,017 took
    577 MB of the web's probe from a 1.3 MB file (an adversarial run)."""
    data = bytearray(avif(64, frames=2))
    stsz = data.index(b"stsz") + 4
    assert struct.unpack_from(">II", data, stsz + 4) == (0, 2)
    assert bmff.read_layout(io.BytesIO(bytes(data))).coded == (64, 64)
    struct.pack_into(">II", data, stsz + 4, 100, bmff.MAX_SAMPLES + 1)
    with pytest.raises(DecompressionBomb, match="samples"):
        bmff.read_layout(io.BytesIO(bytes(data)))


def test_an_alpha_item_and_an_image_sequence_are_priced_once(tmp_path):
    """Summing every AV1 item priced an alpha item as a second colour frame, and a sequence's items and tracks both,
    though libavif decodes one or the other: a 4000x3000 RGBA AVIF went from 210 to 301 MiB, over the limit (a
    review). An alpha item's frame is grey: its own sequence header says so."""
    rgba = io.BytesIO()
    Image.new("RGBA", (256, 256), (10, 20, 30, 128)).save(rgba, "AVIF", quality=30, speed=10, max_threads=1)
    layout = bmff.read_layout(io.BytesIO(rgba.getvalue()))
    assert layout.coded_pixels == 2 * 256 * 256, "the colour item and the alpha item"
    assert layout.coded_bytes == 256 * 256 * (1.5 + 1.0), "4:2:0 colour, grey alpha"
    sequence = bmff.read_layout(io.BytesIO(avif(256, frames=3)))
    assert sequence.coded_pixels == 256 * 256 and sequence.coded_bytes == 256 * 256 * 1.5, \
        "its items or its track, not both"


def test_countless_sequence_headers_and_boxes_nested_deep_are_refused_quickly(large):
    """A review: 16,000 distinct sequence headers of 32 operating points each took 6 s a read (the walk parses
    each in Python); 2,000 nested moov boxes raised a RecursionError out of the probe."""
    data = item_data(large)
    header = next(obu for obu in obus(data) if (obu[0] >> 3) & 0x0F == 1)
    assert header[1] < 0x7F, "a one-byte size"
    # each header made distinct by a byte after its fields (a decoder reads no further)
    many = [header[:1] + bytes([header[1] + 2]) + header[2:] + struct.pack(">H", k)
            for k in range(bmff.MAX_SEQUENCE_HEADERS + 1)]
    started = time.monotonic()
    with pytest.raises(DecompressionBomb, match="sequence headers"):
        bmff.read_layout(io.BytesIO(with_item(large, [data[:2] + b"".join(many) + data[2:]])))
    assert time.monotonic() - started < 2
    shared = bmff.read_layout(io.BytesIO(with_item(large, [data[:2] + header * 300 + data[2:]])))
    assert shared.coded == (2048, 2048), "the same header many times is read once"
    nested = b"ftypavif"
    for _ in range(2000):
        nested = struct.pack(">I4s", 8 + len(nested), b"moov") + nested
    with pytest.raises(CorruptImage, match="nested"):
        bmff.read_layout(io.BytesIO(large[:boxes(large)[b"meta"][0]] + nested))


def test_an_item_of_many_frames_is_a_bomb(large):
    """The decoder decodes every frame of an item until one is shown: 1,000 hidden key frames in one item took 21 s
    of CPU an open (a fifth adversarial run). A photo's item has one frame."""
    data = item_data(large)
    frames = [obu for obu in obus(data) if (obu[0] >> 3) & 0x0F in (3, 6)]
    assert len(frames) == 1
    rest = data[:data.index(frames[0])]
    with pytest.raises(DecompressionBomb, match="frames"):
        bmff.read_layout(io.BytesIO(with_item(large, [rest + frames[0] * (bmff.MAX_FRAMES + 1)])))
    assert bmff.read_layout(io.BytesIO(with_item(large, [rest + frames[0] * 2]))).coded == (2048, 2048)


def test_a_second_meta_is_corrupt(data_file):
    """libheif reads a file's last meta, libavif its first: a decoy meta of 1x1 ispe before the real one lent them
    to the real items' indices, and an 8000x8000 picture was priced 11 MB (a sixth adversarial run)."""
    with pytest.raises(CorruptImage, match="meta"):
        probe(data_file("hostile/heic_meta_decoy_first.heic"), Limits())


@pytest.mark.parametrize("name", ["heic_ovl_canvas8000_two_ispe.heic", "heic_ovl_canvas8000_ispe_last.heic"])
def test_an_overlay_canvas_is_every_one_of_its_ispe(name, data_file):
    """libheif allocates an overlay's canvas at the size in its data and takes the last of its ``ispe``: an
    8000x8000 canvas with an ``ispe`` of its size and then one of 64x64 was priced as 64x64 and decoded whole,
    ``ready``, 841-945 MB in a worker (a re-attack). A canvas must be the size of every ``ispe`` it has."""
    with pytest.raises(CorruptImage, match="canvas"):
        probe(data_file(f"hostile/{name}"), Limits())


@pytest.mark.parametrize("name", ["heic_grid8000_clap64_deep.heic", "heic_iden_grid8000.heic",
                                  "heic_grid8000_nested.heic", "heic_grid8000_iloc_twice.heic"])
def test_a_canvas_made_small_by_what_is_derived_from_it_is_priced_at_its_size(name, data_file):
    """libheif allocates every grid's canvas the primary image is made from, at its picture's bytes per pixel,
    though a crop, an ``iden`` or an outer grid makes a small image of it: a 996-byte 8000x8000 grid of one 10-bit
    4:4:4 tile referenced 64 times, cropped to 64x64, took 387 MB a render priced 17 MB, and nested under a 1x1
    grid 734 MB, ``ready`` (an adversarial run). Each canvas on the way is priced, at its largest where ``iloc``
    lists the grid twice (again as 64x64, with no ``ispe``: 1.1 GB in a worker, priced 22 MiB, a re-attack)."""
    with open(data_file(f"hostile/{name}"), "rb") as fp:
        layout = bmff.read_layout(fp)
    assert layout.canvas_pixels >= 8000 * 8000 * (2 if "nested" in name else 1)
    with pytest.raises(ImageTooLarge):
        probe(data_file(f"hostile/{name}"), Limits())


@pytest.mark.parametrize(("name", "canvas", "inputs"), [
    ("heic_ovl7500_grey10_clap64.heic", 7500 * 7500, 7500 * 7500),
    ("heic_ovl64_iden_grey10_7500.heic", 64 * 64, 7500 * 7500),
    ("heic_ovl5400_over_grey10_64.heic", 5400 * 5400, 64 * 64),
])
def test_an_overlay_is_priced_with_its_canvas_and_its_inputs_in_rgb(data_file, name, canvas, inputs):
    """libheif draws an overlay on a canvas of RGB planes at its first input's depth, each input converted to RGB
    at its own depth first: a 7500x7500 10-bit grey overlay cropped to 64x64 took 926 MiB a render priced 277
    (under the budget), ``ready`` (a re-attack); a second re-attack put an ``iden`` with no ``ispe`` between the
    overlay and its 7500x7500 input (604 MiB, priced 277), and a 5400x5400 canvas over a 64x64 10-bit input
    (334 MiB, priced 286 at 8 bits)."""
    path = data_file(f"hostile/{name}")
    with open(path, "rb") as fp:
        layout = bmff.read_layout(fp)
    assert layout.heif_bytes >= canvas * bmff.OVERLAY_CANVAS_BYTES + inputs * bmff.OVERLAY_INPUT_BYTES
    with pytest.raises(ImageTooLarge):
        probe(path, Limits())


def test_the_profile_every_image_of_a_heic_shares_is_priced_once_an_image(tmp_path):
    """pillow-heif copies a profile into the info of each top-level image it opens: 16 images sharing one 47 MB
    profile (a 49 MB file) took 846 MB an open and a render, priced 102, ``ready`` (a re-attack). Each image's copy
    is priced, and what the open alone would copy past the budget is refused before it opens."""
    import pillow_heif
    from PIL import ImageCms

    profile = bytearray(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes() + bytes(1_000_000))
    profile[0:4] = struct.pack(">I", len(profile))
    made = pillow_heif.HeifFile()
    for index in range(16):
        made.add_frombytes("RGB", (64, 64), Image.new("RGB", (64, 64), (200, 100, index)).tobytes())
        if index:
            made[index].info["icc_profile"] = bytes(profile)
    made.primary_index = 0
    path = tmp_path / "shared.heic"
    made.save(path, quality=50)
    with open(path, "rb") as fp:
        assert bmff.read_layout(fp).profile_bytes >= 15 * len(profile)
    with pytest.raises(ImageTooLarge, match="colour profiles"):
        probe(path, Limits(max_decode_bytes=32 * 2**20))
    with open_checked(path, Limits()) as opened:
        assert opened.priced.total >= 4 * 15 * len(profile)


def test_each_frame_of_an_item_is_priced_as_a_picture_held(large):
    """A layered ("progressive") AVIF keeps an item's frames' pictures: four layers of 4800x4800, 1.3 KB, took
    377 MiB a render priced 250 as one picture (an adversarial run, libavif's extraLayerCount). Each frame is
    priced as a picture, up to AV1's eight reference slots."""
    data = item_data(large)
    frame = next(obu for obu in obus(data) if (obu[0] >> 3) & 0x0F in (3, 6))
    rest = data[:data.index(frame)]
    one = bmff.read_layout(io.BytesIO(with_item(large, [rest + frame]))).coded_bytes
    assert one == 2048 * 2048 * 1.5
    assert bmff.read_layout(io.BytesIO(with_item(large, [rest + frame * 4]))).coded_bytes == 4 * one
    many = bmff.read_layout(io.BytesIO(with_item(large, [rest + frame * 12])))
    assert many.coded_bytes == bmff.HELD_PICTURES * one and many.coded == (2048, 2048)
