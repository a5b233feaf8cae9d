"""Pillow exceptions -> :mod:`app.errors`, in one place.

Pillow reports bad input through a zoo of exception types (``OSError`` for
truncation and decoder errors, ``SyntaxError``/``struct.error``/``ValueError``
for malformed headers, its own ``DecompressionBombError`` and a *warning*
for the 1x-2x ``MAX_IMAGE_PIXELS`` band, ``UnidentifiedImageError`` for
"no plugin accepted this"; pillow-heif adds ``RuntimeError`` for libheif's
decoding errors). Callers of :mod:`app.adapters.imaging` only ever see
the permanent errors from :mod:`app.errors`; the Pillow exception stays
available as ``__cause__`` for logs.

Messages are short, human and never contain a path: Pillow's own texts
sometimes embed the file name, so they are not reused verbatim.
"""

from __future__ import annotations

import re
import struct
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from PIL import Image, UnidentifiedImageError

from app.errors import (
    CorruptImage,
    DecompressionBomb,
    PermanentError,
    UnsupportedFormat,
)

# What malformed input looks like once Pillow has accepted the signature.
# Pillow's own Image.open swallows (SyntaxError, IndexError, TypeError,
# struct.error) while *choosing* a plugin; past that point, and during
# decoding, any of these may surface from a plugin or a C decoder
# (RuntimeError: libheif's errors, through pillow-heif).
MALFORMED_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    RuntimeError,
    SyntaxError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    EOFError,
    ZeroDivisionError,
    OverflowError,
    struct.error,
)

_PIXELS_RE = re.compile(r"\((\d+) pixels\)")


@contextmanager
def bomb_warnings_as_errors() -> Iterator[None]:
    """Turn Pillow's ``DecompressionBombWarning`` into an exception.

    Between ``MAX_IMAGE_PIXELS`` and twice that, Pillow only *warns* and
    then happily decodes; for a service that is a denial of service waiting
    to happen, so the warning is raised as an error and translated.

    Caveat: ``warnings.catch_warnings`` swaps the process-wide filter list,
    so it is not thread-safe before Python 3.14. It is harmless here: the
    filter only escalates one warning class, and the explicit
    ``Limits.max_pixels`` check in :func:`app.adapters.imaging.probe.probe` (64 MP
    by default, below Pillow's 89 MP) rejects those images anyway; this is
    the second line of defence.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        yield


def is_text_chunk_bomb(exc: BaseException) -> bool:
    """PNG zTXt/iTXt/iCCP chunks that inflate past Pillow's limits (a chunk's, or all text's together:
    ``segments.PNG_TEXT_CHARACTERS``)."""
    return isinstance(exc, ValueError) and ("Decompressed data too large" in str(exc)
                                            or "Too much memory used in text chunks" in str(exc))


def is_library_limit(exc: BaseException) -> bool:
    """libheif refusing a file that would exceed one of its security limits (sizes, items, memory)."""
    return isinstance(exc, RuntimeError) and "Security limit exceeded" in str(exc)


def bomb_error(exc: BaseException | None = None) -> DecompressionBomb:
    """A :class:`DecompressionBomb` for a Pillow bomb error or warning."""
    if exc is not None and is_text_chunk_bomb(exc):
        return DecompressionBomb("image metadata decompresses to an excessive size")
    if exc is not None and is_library_limit(exc):
        return DecompressionBomb("image exceeds the decoder's safety limits")
    match = _PIXELS_RE.search(str(exc)) if exc is not None else None
    if match:
        return DecompressionBomb(
            f"image declares {int(match[1]):,} pixels, too many to decode safely"
        )
    return DecompressionBomb("image declares too many pixels to decode safely")


def translate_open_error(exc: BaseException) -> PermanentError:
    """Map an exception from ``Image.open`` to an :mod:`app.errors` error."""
    if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return bomb_error(exc)
    if is_text_chunk_bomb(exc):
        return bomb_error(exc)
    if isinstance(exc, UnidentifiedImageError):
        # Pillow cannot tell "unknown format" from "header damaged beyond
        # recognition"; either way there is nothing attache can process.
        return UnsupportedFormat("image format is not recognised")
    if isinstance(exc, NotImplementedError):
        return UnsupportedFormat("image uses a feature that is not supported")
    return CorruptImage("image header is malformed")


def translate_decode_error(exc: BaseException) -> PermanentError:
    """Map an exception raised while decoding pixel data."""
    if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return bomb_error(exc)
    if is_text_chunk_bomb(exc) or is_library_limit(exc):
        return bomb_error(exc)
    if isinstance(exc, NotImplementedError):
        return UnsupportedFormat("image uses a feature that is not supported")
    if "truncated" in str(exc).lower():
        return CorruptImage("image data is truncated")
    return CorruptImage("image data cannot be decoded")


@contextmanager
def frames_let_go() -> Iterator[None]:
    """An error raised in the block leaves with the locals of the frames it came through cleared (and its causes'):
    a render's error kept the image it failed on, its pixels half decoded, outside any reservation, and the inspect
    step keeps each failed render's error until all its renders end (four truncated 6000x5000 PNGs: 1.1-1.4 GB of
    a worker, an adversarial run). The frames still running are left alone."""
    try:
        yield
    except BaseException as exc:
        seen: set[int] = set()
        error: BaseException | None = exc
        while error is not None and id(error) not in seen:
            seen.add(id(error))
            traceback.clear_frames(error.__traceback__)
            error = error.__cause__ or error.__context__
        raise
