"""Client filenames are display text only: sanitized here, never used in a key or a path."""

from __future__ import annotations

import unicodedata

MAX_LENGTH = 255
FALLBACK = "upload"


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
