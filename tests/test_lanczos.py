"""``app.adapters.imaging.lanczos``: Pillow's LANCZOS resize, byte for byte, or nothing.

The renderer's promise is Pillow's pixels; the compiled passes may only ever
give them. Every case below is resized both ways and compared byte for byte:
random sizes and fractional boxes (L and RGB, up and down, both pass orders
of Pillow 13), and the bench's odd-sided photo as the renderer decodes it.
"""

from __future__ import annotations

import os
import random

import pytest
from PIL import Image

from app.adapters.imaging import lanczos
from app.adapters.imaging.geometry import REDUCING_GAP

LANCZOS = Image.Resampling.LANCZOS


def pillows(img, size, box):
    return img.resize(size, LANCZOS, box=box, reducing_gap=REDUCING_GAP)


def test_the_compiled_passes_are_built():
    """make install compiles them (a C compiler is on this machine); without them the renderer is slower, and
    the tests below would prove nothing."""
    assert lanczos.available()


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_random_shapes_and_boxes_give_pillows_bytes(mode):
    rnd = random.Random(11 if mode == "RGB" else 12)
    taken = declined = 0
    for _ in range(250):
        width, height = rnd.randint(1, 260), rnd.randint(1, 260)
        img = Image.frombytes(mode, (width, height), os.urandom(width * height * len(mode)))
        out = (rnd.randint(1, 300), rnd.randint(1, 300))
        x0 = rnd.choice([0, 0.5, rnd.uniform(0, width / 2)])
        y0 = rnd.choice([0, 0.25, rnd.uniform(0, height / 2)])
        box = (x0, y0, rnd.choice([width, width - 0.5, rnd.uniform(x0 + 0.01, width)]),
               rnd.choice([height, height - 0.5, rnd.uniform(y0 + 0.01, height)]))
        if box[2] <= box[0] or box[3] <= box[1]:
            continue
        ours = lanczos.resize(img, out, box)
        if ours is None:
            declined += 1
            continue
        taken += 1
        assert ours.mode == mode and ours.size == out
        assert ours.tobytes() == pillows(img, out, box).tobytes(), (mode, img.size, out, box)
    assert taken > 120 and declined > 10, (taken, declined)



@pytest.mark.parametrize("bands", [3, 1])
def test_the_horizontal_pass_in_avx2_and_in_portable_c_gives_the_same_bytes(bands):
    """On a CPU with AVX2 (this machine's) the horizontal pass runs a copy written with its intrinsics; the test
    above compares it with Pillow. This one compares it with the portable copy, which other CPUs run, on blocks of
    every height (a block holds 8 RGB or 32 L rows; the last is often short) and weights of every sign."""
    passes = lanczos._lanczos
    rnd = random.Random(21 + bands)
    for _ in range(400):
        width, rows = rnd.randint(1, 400), rnd.randint(1, 70)
        out_w = rnd.randint(1, width)
        x0 = rnd.uniform(0, width / 3)
        weights, bounds, ksize = passes.coefficients(width, x0, rnd.uniform(x0 + 0.01, width), out_w)
        source = os.urandom(width * rows * bands)
        simd, portable = bytearray(out_w * rows * bands), bytearray(out_w * rows * bands)
        passes.horizontal(source, width, bands, simd, out_w, weights, bounds, ksize)
        passes.horizontal(source, width, bands, portable, out_w, weights, bounds, ksize, False)
        assert simd == portable, (bands, width, rows, out_w, x0)

def test_an_odd_sided_photo_decoded_at_half_scale(data_file):
    """The bench's 4247x2825 photo: decoded at 1/2 it is 2124x1413 for a region of 2123.5x1412.5."""
    img = Image.open(data_file("photos/chelsea_12mp_4247x2825.jpg"))
    img.draft("RGB", (2048, 1362))
    img.load()
    assert img.size == (2124, 1413)
    box = (0, 0, 2123.5, 1412.5)
    ours = lanczos.resize(img, (2048, 1362), box)
    assert ours is not None and ours.tobytes() == pillows(img, (2048, 1362), box).tobytes()


def test_what_pillow_makes_otherwise_is_left_to_it():
    img = Image.frombytes("RGB", (300, 200), os.urandom(300 * 200 * 3))
    assert lanczos.resize(img, (290, 60), (0, 0, 300, 200)) is None, "Pillow 13 runs this vertical pass first"
    assert lanczos.resize(img, (60, 40), (0, 0, 300, 200)) is None, "Pillow reduce()s first"
    assert lanczos.resize(img, (100, 100), (10, 20, 110, 120)) is None, "Pillow crops"
    assert lanczos.resize(img, (300, 200), (0, 0, 300, 200)) is None, "Pillow copies"
    assert lanczos.resize(img, (300, 150), (0, 0, 300, 200)) is None, "no horizontal pass"
    assert lanczos.resize(img.convert("RGBA"), (200, 150), (0, 0, 300, 200)) is None, "RGBA is not resampled here"
    assert lanczos.resize(img, (200, 150), (0, 0, 300, 200)) is not None


PROBES = r"""
from app.adapters.imaging import _lanczos as m
refused = 0
for call in (
    lambda: m.vertical(b"", 2**62 + 1, 0, bytearray(4), 4, bytes(16), bytes(32), 1),
    lambda: m.vertical(b"", 2**62, 0, bytearray(0), 4, bytes(16), bytes(32), 1),
    lambda: m.vertical(b"\0" * 8, 4, 0, bytearray(8), 2, bytes(8), (5).to_bytes(4, "little") * 4, 1),
    lambda: m.horizontal(b"", 4, 3, bytearray(0), 2, bytes(8), bytes(16), 1),
    lambda: m.horizontal(b"\0" * 12, 4, 3, bytearray(6), 2, bytes(8), (9).to_bytes(4, "little") * 4, 1),
    lambda: m.coefficients(1, 0.0, 3.0e7, 1),
    lambda: m.coefficients(10, float("nan"), 5.0, 3),
    lambda: m.coefficients(10, 0.0, float("inf"), 3),
    lambda: m.coefficients(10, 1.0e12, 1.0e12 + 1.0e6, 3),  # its first samples overflowed an int
    lambda: m.coefficients(10, -5.0, 5.0, 3),
    lambda: m.vertical(b"\0" * 30, 3, 2**31 - 5, bytearray(15), 5, bytes(20), bytes(40), 1),  # first + rows > int
    lambda: m.coefficients(2**31 - 1, 2147483520.0, 2147483647.0, 3),  # its last sample overflowed an int
    # 2**24 rows: the side every size stays under (near 2**31, the next block's first row overflowed an int)
    lambda: m.horizontal(bytes(1 << 24), 1, 1, bytearray(1 << 24), 1, (1 << 22).to_bytes(4, "little"), bytes(4) + b"\1\0\0\0", 1),
):
    try:
        call()
    except (ValueError, MemoryError):
        refused += 1
print(refused)
"""


def test_the_compiled_functions_refuse_what_does_not_fit_instead_of_reading_past_it():
    """Called with sizes that do not match their buffers (an empty source, an overflowing line, bounds outside
    the input, a box outside the input, a reduction far beyond the renderer's), each raises; none crashes the
    process. The last five were found by a build with ``-fsanitize=address,undefined`` and an adversarial review
    (int overflows; with 2**31 - 1 rows the pass wrote 2 GiB before its output)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PROBES], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "13", done.stdout


def test_sides_beyond_single_precision_are_left_to_pillow():
    """Pillow compares the box with the sizes in single precision; from 2**24 px the comparisons differ from exact
    ones (a crop where an exact test sees a resample), so such images are not resampled here."""
    img = Image.new("L", (2, lanczos.MAX_SIDE + 2))
    assert lanczos.resize(img, (1, lanczos.MAX_SIDE), (0, 1, 2, lanczos.MAX_SIDE + 2)) is None


ALIASED = r"""
import struct
from app.adapters.imaging import _lanczos as m
# the output buffer is also the bounds table: the pass writes 0xff pixels over the bounds it checked
out_w, rows = 16, 32
buf = bytearray(rows * out_w)
buf[:8 * out_w] = struct.pack("<2i", 0, 1) * out_w
m.horizontal(b"\xff" * (16 * rows), 16, 1, buf, out_w, struct.pack("<i", 1 << 22) * out_w, memoryview(buf)[:8 * out_w], 1)
assert bytes(buf) == b"\xff" * len(buf)
# output row 0 (input row 0, weight 1.0) writes the bounds of output row 1: first 2**20, far past the input
line, out_h = 64, 64
buf = bytearray(line * out_h)
buf[:8 * out_h] = struct.pack("<2i", 0, 1) * out_h
src = bytearray(line * 4)
src[8:16] = struct.pack("<2i", 1 << 20, 1)
m.vertical(bytes(src), line, 0, buf, out_h, struct.pack("<i", 1 << 22) * out_h, memoryview(buf)[:8 * out_h], 1)
assert bytes(buf) == bytes(src[:line]) * out_h
print("ok")
"""


def test_the_passes_read_the_tables_they_checked():
    """The passes run without the GIL: they read their own copy of the tables, checked, never the caller's buffer,
    which another thread may rewrite meanwhile or which may be the output itself. Reading the caller's, both
    calls below read outside the input and the process died (SIGSEGV): found by an adversarial review."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", ALIASED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


def test_images_wider_than_a_strip_of_a_block_are_left_to_pillow():
    """A strip of STRIP_BYTES holds fewer rows than the horizontal pass's block once an image is wider than
    32,768 px: each row was a call computing 8 or 32 lanes to keep one, 1.9-2.7 times Pillow's CPU on a
    1,200,000x8 image (found by an adversarial review)."""
    wide = 32_768  # 1 MiB strips / 32 bytes a column of a block
    assert lanczos.resize(Image.new("L", (wide, 4)), (wide // 2, 3), (0, 0, wide, 4)) is not None
    assert lanczos.resize(Image.new("L", (wide + 1, 4)), (wide // 2, 3), (0, 0, wide + 1, 4)) is None
    assert lanczos.resize(Image.new("RGB", (wide + 1, 4)), (wide // 2, 3), (0, 0, wide + 1, 4)) is None
