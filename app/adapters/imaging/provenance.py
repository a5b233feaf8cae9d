"""What a derivative was made with, for its provenance record: libraries, and the metadata it left behind.

* :func:`libraries` - the renderer and the versions of the codec libraries
  Pillow was built with (``PIL.features``), pillow-heif's libheif, and
  libvips (which makes the large copies of most JPEGs);
* :func:`stripped_metadata` - what the source carried that no derivative
  keeps: its EXIF tags by name, whether it had GPS, XMP or a comment, and
  whether its ICC profile was converted to sRGB. Read from the header only
  (no pixel is decoded, a PNG's trailing ``eXIf`` chunk included).

The encoder settings of a render are in :attr:`~app.adapters.imaging.render.Rendered.encoder`.
"""

from __future__ import annotations

import functools
import io
import os

import PIL
from PIL import ExifTags, Image, ImageCms, PngImagePlugin
from PIL import features as pil_features

from . import bmff, budget, segments
from .sniff import SNIFF_BYTES, family_of, sniff

RENDERER = "attache.imaging (Pillow, libvips)"
#: the codecs whose versions a record names (PIL.features' names)
CODECS = ("jpg", "jpg_2000", "webp", "avif", "libtiff", "zlib", "littlecms2", "freetype2")
GPS_IFD = 0x8825


@functools.cache
def libraries() -> dict:
    """The renderer and library versions in this process (fixed for its life)."""
    versions: dict[str, str | None] = {"Pillow": PIL.__version__}
    for codec in CODECS:
        try:
            versions[codec] = pil_features.version(codec)
        except ValueError:  # a codec this Pillow does not know
            versions[codec] = None
    try:
        import pillow_heif

        versions["pillow_heif"] = pillow_heif.__version__
        versions["libheif"] = pillow_heif.libheif_version()
    except Exception:  # pragma: no cover - pillow-heif is a dependency, but a record never fails on it
        versions["pillow_heif"] = None
    try:
        from . import libvips

        versions["libvips"] = libvips.version().removeprefix("libvips ")
    except Exception:  # pragma: no cover - as above
        versions["libvips"] = None
    return {"renderer": RENDERER, "libraries": versions}


def stripped_metadata(path: str | os.PathLike[str], max_decode_bytes: int | None = None) -> dict:
    """What the source carried that the derivatives do not (they keep no metadata at all).

    ``max_decode_bytes``: the process's memory budget (``Limits.max_decode_bytes``), under which what Pillow
    keeps of the metadata while it reads the header is reserved first, as a render reserves its price: this runs
    after the render gave its reservation back, and four renders of 64x64 images carrying tens of MB of metadata
    each held their copies here at once, unreserved (an adversarial run of 2026-12-07)."""
    if max_decode_bytes is None:
        return _stripped_metadata(path)
    with budget.RESERVATIONS.scope(max_decode_bytes) as reserve:
        reserve(_metadata_price(path))
        return _stripped_metadata(path)


def _metadata_price(path: str | os.PathLike[str]) -> int:
    """What reading the file's metadata again copies of it; a HEIF's or AVIF's from its container's items (they
    were priced 0 here: four 64x64 HEICs carrying 43 MB of Exif took 371-617 MB at once, an adversarial run)."""
    try:
        with open(path, "rb") as fp:
            family = family_of(sniff(fp.read(SNIFF_BYTES)))
            fp.seek(0)
            if family in ("HEIF", "AVIF"):
                return budget.heif_opening_bytes(bmff.read_layout(fp))
            return budget.METADATA_COPIES * segments.metadata_bytes(fp, family) if family else 0
    except (OSError, ValueError):
        return 0


def _stripped_metadata(path: str | os.PathLike[str]) -> dict:
    try:
        with Image.open(path) as img:
            exif = _exif(img)
            tags = sorted({ExifTags.TAGS.get(tag, f"0x{tag:04x}") for tag in exif})
            # the tag that points to a GPS directory, not the directory: reading it whole took 554 MB for 24 MB of
            # a TIFF's RATIONALs there (an adversarial run), after the render gave its reservation back
            gps = GPS_IFD in exif
            icc = img.info.get("icc_profile")
            xmp = bool(img.info.get("xmp") or img.info.get("XML:com.adobe.xmp"))
            comment = bool(img.info.get("comment"))
    except Exception:  # the render decoded it; a header we cannot read again here is reported as unknown
        return {"exif_tags": None, "gps": None, "xmp": None, "comment": None, "icc_profile": None,
                "icc_converted": None}
    return {"exif_tags": tags, "gps": gps, "xmp": xmp, "comment": comment, "icc_profile": bool(icc),
            "icc_converted": bool(icc) and _parses(icc)}


def _exif(img: Image.Image) -> Image.Exif:
    """The image's EXIF from its header. A PNG's ``getexif()`` decodes every pixel to reach an ``eXIf`` chunk after
    the image data, outside the memory budget and after the render gave its reservation back (an adversarial
    review: 87 MB for a 4000x4000 16-bit PNG); its chunks are walked instead."""
    if not isinstance(img, PngImagePlugin.PngImageFile):
        return img.getexif()
    exif = Image.Exif()
    data = segments.png_exif(img.fp)
    if data:
        exif.load(data if data.startswith(b"Exif\x00\x00") else b"Exif\x00\x00" + data)
    return exif


def _parses(icc: bytes) -> bool:
    """A profile LittleCMS can read is converted to sRGB (``colour.to_srgb``); one it cannot is dropped."""
    try:
        ImageCms.ImageCmsProfile(io.BytesIO(icc))
        return True
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
        return False
