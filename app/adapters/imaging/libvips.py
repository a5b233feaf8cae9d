"""What libvips does for the renderer: a JPEG's decode and LANCZOS resample, or the vertical pass of a
resample, where that gives Pillow's pixels.

Every variant of pipelines v1 and v2 is promised Pillow's LANCZOS (a = 3),
with ``reducing_gap`` (an integer box ``reduce()`` while at least twice the
final size remains), from the JPEG decoded at the draft scale (libjpeg's
1/2, 1/4 or 1/8 IDCT). Pillow's resampler is scalar C and holds the whole
decoded image; libvips decodes with libjpeg-turbo's decoder (its wheel's
mozjpeg 5, a fork of it) at the same scale and computes the same
separable kernel with SIMD, streaming rows
from the decoder through the two passes, so neither the decoded image nor
a copy of it is ever held. A 3464 px square photo to 2048 px: 253 against
142 ms of CPU, and some tens of MB less at the peak.

It applies (:func:`applies`) when the result is the same, to
``tests/test_render_quality.py``'s 35 dB and in practice to 44-60 dB:

* the JPEG decodes to ``RGB`` or ``L`` (not CMYK, whose inversion differs);
* the region to resample is the whole decoded image: a ``fit`` or
  ``bounded`` variant, or a ``cover`` of a square, of a JPEG whose sides
  divide by the draft scale. An odd side decoded at 1/2 is a fraction of a
  pixel larger than the region Pillow resamples (4247 px is 2124 px for a
  region of 2123.5), and libvips, which centres its grid on the whole
  image, cannot express that: such a photo stays with Pillow. Cameras'
  sizes (4032x3024, 6000x4000) divide by 8;
* it is a reduction by less than ``2 * REDUCING_GAP`` on both axes, so
  Pillow would not ``reduce()`` first (the draft leaves less than 2x);
* the output is large (:data:`MIN_OUTPUT_PIXELS`): the 2048 px copies, not
  the thumbnails, where Pillow is as fast.

Where the region is not the whole image, the image is decoded by Pillow,
but the vertical pass can still be libvips's (:func:`resize`): when the
region spans every row, libvips reduces the whole height, on the rows of
Pillow's horizontal pass (rounded to 8 bits, as Pillow rounds them before
its own vertical pass). That is the large copy of a JPEG of odd width and
even height (4241x2830 at 1/2 is 2121x1415 for a region of 2120.5x1415),
and of a PNG or WebP: 31 against 7 ms on 2048x1415 to 1367 rows, the
pixels copied to libvips and back included. The pixels are 55-56 dB from
Pillow's (a photo, noise); encoded, the sharp test images' large copies
are 37-43 dB from the reference's, noise the lowest, as the whole-image
path's are 36-41. It costs a copy of the horizontal pass's rows while they
are alive (priced by :mod:`~app.adapters.imaging.budget`). The horizontal
pass is not taken over the same way: libvips would need a copy of the
whole decoded image.

The passes run in Pillow's order, horizontal then vertical. libvips's own
``resize`` runs vertical first, which differs from Pillow by 34.8 dB on a
fine line grating; in Pillow's order the worst of the corpus and the sharp
test images is above 44 dB.

The file must also be one the two libjpegs judge alike (:func:`_layout`),
or Pillow decodes it and its verdict stands:

* Huffman-coded baseline, extended or progressive DCT (SOF0-SOF2). Pillow's
  libjpeg-turbo refuses arithmetic coding (SOF9-SOF15), which libvips's
  mozjpeg decodes; lossless and hierarchical frames are not taken either;
* a header (the bytes before the first scan) of segments only (APPn, COM,
  DQT, DHT, DRI), under :data:`MAX_HEADER_BYTES`: libjpeg keeps a copy of
  libvips's APP1, APP2, APP13 and APP14 segments, and Pillow its own;
* a single-scan file's scan ends with EOI. Pillow finishes the
  decompression and so refuses a file whose scan is followed by a bad
  marker (a second SOF or SOS, an unknown marker, a bad table: a
  concatenation, a broken writer); libvips stops at the last row and would
  render it. A progressive file is read to its EOI by both before a row
  comes out.

A decoding error of libvips's (``fail_on`` ``truncated``: a truncated
file, as Pillow never loads truncated images; libjpeg errors; more than
libvips's limit of libjpeg warnings, which Pillow ignores, as in a file
of broken restart intervals) is not translated: :func:`decode_resampled`
returns ``None``, and Pillow decodes the file and refuses or renders it
itself. A corrupt file is then decoded twice; a good one never is.

The file is streamed to libvips from a descriptor of its own on the same
file (:func:`_source`), up to where libjpeg stops: trailing data (an MPO's
second frame, a gain map, garbage) is not read, and no copy of the file is
made (pyvips would copy a ``bytes`` buffer once more).
pyvips is imported on first use, so only the worker loads libvips, with the
operation cache off: every image is decoded once.
"""

from __future__ import annotations

import os
import re
from typing import BinaryIO

from PIL import Image

from .geometry import REDUCING_GAP

#: Pillow's filters and libvips's kernels computing the same function.
KERNELS = {
    Image.Resampling.LANCZOS: "lanczos3",
    Image.Resampling.BICUBIC: "cubic",
    Image.Resampling.BILINEAR: "linear",
}
#: Pillow's mode of a decoded JPEG -> libvips's bands, for the modes decoded here.
BANDS = {"L": 1, "RGB": 3}
#: Smaller outputs stay with Pillow: there libvips's setup costs what its resampler saves (one core, CPU
#: time: 800x533 to 533 px 12.1 / 12.4 ms, 1024x682 to 682 px 19.2 / 16.7, 2896x1930 to 1930 px 173 / 101).
MIN_OUTPUT_PIXELS = 512 * 1024
#: The frames libvips decodes here, by SOF marker: Huffman-coded baseline and extended sequential, progressive.
SOF_MARKERS = {0xC0: False, 0xC1: False, 0xC2: True}  # -> progressive
#: Segments a header may have besides its SOF: APPn, COM, DQT, DHT, DRI.
HEADER_MARKERS = frozenset(range(0xE0, 0xF0)) | {0xFE, 0xDB, 0xC4, 0xDD}
#: Longer headers (metadata beyond a camera's: EXIF, ICC and XMP are some 100 KB) stay with Pillow.
MAX_HEADER_BYTES = 1024 * 1024
_EOI = 0xD9
#: A marker libjpeg stops at in entropy-coded data: 0xFF, then neither a stuffed 0 nor RST0-7 (nor a fill 0xFF).
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_CHUNK = 1024 * 1024

_pyvips = None


def applies(mode: str, decoded: tuple[int, int], box: tuple[float, ...], out_size: tuple[int, int],
            resample: Image.Resampling) -> bool:
    """Whether :func:`decode_resampled` gives the pixels Pillow would (see the module doc)."""
    width, height = decoded
    return _same_passes(mode, box, out_size, resample) and tuple(box) == (0, 0, width, height)


def _same_passes(mode: str, box: tuple[float, ...], out_size: tuple[int, int], resample: Image.Resampling) -> bool:
    """Whether libvips's passes compute Pillow's here: a kernel both have, 8-bit ``L`` or ``RGB``, a large output,
    and no ``reduce()`` before the passes (less than ``2 * REDUCING_GAP`` on both axes)."""
    out_w, out_h = out_size
    return (
        resample in KERNELS
        and mode in BANDS
        and out_w * out_h >= MIN_OUTPUT_PIXELS
        and 1 <= (box[2] - box[0]) / out_w < 2 * REDUCING_GAP
        and 1 <= (box[3] - box[1]) / out_h < 2 * REDUCING_GAP
    )


def resize(img: Image.Image, out_size: tuple[int, int], box: tuple[float, ...],
           resample: Image.Resampling) -> Image.Image | None:
    """Pillow's ``img.resize(out_size, resample, box=box, reducing_gap=REDUCING_GAP)``, its vertical pass made by
    libvips; ``None`` when that pass is not libvips's to make (see the module doc), and Pillow makes it all.

    The vertical pass is libvips's when it reduces the whole height (``box`` spans every row), as for the large
    copy of a JPEG of odd width and even height, or of a PNG. The horizontal pass, if any, is Pillow's (its
    region may start or end inside a pixel, which libvips cannot express), and is rounded to 8 bits before the
    vertical one, as in Pillow.
    """
    width, height = img.size
    out_w, out_h = out_size
    if not (_same_passes(img.mode, box, out_size, resample) and box[1] == 0 and box[3] == height
            and out_h != height):
        return None
    mode, bands = img.mode, BANDS[img.mode]
    if (box[0], box[2], out_w) != (0, width, width):
        img = img.resize((out_w, height), resample, box=(box[0], 0, box[2], height))  # Pillow's horizontal pass
    vips = _vips()
    data = _rows(img)
    img = None  # the horizontal pass's image goes before the output is made
    try:
        rows = vips.Image.new_from_memory(data, out_w, height, bands, "uchar")
        pixels = rows.reducev(height / out_h, kernel=KERNELS[resample]).write_to_memory()
    except vips.Error:  # pragma: no cover - libvips failing on pixels in memory: Pillow makes them
        return None
    if len(pixels) != out_w * out_h * bands:
        raise AssertionError(f"libvips made {len(pixels)} bytes, not {out_w}x{out_h}x{bands}")
    return Image.frombytes(mode, out_size, pixels)


#: rows copied at a time by :func:`_rows`
STRIP_ROWS = 64


def _rows(img: Image.Image) -> bytearray:
    """*img*'s pixels, packed (1 or 3 bytes a pixel), in one buffer: the copy the budget prices.

    Copied a strip at a time: ``img.tobytes()`` of the whole image would hold its pieces and their join at once,
    twice the copy (``tests/test_image_budget.py`` measured 400 MB against 386 priced on a 7900x7900 PNG).
    """
    width, height = img.size
    line = width * BANDS[img.mode]
    data = bytearray(line * height)
    for top in range(0, height, STRIP_ROWS):
        bottom = min(top + STRIP_ROWS, height)
        data[top * line:bottom * line] = img.crop((0, top, width, bottom)).tobytes()
    return data


def decode_resampled(fp: BinaryIO, scale: int, mode: str, decoded: tuple[int, int], out_size: tuple[int, int],
                     resample: Image.Resampling) -> Image.Image | None:
    """The JPEG in *fp* decoded at 1/*scale* (to *decoded*, in *mode*) and resampled to *out_size*.

    ``None`` when libvips might judge the file otherwise than Pillow (see the module doc): a frame or a
    header it does not take, or any error of libvips's. Pillow then decodes it, and refuses or renders it.

    The bytes are read from the file of *fp*'s descriptor, at offsets of libvips's own (:func:`_source`): *fp*'s
    position, which Pillow relies on, is left alone, and they are the bytes Pillow's header checks passed.
    """
    fd = fp.fileno()
    if not _layout(fd):
        return None
    vips = _vips()
    kernel = KERNELS[resample]
    # the source (its descriptor, or its callbacks) lives as long as this Python object: it must outlive every
    # image made from it
    source = _source(vips, fd)
    image = None
    try:
        image = vips.Image.jpegload_source(source, shrink=scale, access="sequential", fail_on="truncated")
        if (image.width, image.height, image.bands, image.format) != (*decoded, BANDS[mode], "uchar"):
            return None  # not the frame Pillow read
        if out_size[0] != decoded[0]:
            image = image.reduceh(decoded[0] / out_size[0], kernel=kernel)
        if out_size[1] != decoded[1]:
            image = image.reducev(decoded[1] / out_size[1], kernel=kernel)
        if (image.width, image.height) != out_size:
            raise AssertionError(f"libvips made {image.width}x{image.height}, not {out_size[0]}x{out_size[1]}")
        pixels = image.write_to_memory()
    except vips.Error:
        return None
    finally:
        image = None  # the decoder may read while it closes: while the source is alive
    del source
    return Image.frombytes(mode, out_size, pixels)


def _layout(fd: int) -> bool:
    """Whether the JPEG's frame and structure are ones libvips and Pillow judge alike (see the module doc)."""
    if os.pread(fd, 2, 0) != b"\xff\xd8":
        return False
    pos, progressive, components = 2, None, 0
    while pos < MAX_HEADER_BYTES:
        head = os.pread(fd, 4, pos)
        if len(head) < 4 or head[0] != 0xFF:
            return False  # cut short, or bytes between segments
        marker, length = head[1], int.from_bytes(head[2:], "big")
        if marker == 0xFF:  # a fill byte
            pos += 1
            continue
        if length < 2:
            return False
        if marker == 0xDA:
            if progressive is None:
                return False
            scan_components = os.pread(fd, 1, pos + 4)
            if progressive or not scan_components or scan_components[0] < components:
                return True  # several scans: libjpeg reads them all, to EOI, before the first row
            return _marker_after(fd, pos + 2 + length) == _EOI
        if marker in SOF_MARKERS and progressive is None:
            frame = os.pread(fd, 6, pos + 4)
            if len(frame) < 6:
                return False
            progressive, components = SOF_MARKERS[marker], frame[5]
        elif marker not in HEADER_MARKERS:
            return False  # another frame type, a second SOF, a marker Pillow and libjpeg may read apart
        pos += 2 + length
    return False


def _marker_after(fd: int, pos: int) -> int | None:
    """The first marker libjpeg meets in the entropy-coded data from *pos* (``None``: the file ends first)."""
    carry = b""
    while chunk := os.pread(fd, _CHUNK, pos):
        pos += len(chunk)
        data = carry + chunk
        if match := _MARKER.search(data):
            return data[match.end() - 1]
        carry = b"\xff" if data.endswith(b"\xff") else b""
    return None


def _source(vips, fd: int):
    """A libvips source reading the file of *fd* at offsets of its own.

    The file is opened again through ``/proc/self/fd`` (the same inode, whatever its path has become): libvips
    reads that descriptor itself. Where there is no ``/proc``, or libvips cannot take the descriptor, Python
    reads for libvips (``pread`` callbacks), which costs some 7 ms more on a 12 MP photo.
    """
    try:
        own = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return _pread_source(vips, fd)
    try:
        return vips.Source.new_from_descriptor(own)  # libvips reads a duplicate of it
    except vips.Error:  # it could not duplicate the descriptor (the process's limit of open files)
        return _pread_source(vips, fd)
    finally:
        os.close(own)


def _pread_source(vips, fd: int):
    """A libvips source whose reads are Python's ``pread`` of *fd*."""
    source = vips.SourceCustom()
    position = 0

    def read(size: int) -> bytes:
        nonlocal position
        chunk = os.pread(fd, size, position)
        position += len(chunk)
        return chunk

    def seek(offset: int, whence: int) -> int:
        nonlocal position
        position = offset + (0, position, os.fstat(fd).st_size)[whence]
        return position

    source.on_read(read)
    source.on_seek(seek)
    return source


def version() -> str:
    """libvips's version, for the provenance of what it resampled."""
    vips = _vips()
    return f"libvips {vips.version(0)}.{vips.version(1)}.{vips.version(2)}"


def load() -> None:
    """Load libvips now (the worker, at boot) rather than in the first render that needs it."""
    _vips()


def _vips():
    global _pyvips
    if _pyvips is None:
        import pyvips

        pyvips.cache_set_max(0)
        _pyvips = pyvips
    return _pyvips
