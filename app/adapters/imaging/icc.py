"""What LittleCMS will make of an image's ICC profile, read from the profile before LittleCMS reads it.

``colour.to_srgb`` links a transform from the profile to sRGB. LittleCMS
widens a lookup table's colour grid (its CLUT) to 16 bits and copies it as
it optimizes the transform, and samples the transform through every CLUT:
what that costs follows from each lookup table's own header (its input
and output channels and grid points), not from the tag table's sizes, which
LittleCMS does not hold a table to (a 49.7 MB 8-bit table under a tag
declared 52 bytes long took 566 MB a render, priced 198: a re-attack of
2026-12-07). :func:`transform_bytes` prices it, and refuses what no image's
profile needs:

* a lookup table of more than :data:`MAX_CHANNELS` input channels (an image
  is grey, RGB or CMYK): LittleCMS interpolates between 2 to the power of
  them at every point it samples (a 919 KB profile of 15-channel tables took
  24-25 s of CPU a render; a 16 MB one ran past the step's time limit and
  ended the worker);
* a multi-process element pipeline (``mpet``: the float ``D2Bx``/``B2Dx``
  tags, which LittleCMS prefers), the same attack's carrier;
* more than :data:`MAX_CLUT_VALUES` values in one colour grid (255 points a
  side of RGB: 49.7 million).
"""

from __future__ import annotations

import struct

from app.errors import DecompressionBomb

#: tags LittleCMS reads of a profile (``MAX_TABLE_TAG``): it refuses one that lists more
MAX_TAGS = 100
#: input channels of a lookup table: an image's colour space has four at most (CMYK)
MAX_CHANNELS = 4
#: output channels of a lookup table (the ICC's own bound)
MAX_OUTPUTS = 15
#: values (grid points times output channels) of one lookup table's colour grid: 2^24, 48 MB at 16 bits after
#: LittleCMS widens it (a printer's CMYK profile has some 3.6 million: 33 points a side, three outputs)
MAX_CLUT_VALUES = 1 << 24
#: bytes LittleCMS holds per value of a colour grid while it links the transform (measured: 7-9 bytes per value of
#: an 8-bit grid of 0.8-49.7 million values, whatever the image's size)
TRANSFORM_BYTES_PER_VALUE = 10
#: the lookup table types whose grids LittleCMS reads (ICC.1:2010 10.8-10.11), and the float pipeline it refuses
_LUTS = (b"mft1", b"mft2", b"mAB ", b"mBA ")
_FLOAT_PIPELINE = b"mpet"


def transform_bytes(profile: bytes) -> int:
    """Bytes LittleCMS holds to link a transform from ``profile``; :class:`DecompressionBomb` for a profile it would
    take too long or too much to link. A profile too short to hold a tag table costs nothing (LittleCMS refuses it,
    and the pixels are taken as sRGB)."""
    if len(profile) < 132:
        return 0
    count = min(struct.unpack_from(">I", profile, 128)[0], MAX_TAGS)
    entries = {struct.unpack_from(">I", profile, 136 + 12 * index)[0]
               for index in range(count) if 144 + 12 * index <= len(profile)}
    return sum(_grid_values(profile, offset) for offset in entries) * TRANSFORM_BYTES_PER_VALUE


def _grid_values(profile: bytes, offset: int) -> int:
    """Values of the colour grid of the tag stored at ``offset`` (0 for a tag that is not a lookup table)."""
    kind = profile[offset:offset + 4]
    if kind == _FLOAT_PIPELINE:
        raise DecompressionBomb("an ICC profile with a multi-process element (float) pipeline")
    if kind not in _LUTS or offset + 32 > len(profile):
        return 0
    inputs, outputs = profile[offset + 8], profile[offset + 9]
    if inputs > MAX_CHANNELS or outputs > MAX_OUTPUTS:
        raise DecompressionBomb(f"an ICC lookup table of {inputs} input and {outputs} output channels")
    if kind in (b"mft1", b"mft2"):
        points = [profile[offset + 10]] * inputs
    else:
        (clut,) = struct.unpack_from(">I", profile, offset + 24)
        at = (offset + clut) % (1 << 32)  # LittleCMS adds them in 32 bits: one that wraps lands before the tag (a
        if not clut or at + 16 > len(profile):  # grid hidden there was priced 0 and took 571 MB: a re-attack)
            return 0
        points = list(profile[at:at + inputs])
    values = outputs
    for side in points:
        values *= side
    if values > MAX_CLUT_VALUES:
        raise DecompressionBomb(f"an ICC lookup table of {values} values, more than {MAX_CLUT_VALUES}")
    return values
