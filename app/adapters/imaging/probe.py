"""Header-only inspection of an image file: what is it, how big, is it safe?

:func:`probe` is what the web upload runs before accepting a file and what
:func:`app.adapters.imaging.render.render` re-runs before decoding anything. It
reads headers only, never pixel data, so it is cheap even for a 24 MP photo
and safe against decompression bombs (a 44-byte GIF declaring 4 gigapixels
is refused in microseconds, with no allocation).

The checks, in order:

1. :func:`~app.adapters.imaging.sniff.sniff` the magic bytes. Unknown -> refuse,
   without handing the bytes to Pillow at all. For HEIF and AVIF the
   container is walked first (:mod:`app.adapters.imaging.bmff`): every size
   it declares goes through the checks of step 3, and a file cut short
   is :class:`CorruptImage`, before libheif or libavif parse it.
2. ``Image.open`` restricted to the sniffed plugin (``formats=[...]``), so
   a file that *claims* to be a PNG is only ever parsed by the PNG plugin.
   Pillow's own bomb check runs inside ``Image.open``; its warning band is
   escalated to an error (see :mod:`app.adapters.imaging._translate`).
   ``Image.MAX_IMAGE_PIXELS`` is deliberately left alone: it is process-wide
   (mutating it would race between worker threads), and setting it to
   ``None`` would disable Pillow's check for every other caller. The
   effective ceiling is therefore ``min(limits.max_pixels,
   Image.MAX_IMAGE_PIXELS)``, and if someone else disables Pillow's check
   the explicit ``max_pixels`` test below still stands.
3. Declared pixels > ``max_pixels`` -> :class:`DecompressionBomb`; a side
   > ``max_dimension`` -> :class:`ImageTooLarge`.
4. The format Pillow parsed must be one attache processes and must agree
   with the sniffed family (MPO counts as JPEG).
5. The memory budget (:mod:`app.adapters.imaging.budget`): the render's peak memory,
   priced from the size, pixel mode, transparency and format details in
   the header, > ``max_decode_bytes`` -> :class:`ImageTooLarge`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple

from PIL import ExifTags, Image, ImageFile, PngImagePlugin, TiffImagePlugin

from app.errors import CorruptImage, DecompressionBomb, ImageTooLarge, UnsupportedFormat

from . import (
    bmff,
    budget,
    plugins,  # noqa: F401  (registers pillow-heif's HEIF opener)
    segments,
)
from ._translate import MALFORMED_ERRORS, bomb_warnings_as_errors, frames_let_go, translate_open_error
from .geometry import VariantSpec
from .sniff import PROCESSED_FORMATS, SNIFF_BYTES, family_of, pillow_formats_for, sniff


@dataclass(frozen=True)
class Limits:
    """Size limits enforced from the header, before any pixel is decoded."""

    #: width * height above this -> :class:`DecompressionBomb`.
    max_pixels: int = 64_000_000
    #: a side longer than this -> :class:`ImageTooLarge`.
    max_dimension: int = 20_000
    #: the processed families accepted (a subset of PROCESSED_FORMATS) -> else :class:`UnsupportedFormat`.
    formats: tuple[str, ...] = tuple(PROCESSED_FORMATS)
    #: the priced peak memory of a render (see :mod:`app.adapters.imaging.budget`)
    #: above this -> :class:`ImageTooLarge`.
    max_decode_bytes: int = budget.DEFAULT_MAX_DECODE_BYTES


@dataclass(frozen=True)
class ImageInfo:
    """What the header says about an image.

    ``width``/``height`` are as stored (before EXIF orientation), as Pillow
    reports them. ``format`` is the processed family (an MPO reports
    ``"JPEG"``), ``content_type`` its MIME type. A HEIC is the exception
    that fits the rule: libheif rotates it while decoding, so it reports
    its upright size and orientation 1 (see :mod:`app.adapters.imaging.plugins`).

    ``orientation`` is the EXIF orientation 1..8 (1 when absent or
    invalid). It comes from EXIF or XMP metadata found in the header; for
    PNG that is the chunks *before* the pixel data, because reading an
    ``eXIf`` chunk stored after ``IDAT`` would mean decoding the image.
    :func:`~app.adapters.imaging.render.render` does look there.

    ``frames`` is the frame count when the header states it (JPEG/MPO,
    PNG/APNG, WebP, BMP, HEIF, AVIF) and ``None`` when counting would mean walking the
    file (GIF frames, TIFF pages). Walking GIF frames is also how Pillow
    meets bombs hidden in later frames.
    """

    format: str
    content_type: str
    width: int
    height: int
    orientation: int
    frames: int | None


def probe(path: str | os.PathLike[str], limits: Limits) -> ImageInfo:
    """Identify and size-check an image from its header only.

    :raises UnsupportedFormat: not one of the eight processed formats.
    :raises DecompressionBomb: declares more than ``limits.max_pixels`` (or
        trips Pillow's own bomb check, or a PNG text-chunk zip bomb).
    :raises ImageTooLarge: a side exceeds ``limits.max_dimension``, or
        rendering it would cost more than ``limits.max_decode_bytes``.
    :raises CorruptImage: the header is malformed, or a HEIF/AVIF file is cut short.
    """
    with budget.RESERVATIONS.scope(limits.max_decode_bytes) as reserve, frames_let_go(), \
            open_checked(path, limits, reserve=reserve) as (img, family, _priced):
        return ImageInfo(
            format=family,
            content_type=PROCESSED_FORMATS[family],
            width=img.width,
            height=img.height,
            orientation=read_orientation(img, header_only=True),
            frames=_declared_frames(img, family),
        )


def claimed_family(head: bytes, limits: Limits) -> str:
    """The accepted family the first :data:`SNIFF_BYTES` bytes claim, or :class:`UnsupportedFormat`.

    The first check of :func:`probe`, and all a resumable upload's first
    part is checked with before its other parts are sent.
    """
    family = sniff(head)
    if family is None:
        raise UnsupportedFormat("not a JPEG, PNG, GIF, WebP, TIFF, BMP, HEIC or AVIF image")
    if family not in limits.formats:
        raise UnsupportedFormat(f"{family} images are not accepted here (accepted: {', '.join(limits.formats)})")
    return family


class Opened(NamedTuple):
    """What :func:`open_checked` yields."""

    image: ImageFile.ImageFile
    family: str
    priced: budget.Estimate


@contextmanager
def open_checked(
    path: str | os.PathLike[str], limits: Limits, spec: VariantSpec | None = None, *,
    reserve: budget.Hold | None = None,
) -> Iterator[Opened]:
    """Open *path* with every probe check applied; yield ``(image, family, priced)``.

    The image is not loaded. The memory budget is priced for *spec*, or
    without one for every derivative a pipeline renders
    (:data:`~app.adapters.imaging.budget.PROBE_SPECS`). The file is opened once, by us, so the bytes
    that were sniffed are the bytes Pillow parses, and it is closed on exit.
    Shared by :func:`probe` and :func:`~app.adapters.imaging.render.render`.

    With *reserve* (a :data:`~app.adapters.imaging.budget.RESERVATIONS` hold), what opening the file copies of
    its metadata is reserved before the open: the web's probes and the inspect step's took it unreserved (a 50 MB
    upload that is mostly metadata cost the web three to four times that while it was probed, 951 MB for 8 at once:
    an adversarial run), and a render took it before reserving its price.
    """
    with open(path, "rb") as fp:
        family = claimed_family(fp.read(SNIFF_BYTES), limits)
        opening = _check_container(fp, limits) if family in ("HEIF", "AVIF") else 0
        metadata = segments.check(fp, family)  # what Pillow would walk in Python before the pixels, a JPEG's scans
        if reserve is not None:
            reserve(opening + budget.METADATA_COPIES * metadata)
        fp.seek(0)
        try:
            with bomb_warnings_as_errors():
                img = Image.open(fp, formats=pillow_formats_for(family))
        except (
            Image.DecompressionBombError,
            Image.DecompressionBombWarning,
            NotImplementedError,
            *MALFORMED_ERRORS,
        ) as exc:
            raise translate_open_error(exc) from exc
        with img:
            try:
                _check(img, family, limits)
                try:
                    priced = budget.check(img, family, fp, limits, spec, metadata=metadata)
                except MALFORMED_ERRORS as exc:
                    raise translate_open_error(exc) from exc
                yield Opened(img, family, priced)
            finally:
                _let_go(img)


def _let_go(img: Image.Image) -> None:
    """Drop what the open image keeps of the file's metadata, as the file closes: an error raised while it was open
    keeps it in its traceback's frames, and a failed render's future kept its error (the inspect step's renders of
    one corrupt AVIF carrying 40 MB of XMP held 1.4 GB until the step ended: an adversarial run)."""
    img.info.clear()
    img.applist = []  # a JPEG's APP segments
    img._exif = None
    if getattr(img, "_decoder", None) is not None:  # Pillow's AVIF and animated WebP decoders hold the whole file
        img._decoder = None


def _check(img: Image.Image, family: str, limits: Limits) -> None:
    width, height = img.size
    if width < 1 or height < 1:
        raise CorruptImage("image declares an empty size")
    _check_size(width, height, limits)
    if family_of(img.format) != family:
        raise UnsupportedFormat("image content does not match its signature")


def _check_container(fp: BinaryIO, limits: Limits) -> int:
    """Every size a HEIF/AVIF container declares is held to the limits; a cut-off file is corrupt. The bytes of
    colour profiles pillow-heif copies as it opens the file."""
    layout = bmff.read_layout(fp)
    for width, height in layout.sizes:
        _check_size(width, height, limits)
    if layout.truncated:
        raise CorruptImage("image data is truncated")
    # copied when pillow-heif opens it, before a price: the colour profiles, Exif and XMP
    opening = budget.heif_opening_bytes(layout)
    if opening > limits.max_decode_bytes:
        raise ImageTooLarge(f"opening this image would copy {opening / 2**20:.0f} MB of colour profiles and "
                            f"metadata; the limit is {limits.max_decode_bytes / 2**20:.0f} MB")
    return opening


def _check_size(width: int, height: int, limits: Limits) -> None:
    if width * height > limits.max_pixels:
        raise DecompressionBomb(
            f"image declares {width}x{height} = {width * height:,} pixels; "
            f"the limit is {limits.max_pixels:,}"
        )
    if max(width, height) > limits.max_dimension:
        raise ImageTooLarge(
            f"image is {width}x{height}; sides are limited to {limits.max_dimension} pixels"
        )


def read_orientation(img: Image.Image, *, header_only: bool) -> int:
    """EXIF orientation 1..8 of *img*; 1 if absent, invalid or unreadable.

    Pillow's ``getexif()`` also honours an XMP ``tiff:Orientation``. For an
    unloaded PNG, ``PngImageFile.getexif()`` would decode the whole image to
    reach a trailing ``eXIf`` chunk; with ``header_only`` the base-class
    implementation is used instead, which sees only what ``Image.open``
    read. Call this once per image object (Pillow caches the result).

    Broken EXIF is not a reason to refuse a photo whose pixels are fine: it
    just counts as "no orientation". The tag is read by us where the EXIF is
    (:func:`segments.exif_orientation`), and Pillow asked only when it is not
    there: Pillow decodes every value of the tag, however many the file
    declares.
    """
    try:
        declared = _declared_orientation(img)
        if declared is not None:
            return declared
        if header_only and isinstance(img, PngImagePlugin.PngImageFile):
            exif = Image.Image.getexif(img)
        else:
            exif = img.getexif()
        value = exif.get(ExifTags.Base.Orientation, 1)
    except MALFORMED_ERRORS:
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _declared_orientation(img: Image.Image) -> int | None:
    """The EXIF Orientation as :func:`segments.exif_orientation` reads it from the EXIF block Pillow has found, or
    None when there is none yet. A TIFF's is Pillow's to read (it turns the image as it loads it, and forgets the
    tag); the probe's walk bounded its values before Pillow opened the file."""
    if isinstance(img, TiffImagePlugin.TiffImageFile):
        return None
    exif = img.info.get("exif")
    if exif is None and "Raw profile type exif" in img.info:  # a PNG's, as Pillow's getexif() decodes it
        # kept where Pillow's getexif() looks first, so that it never splits the text itself
        exif = img.info["exif"] = _raw_profile(str(img.info["Raw profile type exif"]))
    if not isinstance(exif, bytes):
        return None
    for _ in range(2):  # Pillow takes off one "Exif\0\0" or two (a second one hid the tag from a walk that took one)
        exif = exif.removeprefix(b"Exif\x00\x00")
    return segments.exif_orientation(io.BytesIO(exif))


def _raw_profile(text: str) -> bytes:
    """The bytes of an ImageMagick raw profile (a name, a length, then hex over many lines) as Pillow's
    ``getexif()`` reads them, ``"".join(text.split("\\n")[3:])``, without its list: a str a line, 64-88 bytes for
    every 3 of text, took a 15 KB PNG's render to 45 MB priced 8 (an adversarial run)."""
    at = -1
    for _ in range(3):
        at = text.find("\n", at + 1)
        if at < 0:
            return b""
    return bytes.fromhex(text[at + 1:].replace("\n", ""))


def _declared_frames(img: Image.Image, family: str) -> int | None:
    if family in ("GIF", "TIFF"):
        return None
    # JPEG/MPO (MP index), PNG (acTL), WebP (ANIM header), HEIF (top-level
    # images) and AVIF (the sequence's sample count) set n_frames at open
    # time from the header; JPEG and BMP are single images.
    frames = getattr(img, "n_frames", 1)
    return frames if isinstance(frames, int) and frames >= 1 else None
