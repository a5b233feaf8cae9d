"""Where a derivative comes from: variant specs and the geometry of a render.

Shared by :mod:`app.adapters.imaging.render` (which executes a plan) and
:mod:`app.adapters.imaging.budget` (which prices one from the header, before any
pixel is decoded). Everything is computed in *stored* (un-oriented)
coordinates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Pillow's thumbnail() default: integer reduce() while >= 2x the final size
#: remains, then LANCZOS for the rest.
REDUCING_GAP = 2.0
OUTPUTS = ("auto", "webp", "avif")
KINDS = ("fit", "cover", "bounded")


@dataclass(frozen=True)
class VariantSpec:
    """One derivative.

    * ``fit``: fits inside ``width`` x ``height``, aspect kept, never upscaled.
    * ``cover``: scaled to cover ``width`` x ``height``, then centre-cropped
      to exactly that size. Images smaller than the target *are* upscaled,
      so a ``cover`` output always has exactly the requested size.
    * ``bounded``: longest side <= ``max(width, height)``, never upscaled.

    ``output`` chooses the encoding: ``auto`` (JPEG when opaque; PNG, or WebP
    for ``bounded``, when translucent), ``webp`` (always WebP q85, alpha
    kept when there is some) or ``avif`` (always AVIF, alpha kept; no
    registered version uses it yet, see ``docs/versions.md``).
    """

    name: str
    kind: str
    width: int
    height: int
    output: str = "auto"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown variant kind {self.kind!r}")
        if self.output not in OUTPUTS:
            raise ValueError(f"unknown variant output {self.output!r}")
        if self.width < 1 or self.height < 1:
            raise ValueError("variant width and height must be positive")


@dataclass(frozen=True)
class Geometry:
    """Where the output comes from, in *stored* (un-oriented) coordinates."""

    out_size: tuple[int, int]  # size after resize, before the transpose
    box: tuple[float, float, float, float]  # source region to resample
    decode_size: tuple[int, int]  # the smallest decode that loses nothing


def plan(stored_size: tuple[int, int], orientation: int, spec: VariantSpec) -> Geometry:
    """Compute output size, source box and decode size for *spec*.

    The target is expressed upright; for orientations 5-8 (a 90 degree
    rotation) its axes are swapped so everything else can be computed in
    the stored orientation.
    """
    src_w, src_h = stored_size
    tgt_w, tgt_h = spec.width, spec.height
    if spec.kind == "bounded":
        tgt_w = tgt_h = max(tgt_w, tgt_h)
    if orientation >= 5:
        tgt_w, tgt_h = tgt_h, tgt_w
    full = (0.0, 0.0, float(src_w), float(src_h))

    if spec.kind == "cover":
        scale = max(tgt_w / src_w, tgt_h / src_h)
        box_w, box_h = min(src_w, tgt_w / scale), min(src_h, tgt_h / scale)
        left, top = (src_w - box_w) / 2, (src_h - box_h) / 2
        return Geometry(
            out_size=(tgt_w, tgt_h),
            box=(left, top, left + box_w, top + box_h),
            decode_size=(max(1, math.ceil(src_w * scale)), max(1, math.ceil(src_h * scale))),
        )

    # fit / bounded: never upscale
    scale = min(1.0, tgt_w / src_w, tgt_h / src_h)
    out = (max(1, round(src_w * scale)), max(1, round(src_h * scale)))
    return Geometry(out_size=out, box=full, decode_size=out)
