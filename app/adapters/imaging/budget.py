"""The memory budget: what rendering an image will cost, priced from its header.

A small file can decode to a lot of memory: an 8000x8000 palette PNG with
transparency is 63-75 KB on disk and one job's renders peaked at 598 MB
(631 MB in the issue); an 8000x8000 float TIFF of 375 KB at 602 MB (813 MB
in the issue). Pixel and side limits do not
see that (both are inside them), so before a single pixel is decoded
:func:`estimate` prices the render from what the header says, and
:func:`check` refuses anything over ``Limits.max_decode_bytes`` with
:class:`~app.errors.ImageTooLarge` (``image_too_large``: 413 at upload,
``failed`` in the worker).

The estimate is the peak of bytes alive at once. A render goes through
three phases (decode; convert and resample; encode, after the file and the
full-size images are released), so it is the largest of their sums, made
of four kinds of cost:

1. **The decode.** Pillow stores ``1``/``L``/``P`` at 1 byte a pixel,
   ``I;16*`` at 2 and every other mode (``RGB`` included, and ``LA``) at 4.
   For JPEG the pixels are the draft size: libjpeg decodes at 1/2, 1/4 or
   1/8 scale, so a 24 MP photo's thumbnail is priced (and decoded) at a
   fraction of its size.
2. **What the decoder keeps besides.** A progressive (or multi-scan) JPEG
   makes libjpeg hold the whole image's DCT coefficients, 2 bytes a sample
   at *full* size whatever the draft scale; libtiff reads a whole strip or
   tile into a buffer of its own (a TIFF written as one strip doubles the
   cost); WebP goes through libwebp's canvas, its copy of the previous
   frame and a bytes copy before Pillow's own image, and a lossless stream
   (the image's, or its alpha's) has libwebp build the tables of every
   group of prefix codes it names first (:mod:`app.adapters.imaging.vp8l`:
   a 1024x1024 naming 65,536 groups took 367 MB); an RLE BMP is
   inflated into a byte array and copied once more. A PNG (interlaced or
   not) and a GIF decode straight into the image. HEIC and AVIF decode to
   the codec's picture (its planes priced from the bit depth and chroma
   subsampling in the container, :mod:`app.adapters.imaging.bmff`), then
   to interleaved 8-bit RGB(A) in a buffer of the library's own, copied
   into Pillow's image: libheif's buffers (and its two copies of the file)
   are released once the image is loaded, while the AVIF decoder keeps its
   picture and the file, and Pillow's plugin copies the RGB buffer once
   more as bytes.
3. **The conversions at full size** (:mod:`app.adapters.imaging.colour` and
   ``Image.resize``): a palette with transparency is expanded to RGBA,
   its alpha channel is read, then it becomes RGB, or RGBa, premultiplied,
   for resampling; 16-bit and float grey go through ``I`` and a scaled
   copy before 8 bits. The table :data:`FULL_SIZE_BYTES` gives the peak,
   decoded image included, in bytes per pixel for each mode; it follows the
   code and was checked against measured peaks
   (``tests/test_image_budget.py`` keeps the estimate an upper bound).
4. **The resample and the output**: the integer ``reduce()`` copy, the
   intermediate of the two-pass LANCZOS (and its copy for libvips, where
   libvips makes the vertical pass), then a few output-sized copies
   (sRGB, transpose) and the encoder's memory (AVIF's is the largest, then
   WebP's).

:func:`~app.adapters.imaging.probe.probe` (upload, and the worker's inspect step)
does not know which derivative will be asked for, so it prices the
derivatives in :data:`PROBE_SPECS`, which cover every registered pipeline
(a test keeps it so), and takes the largest. :func:`~app.adapters.imaging.render.render`
prices its own spec again before decoding, so a pipeline with larger
derivatives is still held to the budget: it fails there as
``image_too_large`` instead of taking the worker's memory.

The budget holds for the *process*, not only for one render: a worker runs
several threads, and four renders each just under the budget would need
four budgets at once. :data:`RESERVATIONS` makes a render reserve its
price before it decodes and wait (first come, first served) while the
renders already running hold more than ``max_decode_bytes`` minus that
price. Small renders still run side by side; a large one runs alone.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

from PIL import Image

from app.errors import DecompressionBomb, ImageTooLarge

from . import bmff, icc, libvips, segments, vp8l
from ._translate import MALFORMED_ERRORS
from .geometry import REDUCING_GAP, Geometry, VariantSpec, plan

MIB = 1024 * 1024

#: Default of ``Limits.max_decode_bytes`` / ``ATTACHE_MAX_DECODE_BYTES``:
#: large enough for the photos people do upload (a 24 MP RGBA PNG is priced
#: 267 MiB, a 20 MP 16-bit TIFF 270 MiB, a 12 MP WebP 239 MiB), far below
#: the hostile files that decode huge (an 8000x8000 palette PNG with
#: transparency, 75 KB, is priced 652 MiB; an 8000x8000 float TIFF 666 MiB).
#: A worker is about 50 MB before it renders, so its peak stays near 340 MB
#: at worst, the budget being shared by its threads (plus at most 24 MiB of
#: resampled images kept for the next variant, :mod:`.shared`).
DEFAULT_MAX_DECODE_BYTES = 288 * MIB

#: The derivatives the probe prices (the largest of each kind any registered
#: pipeline renders; the cost grows with the target, and for ``cover`` a
#: smaller target can cost more on a panorama, so each kind is priced).
PROBE_SPECS: tuple[VariantSpec, ...] = (
    VariantSpec("probe-fit", "fit", 512, 512),
    VariantSpec("probe-cover", "cover", 512, 512),
    VariantSpec("probe-bounded", "bounded", 2048, 2048, output="webp"),
)

#: Fixed overhead of a render on top of the pixels (decoder state, Python
#: objects, encoder buffers), bytes.
FIXED_BYTES = 8 * MIB

# Peak bytes per pixel at full (decoded) size while the image is converted to
# its working mode and handed to resize(), decoded image included:
# (without transparency, with transparency). See colour.to_working_mode.
FULL_SIZE_BYTES: dict[str, tuple[int, int]] = {
    "1": (2, 2),  # 1 -> L
    "L": (1, 10),  # tRNS: L -> LA -> alpha -> RGBA -> RGBa (resize)
    "P": (5, 9),  # P -> RGB; tRNS: P -> RGBA, alpha, -> RGB or RGBa
    "RGB": (4, 13),  # tRNS: RGB -> RGBA, alpha, -> RGB or RGBa
    "RGBA": (9, 9),  # alpha channel, -> RGB or RGBa
    "LA": (13, 13),  # alpha channel, -> RGBA -> RGBa
    "PA": (13, 13),
    "La": (13, 13),
    "RGBa": (13, 13),
    "CMYK": (4, 4),  # resampled as is; sRGB on the small image
    "I;16": (12, 16),  # -> I, scaled copy, -> L (tRNS: + LA, alpha, merge)
    "I;16L": (12, 16),
    "I;16B": (12, 16),
    "I;16N": (12, 16),
    "I": (10, 16),  # scaled copy, -> L
    "F": (14, 16),  # NaN or infinite pixels: a finite mask, a float filled from it, -> scaled copy, -> L
}
#: Copies of an image's metadata alive while it is open, per byte of the file's (the segments Pillow keeps, the
#: ICC profile joined from them, the parsed EXIF...): 64x64 images carrying 45 MB of ICC profile or XMP took 92-189
#: MB a render (an adversarial run). Kept with the image from its decode to its last conversion.
METADATA_COPIES = 4
#: Copies of a HEIF's or AVIF's Exif and XMP items alive while it is opened and its orientation read, per byte of
#: the items (libheif's, pillow-heif's, Pillow's parse of the Exif...): a 40 MB Exif item took 241 MB a probe, a
#: 40 MB XMP one 122-161 MB (a re-attack); reserved before the open (``probe.open_checked``), and priced
HEIF_METADATA_COPIES = 7


def heif_opening_bytes(layout) -> int:
    """What opening a HEIF or AVIF copies of its colour profiles and metadata items (a :class:`bmff.Layout`),
    before any price is made: the probe and the render reserve it before they open the file, the provenance
    read before it reads the metadata again."""
    return METADATA_COPIES * layout.profile_bytes + HEIF_METADATA_COPIES * layout.metadata_bytes
#: Any other mode (YCbCr, RGBX, LAB, HSV...) is converted to RGB.
OTHER_MODE_BYTES = 8
#: Bytes per *output* pixel after the resample: the resized image, its sRGB
#: and upright copies, the encoder's (JPEG/PNG); libwebp's encoder keeps
#: ARGB and YUV pictures and its own work buffers (measured: ~16 B/px).
OUTPUT_BYTES = 12
WEBP_OUTPUT_BYTES = 22
#: libavif's YUV picture and libaom's encoder state, with the images above
#: (measured: 40 B/px for a 256 px output, 24 B/px at 2048 px).
AVIF_OUTPUT_BYTES = 40
#: What Pillow keeps for each strip or tile a TIFF lists (its tile tuple; measured: some 270 bytes).
TIFF_TILE_BYTES = 300
#: The alpha plane of a HEIC or AVIF picture (a second, grey picture), at 16 bits.
ALPHA_PICTURE_BYTES = 2
#: dav1d's own frame state besides the picture, per pixel (measured: under 1 B/px
#: for 12 and 24 MP AVIFs, on two threads).
AV1_DECODER_BYTES = 1
#: What each AV1 decoder (dav1d instance) past the first holds whatever its picture's size, and more for each thread
#: Pillow gives it (``AvifImagePlugin``'s max threads: the CPUs the process may run on): libavif opens one for each
#: tile of a grid whose tiles differ in operating point (:attr:`bmff.Layout.av1_decoders`), all alive until the
#: image is done. Measured here, split grids of 256 and 1,024 64x64 tiles less the same grids unsplit, per decoder:
#: 0.36 MiB at 1 thread, 0.63 at 2 (this machine's count), 1.15 at 4, 2.18 at 8, some 0.10 MiB and 0.26 a thread.
#: Unpriced, a 134 KB grid of 3,072 tiles took 3.2 GB of a worker priced 122 MB, and one of 1,024 tiles (45 KB)
#: 684-703 MB priced 46, holding 2,050 threads (an adversarial run). The first decoder is in :data:`FIXED_BYTES`.
AV1_DECODER_INSTANCE_BYTES = 128 * 1024
AV1_DECODER_THREAD_BYTES = 280 * 1024
#: libavif's clamp on the threads it gives dav1d (``DAV1D_MAX_THREADS``).
DAV1D_MAX_THREADS = 256
#: The most dav1d threads one image's decoders may start together, beyond its colour's and its alpha's (two, what
#: a photo needs, however many CPUs give each its threads): a split grid's 1,024 decoders held 2,050 threads at
#: once (an adversarial run), threads a worker shares with its other renders. More is a bomb.
MAX_AV1_DECODER_THREADS = 256
#: the pictures each tile's own decoder holds until the image is done, when libavif opens one a tile
#: (``bmff.Layout.av1_decoders`` above 1), at their rows' padded size (``bmff.Layout.padded_coded_bytes``), beside
#: the grid's canvas rather than instead of it: the decoded frame, its film-grained copy (dav1d applies grain to a
#: picture of its own) and libavif's view of it. A one-row grid of 22 tiles of 130x8192 at 4:4:4 with film grain,
#: every second tile tagged with operating point 1, 1,969 bytes, was priced 268 MB and took 537 MB a render (632 MB
#: of a worker: an adversarial run); measured 1.5-2.9 such pictures a tile, so 4: no encoder writes such a grid
SPLIT_TILE_PICTURES = 4
#: Bytes per pixel of the deepest HEIC pictures libheif turns into 8-bit RGB(A) directly: a deep (10- or 12-bit)
#: 4:2:0 one, or an 8-bit 4:4:4 one. A deeper one (deep 4:2:2 at 4, deep 4:4:4 at 6) goes through RGB(A) of 16
#: bits a sample first, twice the 8-bit RGB(A), held with the coded picture and the 8-bit copy (measured at 12 MP:
#: 15.0 bytes a pixel for 4:4:4 at 12 bits, 13.0 for 4:2:2 at 10, 7.7 for 4:2:0 at 10 and 9.0 for 4:4:4 at 8;
#: 323 MB was taken by a 22 MP one priced 274 in an adversarial run).
HEIF_DIRECT_RGB_PICTURE_BYTES = 3
#: The resized image while the full-size ones are still alive (RGBA is
#: resampled as premultiplied RGBa and converted back: two copies).
RESIZED_BYTES = 8


@dataclass(frozen=True)
class Estimate:
    """The priced peak of one render, in bytes, and what it is made of."""

    total: int
    decoded_size: tuple[int, int]
    mode: str
    parts: tuple[tuple[str, int], ...]

    @property
    def output(self) -> int:
        """The output phase alone: what encoding pixels already made (shared) costs."""
        return dict(self.parts)["output"] + FIXED_BYTES

    def describe(self) -> str:
        shown = ", ".join(f"{name} {value / MIB:.0f} MB" for name, value in self.parts)
        return f"about {self.total / MIB:.0f} MB at the peak ({shown})"


def pixel_bytes(mode: str) -> int:
    """Bytes per pixel Pillow uses to store *mode*."""
    if mode in ("1", "L", "P"):
        return 1
    if mode.startswith("I;16"):
        return 2
    return 4


def check(img: Image.Image, family: str, fp: BinaryIO, limits, spec: VariantSpec | None = None, *,
          metadata: int | None = None) -> Estimate:
    """Price the render (or, without *spec*, the costliest of :data:`PROBE_SPECS`); ``metadata``, the file's
    :func:`segments.metadata_bytes` if already known (:func:`segments.check` gives it).

    :raises ImageTooLarge: the estimate exceeds ``limits.max_decode_bytes``.
    """
    est = estimate(img, family, fp, spec, metadata=metadata)
    if est.total > limits.max_decode_bytes:
        width, height = img.size
        raise ImageTooLarge(
            f"decoding this {width}x{height} {family} ({img.mode}) image would need "
            f"{est.describe()}; the limit is {limits.max_decode_bytes / MIB:.0f} MB"
        )
    return est


def estimate(img: Image.Image, family: str, fp: BinaryIO, spec: VariantSpec | None = None, *,
             metadata: int | None = None) -> Estimate:
    """The largest priced peak over the derivatives asked for (see the module doc)."""
    specs = (spec,) if spec is not None else PROBE_SPECS
    if family == "JPEG":
        from .probe import read_orientation  # probe imports this module

        orientations: tuple[int, ...] = (read_orientation(img, header_only=True),)
        decoding = _jpeg_coefficient_bytes(img, fp)
    else:
        orientations = (1, 6)  # known only after decoding: price both axes
        decoding = 0
    transient, kept = _decoder_bytes(img, family, fp)
    if metadata is None:
        metadata = segments.metadata_bytes(fp, family)
    if family in ("HEIF", "AVIF"):  # the container's profile, Exif, XMP and other metadata items, copied by the
        # decoder and by Pillow (a 47 MB profile: 184 MB a probe, priced 56; a 40 MB ``uri `` item 160 MB a render,
        # priced 88: re-attacks)
        metadata += sum(len(img.info.get(key) or b"") for key in ("icc_profile", "exif", "xmp"))
        metadata += sum(len(item.get("data") or b"") for item in img.info.get("metadata") or ()
                        if isinstance(item, dict))
    decoder = (transient, kept + METADATA_COPIES * metadata + _icc_transform_bytes(img))
    if family == "TIFF" and _turned_upright_on_load(img):
        # a full-size copy beside the decoded image and the decoder's buffer (a scanner's 6400x6400 RGB TIFF of
        # Orientation 6 took 430 MiB a render priced 281, an adversarial run)
        decoding += img.size[0] * img.size[1] * pixel_bytes(img.mode)
    best: Estimate | None = None
    for one in specs:
        for orientation in orientations:
            est = _price(img, family, one, plan(img.size, orientation, one), decoder, decoding)
            if best is None or est.total > best.total:
                best = est
    assert best is not None
    return best


#: the orientations Pillow's ``exif_transpose`` turns (its table; 6.0 and 6/1 are 6 to it)
_TURNED = (2, 3, 4, 5, 6, 7, 8)
#: where :meth:`Image.getexif` finds an orientation in the XMP (its pattern)
_XMP_ORIENTATION = r'tiff:Orientation(="|>)([0-9])'


def _turned_upright_on_load(img: Image.Image) -> bool:
    """Whether Pillow will turn this TIFF upright as it ends its load (``TiffImageFile.load_end``: ``exif_transpose``
    in place), from the orientation Pillow itself reads: tag 274 of any type it reads (a FLOAT 6.0, a RATIONAL
    6/1), or the XMP's ``tiff:Orientation`` where there is no tag. Read from the header alone, the tag's values
    bounded by the segments check (:meth:`Image.getexif` would read the directory's values again, a copy of them
    all); an orientation that cannot be read is priced as turned. A walk of the budget's own saw neither, and
    6400x6400 TIFFs took 446-477 MB of a worker, priced 166 MiB (a re-attack)."""
    try:
        tags = getattr(img, "tag_v2", None)
        orientation = tags.get(274) if tags is not None else None  # the first directory, as Image.getexif reads it
        if orientation is None:  # Image.getexif's own fallback, on the XMP Pillow read with the header
            xmp = img.info.get("XML:com.adobe.xmp") or img.info.get("xmp")
            pattern = _XMP_ORIENTATION if isinstance(xmp, str) else _XMP_ORIENTATION.encode()
            match = re.search(pattern, xmp) if xmp else None
            orientation = int(match[2]) if match else 1
        return orientation in _TURNED
    except MALFORMED_ERRORS:
        return True


def _price(img: Image.Image, family: str, spec: VariantSpec, geometry: Geometry,
           decoder: tuple[int, int], decoding: int) -> Estimate:
    """The peak of the three phases of a render; they follow each other, so they do not add up.
    ``decoding``: what is held only until the decode ends (a JPEG's coefficients, a TIFF's upright copy).

    * decode: the decoded image and the decoder's buffers;
    * convert and resample: the full-size conversions (decoded image
      included), the resample and the resized image, plus whatever the
      decoder keeps until the file is closed;
    * output (the file is closed, the full-size images are gone): sRGB,
      transpose and the encoder.
    """
    width, height = img.size
    mode = img.mode
    box = geometry.box
    if family == "JPEG" and decodes_scaled(img):
        # Image.draft's own arithmetic (JpegImagePlugin.draft)
        want_w, want_h = geometry.decode_size
        ratio = min(width // want_w, height // want_h)
        scale = next((s for s in (8, 4, 2) if ratio >= s), 1)
        decoded = ((width + scale - 1) // scale, (height + scale - 1) // scale)
        box = tuple(v / scale for v in box)
    else:
        decoded = (width, height)
    pixels = decoded[0] * decoded[1]
    transient, kept = decoder
    transparent = 1 if _has_transparency(img) else 0
    per_pixel = FULL_SIZE_BYTES.get(mode, (OTHER_MODE_BYTES, OTHER_MODE_BYTES))[transparent]
    grey = _grey_working_mode(mode, transparent)
    out_w, out_h = geometry.out_size
    output_bytes = _output_bytes(spec, bool(transparent))
    parts = (
        ("decode", pixels * pixel_bytes(mode) + transient + decoding + kept),
        ("conversions and resample",
         pixels * per_pixel + kept + _resample_bytes(box, geometry.out_size, 1 if grey else 4)
         + _vertical_pass_copy_bytes(mode, transparent, box, geometry.out_size, grey)
         + RESIZED_BYTES * out_w * out_h),
        ("output", out_w * out_h * output_bytes),
    )
    return Estimate(max(v for _, v in parts) + FIXED_BYTES, decoded, mode, parts)


def _output_bytes(spec: VariantSpec, transparent: bool) -> int:
    """Bytes a pixel of the output phase: the encoder's, on top of the output-sized image."""
    if spec.output == "avif":
        return AVIF_OUTPUT_BYTES
    if spec.output == "webp" or (spec.kind == "bounded" and transparent):
        return WEBP_OUTPUT_BYTES
    return OUTPUT_BYTES


def output_price(spec: VariantSpec, image: Image.Image) -> int:
    """The output phase of a render (:attr:`Estimate.output`) for pixels already made: what encoding *image*, the
    upright output-sized pixels another render made and shares, costs."""
    return image.width * image.height * _output_bytes(spec, _has_transparency(image)) + FIXED_BYTES


def _icc_transform_bytes(img: Image.Image) -> int:
    """What LittleCMS holds to link the transform from the image's ICC profile to sRGB (:mod:`.icc`: a 64x64 TIFF
    carrying a 49.7 MB lookup table took 522 MB a render priced 198, four 1.1 GB in a worker, ``ready``: an
    adversarial run of 2026-12-07); a profile it would take too long or too much to link is a bomb."""
    profile = img.info.get("icc_profile")
    return icc.transform_bytes(profile) if isinstance(profile, bytes) else 0


def _has_transparency(img: Image.Image) -> bool:
    return img.info.get("transparency") is not None or img.mode in ("RGBA", "LA", "PA", "La", "RGBa")


def _grey_working_mode(mode: str, transparent: int) -> bool:
    """Whether to_working_mode gives ``L`` (1 byte a pixel) rather than a 4-byte mode."""
    return not transparent and (mode in ("1", "L", "I", "F") or mode.startswith("I;16"))


def _resample_bytes(box: tuple[float, ...], out_size: tuple[int, int], bpp: int) -> int:
    """``resize(..., LANCZOS, box, reducing_gap)``: reduce copy, pass-one intermediate, outputs."""
    box_w, box_h = box[2] - box[0], box[3] - box[1]
    out_w, out_h = out_size
    factor_x = int(box_w / out_w / REDUCING_GAP) or 1
    factor_y = int(box_h / out_h / REDUCING_GAP) or 1
    reduced = 0
    rows = math.ceil(box_h)
    if factor_x > 1 or factor_y > 1:
        # the "safe box" reduce() works on is the box plus the filter support
        reduced = math.ceil(box_w / factor_x + 8) * math.ceil(box_h / factor_y + 8)
        rows = math.ceil(box_h / factor_y + 8)
    return bpp * (reduced + out_w * rows)


def _vertical_pass_copy_bytes(mode: str, transparent: int, box: tuple[float, ...], out_size: tuple[int, int],
                              grey: bool) -> int:
    """A vertical pass made by libvips (:func:`.libvips.resize`): the horizontal pass's rows copied for it, 1 or 3
    bytes a pixel, alive with them (priced wherever the working mode may be ``L`` or ``RGB``)."""
    out_w, out_h = out_size
    if transparent or mode == "CMYK" or out_w * out_h < libvips.MIN_OUTPUT_PIXELS:
        return 0
    return (1 if grey else 3) * out_w * math.ceil(box[3] - box[1])


def decodes_scaled(img: Image.Image) -> bool:
    """Whether libjpeg decodes this JPEG at 1/2, 1/4 or 1/8 when asked (``Image.draft``): not a lossless one (SOF3,
    which has no quantization tables), whose draft broke its decode ("broken data stream": every variant of an
    8000x4000 lossless JPEG failed ``corrupt_image``, an adversarial run); it is decoded, and priced, whole."""
    return bool(getattr(img, "quantization", None))


def _decoder_bytes(img: Image.Image, family: str, fp: BinaryIO) -> tuple[int, int]:
    """Memory the decoder holds besides the decoded image: (while decoding, until the file is closed)."""
    width, height = img.size
    pixels = width * height
    if family in ("HEIF", "AVIF"):
        layout = bmff.read_layout(fp)
        picture, rgb = layout.picture_bytes, 3
        if _has_transparency(img):
            picture += ALPHA_PICTURE_BYTES
            rgb = 4
        if family == "HEIF":
            if layout.picture_bytes > HEIF_DIRECT_RGB_PICTURE_BYTES:
                rgb *= 3  # the 8-bit RGB(A) and the 16-bit one before it
            # the file (pillow-heif's bytes and libheif's copy), the pictures, canvases and the RGB(A), all held
            # together and released once the image is loaded; each coded picture (an alpha item's among them)
            # and each grid's or overlay's canvas at its own size, whatever crop, grid, overlay or alpha makes of
            # it (Layout.heif_bytes); at least the image's pixels as its pictures; the RGB(A) of the largest picture
            # or canvas, made before a crop makes it small
            pictures = max(layout.heif_bytes, pixels * layout.picture_bytes)
            profiles = METADATA_COPIES * layout.profile_bytes  # each image's copy of its profile, pillow-heif's
            return math.ceil(pictures + max(layout.largest_picture, pixels) * rgb) + 2 * layout.file_bytes, profiles
        # libavif's RGB(A) copied to bytes; the pictures and the file stay with the decoder. The pictures are of
        # the frames the AV1 sequence headers allow (each tile's of a grid, an alpha item's, each at its own bytes
        # per pixel), a decoder's state for each, and a frame larger than ``ispe`` says is scaled to it, a copy more
        largest = layout.coded[0] * layout.coded[1] if layout.coded else 0
        pictures = max(layout.coded_bytes, pixels * picture)
        if layout.av1_decoders > 1:  # each tile's pictures held by its own decoder beside the grid's canvas
            pictures = pixels * picture + layout.padded_coded_bytes * SPLIT_TILE_PICTURES
        decoders = max(layout.coded_pixels, pixels) * AV1_DECODER_BYTES + _av1_instance_bytes(layout.av1_decoders)
        scaled = pixels * picture if largest > pixels else 0
        return pixels * rgb, math.ceil(pictures + decoders + scaled) + layout.file_bytes
    if family == "WEBP":
        # libwebp's canvas and its copy of the previous frame (RGBA) and the
        # file twice, read whole by Pillow and copied by the decoder (a lossless
        # photo's chunk padded with 45 MB rendered in 231 MB priced 193; a 64x64
        # padded to 48 MB in 96 MB priced 56: adversarial runs), all kept by the
        # open image; while the first frame decodes, the frame handed to Pillow
        # as bytes (let go once it is loaded: 12 bytes a pixel held after the
        # load with the pixels, 16 at its peak, measured at 16 MP; kept, it
        # priced honest 14-18 MP photos past the budget, 330 MB for a 252 MB
        # peak: an adversarial run) and the prefix-code tables of its lossless
        # streams
        return vp8l.webp_table_bytes(fp) + 4 * pixels, 2 * 4 * pixels + 2 * _file_size(fp)
    if family == "BMP" and img.info.get("compression") in (1, 2):  # RLE8 / RLE4
        return 2 * pixels, 0  # PyDecoder: a bytearray of the pixels, then bytes()
    if family == "TIFF":
        # and the tile Pillow keeps for each strip or tile it lists (131,072 tiles of 1x1 cost 37 MB: a run)
        return _tiff_buffer_bytes(img), TIFF_TILE_BYTES * len(img.tile)
    return 0, 0


def av1_threads() -> int:
    """The threads each AV1 decoder is given: Pillow's ``AvifImagePlugin`` max threads (its
    ``DEFAULT_MAX_THREADS``, else the CPUs the process may run on), as libavif clamps them."""
    try:
        from PIL import AvifImagePlugin

        threads = AvifImagePlugin._get_default_max_threads()
    except (ImportError, AttributeError):  # another Pillow: its default then, the CPU count
        threads = os.cpu_count() or 1
    return min(max(1, threads), DAV1D_MAX_THREADS)


def _av1_instance_bytes(decoders: int) -> int:
    """What an AVIF's AV1 decoders past the first hold, whatever their pictures' size; more threads than
    :data:`MAX_AV1_DECODER_THREADS` for decoders past two is a bomb."""
    threads = av1_threads()
    if decoders > 2 and decoders * threads > MAX_AV1_DECODER_THREADS:
        raise DecompressionBomb(f"an AVIF decoded by {decoders} AV1 decoders of {threads} threads each, more than "
                                f"{MAX_AV1_DECODER_THREADS} threads")
    return max(0, decoders - 1) * (AV1_DECODER_INSTANCE_BYTES + threads * AV1_DECODER_THREAD_BYTES)


def _file_size(fp: BinaryIO) -> int:
    position = fp.tell()
    try:
        return fp.seek(0, 2)
    finally:
        fp.seek(position)


def _tiff_buffer_bytes(img: Image.Image) -> int:
    """libtiff reads one strip or tile at a time into a buffer of that size.

    Pillow's RGBA path (for YCbCr, where libtiff undoes the subsampling)
    needs 4 bytes a pixel for the strip's or tile's rows across the whole
    image, so for YCbCr the larger of the raw and RGBA sizes is counted; any other TIFF is read raw (a 1-bit G4 scan of
    4960x7016 in one strip was priced 166 MB to decode against 38 MB
    measured, four bytes a pixel for a buffer of one bit: a seventh run).
    """
    tags = getattr(img, "tag_v2", {})
    width, height = img.size
    try:
        bits = sum(_as_tuple(tags.get(258, (1,)))) or 1
        if len(_as_tuple(tags.get(258, (1,)))) == 1:
            bits *= int(tags.get(277, 1))
        tile_w, tile_h = tags.get(322), tags.get(323)
        if tile_w and tile_h:
            cols, rows = int(tile_w), int(tile_h)
        else:
            cols, rows = width, min(height, int(tags.get(278, height)) or height)
        cols, rows = max(1, cols), max(1, rows)
    except (TypeError, ValueError, OverflowError):
        cols, rows, bits = width, height, 32  # unreadable layout: assume one strip
    raw = rows * math.ceil(cols * bits / 8)
    # the RGBA path reads a block of the whole image's width (TiffDecode.c, _decodeAsRGBA): a tile's rows of it
    # (YCbCr tiles 16 pixels wide and as tall as a 6400x6400 image took 313 MiB priced 173, an adversarial run)
    return max(raw, rows * width * 4) if tags.get(262) in (6, None) else raw


def _as_tuple(value) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (int(value),)


# libjpeg buffers the whole image's coefficients for progressive and
# lossless/differential modes, and for any image coded in more than one scan
# (first SOS lists fewer components): all but C0 baseline, C1 extended and C9
# arithmetic sequential sent in one scan.
_SINGLE_SCAN_SOF = {0xC0, 0xC1, 0xC9}
#: the most components a JPEG Pillow opens has (CMYK), priced where its frame cannot be read
_MOST_COMPONENTS = 4


def _jpeg_coefficient_bytes(img: Image.Image, fp: BinaryIO) -> int:
    """Bytes of DCT coefficients libjpeg keeps for the whole image, if it must.

    The segments up to the first SOS are walked as libjpeg walks them
    (:func:`~app.adapters.imaging.segments.jpeg_frame`); the file position
    is restored.
    """
    width, height = img.size
    position = fp.tell()
    try:
        frame = segments.jpeg_frame(fp)
    except MALFORMED_ERRORS:
        frame = segments.JpegFrame(None, (), 0)
    finally:
        fp.seek(position)
    if not frame.sampling:  # unknown layout: assume the worst, every component full size
        return _MOST_COMPONENTS * width * height * 2
    if frame.marker in _SINGLE_SCAN_SOF and frame.first_scan >= len(frame.sampling):
        return 0
    h_max = max(h for h, _ in frame.sampling)
    v_max = max(v for _, v in frame.sampling)
    blocks = 0
    for h, v in frame.sampling:
        cols = math.ceil(math.ceil(width * h / h_max) / 8)
        rows = math.ceil(math.ceil(height * v / v_max) / 8)
        blocks += (math.ceil(cols / h) * h) * (math.ceil(rows / v) * v)  # padded to whole MCUs
    return blocks * 64 * 2


class Reservations:
    """Bytes reserved by the renders of this process, bounded by the budget.

    ``with RESERVATIONS.scope(capacity) as reserve: ... reserve(n)`` blocks
    until *n* more bytes fit under *capacity* and this caller is first in
    line (so a large render is not starved by a stream of small ones); what
    was reserved is given back when the scope ends, or earlier by
    ``reserve.release()``. A caller that needs more than it holds releases
    first: holding part while waiting for the rest could wait forever on
    another caller doing the same.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()
        self.in_use = 0
        #: the most ever reserved at once (for tests and benchmarks)
        self.peak = 0

    @contextmanager
    def scope(self, capacity: int) -> Iterator[Hold]:
        hold = Hold(self, capacity)
        try:
            yield hold
        finally:
            hold.release()


class Hold:
    """What one scope of :class:`Reservations` holds: call it to reserve bytes, ``release()`` to give them back."""

    def __init__(self, pool: Reservations, capacity: int) -> None:
        self._pool = pool
        self._capacity = capacity
        self.held = 0

    def __call__(self, nbytes: int) -> None:
        pool = self._pool
        nbytes = max(0, min(nbytes, self._capacity))
        ticket = object()
        with pool._cond:
            pool._queue.append(ticket)
            try:
                pool._cond.wait_for(lambda: pool._queue[0] is ticket and pool.in_use + nbytes <= self._capacity)
            finally:
                pool._queue.remove(ticket)
                pool._cond.notify_all()
            pool.in_use += nbytes
            self.held += nbytes
            pool.peak = max(pool.peak, pool.in_use)

    def top_up(self, nbytes: int) -> bool:
        """Reserve *nbytes* more, only if they fit now and nobody is waiting: a caller that holds part never waits
        for the rest (it releases, then reserves the whole); ``False`` leaves the hold as it was."""
        pool = self._pool
        nbytes = max(0, min(nbytes, self._capacity - self.held))
        if not nbytes:  # held already: the open's reservation may be the whole price
            return True
        with pool._cond:
            if pool._queue or pool.in_use + nbytes > self._capacity:
                return False
            pool.in_use += nbytes
            self.held += nbytes
            pool.peak = max(pool.peak, pool.in_use)
            return True

    def release(self) -> None:
        if self.held:
            with self._pool._cond:
                self._pool.in_use -= self.held
                self.held = 0
                self._pool._cond.notify_all()


#: The process's reservations (one per process: the budget is per process), taken by renders, the provenance read
#: of their source and probes (the web's and the inspect step's).
RESERVATIONS = Reservations()
