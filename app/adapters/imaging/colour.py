"""Pixel-mode normalisation and conversion to sRGB.

Derivatives are always 8-bit sRGB (or 8-bit grey), so they look the same in
every browser and need no embedded profile. Two steps, split around the
resize so that the expensive part runs on the small image:

* :func:`to_working_mode` (before resizing, on the decoded image) turns
  whatever Pillow decoded into one of ``L``, ``RGB``, ``RGBA`` or ``CMYK``,
  all 8 bits per channel, which LANCZOS resamples correctly. Palette
  images must be expanded first (Pillow would silently fall back to
  nearest-neighbour for ``P``), transparency becomes a real alpha channel,
  and high-bit-depth data is *scaled* to 8 bits rather than clipped (a naive
  ``I;16 -> L`` conversion turns most of a 16-bit image white).
* :func:`to_srgb` (after resizing) applies the embedded ICC profile with
  LittleCMS, or drops it when it cannot be parsed or does not fit the
  pixel mode, and turns CMYK into RGB.
"""

from __future__ import annotations

import io
import math
from functools import lru_cache

from PIL import Image, ImageCms, ImageMath

from app.errors import UnsupportedFormat

from . import icc

_HIGH_BIT_DEPTH = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")


def to_working_mode(img: Image.Image) -> Image.Image:
    """Return *img* as ``L``, ``RGB``, ``RGBA`` or ``CMYK`` (8 bits/channel).

    ``RGBA`` is returned only when some pixel really is translucent (an
    all-opaque alpha channel is dropped, so such images become JPEGs). The
    ``info`` dict (ICC profile) is carried over for :func:`to_srgb`.
    """
    info = dict(img.info)
    try:
        out = _normalise(img)
    except ValueError as exc:  # Pillow: "conversion from X to Y not supported"
        raise UnsupportedFormat("image colour mode is not supported") from exc
    if out.mode == "LA":
        out = out.convert("RGBA") if _alpha_used(out) else out.convert("L")
    elif out.mode == "RGBA" and not _alpha_used(out):
        out = out.convert("RGB")
    out.info = info
    return out


def _normalise(img: Image.Image) -> Image.Image:
    mode = img.mode
    if mode in ("L", "RGB", "RGBA", "CMYK", "LA"):
        if mode in ("L", "RGB") and img.has_transparency_data:
            # tRNS colour key (PNG) -> alpha channel
            return img.convert("LA" if mode == "L" else "RGBA")
        return img
    if mode == "1":
        return img.convert("L")
    if mode in ("P", "PA"):
        return img.convert("RGBA" if img.has_transparency_data else "RGB")
    if mode in ("La", "RGBa"):
        return img.convert("LA" if mode == "La" else "RGBA")
    if mode in _HIGH_BIT_DEPTH:
        return _high_bit_depth_to_8bit(img)
    # RGBX, YCbCr, LAB, HSV, ...
    return img.convert("RGB")


#: the largest finite value a float image may hold (FLT_MAX, rounded down)
_FLOAT_MAX = 3.4e38


def _finite(img: Image.Image) -> tuple[Image.Image, float, float]:
    """A float image whose NaN and infinite pixels (a GeoTIFF's "no data") are its smallest finite value, and the
    extrema of its finite ones: one NaN among them made the extrema NaN, and every variant black (an adversarial
    run). Extrema ``(0.0, 0.0)`` when none is finite."""
    finite = ImageMath.lambda_eval(
        lambda a: (a["x"] == a["x"]) * (a["x"] < _FLOAT_MAX) * (a["x"] > -_FLOAT_MAX), x=img
    ).point(lambda v: v * 255).convert("L")
    low = Image.composite(img, Image.new("F", img.size, _FLOAT_MAX), finite).getextrema()[0]
    high = Image.composite(img, Image.new("F", img.size, -_FLOAT_MAX), finite).getextrema()[1]
    if low > high:  # nothing finite
        low = high = 0.0
    return Image.composite(img, Image.new("F", img.size, low), finite), low, high


def _high_bit_depth_to_8bit(img: Image.Image) -> Image.Image:
    """Scale 16-bit / 32-bit integer / float grey to 8 bits.

    ``I;16*`` is 16-bit by definition, so it is scaled by 1/257 (65535 ->
    255). For ``I`` and ``F`` the bit depth is not recorded, so the range is
    read from the data: values already in 0..255 are kept, 0..65535 is
    treated as 16-bit, float 0..1 as normalised, anything else is stretched
    from its minimum to its maximum.
    """
    alpha = None
    if img.info.get("transparency") is not None:
        try:  # Pillow promotes the tRNS grey value to alpha when converting
            alpha = img.convert("LA").getchannel("A")
        except ValueError:
            alpha = None
    work = img if img.mode in ("I", "F") else img.convert("I")
    low, high = work.getextrema()
    if work.mode == "F" and not (math.isfinite(low) and math.isfinite(high)):
        work, low, high = _finite(work)
    if img.mode.startswith("I;16"):
        scale, offset = 1 / 257, 0.0
    elif work.mode == "F" and low >= 0 and high <= 1.0:
        scale, offset = 255.0, 0.0
    elif low >= 0 and high <= 255:
        scale, offset = 1.0, 0.0
    elif work.mode == "I" and low >= 0 and high <= 65535:
        scale, offset = 1 / 257, 0.0
    else:
        scale = 255.0 / (high - low) if high > low else 1.0
        offset = -low * scale
    # +0.5: Pillow truncates when converting back to integers.
    grey = work.point(lambda v: v * scale + (offset + 0.5)).convert("L")
    if alpha is not None:
        return Image.merge("LA", (grey, alpha))
    return grey


def _alpha_used(img: Image.Image) -> bool:
    low, _high = img.getchannel("A").getextrema()
    return low < 255


@lru_cache(maxsize=1)
def _srgb_profile() -> ImageCms.ImageCmsProfile:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


def to_srgb(img: Image.Image, icc_profile: bytes | None) -> Image.Image:
    """Convert an ``L``/``RGB``/``RGBA``/``CMYK`` image to sRGB.

    With an embedded profile the pixels are transformed with LittleCMS
    (perceptual intent); alpha is split off and re-attached untouched, and
    grey stays grey. When the profile cannot be parsed or does not match the
    pixel mode (say, an RGB profile on a CMYK image) it is dropped, i.e. the
    pixels are taken to be sRGB already, which is what browsers do. CMYK
    without a usable profile goes through Pillow's plain conversion.
    """
    if icc_profile:
        converted = _apply_profile(img, icc_profile)
        if converted is not None:
            return converted
    return img.convert("RGB") if img.mode == "CMYK" else img


def _apply_profile(img: Image.Image, icc_profile: bytes) -> Image.Image | None:
    icc.transform_bytes(icc_profile)  # one the probe did not see is held to the same refusals (the probe refuses a
    # PNG whose iCCP comes after its pixels, where Pillow finds it only at load)
    alpha = img.getchannel("A") if img.mode == "RGBA" else None
    base = img.convert("RGB") if alpha is not None else img
    try:
        source = ImageCms.ImageCmsProfile(io.BytesIO(icc_profile))
        # A grey profile maps to neutral sRGB greys: transform to RGB, then
        # keep the (smaller) one-channel encoding.
        converted = ImageCms.profileToProfile(base, source, _srgb_profile(), outputMode="RGB")
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
        return None
    if converted is None:
        return None
    if base.mode == "L":
        return converted.convert("L")
    if alpha is not None:
        converted.putalpha(alpha)
    return converted
