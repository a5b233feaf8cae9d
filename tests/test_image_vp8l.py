"""A lossless WebP naming many groups of prefix codes is priced from its header (``app/adapters/imaging/vp8l.py``).

A review: a 295 KB 1024x1024 VP8L whose entropy image names 65,536 groups rendered in 364-367 MB (libwebp builds
every group's tables before a pixel), priced 28-39 MB. ``tests/data/hostile/webp_vp8l_65536_groups.webp`` is that
file (made by :func:`tests.hostile_images.webp_file`); its alpha (``ALPH``) and first-frame (``ANMF``) forms took the
same. libwebp-encoded files name a few hundred groups at most.
"""

from __future__ import annotations

import io
import random
import struct

import pytest
from PIL import Image, ImageDraw

from app.adapters.imaging import Limits, budget, probe, render, vp8l
from app.adapters.imaging.probe import open_checked
from app.errors import CorruptImage, DecompressionBomb, ImageTooLarge
from tests import hostile_images
from tests.test_image_budget import ALL_SPECS, MEASURE, _can_reset_peak, _measured_over_priced
from tests.test_imaging import LoadSpy

HOSTILE = "hostile/webp_vp8l_65536_groups.webp"
#: peak RSS of a render of the hostile file (and its ALPH and ANMF forms), measured in a fresh process
MEASURED_PEAK = 365 * budget.MIB


def webp(img: Image.Image, **params) -> bytes:
    out = io.BytesIO()
    img.save(out, "WEBP", **params)
    return out.getvalue()


def chunk(data: bytes, kind: bytes = b"VP8L") -> bytes:
    """The payload of the first ``kind`` chunk of a WebP."""
    at = data.index(kind, 12)
    return data[at + 8:at + 8 + struct.unpack("<I", data[at + 4:at + 8])[0]]


def photo(size: tuple[int, int] = (451, 300)) -> Image.Image:
    from tests.test_image_budget import DATA

    return Image.open(DATA / "photos" / "chelsea.png").convert("RGB").resize(size)


def screenshot(size: tuple[int, int] = (1600, 1000)) -> Image.Image:
    img = Image.new("RGB", size, (245, 245, 245))
    draw, rng = ImageDraw.Draw(img), random.Random(1)
    for y in range(0, size[1], 18):
        draw.text((rng.randint(0, 40), y), "".join(rng.choice("abcdefgh QRSTUV 0123") for _ in range(120)),
                  fill=(rng.randint(0, 90),) * 3)
    for _ in range(60):
        x, y = rng.randint(0, size[0] - 100), rng.randint(0, size[1] - 50)
        draw.rectangle((x, y, x + 90, y + 40), fill=(rng.randint(0, 255), rng.randint(0, 255), 120))
    return img


def decode_to_the_end(payload: bytes) -> tuple[int, int]:
    """Read a VP8L stream whole with the reader's pieces (the header again, every group's codes, the pixels):
    (groups indexed, bits left over). A reader out of step with libwebp's layout ends far from the end, or
    fails."""
    bits = vp8l._Bits(payload)
    bits.read(8)
    width, height = bits.read(14) + 1, bits.read(14) + 1
    bits.read(4)
    xsize = width
    while bits.read(1):
        kind = bits.read(2)
        if kind in (0, 1):
            block = 2 + bits.read(3)
            vp8l._subimage(bits, vp8l._subsample(xsize, block), vp8l._subsample(height, block))
        elif kind == 3:
            colours = bits.read(8) + 1
            vp8l._subimage(bits, colours, 1)
            xsize = vp8l._subsample(xsize, 0 if colours > 16 else 1 if colours > 4 else 2 if colours > 2 else 3)
    cache = vp8l._cache_bits(bits)
    precision, image = 0, [0]
    if bits.read(1):
        precision = 2 + bits.read(3)
        image = [(p >> 8) & 0xFFFF for p in vp8l._subimage(bits, vp8l._subsample(xsize, precision),
                                                             vp8l._subsample(height, precision))]
    groups = [[vp8l._read_code(bits, size) for size in (280 + (1 << cache if cache else 0), 256, 256, 256, 40)]
              for _ in range(max(image) + 1)]
    done, columns = 0, vp8l._subsample(xsize, precision)
    while done < xsize * height:
        row, col = divmod(done, xsize)
        group = image[(row >> precision) * columns + (col >> precision)] if precision else 0
        green, red, blue, alpha, distance = groups[group]
        code = green.read(bits)
        if code < 256:
            red.read(bits), blue.read(bits), alpha.read(bits)
            done += 1
        elif code < 280:
            done += vp8l._copy_value(code - 256, bits)
            vp8l._copy_value(distance.read(bits), bits)
        else:
            done += 1
    return max(image) + 1, bits.end - bits.pos


# --- the hostile file -------------------------------------------------------------------------------------------


def test_a_lossless_webp_naming_65536_groups_is_refused_from_its_header(data_file, monkeypatch) -> None:
    path = data_file(HOSTILE)
    assert path.stat().st_size < 300_000
    with open(path, "rb") as fp:
        (stream,) = vp8l._first_frame(fp)
    assert (stream.width, stream.height, stream.groups) == (1024, 1024, 65536)
    spy = LoadSpy(monkeypatch)
    with pytest.raises(ImageTooLarge) as err:
        probe(path, Limits())
    assert "1024x1024" in str(err.value)
    for spec in ALL_SPECS:
        with pytest.raises(ImageTooLarge):
            render(path, spec, Limits())
    assert spy.calls == [], "nothing may be decoded"


@pytest.mark.parametrize("kind", ["still", "alpha", "frame"])
def test_its_alpha_and_first_frame_forms_are_priced_above_the_measured_peak(tmp_path, kind) -> None:
    path = hostile_images.webp_file(tmp_path / f"{kind}.webp", kind)
    with Image.open(path) as img, open(path, "rb") as fp:
        assert budget.estimate(img, "WEBP", fp).total >= MEASURED_PEAK
    with pytest.raises(ImageTooLarge):
        probe(path, Limits())


def test_the_stored_file_is_what_the_builder_makes(data_file, tmp_path) -> None:
    made = hostile_images.webp_file(tmp_path / "still.webp")
    assert made.read_bytes() == data_file(HOSTILE).read_bytes()
    groups, left = decode_to_the_end(chunk(made.read_bytes()))
    assert groups == 65536 and 0 <= left < 8


def test_measured_peak_of_the_hostile_file_stays_under_its_price(data_file, tmp_path) -> None:
    if not _can_reset_peak():
        pytest.skip("needs Linux /proc/self/clear_refs and VmHWM")
    alpha = hostile_images.webp_file(tmp_path / "alpha.webp", "alpha")
    measure = MEASURE.replace("specs = [*distinct.values(), ", "specs = [*list(distinct.values())[:1], ")
    assert _measured_over_priced(measure, [data_file(HOSTILE), alpha], [data_file("pillow/hopper.webp")]) == []


# --- libwebp's own files ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", [0, 4, pytest.param(6, marks=pytest.mark.long)])  # 6: 4-11 s an encode, in make
@pytest.mark.parametrize("kind", ["photo", "screenshot"])                            # soak
def test_lossless_webps_from_libwebp_are_accepted_and_priced_within_the_budget(tmp_path, kind, method) -> None:
    img = photo((2000, 1500)) if kind == "photo" else screenshot()
    path = tmp_path / f"{kind}_{method}.webp"
    path.write_bytes(webp(img, lossless=True, method=method, quality=100))
    stream = vp8l.read(chunk(path.read_bytes()))
    assert stream.groups <= 300 and stream.subimage_pixels < vp8l.MAX_SUBIMAGE_PIXELS // 16
    assert stream.table_bytes < 8 * budget.MIB
    with open_checked(path, Limits()) as (_, _, priced):
        assert priced.total < budget.DEFAULT_MAX_DECODE_BYTES


def test_the_alpha_of_a_lossy_webp_is_read_and_accepted(tmp_path) -> None:
    img = photo().convert("RGBA")
    img.putalpha(img.convert("L").point(lambda v: 255 if v > 60 else v))
    path = tmp_path / "alpha.webp"
    path.write_bytes(webp(img, quality=80))
    with open(path, "rb") as fp:
        (stream,) = vp8l._first_frame(fp)
    assert (stream.width, stream.height) == img.size and stream.groups >= 1
    probe(path, Limits())


@pytest.mark.parametrize("colours, transforms", [
    (None, {0, 2}),  # method 0: subtract-green, predictor
    (256, {0, 1, 2}),  # method 4: and cross-colour
    (2, {3}), (3, {3}), (12, {3}), (200, {3}),  # colour indexing, 8, 4, 2 and 1 pixels to a byte
])
def test_the_reader_follows_each_transform(colours, transforms) -> None:
    img = photo()
    if colours is None:
        data = webp(img, lossless=True, method=0)
    elif colours == 256:
        data = webp(img, lossless=True, method=4)
    else:
        data = webp(img.quantize(colours), lossless=True)
    stream = vp8l.read(chunk(data))
    assert (stream.width, stream.height) == img.size
    assert set(stream.transforms) == transforms
    groups, left = decode_to_the_end(chunk(data))
    assert stream.groups == groups and 0 <= left < 8


def test_a_colour_cache_is_read(tmp_path) -> None:
    data = webp(screenshot((800, 600)), lossless=True, method=4, quality=100)
    stream = vp8l.read(chunk(data))
    assert stream.cache_bits > 0
    assert decode_to_the_end(chunk(data))[1] < 8


# --- bounded, and malformed streams --------------------------------------------------------------------------


def stream_header(width: int, height: int, *fields: tuple[int, int]) -> bytes:
    out = hostile_images._BitWriter()
    for value, count in ((0x2F, 8), (width - 1, 14), (height - 1, 14), (0, 4), *fields):
        out.put(value, count)
    return out.bytes() + bytes(64)


def test_sub_images_beyond_the_bound_are_a_bomb() -> None:
    # 16384x16384 with a predictor of 4x4 blocks: a sub-image of 16,777,216 pixels, refused before it is read
    with pytest.raises(DecompressionBomb):
        vp8l.read(stream_header(16384, 16384, (1, 1), (0, 2), (0, 3)))


@pytest.mark.parametrize("fields", [
    ((1, 1), (2, 2), (1, 1), (2, 2)),  # subtract-green twice
    ((0, 1), (1, 1), (12, 4)),  # a colour cache of 12 bits
    ((0, 1), (0, 1), (1, 1), (0, 3), (0, 1), (0, 1), (0, 4)),  # an entropy image whose first code has no symbol
], ids=["transform-twice", "cache-bits", "empty-code"])
def test_malformed_streams_are_corrupt(fields) -> None:
    with pytest.raises(CorruptImage):
        vp8l.read(stream_header(64, 64, *fields))


def test_a_cut_stream_is_corrupt() -> None:
    data = chunk(webp(photo(), lossless=True, method=4))
    stream = vp8l.read(data)
    for end in range(5, 200):
        with pytest.raises(CorruptImage):
            vp8l.read(data[:end])
    assert vp8l.read(data[:len(data) // 2]) == stream  # the main image's codes and pixels are not read


def test_fuzzed_streams_raise_only_corrupt_image_or_bomb() -> None:
    rng = random.Random(9649)
    valid = [chunk(webp(photo(), lossless=True, method=m)) for m in (0, 4)]
    valid += [chunk(webp(photo().quantize(12), lossless=True)), hostile_images.vp8l_groups(64, 64),
              chunk(webp(screenshot((400, 300)), lossless=True, method=4, quality=100))]
    for case in range(600):
        data = bytearray(rng.choice(valid))
        if case % 3 == 0:
            data = bytearray(b"\x2f" + rng.randbytes(rng.randint(4, 400)))
        else:
            for _ in range(rng.randint(1, 8)):
                at = rng.randrange(5, min(len(data), 2000))
                data[at] ^= 1 << rng.randrange(8)
            if case % 3 == 2:
                data = data[:rng.randint(5, len(data))]
        try:
            vp8l.read(bytes(data))
        except (CorruptImage, DecompressionBomb):
            pass


# --- an adversarial run on the reader -------------------------------------------------------------------------------


def test_an_animation_frames_alpha_is_read_at_its_pictures_size_not_its_headers(tmp_path) -> None:
    """The frame header said 16x16 over a 1024x1024 picture: the alpha's entropy image was read at 16x16 and its
    65,536 groups counted as 241 (2.98 MB); it rendered in 364.8 MiB, priced 31 MiB."""
    path = hostile_images.webp_file(tmp_path / "lying.webp", "frame-alpha", frame_header=(16, 16))
    with open(path, "rb") as fp:
        (stream,) = vp8l._first_frame(fp)
    assert (stream.width, stream.height, stream.groups) == (1024, 1024, 65536)
    with pytest.raises(ImageTooLarge):
        probe(path, Limits())


def test_the_bound_on_sub_images_does_not_grow_with_the_declared_size() -> None:
    """It was one in 128 of the declared pixels past 524,288: a frame header of 65535x65535 over a 64x64 canvas
    let 2.5 MB of sub-images cost 20 s of the web's CPU. 16384x16384 with a predictor of 16x16 blocks: 1,048,576."""
    with pytest.raises(DecompressionBomb):
        vp8l.read(stream_header(16384, 16384, (1, 1), (0, 2), (2, 3)))


def test_no_more_of_a_long_stream_is_read_than_its_header_can_need(tmp_path) -> None:
    """A 50 MB chunk was read whole and copied twice: 150 MB of the web for the reader alone."""
    import tracemalloc

    data = chunk(webp(photo(), lossless=True, method=4))
    padded = data + bytes(30 << 20)
    path = tmp_path / "padded.webp"
    body = hostile_images._riff_chunk(b"VP8L", padded)
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body)
    tracemalloc.start()
    try:
        with open(path, "rb") as fp:
            (stream,) = vp8l._first_frame(fp)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stream == vp8l.read(data)
    assert peak < vp8l.MAX_STREAM_BYTES + (2 << 20)
    with pytest.raises(DecompressionBomb):  # what lies past the bytes read is a bomb, not a corrupt stream
        vp8l.read(data[:200], cut=True)


def test_the_file_libwebp_is_handed_whole_is_priced(tmp_path) -> None:
    """A lossless photo's chunk padded with 45 MB rendered in 231 MB, priced 193 (Pillow reads the file for the
    decoder and keeps it while the image is open); priced once, a 64x64 padded to 48 MB rendered in 96 MB priced 56
    (libwebp's decoder copies it)."""
    data = chunk(webp(photo(), lossless=True, method=4))
    priced = []
    for padding in (0, 45 << 20):
        body = hostile_images._riff_chunk(b"VP8L", data + bytes(padding))
        path = tmp_path / f"padded-{padding}.webp"
        path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body)
        with Image.open(path) as img, open(path, "rb") as fp:
            priced.append(budget.estimate(img, "WEBP", fp).total)
    assert priced[1] - priced[0] >= 2 * (45 << 20), "read whole by Pillow, and copied by the decoder"


@pytest.mark.parametrize("first_frame", [b"", hostile_images._riff_chunk(b"XYZW", bytes(8))], ids=["empty", "unknown"])
def test_a_frame_libwebp_drops_does_not_hide_the_next_ones_groups(tmp_path, first_frame) -> None:
    """A second adversarial run: libwebp's demuxer drops an animation frame without an image (an empty ANMF, or
    one whose first chunk it does not know) and decodes the next; the walk took the first ANMF's chunks, found no
    image there and priced no tables: 364 MB a render, priced 26-48 MB."""
    canvas = struct.pack("<I", 1023)[:3] * 2
    header = bytes(6) + canvas + b"\x64\0\0\0"
    body = (hostile_images._riff_chunk(b"VP8X", bytes([0x02, 0, 0, 0]) + canvas)
            + hostile_images._riff_chunk(b"ANIM", bytes(6)) + hostile_images._riff_chunk(b"ANMF", header + first_frame)
            + hostile_images._riff_chunk(b"ANMF", header + hostile_images._riff_chunk(
                b"VP8L", hostile_images.vp8l_groups(1024, 1024))))
    path = tmp_path / "dropped-first.webp"
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body)
    with Image.open(path) as img, open(path, "rb") as fp:
        assert budget.estimate(img, "WEBP", fp).total >= MEASURED_PEAK
    with pytest.raises(ImageTooLarge):
        probe(path, Limits())


def test_frames_nested_in_frames_are_read_in_file_order_as_libwebp_reads_them(tmp_path) -> None:
    """A review: the walk went by each ANMF's declared length and four frames deep, so with frames nested five deep
    it skipped the 1024x1024 one libwebp decodes first and priced a 1x1 frame after it."""
    chunk_of, canvas = hostile_images._riff_chunk, struct.pack("<I", 1023)[:3] * 2

    def frame(inner: bytes) -> bytes:
        return chunk_of(b"ANMF", bytes(6) + canvas + b"\x64\0\0\0" + inner)

    tiny = chunk_of(b"VP8L", chunk(webp(Image.new("RGB", (1, 1)), lossless=True)))
    heavy = frame(chunk_of(b"VP8L", hostile_images.vp8l_groups(1024, 1024)))
    body = (chunk_of(b"VP8X", bytes([0x02, 0, 0, 0]) + canvas) + chunk_of(b"ANIM", bytes(6))
            + frame(frame(frame(frame(heavy) + frame(tiny)))))
    path = tmp_path / "nested.webp"
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body)
    with open(path, "rb") as fp:
        (stream,) = vp8l._first_frame(fp)
    assert stream.groups == 65536


def test_a_chunk_longer_than_its_file_is_corrupt_not_a_bomb(tmp_path) -> None:
    data = chunk(webp(photo(), lossless=True, method=4))
    body = b"VP8L" + struct.pack("<I", 20 << 20) + data[:100]  # says 20 MB, holds 100 bytes
    path = tmp_path / "short.webp"
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body)
    with open(path, "rb") as fp, pytest.raises(CorruptImage):
        vp8l.webp_table_bytes(fp)


@pytest.mark.parametrize("cache_hits", [False, True], ids=["literal", "cache-hit"])
def test_a_sub_image_coded_in_no_bits_costs_no_more_than_its_bytes(tmp_path, cache_hits) -> None:
    """A 40-byte WebP whose predictor sub-image of 524,176 pixels took no bits cost the web 0.16-0.21 s of CPU an
    upload, read pixel by pixel (an adversarial run: a few connections slowed everyone's uploads 10-100 times)."""
    import time

    data = hostile_images.vp8l_free_subimage(cache_hits=cache_hits)
    assert len(data) < 100
    path = tmp_path / "free.webp"
    path.write_bytes(data)
    began = time.process_time()
    stream = vp8l.read(chunk(data))
    took = time.process_time() - began
    assert stream.subimage_pixels == 724 * 724 and stream.groups == 1
    assert took < 0.04, f"{took:.3f} s of CPU for {len(data)} bytes"
    with Image.open(path) as img:  # libwebp reads it as the reader does
        img.load()
