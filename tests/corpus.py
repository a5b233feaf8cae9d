"""The image corpus in tests/data, as the tests read it.

Two manifests in the same columns: ``tests/data/MANIFEST.tsv``, an
unchanged copy of the shared corpus's (its ``expected`` is what Pillow alone
did with each file), and ``tests/data/phones/MANIFEST.tsv``, the HEIC and
AVIF files made by ``tests/phone_images.py`` (its ``expected`` is what
attache must do). :data:`ROWS` is both, with the shared rows that attache
reads differently from Pillow alone corrected (:data:`READ_WITH_PILLOW_HEIF`).
``tests/data/README.md`` describes every file.
"""

from __future__ import annotations

import csv
from pathlib import Path

from app.errors import CorruptImage, UnsupportedFormat

DATA = Path(__file__).resolve().parent / "data"


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


SHARED = read(DATA / "MANIFEST.tsv")
PHONES = read(DATA / "phones" / "MANIFEST.tsv")

#: Shared-corpus files Pillow alone cannot identify but attache reads, having
#: registered pillow-heif: the columns as Pillow sees them with it.
READ_WITH_PILLOW_HEIF: dict[str, dict[str, str]] = {
    "pillow/avif_hopper.heif": {"format": "HEIF", "width": "128", "height": "128", "frames": "1",
                                "expected": "process"},
}

ROWS = [{**row, **READ_WITH_PILLOW_HEIF.get(row["path"], {})} for row in SHARED] + PHONES

# Where each reject_corrupt file is refused, and how. Most headers are fine
# (so probe, which reads headers only, accepts them) and the pixel data is
# not, so render refuses them. BLP and SGI are not formats attache processes
# at all, so the magic-byte sniff refuses them as unsupported before Pillow
# sees them (no 650 MB allocation for the BLP "timeout" file). A HEIC or
# AVIF cut short is seen from its container (a box runs past the end of the
# file), so the upload refuses it; so is a TIFF listing a layout tag twice
# (two fuzzers' files: libtiff and Pillow would read it apart).
CORRUPT_OUTCOME = {
    "pillow/crash-0c7e0e8e11ce787078f00b5b0ca409a167f070e0.tif": ("probe", CorruptImage),
    "pillow/crash-754d9c7ec485ffb76a90eeaab191ef69a2a3a3cd.sgi": ("probe", UnsupportedFormat),
    "pillow/timeout-060745d3f534ad6e4128c51d336ea5489182c69d.blp": ("probe", UnsupportedFormat),
    "pillow/timeout-6646305047838720": ("probe", CorruptImage),
    "pillow/truncated_image.png": ("render", CorruptImage),
    "pillow/truncated_jpeg.jpg": ("render", CorruptImage),
    "pillow/ultrahdr.jpg": ("render", CorruptImage),
    "synthetic/astronaut_truncated60.jpg": ("render", CorruptImage),
    "phones/card_truncated60.heic": ("probe", CorruptImage),
    "phones/card_truncated60.avif": ("probe", CorruptImage),
}
