"""Pillow's LANCZOS resize, byte for byte, two to three times faster: the passes of :mod:`._lanczos`.

Every variant of pipelines v1 and v2 is promised Pillow's LANCZOS (``Image.resize`` with a ``box`` and
``reducing_gap``). Pillow's resampler is scalar C that runs over a filter's taps innermost, one output sample
at a time; ``_lanczos`` (C, built with the package) computes the same sums of the same 8-bit samples and
22-bit weights in 32-bit integers, in loops a compiler vectorises (a whole row at a time in the vertical
pass, columns of transposed rows in the horizontal one, written with AVX2 intrinsics where the CPU has
them). Integer sums do not depend on their order, so the
bytes are Pillow's (``tests/test_lanczos.py`` compares them on every shape of box and size, and the quality
test on the corpus). On a 12 MP JPEG of odd sides decoded at 1/2 (2124x1413, the region 2123.5x1412.5) to
2048 px: 58-82 ms of CPU in Pillow, 20-23 in the passes here; a 3464 px square to 2048 px, horizontal pass
alone: 20-31 ms (52-79 before the AVX2 block) (one core, this machine).

:func:`resize` takes what Pillow 13 would resample in two passes, horizontal first, and only that (it
returns ``None`` otherwise, and Pillow or libvips make it): ``L`` or ``RGB``; no ``reduce()`` before the
passes (less than ``2 * REDUCING_GAP`` on both axes); not Pillow's own shortcuts (a copy, a crop); a
horizontal pass, run first, as Pillow runs it unless the height shrinks by more than twice what the width
does; no side of 2**24 px or more (:data:`MAX_SIDE`), and no image wider than a strip of a block's rows
(:data:`BLOCK_BYTES`). The rows the vertical pass needs are copied out of Pillow a strip at a time (:data:`STRIP_BYTES`) and
resampled horizontally into one buffer of the output's width, 1 or 3 bytes a pixel: no more than Pillow's own
intermediate (4 bytes a pixel), which :mod:`.budget` prices; then the vertical pass makes the output's bytes.
Without a C compiler at install the module is absent and Pillow resamples everything, as before.
"""

from __future__ import annotations

import struct

from PIL import Image

from .geometry import REDUCING_GAP
from .libvips import BANDS  # the modes resampled here too, and their bytes a pixel once packed (tobytes)

try:
    from . import _lanczos
except ImportError:  # pragma: no cover - installed without a C compiler: Pillow resamples
    _lanczos = None

#: rows copied out of Pillow at a time are at most this many bytes (and at least one row)
STRIP_BYTES = 1 << 20
#: Pillow compares sizes with the box in single precision, exact only below this; larger sides are left to it
MAX_SIDE = 1 << 24
#: bytes of a column in the horizontal pass's block (8 RGB rows, 32 L rows): a strip of fewer rows computes lanes
#: for nothing, once a call, so images wider than STRIP_BYTES / BLOCK_BYTES (32,768 px) are left to Pillow
BLOCK_BYTES = 32


def available() -> bool:
    return _lanczos is not None


def resize(img: Image.Image, out_size: tuple[int, int], box: tuple[float, ...]) -> Image.Image | None:
    """``img.resize(out_size, Image.Resampling.LANCZOS, box=box, reducing_gap=REDUCING_GAP)``, or ``None`` where
    that is not made here (see the module doc)."""
    if _lanczos is None or img.mode not in BANDS:
        return None
    width, height = img.size
    out_w, out_h = out_size
    if max(width, height, out_w, out_h) >= MAX_SIDE or width * BLOCK_BYTES > STRIP_BYTES:
        return None
    if out_w < 1 or out_h < 1 or tuple(out_size) == img.size and tuple(box) == (0, 0, width, height):
        return None  # Pillow copies
    if (int((box[2] - box[0]) / out_w / REDUCING_GAP) or 1) > 1 or (int((box[3] - box[1]) / out_h / REDUCING_GAP)
                                                                    or 1) > 1:
        return None  # Pillow reduce()s first
    x0, y0, x1, y1 = (_single(v) for v in box)  # Pillow's C core takes the box in single precision
    if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
        return None  # Pillow refuses it, or resamples an empty box
    if x0 == int(x0) and x1 - x0 == out_w and y0 == int(y0) and y1 - y0 == out_h:
        return None  # Pillow crops
    resample_x = out_w != width or x0 != 0 or x1 != out_w
    resample_y = out_h != height or y0 != 0 or y1 != out_h
    horizontal_first = not (height - out_h > 0 and height - out_h > (width - out_w) * 2)
    if not (resample_x and horizontal_first):
        return None

    bands = BANDS[img.mode]
    weights_y, bounds_y, ksize_y = _lanczos.coefficients(height, y0, y1, out_h)
    spans = memoryview(bounds_y).cast("i")
    first, last = spans[0], spans[2 * out_h - 2] + spans[2 * out_h - 1]
    weights_x, bounds_x, ksize_x = _lanczos.coefficients(width, x0, x1, out_w)
    rows = bytearray(out_w * bands * (last - first))  # the horizontal pass's output, Pillow's intermediate
    step = max(1, STRIP_BYTES // (width * bands))
    for top in range(first, last, step):
        bottom = min(top + step, last)
        strip = img.crop((0, top, width, bottom)).tobytes()
        at = (top - first) * out_w * bands
        _lanczos.horizontal(strip, width, bands, memoryview(rows)[at:at + (bottom - top) * out_w * bands], out_w,
                            weights_x, bounds_x, ksize_x)
    if resample_y:
        pixels = bytearray(out_w * bands * out_h)
        _lanczos.vertical(rows, out_w * bands, first, pixels, out_h, weights_y, bounds_y, ksize_y)
    else:
        pixels = rows
    rows = None  # before the image is made from the output
    return Image.frombytes(img.mode, out_size, pixels)


def _single(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]
