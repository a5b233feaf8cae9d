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

from app.adapters.imaging.segments import PNG_INFLATED_CHUNK_BYTES, PNG_TEXT_CHARACTERS

pillow_heif.register_heif_opener(thumbnails=False, depth_images=False, aux_images=False)

# the text a PNG may carry, and what one compressed chunk may inflate to (Pillow's default): segments says why
PngImagePlugin.MAX_TEXT_MEMORY = PNG_TEXT_CHARACTERS
PngImagePlugin.MAX_TEXT_CHUNK = PNG_INFLATED_CHUNK_BYTES
