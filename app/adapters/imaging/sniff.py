"""Magic-byte sniffing: which image family do these bytes claim to be?

This is the cheapest check in the module and the first one to run, both in
the web upload (on the first bytes of the body, before anything is staged)
and in :func:`app.adapters.imaging.probe.probe`. It looks only at fixed signatures,
never at file names or client-supplied content types, and it knows only
the eight formats attache processes. Anything else (SVG, HTML, a HEIF
whose brands name neither HEVC nor AV1, ICO, TGA, BLP, SGI, an empty
body...) answers ``None`` and is refused as ``unsupported_format`` without
Pillow ever seeing it, which also keeps Pillow's long tail of rarely
exercised plugins out of reach of uploads.

HEIC and AVIF share a container; its ``ftyp`` brands tell them apart
(:func:`app.adapters.imaging.bmff.family`).
"""

from __future__ import annotations

from . import bmff

#: Pillow format name -> the MIME type attache records for it.
PROCESSED_FORMATS: dict[str, str] = {
    "JPEG": "image/jpeg",
    "PNG": "image/png",
    "GIF": "image/gif",
    "WEBP": "image/webp",
    "TIFF": "image/tiff",
    "BMP": "image/bmp",
    # HEVC in a HEIF container (read by pillow-heif, see app.adapters.imaging.plugins)
    "HEIF": "image/heic",
    "AVIF": "image/avif",
}

#: How many leading bytes :func:`sniff` needs: enough for the ``ftyp`` box
#: of a HEIF or AVIF file and the brands it lists (a phone's is 24-44 bytes).
SNIFF_BYTES = 64

# Pillow formats that belong to a sniffed family. An MPO ("multi-picture
# object", e.g. stereo camera output) is a baseline JPEG followed by more
# JPEGs; its first picture is an ordinary JPEG, so it is processed as one.
_FAMILY_MEMBERS: dict[str, frozenset[str]] = {
    "JPEG": frozenset({"JPEG", "MPO"}),
    "PNG": frozenset({"PNG"}),
    "GIF": frozenset({"GIF"}),
    "WEBP": frozenset({"WEBP"}),
    "TIFF": frozenset({"TIFF"}),
    "BMP": frozenset({"BMP"}),
    "HEIF": frozenset({"HEIF"}),
    "AVIF": frozenset({"AVIF"}),
}


def sniff(head: bytes) -> str | None:
    """Return the Pillow format name the magic bytes announce, or ``None``.

    Only the start of the data is looked at (the first 12 bytes suffice,
    except for a HEIF or AVIF file whose major brand is a generic one;
    passing :data:`SNIFF_BYTES` is always enough). The answer is a *claim*:
    :func:`app.adapters.imaging.probe.probe` still has Pillow parse the header and
    checks that it agrees.
    """
    head = bytes(head[:SNIFF_BYTES])
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head.startswith(b"BM"):
        return "BMP"
    return bmff.family(head)


def family_of(pillow_format: str | None) -> str | None:
    """Map a format reported by Pillow to its processed family, if any.

    ``"MPO"`` maps to ``"JPEG"``; formats attache does not process map to
    ``None``.
    """
    for family, members in _FAMILY_MEMBERS.items():
        if pillow_format in members:
            return family
    return None


def pillow_formats_for(family: str) -> list[str]:
    """The Pillow plugin names ``Image.open(formats=...)`` may try for a family.

    Only the JPEG plugin is listed for JPEG: it detects MPO itself and
    hands back an MPO image.
    """
    return [family]
