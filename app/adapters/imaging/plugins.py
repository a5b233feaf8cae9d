"""Pillow plugins attache adds to Pillow's own (pillow-heif, for HEIC), and a limit it sets on one of Pillow's.

Pillow reads AVIF itself (through libavif); HEIC, HEVC pictures in a HEIF
container, is read by ``pillow-heif`` (libheif with libde265), registered
here once, when :mod:`app.adapters.imaging` is imported, as Pillow's
``HEIF`` plugin. The registration is process-wide, which is harmless:
attache only ever opens a file with ``formats=[the sniffed family]``.

Options, chosen for a service that renders the primary picture only:

* ``thumbnails=False``: the small preview a phone embeds is not parsed, and
  ``draft()`` never swaps it in for the picture (its quality is the
  phone's, not ours);
* ``depth_images=False``, ``aux_images=False``: depth maps, HDR gain maps
  and portrait mattes are not read.

libheif applies the container's rotation and mirroring (``irot``,
``imir``) and its crop (``clap``) while decoding, and pillow-heif resets
the EXIF orientation to 1 so it is not applied twice: a HEIC is upright
once decoded, and reports its upright size. (Pillow's AVIF plugin does
the opposite: it reports the stored size and turns ``irot``/``imir`` into
an EXIF orientation, applied like a JPEG's.)
"""

from __future__ import annotations

import pillow_heif
from PIL import PngImagePlugin

pillow_heif.register_heif_opener(thumbnails=False, depth_images=False, aux_images=False)

#: the characters of a PNG's text chunks (tEXt, zTXt, iTXt) Pillow keeps per open, all chunks together (Pillow's
#: default: 64 Mi). Pillow counts characters, and a character of an iTXt can take 4 bytes: 255 iTXt chunks of 1 Mi
#: emoji each, a 274 KB PNG of 1024x768, held 270 MB an open, 592 MB in the worker and 2 GB for four at once,
#: outside the memory budget (an adversarial run). A photo's text, XMP included, is a few KB to a few hundred.
#: More is refused as a decompression bomb (``_translate.is_text_chunk_bomb``).
PNG_TEXT_CHARACTERS = 4 * 1024 * 1024
PngImagePlugin.MAX_TEXT_MEMORY = PNG_TEXT_CHARACTERS
