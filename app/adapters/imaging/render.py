"""Rendering derivatives (thumbnail, square crop, optimised display copy).

Pipeline, and why it is in this order:

1. **Probe checks first** (:func:`~app.adapters.imaging.probe.open_checked`): the
   size limits and the memory budget (priced for this very spec, see
   :mod:`app.adapters.imaging.budget`) are enforced from the header before a single
   pixel is decoded. What the open copies of the metadata is reserved before it, and the
   price then, from the process's budget (:data:`~app.adapters.imaging.budget.RESERVATIONS`),
   waiting while other threads' renders hold it (closed meanwhile: :func:`_made_at_once`), and
   given back when the derivative is encoded; a render whose pixels are shared
   (:mod:`app.adapters.imaging.shared`) never opens the file and reserves only its encoding's.
2. **Decode at the scale needed.** For JPEG, ``Image.draft`` asks libjpeg
   to decode at 1/2, 1/4 or 1/8 scale directly from the DCT coefficients,
   choosing the largest reduction that still leaves at least the size the
   output needs (for ``cover`` the *short* side must reach the target). A
   12 MP photo rendered as a 256 px thumbnail is decoded at 433x433 instead
   of 3464x3464: under 1 MB instead of 48 MB (Pillow keeps RGB at 4 bytes a
   pixel), and several times faster.
   The scaled IDCT is a proper low-pass reduction, so no extra headroom is
   requested. Other formats have no such shortcut and decode at full size
   (the limits bound that).
3. **Normalise the pixel mode** (:mod:`app.adapters.imaging.colour`) so LANCZOS can
   work on it: palette -> RGB(A), transparency -> alpha, 16-bit/float ->
   8-bit (scaled, not clipped).
4. **Downscale** with ``resize(..., LANCZOS, reducing_gap=2.0)``: Pillow first
   ``reduce()``\\s by an integer factor (cheap box averaging) while at least
   2x the final size remains, then finishes with LANCZOS, the same recipe as
   ``Image.thumbnail``. ``cover`` passes the centred crop as ``box`` so
   cropping and scaling are a single resample. The large copies of most
   JPEGs are decoded (step 2) and resampled here by libvips instead, with
   the same kernel in the same order (:mod:`app.adapters.imaging.libvips`
   says when: the pixels must be Pillow's to 35 dB, in practice 43-50, and
   the file one the two decoders judge alike; a file libvips declines or
   fails on is decoded by Pillow, whose verdict stands). Everything else
   Pillow would resample in two passes, horizontal first, is resampled by
   the compiled passes of :mod:`app.adapters.imaging.lanczos`: Pillow's
   arithmetic in vectorised loops, Pillow's bytes (a JPEG of odd sides, a
   PNG, the thumbnails). Of what remains, libvips makes the vertical pass
   when it spans every row.
   :data:`RESAMPLE` is part of what a pipeline version promises: BICUBIC would take 20-65 % less time
   on the large copies and is within 50 dB of LANCZOS on photos, but only
   26-36 dB on text, fine lines and noise, beyond what an existing version
   may change (``tests/test_render_quality.py``, ``docs/performance.md``).
5. **Colour to sRGB** on the small image (ICC transform via LittleCMS).
6. **EXIF orientation last**: a transpose is a pure pixel shuffle, so it is
   exact at any size and cheapest on the smallest image. The orientation is
   read before the image is modified (for JPEG from the header, because
   the draft target depends on it; for other formats right after decoding,
   because a PNG may store ``eXIf`` after its pixel data). All geometry is
   computed in stored orientation with the target's axes swapped for
   orientations 5-8.
7. **Encode without metadata**: opaque -> JPEG q85 (progressive for the
   large ``bounded`` copy, where progressive rendering helps and usually
   saves bytes); translucent -> PNG for the small variants (lossless alpha,
   small at these sizes) and WebP q85 for the large one (a PNG of a
   2048 px photo would be several MB). A spec may ask for WebP or AVIF
   instead (``VariantSpec.output``). Pillow encodes every format, into a
   memory file (:mod:`app.adapters.imaging.encode_files`): its JPEG encoder
   holds the GIL when it writes into ``BytesIO``, not into a descriptor.
   (libvips's JPEG encoder made the same bytes at 25-60 % more CPU, and
   measured slower on every figure of ``make bench``:
   ``docs/performance.md``.) No EXIF/GPS, XMP,
   comments or ICC profile is written (pixels are already sRGB). The encoders are
   deterministic, so the same input bytes give the same output bytes (the
   AVIF encoder runs on one thread for that: libaom's output depends on
   its thread count).

Steps 2-6 make the derivative's pixels; they depend on the original and the
geometry only, not on the encoder, so they are shared through
:mod:`app.adapters.imaging.shared`: pipeline v2's ``optimized`` (JPEG) and
``webp`` decode and resample the original once per process, the second
render only encodes.

Animated GIF/WebP/APNG/AVIF: only the first frame is rendered; the image is
never seeked (a later GIF frame can be a decompression bomb).

HEIC and AVIF take the same path as every format but JPEG: decoded at full
size, then the steps above. Their rotation and colour are handled like a
JPEG's: an AVIF's ``irot``/``imir`` reach step 6 as an EXIF orientation,
a HEIC comes out of libheif already upright, and both carry their ICC
profile (an iPhone's Display P3) to step 5.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from PIL import Image, ImageFile

from . import budget, encode_files, lanczos, libvips
from ._translate import (
    MALFORMED_ERRORS,
    bomb_warnings_as_errors,
    frames_let_go,
    translate_decode_error,
)
from .colour import to_srgb, to_working_mode
from .geometry import REDUCING_GAP, VariantSpec, plan
from .probe import Limits, open_checked, read_orientation
from .shared import SHARED, content_key

JPEG_QUALITY = 85
WEBP_QUALITY = 85
WEBP_METHOD = 4
#: libavif's 0-100 quality scale (Pillow's default is 75); at 70 a 2048 px
#: photo takes about half the bytes of its JPEG q85 rendition.
AVIF_QUALITY = 70
#: libaom's speed 0 (slowest, smallest) to 10; 6 is libavif's default.
AVIF_SPEED = 6
#: One encoder thread: libaom's output bytes depend on the thread count.
AVIF_THREADS = 1
#: The resampling filter of every variant of pipelines v1 and v2.
RESAMPLE = Image.Resampling.LANCZOS

# EXIF orientation -> the transpose that makes the image upright
# (the same table as PIL.ImageOps.exif_transpose).
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


PIPELINE_V1_SPECS: dict[str, VariantSpec] = {
    "thumbnail": VariantSpec("thumbnail", "fit", 256, 256),
    "crop": VariantSpec("crop", "cover", 512, 512),
    "optimized": VariantSpec("optimized", "bounded", 2048, 2048),
}


@dataclass(frozen=True)
class Rendered:
    """An encoded derivative, ready to store."""

    data: bytes
    content_type: str
    extension: str
    width: int
    height: int
    #: the encoder and its settings (for the variant's provenance)
    encoder: dict = field(default_factory=dict)


def render(path: str | os.PathLike[str], spec: VariantSpec, limits: Limits, *, sha256: str | None = None) -> Rendered:
    """Render one derivative of the image at *path*.

    *sha256*: the hex SHA-256 of the file's bytes, where the caller knows it (the worker: the attachment's,
    taken at upload); the resampled pixels shared between renders are keyed by it
    (:mod:`app.adapters.imaging.shared`). Without it the file is hashed, some 0.7 ms a MB.

    :raises UnsupportedFormat, DecompressionBomb, ImageTooLarge, CorruptImage:
        as :func:`~app.adapters.imaging.probe.probe`; ``CorruptImage`` also when the
        pixel data cannot be decoded (truncated file, decoder error).
    """
    key = (sha256 or content_key(path), *_geometry_key(spec))
    with budget.RESERVATIONS.scope(limits.max_decode_bytes) as reserve, frames_let_go():  # let go, then released

        def share(image: Image.Image) -> None:
            # pixels kept or made by another render (v2's optimized and webp share theirs) cost this render only
            # their encoding, reserved before it takes them (never while it waits for their maker); the file is
            # not opened at all
            reserve(budget.output_price(spec, image))

        def make() -> Image.Image:
            made = _made_at_once(path, spec, limits, reserve)
            if isinstance(made, Image.Image):
                return made
            # never hold a part while waiting for the rest, nor an open file's metadata unreserved: the file closed
            # and let go, the whole price reserved (waiting while other renders hold the budget), opened again
            reserve.release()
            reserve(made)
            with open_checked(path, limits, spec) as (img, family, _priced):
                return _upright(img, family, spec)

        work = SHARED.get_or_make(key, make, share)
        # the reservation covers the encoder too; the encoder gets an Image of its own over the shared pixels, which
        # encoding reads and never writes (its attributes, encoderinfo among them, are the encoding's own)
        return _encode(work._new(work.im), spec)


def _made_at_once(path: str | os.PathLike[str], spec: VariantSpec, limits: Limits,
                  reserve: budget.Hold) -> Image.Image | int:
    """The pixels, if the render's whole price can be held as soon as the file is open; else the price to wait for,
    the file closed and nothing of it kept (its metadata goes with this frame).

    What opening the file copies of its metadata is reserved before the open: a render opened it unreserved, and
    four 64x64 HEICs carrying 43 MB of Exif took 1.0-1.1 GB of a four-thread worker (an adversarial run)."""
    with open_checked(path, limits, spec, reserve=reserve) as (img, family, priced):
        if reserve.top_up(priced.total - reserve.held):  # the rest of the price, at once or not at all
            return _upright(img, family, spec)
        return max(priced.total, reserve.held)


def load_codecs() -> None:
    """Load every codec a render may use: Pillow's plugins (its first save of a WebP imports all forty of them)
    and libvips. A worker process does it at boot, not in its first jobs (some 50 ms of CPU, the GIL held)."""
    Image.init()
    libvips.load()


def _geometry_key(spec: VariantSpec) -> tuple[str, int, int]:
    """What decides a render's pixels besides the original: not its name, not its encoding."""
    if spec.kind == "bounded":
        side = max(spec.width, spec.height)
        return spec.kind, side, side
    return spec.kind, spec.width, spec.height


def _upright(img: ImageFile.ImageFile, family: str, spec: VariantSpec) -> Image.Image:
    """Decode, resample, sRGB, orientation: the pixels of the derivative, not yet encoded."""
    stored_size = img.size
    scale_back = 1.0
    if family == "JPEG":
        orientation = read_orientation(img, header_only=True)
        geometry = plan(stored_size, orientation, spec)
        drafted = img.draft(img.mode, geometry.decode_size) if budget.decodes_scaled(img) else None
        if drafted is not None:
            scale_back = drafted[1][2] / stored_size[0]
        box = tuple(v * scale_back for v in geometry.box)
        if libvips.applies(img.mode, img.size, box, geometry.out_size, RESAMPLE):
            work = libvips.decode_resampled(img.fp, round(1 / scale_back), img.mode, img.size, geometry.out_size,
                                            RESAMPLE)
            if work is not None:
                return _finish(work, img.info.get("icc_profile"), orientation)
            # libvips declined the file, or failed on it: Pillow decodes it and judges it
        _load(img)
    else:
        _load(img)
        orientation = read_orientation(img, header_only=False)
        geometry = plan(stored_size, orientation, spec)
        box = geometry.box

    icc_profile = img.info.get("icc_profile")
    work = to_working_mode(img)
    work = _resize(work, geometry.out_size, box)
    img.close()  # resize() made a new image: the full-size pixels go before the output-sized copies are made
    return _finish(work, icc_profile, orientation)


def _resize(work: Image.Image, out_size: tuple[int, int], box: tuple[float, ...]) -> Image.Image:
    """LANCZOS with ``reducing_gap``: Pillow's bytes from the compiled passes (:mod:`.lanczos`) wherever they make
    them; else the vertical pass libvips's where that gives Pillow's pixels (step 4); else Pillow's."""
    resized = lanczos.resize(work, out_size, box) if RESAMPLE == Image.Resampling.LANCZOS else None
    if resized is None:
        resized = libvips.resize(work, out_size, box, RESAMPLE)
    if resized is None:
        resized = work.resize(out_size, RESAMPLE, box=box, reducing_gap=REDUCING_GAP)
    return resized


def _finish(work: Image.Image, icc_profile: bytes | None, orientation: int) -> Image.Image:
    """The resampled pixels in sRGB, upright, with nothing of the source's metadata."""
    work = to_srgb(work, icc_profile)
    if orientation in _UPRIGHT:
        work = work.transpose(_UPRIGHT[orientation])
    work.info = {}  # nothing from the source (comment, exif, icc, ...) is written
    return work


def _load(img: Image.Image) -> None:
    """Decode the current (first) frame, translating Pillow's errors.

    ``ImageFile.LOAD_TRUNCATED_IMAGES`` is never enabled: an upload cut short
    (its file ends before its image data) is refused as corrupt rather than
    rendered with a grey band. Image data that ends cleanly before the last
    row (an early EOI, a finished zlib stream) is decoded as far as it goes:
    libjpeg only warns, and Pillow's PNG decoder reports nothing
    (``docs/architecture.md``).
    """
    try:
        with bomb_warnings_as_errors():
            img.load()
    except (
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
        NotImplementedError,
        *MALFORMED_ERRORS,
    ) as exc:
        raise translate_decode_error(exc) from exc


def _encode(img: Image.Image, spec: VariantSpec) -> Rendered:
    if spec.output == "webp":
        if img.mode not in ("RGB", "RGBA"):
            img = img.convert("RGB")
        settings = {"format": "WEBP", "quality": WEBP_QUALITY, "method": WEBP_METHOD}
        content_type, extension = "image/webp", "webp"
    elif spec.output == "avif":
        if img.mode not in ("L", "RGB", "RGBA"):
            img = img.convert("RGB")
        settings = {"format": "AVIF", "quality": AVIF_QUALITY, "speed": AVIF_SPEED, "max_threads": AVIF_THREADS}
        content_type, extension = "image/avif", "avif"
    elif img.mode == "RGBA":
        if spec.kind == "bounded":
            settings = {"format": "WEBP", "quality": WEBP_QUALITY, "method": WEBP_METHOD}
            content_type, extension = "image/webp", "webp"
        else:
            settings = {"format": "PNG", "optimize": True}
            content_type, extension = "image/png", "png"
    else:
        if img.mode not in ("L", "RGB"):
            img = img.convert("RGB")
        settings = {"format": "JPEG", "quality": JPEG_QUALITY, "optimize": True,
                    "progressive": spec.kind == "bounded"}
        content_type, extension = "image/jpeg", "jpg"
    options = {key: value for key, value in settings.items() if key != "format"}
    data = encode_files.encode(img, settings["format"], options)
    return Rendered(
        data=data,
        content_type=content_type,
        extension=extension,
        width=img.width,
        height=img.height,
        encoder={**settings, "mode": img.mode},
    )
