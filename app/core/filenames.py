"""Client filenames are display text only: sanitized here, never used in a key or a path."""

from __future__ import annotations

import unicodedata

MAX_LENGTH = 255
FALLBACK = "upload"
#: the extension a download is named with, from the content type attache served it as (never the client's)
EXTENSIONS = {"image/jpeg": "jpg", "image/png": "png", "image/gif": "gif", "image/webp": "webp",
              "image/tiff": "tif", "image/bmp": "bmp", "image/heic": "heic", "image/avif": "avif"}


def sanitize(raw: str | None) -> str:
    """A safe display name: last path segment, no control characters, at most 255 characters.

    ``../../etc/passwd`` becomes ``passwd``; NUL and other control or
    format characters (including bidi overrides) are dropped; a 10 KB name
    is shortened, keeping its extension when it has a short one.
    """
    if not raw:
        return FALLBACK
    text = unicodedata.normalize("NFC", str(raw))
    text = text.replace("\\", "/").rsplit("/", 1)[-1]
    text = "".join(ch for ch in text if unicodedata.category(ch)[0] not in ("C",) and ch not in "\u2028\u2029")
    text = " ".join(text.split())  # collapse whitespace
    text = text.strip(" .")
    if not text:
        return FALLBACK
    if len(text) > MAX_LENGTH:
        stem, dot, ext = text.rpartition(".")
        if dot and 0 < len(ext) <= 10:
            text = stem[: MAX_LENGTH - len(ext) - 1] + "." + ext
        else:
            text = text[:MAX_LENGTH]
    return text


def download_name(display_name: str, variant: str, content_type: str) -> str:
    """The name a download is saved as: the display name's stem, the variant, the served format's extension.

    ``photo.png`` that is really a JPEG downloads as ``photo.jpg``; its
    thumbnail as ``photo-thumbnail.jpg``.
    """
    stem, dot, extension = display_name.rpartition(".")
    if not (dot and stem and 0 < len(extension) <= 10 and extension.isalnum()):
        stem = display_name
    name = stem if variant == "original" else f"{stem}-{variant}"
    served = EXTENSIONS.get(content_type.split(";")[0].strip().lower())
    return f"{name}.{served}" if served else name
