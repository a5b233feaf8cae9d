"""Image handling for attache: sniff, probe and render derivatives.

* :func:`sniff` - magic bytes only; :func:`claimed_family` refuses what they
  claim unless it is accepted (a resumable upload's first part).
* :func:`probe` - header-only identification and limit checks (no pixel
  data is decoded), shared by the upload and the worker, including the
  memory budget (:mod:`app.adapters.imaging.budget`): what a render would cost,
  priced from the header.
* :func:`render` - one derivative (thumbnail / crop / optimized), decoded
  at the smallest scale that works, oriented, in sRGB, without metadata.
* :func:`libraries`, :func:`stripped_metadata` - what a derivative's
  provenance record names: the library versions, and what was stripped.

Every failure is an :mod:`app.errors` ``PermanentError``
(``UnsupportedFormat``, ``CorruptImage``, ``DecompressionBomb``,
``ImageTooLarge``); Pillow exceptions never leave this package.
"""

from .probe import ImageInfo, Limits, claimed_family, probe
from .provenance import libraries, stripped_metadata
from .render import PIPELINE_V1_SPECS, Rendered, VariantSpec, load_codecs, render
from .sniff import PROCESSED_FORMATS, SNIFF_BYTES, sniff

__all__ = [
    "PIPELINE_V1_SPECS",
    "PROCESSED_FORMATS",
    "SNIFF_BYTES",
    "ImageInfo",
    "Limits",
    "Rendered",
    "VariantSpec",
    "claimed_family",
    "libraries",
    "load_codecs",
    "probe",
    "render",
    "sniff",
    "stripped_metadata",
]
