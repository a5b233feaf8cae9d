"""The HEIC and AVIF files in ``tests/data/phones/``, and how they were made.

Phones save photos as HEIC (iPhone) and AVIF (Android), rotated by the
container (``irot``) rather than in the pixels, and in Display P3 rather
than sRGB. The files here are made to check that attache gets both right,
so their content is a test card whose right answer is known: four flat
quadrants of known sRGB colours (:data:`QUADRANTS`, as seen upright),
written as the Display P3 numbers of those colours, tagged with a Display P3
ICC profile, and stored turned a quarter to the left with the container
saying "turn it back" (EXIF orientation 6). A renderer that ignores the
profile gets colours up to 40 levels off; one that ignores the rotation
gets the quadrants in the wrong corners.

Written with ``python -m tests.phone_images`` (pillow-heif's HEVC encoder,
x265, and Pillow's AVIF encoder, libaom), which also rewrites
``tests/data/phones/MANIFEST.tsv``. The files are committed; the tests
never re-encode them, and other encoder versions would write other bytes.
``tests/data/README.md`` lists them.
"""

from __future__ import annotations

import csv
import hashlib
import io
import struct
import warnings
from pathlib import Path

from PIL import ExifTags, Image, ImageCms

PHONES = Path(__file__).resolve().parent / "data" / "phones"
#: Display P3 (sRGB curve, P3 primaries, D65), parametric v4 profile, 480 bytes:
#: saucecontrol/Compact-ICC-Profiles, profiles/DisplayP3-v4.icc at commit
#: bdd84663061bc4ae95ca70decff54f581e27f702, CC0 1.0.
DISPLAY_P3 = PHONES / "DisplayP3-v4.icc"

#: The card as seen upright: (width, height), and each quadrant's sRGB colour.
CARD_SIZE = (600, 400)
QUADRANTS: dict[str, tuple[int, int, int]] = {
    "top_left": (200, 40, 40),  # red: P3 (184, 56, 49)
    "top_right": (40, 160, 60),  # green: P3 (80, 158, 73)
    "bottom_left": (220, 200, 40),  # yellow: P3 (217, 201, 77)
    "bottom_right": (128, 128, 128),  # grey: the same in both
}

#: path (under tests/data) -> (what attache must do, what the file is)
FILES: dict[str, tuple[str, str]] = {
    "phones/card_p3_orientation6.heic": (
        "process",
        "test card in Display P3 (ICC), stored turned left in a grid of 256 px tiles, irot 270 and EXIF "
        "orientation 6 (as an iPhone writes it)",
    ),
    "phones/card_p3_orientation6.avif": (
        "process",
        "test card in Display P3 (ICC), stored turned left, irot 270 written by Pillow from EXIF orientation 6",
    ),
    "phones/card_truncated60.heic": ("reject_corrupt", "the first 60 % of card_p3_orientation6.heic"),
    "phones/card_truncated60.avif": ("reject_corrupt", "the first 60 % of card_p3_orientation6.avif"),
    "phones/heic_ispe_65000x65000.heic": (
        "reject_bomb", "a 64x64 grey HEIC whose ispe property is patched to declare 65000x65000"),
    "phones/avif_ispe_65000x65000.avif": (
        "reject_bomb", "a 64x64 grey AVIF whose ispe property is patched to declare 65000x65000"),
    "phones/avif_frame_9000x9000_ispe_256x256.avif": (
        "reject_bomb", "a 9000x9000 AVIF whose ispe property is patched to declare 256x256: libavif decodes the "
        "frame its AV1 sequence header allows, whatever ispe says"),
}


def p3_numbers(srgb: tuple[int, int, int]) -> tuple[int, int, int]:
    """The Display P3 pixel values of an sRGB colour (LittleCMS, relative colorimetric)."""
    p3 = ImageCms.ImageCmsProfile(io.BytesIO(DISPLAY_P3.read_bytes()))
    pixel = Image.new("RGB", (1, 1), srgb)
    return ImageCms.profileToProfile(pixel, ImageCms.createProfile("sRGB"), p3,
                                     renderingIntent=ImageCms.Intent.RELATIVE_COLORIMETRIC).getpixel((0, 0))


def card() -> Image.Image:
    """The upright card, in Display P3 numbers."""
    width, height = CARD_SIZE
    image = Image.new("RGB", CARD_SIZE)
    for name, colour in QUADRANTS.items():
        left = 0 if name.endswith("left") else width // 2
        top = 0 if name.startswith("top") else height // 2
        image.paste(p3_numbers(colour), (left, top, left + width // 2, top + height // 2))
    return image


def _orientation_6() -> bytes:
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6
    return exif.tobytes()


def _patch_ispe(data: bytes, width: int, height: int) -> bytes:
    """Declare another size in the file's only ``ispe`` property (the pixels stay 64x64)."""
    assert data.count(b"ispe") == 1
    at = data.index(b"ispe") + 4 + 4  # box type, then version and flags
    return data[:at] + struct.pack(">II", width, height) + data[at + 8:]


def large_frame(side: int = 9000) -> bytes:
    """A flat AVIF of ``side`` x ``side`` (some 15 s and 2 GB to encode at 9000)."""
    out = io.BytesIO()
    Image.new("RGB", (side, side), (30, 120, 200)).save(out, "AVIF", quality=10, speed=10, max_threads=1)
    return out.getvalue()


def write() -> None:
    import pillow_heif

    pillow_heif.register_heif_opener()
    stored = card().transpose(Image.Transpose.ROTATE_90)  # turned left; orientation 6 turns it back
    icc = DISPLAY_P3.read_bytes()
    heic, avif = io.BytesIO(), io.BytesIO()
    stored.save(heic, "HEIF", quality=90, tile_size=256, icc_profile=icc, exif=_orientation_6())
    stored.save(avif, "AVIF", quality=90, speed=6, max_threads=1, icc_profile=icc, exif=_orientation_6())
    grey = Image.new("RGB", (64, 64), (128, 128, 128))
    small_heic, small_avif = io.BytesIO(), io.BytesIO()
    grey.save(small_heic, "HEIF", quality=50, tile_size=0)
    grey.save(small_avif, "AVIF", quality=50, max_threads=1)
    contents = {
        "phones/card_p3_orientation6.heic": heic.getvalue(),
        "phones/card_p3_orientation6.avif": avif.getvalue(),
        "phones/card_truncated60.heic": heic.getvalue()[: len(heic.getvalue()) * 6 // 10],
        "phones/card_truncated60.avif": avif.getvalue()[: len(avif.getvalue()) * 6 // 10],
        "phones/heic_ispe_65000x65000.heic": _patch_ispe(small_heic.getvalue(), 65000, 65000),
        "phones/avif_ispe_65000x65000.avif": _patch_ispe(small_avif.getvalue(), 65000, 65000),
        "phones/avif_frame_9000x9000_ispe_256x256.avif": _patch_ispe(large_frame(), 256, 256),
    }
    data_dir = PHONES.parent
    rows = []
    for relative, data in contents.items():
        (data_dir / relative).write_bytes(data)
        rows.append(_manifest_row(data_dir / relative, relative, data))
    with open(PHONES / "MANIFEST.tsv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def _manifest_row(path: Path, relative: str, data: bytes) -> dict[str, str]:
    """A row in the shared corpus's columns; ``format`` etc. as Pillow with pillow-heif sees the file."""
    expected, note = FILES[relative]
    row = {"path": relative, "bytes": str(len(data)), "sha256": hashlib.sha256(data).hexdigest(),
           "format": "", "width": "", "height": "", "frames": "", "expected": expected,
           "origin": "tests/phone_images.py", "note": note}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                row.update(format=image.format, width=str(image.width), height=str(image.height),
                           frames=str(getattr(image, "n_frames", 1)))
    except Exception as exc:  # noqa: BLE001  (the row records whatever Pillow said)
        row["format"] = f"error: {type(exc).__name__}: {str(exc).replace(str(path), path.name)}"
    return row


if __name__ == "__main__":
    write()
