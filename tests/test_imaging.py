"""Tests for app.adapters.imaging, driven by the corpus manifests in tests/data/.

tests/data/MANIFEST.tsv and tests/data/phones/MANIFEST.tsv have one row per
file with the format Pillow saw, the declared size and the expected outcome
(process / reject_*), read through tests/corpus.py; see tests/data/README.md
for where every file comes from. These tests need no services: no
database, broker or network.
"""

from __future__ import annotations

import base64
import io
import math
import os
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import pytest
from PIL import (
    ExifTags,
    Image,
    ImageChops,
    ImageCms,
    ImageDraw,
    ImageFile,
    ImageOps,
    ImageStat,
    TiffImagePlugin,
)

from app.adapters.imaging import (
    PIPELINE_V1_SPECS,
    PROCESSED_FORMATS,
    ImageInfo,
    Limits,
    Rendered,
    VariantSpec,
    bmff,
    lanczos,
    libvips,
    probe,
    render,
    sniff,
)
from app.adapters.imaging._translate import translate_decode_error
from app.adapters.imaging.shared import SHARED
from app.errors import (
    CorruptImage,
    DecompressionBomb,
    ImageTooLarge,
    PermanentError,
    UnsupportedFormat,
)
from tests import corpus, phone_images
from tests.corpus import CORRUPT_OUTCOME

# Pillow warns about the fuzzer TIFFs' broken tags; that is expected noise.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:PIL.TiffImagePlugin")

DATA = corpus.DATA
REPO = Path(__file__).resolve().parents[1]
LIMITS = Limits()
SPECS = list(PIPELINE_V1_SPECS.values())

MANIFEST = corpus.ROWS


def _rows(expected: str, *, processed: bool | None = None) -> list[dict[str, str]]:
    def fmt_ok(row: dict[str, str]) -> bool:
        is_processed = row["format"] in PROCESSED_FORMATS or row["format"] == "MPO"
        return processed is None or is_processed == processed

    return [row for row in MANIFEST if row["expected"] == expected and fmt_ok(row)]


def _params(rows: list[dict[str, str]]) -> list:
    return [pytest.param(row, id=row["path"]) for row in rows]


PROCESS_ROWS = _rows("process", processed=True)
PROCESS_UNPROCESSED_ROWS = _rows("process", processed=False)

ALPHA_FILES = [
    "pillow/pil123rgba.png",  # RGBA, interlaced
    "synthetic/png_1x1_rgba.png",  # RGBA, alpha 128
    "pillow/rgb_trns.png",  # RGB + tRNS colour key
    "pillow/i_trns.png",  # 16-bit grey + tRNS
]


def path_of(rel: str) -> Path:
    return DATA / rel


# --- helpers --------------------------------------------------------------


class LoadSpy:
    """Records every pixel decode started, Pillow's or libvips's: (format, size being decoded)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.calls: list[tuple[str | None, tuple[int, int]]] = []
        self.by_libvips: list[tuple[int, int]] = []  # the sizes libvips decoded at (some of self.calls)
        for cls in (ImageFile.ImageFile, TiffImagePlugin.TiffImageFile):
            original = cls.__dict__["load"]

            def load(self_img, _original=original):
                if self_img.tile:  # pixel data still to be decoded
                    self.calls.append((self_img.format, self_img.size))
                return _original(self_img)

            monkeypatch.setattr(cls, "load", load)
        decode_resampled = libvips.decode_resampled

        def by_libvips(fp, scale, mode, decoded, *args):
            self.calls.append(("JPEG", decoded))
            self.by_libvips.append(decoded)
            return decode_resampled(fp, scale, mode, decoded, *args)

        monkeypatch.setattr(libvips, "decode_resampled", by_libvips)


def source_orientation(rel: str) -> int:
    with Image.open(path_of(rel)) as im:
        return im.getexif().get(0x0112, 1) or 1


def upright_size(row: dict[str, str]) -> tuple[int, int]:
    width, height = int(row["width"]), int(row["height"])
    if source_orientation(row["path"]) in (5, 6, 7, 8):
        width, height = height, width
    return width, height


def decode(rendered: Rendered) -> Image.Image:
    im = Image.open(io.BytesIO(rendered.data))
    im.load()
    return im


def mean_abs_diff(a: Image.Image, b: Image.Image) -> float:
    a, b = a.convert("RGB"), b.convert("RGB")
    assert a.size == b.size
    return sum(ImageStat.Stat(ImageChops.difference(a, b)).mean) / 3


def reference(rel: str, spec: VariantSpec, size: tuple[int, int]) -> Image.Image:
    """What a derivative should look like: exif_transpose, to sRGB, resize."""
    with Image.open(path_of(rel)) as im:
        icc = im.info.get("icc_profile")
        upright = ImageOps.exif_transpose(im).convert("RGB")
    if icc:
        source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        upright = ImageCms.profileToProfile(upright, source, ImageCms.createProfile("sRGB"))
    if spec.kind == "cover":
        return ImageOps.fit(upright, size, Image.Resampling.LANCZOS)
    return upright.resize(size, Image.Resampling.LANCZOS)


# Container structures a derivative may contain: nothing that carries
# metadata (APPn other than JFIF, COM; PNG text/eXIf/iCCP; WebP EXIF/XMP/ICCP).
ALLOWED_STRUCTURE = {
    "JPEG": {"APP0", "DQT", "SOF0", "SOF2", "DHT", "SOS", "DRI"},
    "PNG": {"IHDR", "PLTE", "tRNS", "IDAT", "IEND"},
    "WEBP": {"VP8 ", "VP8L", "VP8X", "ALPH"},
}


def container_structure(data: bytes) -> tuple[str, list[str]]:
    """Segment / chunk names of a JPEG, PNG or WebP file, up to the pixel data."""
    if data[:2] == b"\xff\xd8":
        names, pos = [], 2
        while True:
            marker = data[pos + 1]
            length = int.from_bytes(data[pos + 2 : pos + 4], "big")
            name = {0xC0: "SOF0", 0xC2: "SOF2", 0xC4: "DHT", 0xDB: "DQT", 0xDA: "SOS", 0xDD: "DRI",
                    0xFE: "COM"}.get(marker, f"APP{marker - 0xE0}" if 0xE0 <= marker <= 0xEF else hex(marker))
            names.append(name)
            if name == "SOS":  # entropy-coded data follows
                return "JPEG", names
            pos += 2 + length
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        names, pos = [], 8
        while pos < len(data):
            length = int.from_bytes(data[pos : pos + 4], "big")
            names.append(data[pos + 4 : pos + 8].decode("latin-1"))
            pos += 12 + length
        return "PNG", names
    assert data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    names, pos = [], 12
    while pos < len(data):
        length = int.from_bytes(data[pos + 4 : pos + 8], "little")
        names.append(data[pos : pos + 4].decode("latin-1"))
        pos += 8 + length + (length & 1)
    return "WEBP", names


def assert_no_metadata(rendered: Rendered) -> None:
    kind, names = container_structure(rendered.data)
    assert set(names) <= ALLOWED_STRUCTURE[kind], names
    if kind == "JPEG":
        assert rendered.data[6:11] == b"JFIF\x00"  # the only APP0 Pillow writes
    im = decode(rendered)
    assert len(im.getexif()) == 0
    assert "icc_profile" not in im.info
    assert "comment" not in im.info
    assert "xmp" not in im.info and "XML:com.adobe.xmp" not in im.info


# --- sniff ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "JPEG"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "PNG"),
        (b"GIF87a\x01\x00", "GIF"),
        (b"GIF89a\x01\x00", "GIF"),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "WEBP"),
        (b"II*\x00\x08\x00\x00\x00", "TIFF"),
        (b"MM\x00*\x00\x00\x00\x08", "TIFF"),
        (b"BM\x36\x00\x00\x00", "BMP"),
        (b"", None),
        (b"\xff\xd8", None),  # too short to be a JPEG
        (b"RIFF\x24\x00\x00\x00WAVEfmt ", None),  # RIFF, but audio
        (b"<svg xmlns='http://www.w3.org/2000/svg'/>", None),
        (b"<!DOCTYPE html><html>", None),
        (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic", "HEIF"),
        (b"\x00\x00\x00\x18ftypheix\x00\x00\x00\x00mif1heix", "HEIF"),
        (b"\x00\x00\x00\x20ftypavif\x00\x00\x00\x00avifmif1miafMA1B", "AVIF"),
        (b"\x00\x00\x00\x18ftypavis\x00\x00\x00\x00avismsf1", "AVIF"),
        # a generic major brand: the compatible brands decide
        (b"\x00\x00\x00\x1cftypmif1\x00\x00\x00\x00mif1miafheic", "HEIF"),
        (b"\x00\x00\x00\x1cftypmif1\x00\x00\x00\x00mif1miafavif", "AVIF"),
        # HEIF holding neither HEVC nor AV1 (JPEG, VVC), or a brand listed past the ftyp box
        (b"\x00\x00\x00\x18ftypmif1\x00\x00\x00\x00mif1jpeg", None),
        (b"\x00\x00\x00\x18ftypvvic\x00\x00\x00\x00mif1vvic", None),
        (b"\x00\x00\x00\x14ftypmif1\x00\x00\x00\x00mif1avif", None),
        (b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00isommp42", None),  # an MP4 video
        (b"\x00\x00\x00\x1cftyp", None),  # too short to say
        (b"\x00\x00\x01\x00\x01\x00", None),  # ICO
        (b"\x00\x00\x0a\x00\x00\x00\x00\x00", None),  # TGA (no magic)
        (b"GIF90a", None),
    ],
)
def test_sniff_magic_bytes(head: bytes, expected: str | None) -> None:
    assert sniff(head) == expected


@pytest.mark.parametrize("row", _params(PROCESS_ROWS))
def test_sniff_agrees_with_pillow_on_corpus(row: dict[str, str]) -> None:
    head = path_of(row["path"]).read_bytes()[:32]
    assert sniff(head) == ("JPEG" if row["format"] == "MPO" else row["format"])


def test_processed_formats_table() -> None:
    assert PROCESSED_FORMATS == {
        "JPEG": "image/jpeg",
        "PNG": "image/png",
        "GIF": "image/gif",
        "WEBP": "image/webp",
        "TIFF": "image/tiff",
        "BMP": "image/bmp",
        "HEIF": "image/heic",
        "AVIF": "image/avif",
    }


# --- the corpus ----------------------------------------------------------


def test_manifest_is_complete_and_covered() -> None:
    for row in MANIFEST:
        assert path_of(row["path"]).is_file(), row["path"]
        assert path_of(row["path"]).stat().st_size == int(row["bytes"])
    outcomes = [row["expected"] for row in corpus.SHARED]
    assert outcomes.count("process") == 47
    assert set(CORRUPT_OUTCOME) == {row["path"] for row in _rows("reject_corrupt")}
    # MPO is processed as JPEG, not refused
    assert any(row["format"] == "MPO" for row in PROCESS_ROWS)


@pytest.mark.parametrize("row", _params(PROCESS_ROWS))
def test_process_rows_probe_and_render(row: dict[str, str], monkeypatch) -> None:
    rel = row["path"]
    spy = LoadSpy(monkeypatch)
    info = probe(path_of(rel), LIMITS)
    assert spy.calls == [], "probe must not decode pixel data"

    family = "JPEG" if row["format"] == "MPO" else row["format"]
    assert isinstance(info, ImageInfo)
    assert (info.format, info.content_type) == (family, PROCESSED_FORMATS[family])
    assert (info.width, info.height) == (int(row["width"]), int(row["height"]))
    assert info.orientation == source_orientation(rel)
    # frames only where the header states it; GIF/TIFF would need a walk
    assert info.frames == (None if family in ("GIF", "TIFF") else int(row["frames"]))

    up_w, up_h = upright_size(row)
    longest = max(up_w, up_h)
    for spec in SPECS:
        out = render(path_of(rel), spec, LIMITS)
        im = decode(out)
        assert (out.width, out.height) == im.size
        assert out.content_type == Image.MIME[im.format]
        assert out.extension == {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}[im.format]
        w, h = im.size
        if spec.name == "thumbnail":
            assert max(w, h) == min(256, longest)
            assert w <= 256 and h <= 256
        elif spec.name == "crop":
            assert (w, h) == (512, 512)
        else:
            assert max(w, h) == min(2048, longest)
        if spec.kind != "cover":  # aspect preserved (to a pixel) and upright
            scale = max(w, h) / longest
            assert abs(w - up_w * scale) <= 1 and abs(h - up_h * scale) <= 1
        assert_no_metadata(out)


@pytest.mark.parametrize("row", _params(PROCESS_UNPROCESSED_ROWS))
def test_formats_pillow_reads_but_attache_does_not(row: dict[str, str]) -> None:
    # ICO, TGA: Pillow can open them, attache does not process them
    assert row["format"] in {"ICO", "TGA"}
    with pytest.raises(UnsupportedFormat):
        probe(path_of(row["path"]), LIMITS)
    with pytest.raises(UnsupportedFormat):
        render(path_of(row["path"]), PIPELINE_V1_SPECS["thumbnail"], LIMITS)


def test_mpo_is_processed_as_jpeg_first_frame() -> None:
    rel = "pillow/sugarshack.mpo"
    info = probe(path_of(rel), LIMITS)
    assert (info.format, info.content_type, info.frames) == ("JPEG", "image/jpeg", 2)
    out = render(path_of(rel), PIPELINE_V1_SPECS["optimized"], LIMITS)
    assert out.content_type == "image/jpeg"
    with Image.open(path_of(rel)) as src:  # frame 0, as Pillow shows it
        ref = src.convert("RGB")
    assert mean_abs_diff(decode(out), ref) < 4


@pytest.mark.parametrize("row", _params(_rows("reject_unsupported")))
def test_reject_unsupported(row: dict[str, str]) -> None:
    with pytest.raises(UnsupportedFormat) as err:
        probe(path_of(row["path"]), LIMITS)
    assert err.value.error_code == "unsupported_format"
    assert_short_message(err.value, row["path"])
    with pytest.raises(UnsupportedFormat):
        render(path_of(row["path"]), PIPELINE_V1_SPECS["thumbnail"], LIMITS)


@pytest.mark.parametrize("row", _params(_rows("reject_bomb")))
def test_reject_bomb_from_header(row: dict[str, str], monkeypatch) -> None:
    spy = LoadSpy(monkeypatch)
    started = time.perf_counter()
    with pytest.raises(DecompressionBomb) as err:
        probe(path_of(row["path"]), LIMITS)
    assert time.perf_counter() - started < 1.0
    assert spy.calls == [], "bomb must be refused before decoding"
    assert err.value.error_code == "decompression_bomb"
    assert_short_message(err.value, row["path"])
    with pytest.raises(DecompressionBomb):
        render(path_of(row["path"]), PIPELINE_V1_SPECS["thumbnail"], LIMITS)
    assert spy.calls == [], "render must apply the limits before decoding"


@pytest.mark.parametrize("row", _params(_rows("reject_corrupt")))
def test_reject_corrupt(row: dict[str, str]) -> None:
    stage, error = CORRUPT_OUTCOME[row["path"]]
    if stage == "probe":
        with pytest.raises(error) as err:
            probe(path_of(row["path"]), LIMITS)
    else:
        probe(path_of(row["path"]), LIMITS)  # the header is fine
        for spec in SPECS:
            with pytest.raises(error) as err:
                render(path_of(row["path"]), spec, LIMITS)
    assert_short_message(err.value, row["path"])


def assert_short_message(exc: PermanentError, rel: str) -> None:
    message = str(exc)
    assert 0 < len(message) <= 120
    assert Path(rel).name not in message and "/" not in message


def test_pillow_exceptions_never_escape() -> None:
    for row in MANIFEST:
        for call in (
            lambda p: probe(p, LIMITS),
            lambda p: render(p, PIPELINE_V1_SPECS["thumbnail"], LIMITS),
        ):
            try:
                call(path_of(row["path"]))
            except PermanentError:
                pass


# --- limits ---------------------------------------------------------------


def test_limits_apply_in_probe_and_render_before_decoding(monkeypatch) -> None:
    spy = LoadSpy(monkeypatch)
    big = path_of("photos/coffee_24mp_6000x4000.jpg")
    with pytest.raises(DecompressionBomb):
        probe(big, Limits(max_pixels=20_000_000))
    with pytest.raises(ImageTooLarge) as err:
        probe(big, Limits(max_dimension=5_000))
    assert err.value.error_code == "image_too_large"
    for spec in SPECS:
        with pytest.raises(DecompressionBomb):
            render(big, spec, Limits(max_pixels=20_000_000))
        with pytest.raises(ImageTooLarge):
            render(big, spec, Limits(max_dimension=5_000))
    assert spy.calls == []
    assert probe(big, Limits(max_pixels=24_000_000, max_dimension=6_000)).width == 6000


def test_bomb_warning_band_is_refused_even_with_generous_limits() -> None:
    # 100 MP: above Pillow's MAX_IMAGE_PIXELS, below twice it (only a warning
    # by default). Even if attache's own limit allowed it, it is refused.
    generous = Limits(max_pixels=200_000_000, max_dimension=20_000)
    with pytest.raises(DecompressionBomb):
        probe(path_of("synthetic/png_bomb_warn_10000x10000.png"), generous)


def test_own_limit_holds_when_pillow_check_is_disabled(monkeypatch) -> None:
    # Someone else in the process may set MAX_IMAGE_PIXELS = None; the
    # explicit Limits.max_pixels check must still refuse every pixel bomb.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    for row in _rows("reject_bomb"):
        with pytest.raises(DecompressionBomb):
            probe(path_of(row["path"]), LIMITS)


def test_truncated_images_are_never_loaded_leniently() -> None:
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_bombs_do_not_allocate() -> None:
    """In a fresh interpreter, refusing every bomb leaves peak RSS flat."""
    files = [str(path_of(row["path"])) for row in _rows("reject_bomb")]
    delta = _peak_rss_delta_mb(
        f"""
        from app.errors import DecompressionBomb
        from app.adapters.imaging import Limits, probe
        for path in {files!r}:
            try:
                probe(path, Limits())
            except DecompressionBomb:
                pass
            else:
                raise SystemExit("not refused: " + path)
        """
    )
    assert delta < 10


# --- decoding at the scale needed -----------------------------------------


def test_12mp_jpeg_thumbnail_is_decoded_with_draft(monkeypatch) -> None:
    spy = LoadSpy(monkeypatch)
    out = render(path_of("photos/astronaut_12mp_3464x3464.jpg"), PIPELINE_V1_SPECS["thumbnail"], LIMITS)
    assert (out.width, out.height) == (256, 256)
    [(fmt, size)] = spy.calls
    assert fmt == "JPEG"
    assert max(size) <= 3464 // 4, f"decoded at {size}, expected a DCT-scaled draft"
    assert min(size) >= 256  # never below the target


def test_cover_draft_keeps_the_short_side(monkeypatch) -> None:
    spy = LoadSpy(monkeypatch)
    out = render(path_of("photos/chelsea_12mp_4247x2825.jpg"), PIPELINE_V1_SPECS["crop"], LIMITS)
    assert (out.width, out.height) == (512, 512)
    [(_fmt, size)] = spy.calls
    assert min(size) >= 512 and max(size) < 4247


def test_a_large_copy_of_a_jpeg_is_decoded_and_resampled_by_libvips(monkeypatch) -> None:
    """The 2048 px copy: libvips decodes at the draft's scale and resamples; Pillow decodes nothing."""
    coffee, chelsea = path_of("photos/coffee_24mp_6000x4000.jpg"), path_of("photos/chelsea_12mp_4247x2825.jpg")
    cases = [
        (coffee, "optimized", (2048, 1365), (3000, 2000), True),
        # an odd side at 1/2 is a fraction of a pixel more than Pillow's region: Pillow's own resampler
        (chelsea, "optimized", (2048, 1362), (2124, 1413), False),
        # a thumbnail: Pillow's, as fast there
        (coffee, "thumbnail", (256, 171), (750, 500), False),
    ]
    for path, name, size, decoded, by_libvips in cases:
        spy = LoadSpy(monkeypatch)
        out = render(path, PIPELINE_V1_SPECS[name], LIMITS)
        assert (out.width, out.height) == size
        assert spy.calls == [("JPEG", decoded)]
        assert spy.by_libvips == ([decoded] if by_libvips else []), (path.name, name)



def _made_by(monkeypatch, module, name):
    """Spy on ``module.name`` (a resize that returns None when it declines): what it made, as (in, out) sizes."""
    made = []
    original = getattr(module, name)

    def spy(img, out_size, box, *args):
        resized = original(img, out_size, box, *args)
        made.append(None if resized is None else (img.size, out_size))
        return resized

    monkeypatch.setattr(module, name, spy)
    return made


OTHER_LARGE_COPIES = [  # (file, variant, (decoded size, output size))
    ("photos/rocket_12mp_4241x2830.jpg", "optimized", ((2121, 1415), (2048, 1367))),  # odd width
    ("large.png", "optimized", ((2121, 1415), (2048, 1366))),
    ("photos/chelsea_12mp_4247x2825.jpg", "optimized", ((2124, 1413), (2048, 1362))),  # odd width and height
]


def _large_png(tmp_path):
    png = tmp_path / "large.png"
    Image.open(path_of("photos/rocket_12mp_4241x2830.jpg")).reduce(2).save(png, compress_level=1)  # 2121x1415
    return png


def test_the_other_large_copies_and_the_thumbnails_are_made_by_the_compiled_passes(monkeypatch, tmp_path) -> None:
    """Where libvips cannot decode and resample it all (a JPEG whose region ends inside its last pixel; a PNG),
    Pillow decodes and the compiled passes resample (``lanczos``: Pillow's bytes); the thumbnails too."""
    png = _large_png(tmp_path)
    compiled = _made_by(monkeypatch, lanczos, "resize")
    by_libvips = _made_by(monkeypatch, libvips, "resize")
    for name, variant, sizes in OTHER_LARGE_COPIES + [("photos/rocket_12mp_4241x2830.jpg", "thumbnail", None)]:
        compiled.clear()
        SHARED.clear()
        out = render(png if name == "large.png" else path_of(name), PIPELINE_V1_SPECS[variant], LIMITS)
        assert len(compiled) == 1 and compiled[0] is not None, (name, variant, compiled)
        assert sizes is None or (compiled[0], (out.width, out.height)) == (sizes, sizes[1])
    assert by_libvips == []


def test_without_the_compiled_passes_libvips_makes_the_vertical_pass_of_the_other_large_copies(
        monkeypatch, tmp_path) -> None:
    """Installed without a C compiler: where the region spans every row, Pillow makes the horizontal pass and
    libvips the vertical one; where it does not (an odd height too), and for a small output, Pillow all."""
    monkeypatch.setattr(lanczos, "_lanczos", None)
    png = _large_png(tmp_path)
    made = _made_by(monkeypatch, libvips, "resize")
    for name, variant, sizes in OTHER_LARGE_COPIES + [("photos/rocket_12mp_4241x2830.jpg", "thumbnail", None)]:
        made.clear()
        SHARED.clear()
        out = render(png if name == "large.png" else path_of(name), PIPELINE_V1_SPECS[variant], LIMITS)
        expected = None if name.startswith("photos/chelsea") or variant == "thumbnail" else sizes
        assert made == [expected], (name, variant)
        assert expected is None or (out.width, out.height) == expected[1]


@pytest.mark.parametrize("refused", ["no /proc", "no descriptor for libvips"])
def test_libvips_reads_the_same_bytes_without_a_descriptor_of_its_own(monkeypatch, refused) -> None:
    """Where ``/proc/self/fd`` cannot be opened, or libvips cannot take the descriptor (the process's limit of open
    files), Python reads the file for libvips: the same bytes come out."""
    import pyvips

    path, spec = path_of("photos/astronaut_12mp_3464x3464.jpg"), PIPELINE_V1_SPECS["optimized"]
    spy = LoadSpy(monkeypatch)
    SHARED.clear()
    own = render(path, spec, LIMITS).data
    opened = os.open

    def no_proc(name, *args, **kwargs):
        if str(name).startswith("/proc/self/fd/"):
            raise FileNotFoundError(name)
        return opened(name, *args, **kwargs)

    def no_descriptor(descriptor):
        raise pyvips.Error("unable to dup descriptor")

    if refused == "no /proc":
        monkeypatch.setattr(os, "open", no_proc)
    else:
        monkeypatch.setattr(pyvips.Source, "new_from_descriptor", staticmethod(no_descriptor))
    SHARED.clear()
    assert render(path, spec, LIMITS).data == own
    assert spy.by_libvips == [(3464, 3464)] * 2

# --- libvips's large copies: Pillow's verdict on every file --------------------------------------------------

#: Pillow's JPEG (q75) of a 1024x512 grey image, all 128, through libjpeg-turbo 2.1.5's
#: ``jpegtran -arithmetic -copy none``: arithmetic-coded (SOF9, a DAC segment), 125 bytes.
ARITHMETIC_JPEG = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIsIxwcKDcpLDAx"
    "NDQ0Hyc5PTgyPC4zNDL/yQALCAIABAABAREA/8wABgAQEAX/2gAIAQEAAD8AHreA/9k="
)


def _large_copy_jpeg(**options) -> bytes:
    """1024x512: its 2048 px copy is 512 Ki pixels, so libvips makes it (the same size: no resample)."""
    img = Image.merge("RGB", [Image.linear_gradient("L").resize((1024, 512)).rotate(r, expand=False)
                              for r in (0, 90, 180)])
    draw = ImageDraw.Draw(img)
    for x in range(-512, 1024, 5):
        draw.line([(x, 0), (x + 512, 512)], fill=(20, 40, 60))
    buf = io.BytesIO()
    img.save(buf, "JPEG", **{"quality": 90, "subsampling": 0, **options})
    return buf.getvalue()


def _scan_start(data: bytes) -> int:
    """Offset of the first scan's entropy-coded data."""
    pos = 2
    while data[pos + 1] != 0xDA:
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    return pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")


def _scan_then_second_sos() -> bytes:
    """A second scan after the only one a baseline frame has (its SOS header again, some data)."""
    data = _large_copy_jpeg()
    start = _scan_start(data)
    return data[:-2] + data[data.rindex(b"\xff\xda", 0, start):start] + b"\x12" * 9 + data[-2:]


def _restarts_cut_short() -> bytes:
    """A restart marker every MCU (8192), every eighth interval's data cut to half: a libjpeg warning each."""
    data = _large_copy_jpeg(restart_marker_blocks=1)
    start = _scan_start(data)
    pieces = data[start:-2].split(b"\xff\xd0")  # RST0 every 8th interval: cut those, keep the rest
    return data[:start] + b"\xff\xd0".join(p[: max(1, len(p) // 2)] for p in pieces) + data[-2:]


def _restart_interval_without_markers() -> bytes:
    """A DRI segment but no restart marker in the data: libjpeg warns at every one of 8192 MCUs."""
    data = _large_copy_jpeg()
    sos = data.rindex(b"\xff\xda", 0, _scan_start(data))
    return data[:sos] + b"\xff\xdd\x00\x04\x00\x01" + data[sos:]


def _arithmetic_across_pillows_read() -> bytes:
    """Arithmetic coding, the scan placed across Pillow's first 64 KiB read (its decoder cannot suspend there)."""
    start = _scan_start(ARITHMETIC_JPEG)
    com = 65536 - start - 1  # a COM segment of that many bytes after SOI
    return ARITHMETIC_JPEG[:2] + b"\xff\xfe" + (com - 2).to_bytes(2, "big") + bytes(com - 4) + ARITHMETIC_JPEG[2:]


def _corrupt_entropy() -> bytes:
    """Bytes of the scan overwritten: libjpeg warns and renders (it never refuses such a file)."""
    data = bytearray(_large_copy_jpeg())
    start = _scan_start(data)
    for i in range(start + 1000, len(data) - 1000, 9973):
        data[i] = 0x5A
    return bytes(data)


#: Files Pillow and libvips's decode could judge apart, and what Pillow makes of them (see libvips.py).
HOSTILE_JPEGS = {
    # Pillow finishes the decompression: a marker after the scan that is not EOI fails it (a concatenation)
    "scan-then-soi": (lambda: _large_copy_jpeg()[:-2] + b"\xff\xd8\xff\xd9", CorruptImage),
    "scan-then-second-sos": (_scan_then_second_sos, CorruptImage),
    # libvips fails on its thousandth libjpeg warning, Pillow renders
    "restart-intervals-cut-short": (_restarts_cut_short, None),
    "restart-interval-without-markers": (_restart_interval_without_markers, None),
    # libvips's mozjpeg decodes arithmetic coding, Pillow's libjpeg-turbo could not here
    "arithmetic-coding": (_arithmetic_across_pillows_read, CorruptImage),
    # the same on both: warnings only, rendered; truncated, refused
    "corrupt-entropy-data": (_corrupt_entropy, None),
    "truncated-progressive": (lambda: _large_copy_jpeg(progressive=True)[:-20000], CorruptImage),
    "truncated-baseline": (lambda: _large_copy_jpeg()[:-20000], CorruptImage),
}


def _psnr(a: Image.Image, b: Image.Image) -> float:
    mse = sum(rms ** 2 for rms in ImageStat.Stat(ImageChops.difference(a, b)).rms) / len(a.getbands())
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


@pytest.mark.parametrize("name", list(HOSTILE_JPEGS))
def test_a_large_copy_by_libvips_has_pillows_outcome_on_hostile_jpegs(name: str, tmp_path: Path,
                                                                       monkeypatch) -> None:
    """Refused with Pillow's error, or rendered to Pillow's pixels (35 dB, tests/test_render_quality.py)."""
    make, pillows_error = HOSTILE_JPEGS[name]
    path = tmp_path / f"{name}.jpg"
    path.write_bytes(make())
    spec = PIPELINE_V1_SPECS["optimized"]

    def outcome() -> Rendered | PermanentError:
        SHARED.clear()  # the pixels of this render, not the last one's
        try:
            return render(path, spec, LIMITS)
        except PermanentError as exc:
            return exc

    spy = LoadSpy(monkeypatch)
    ours = outcome()
    with Image.open(path) as img:
        width, height = img.size
    assert spy.by_libvips == [(width, height)], "the file is one libvips's path is tried on"
    monkeypatch.setattr(libvips, "BANDS", {})  # Pillow's own path
    pillows = outcome()
    assert spy.by_libvips == [(width, height)]
    if pillows_error is not None:
        assert isinstance(pillows, pillows_error), "Pillow's verdict is not what this test was written for"
        assert (type(ours), str(ours)) == (type(pillows), str(pillows))
        assert_short_message(ours, path.name)
    else:
        assert isinstance(pillows, Rendered), "Pillow's verdict is not what this test was written for"
        assert isinstance(ours, Rendered), ours
        assert (ours.width, ours.height, ours.content_type) == (pillows.width, pillows.height, pillows.content_type)
        assert _psnr(decode(ours).convert("RGB"), decode(pillows).convert("RGB")) >= 35


@pytest.mark.parametrize(
    "name",
    [
        "40-mb-after-eoi",  # an MPO's frames, a gain map, garbage: libvips reads up to EOI, and copies nothing
        "20-mb-of-app2",  # libjpeg would keep a copy of these for libvips (APP1, APP2, APP13, APP14): Pillow's only
    ],
)
def test_a_large_copy_by_libvips_takes_no_more_memory_than_pillows(name: str, tmp_path: Path) -> None:
    path, warm = tmp_path / f"{name}.jpg", tmp_path / "warm.jpg"
    jpeg = _large_copy_jpeg()
    if name == "40-mb-after-eoi":
        path.write_bytes(jpeg + bytes(40 * 1024 * 1024))
    else:
        path.write_bytes(jpeg[:2] + (b"\xff\xe2\xff\xff" + bytes(65533)) * 320 + jpeg[2:])
    warm.write_bytes(_large_copy_jpeg(quality=80))
    warm_up = f"""
        from app.adapters.imaging import libvips
        render({str(warm)!r}, PIPELINE_V1_SPECS["optimized"], Limits())  # libvips is loaded
        made, decode_resampled = [], libvips.decode_resampled
        libvips.decode_resampled = lambda *args: made.append(decode_resampled(*args)) or made[-1]
        """
    body = f"""
        out = render({str(path)!r}, PIPELINE_V1_SPECS["optimized"], Limits())
        assert (out.width, out.height) == (1024, 512)
        """
    # the first by libvips, the second by Pillow (libvips declines over 1 MiB of metadata)
    by_libvips = name == "40-mb-after-eoi"
    ours = _peak_rss_delta_mb(body + f"assert [m is not None for m in made] == [{by_libvips}]\n", warm_up)
    pillows = _peak_rss_delta_mb("libvips.BANDS = {}\n" + textwrap.dedent(body) + "assert made == []\n", warm_up)
    assert ours < pillows + 5, (ours, pillows)


def test_12mp_jpeg_thumbnail_peak_memory() -> None:
    """The full 3464x3464 decode alone would be 36 MB; the draft needs ~0.5 MB."""
    path = str(path_of("photos/astronaut_12mp_3464x3464.jpg"))
    delta = _peak_rss_delta_mb(
        f"""
        from app.adapters.imaging import PIPELINE_V1_SPECS, Limits, render
        out = render({path!r}, PIPELINE_V1_SPECS["thumbnail"], Limits())
        assert (out.width, out.height) == (256, 256)
        """
    )
    assert delta < 20


def _peak_rss_delta_mb(body: str, warm_up: str = "") -> float:
    """Run *body* in a fresh interpreter; return its peak-RSS growth in MB.

    Pillow allocates pixels with malloc, which tracemalloc does not see, so
    the kernel's high-water mark of this process's memory (``VmHWM``) is
    used. (``ru_maxrss`` would not do: Linux carries the parent's RSS over
    fork+exec into it.) The warm-up renders load every plugin and library
    first, so only the body's own allocations are measured; *warm_up* runs before them too.
    """
    status = Path("/proc/self/status")
    if not status.exists() or "VmHWM" not in status.read_text():
        pytest.skip("needs Linux /proc/self/status")
    script = textwrap.dedent(
        f"""
        import re
        from app.adapters.imaging import PIPELINE_V1_SPECS, Limits, render

        def peak_kb():
            with open("/proc/self/status") as fh:
                return int(re.search(r"VmHWM:\\s+(\\d+) kB", fh.read())[1])

        render({str(path_of("pillow/hopper.jpg"))!r}, PIPELINE_V1_SPECS["crop"], Limits())
        render({str(path_of("pillow/hopper.gif"))!r}, PIPELINE_V1_SPECS["crop"], Limits())
        """
    ) + textwrap.dedent(warm_up) + "\nbefore = peak_kb()\n" + textwrap.dedent(body) + textwrap.dedent(
        """
        print((peak_kb() - before) / 1024)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout.strip().splitlines()[-1])


# --- orientation ------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "orientation"),
    [
        ("pillow/hopper_orientation_3.jpg", 3),
        ("pillow/hopper_orientation_6.jpg", 6),
        ("pillow/hopper_orientation_8.jpg", 8),
        ("pillow/hopper_orientation_6.webp", 6),
        ("pillow/xmp_tags_orientation.png", 3),  # only in XMP
        ("synthetic/exif_gps_orientation6.jpg", 6),
    ],
)
def test_exif_orientation_is_applied(rel: str, orientation: int) -> None:
    assert probe(path_of(rel), LIMITS).orientation == orientation
    with Image.open(path_of(rel)) as im:
        unrotated = im.convert("RGB")
    for spec in SPECS:
        out = decode(render(path_of(rel), spec, LIMITS))
        right = mean_abs_diff(out, reference(rel, spec, out.size))
        assert right < 6, f"{spec.name}: differs from exif_transpose by {right:.1f}"
        # and it is clearly not the stored, un-rotated picture
        wrong_ref = (
            ImageOps.fit(unrotated, out.size, Image.Resampling.LANCZOS)
            if spec.kind == "cover"
            else unrotated.resize(out.size, Image.Resampling.LANCZOS)
        )
        assert mean_abs_diff(out, wrong_ref) > 3 * right + 10


def test_orientation_rectangle_becomes_portrait() -> None:
    rel = "pillow/orientation_rectangle.jpg"  # stored 2x1, orientation 8
    info = probe(path_of(rel), LIMITS)
    assert (info.width, info.height, info.orientation) == (2, 1, 8)
    out = render(path_of(rel), PIPELINE_V1_SPECS["optimized"], LIMITS)
    assert (out.width, out.height) == (1, 2)
    out = render(path_of(rel), PIPELINE_V1_SPECS["thumbnail"], LIMITS)
    assert (out.width, out.height) == (1, 2)


def test_exif_and_gps_are_stripped() -> None:
    rel = "synthetic/exif_gps_orientation6.jpg"
    with Image.open(path_of(rel)) as src:
        assert src.getexif().get_ifd(0x8825)  # the source does carry GPS
    for spec in SPECS:
        out = render(path_of(rel), spec, LIMITS)
        assert out.content_type == "image/jpeg"
        assert_no_metadata(out)
        assert not decode(out).getexif()
        assert b"GPS" not in out.data and b"Exif" not in out.data
        assert out.width > out.height or spec.kind == "cover"  # upright: 451x300


# --- colour and output format -------------------------------------------


@pytest.mark.parametrize("rel", ALPHA_FILES)
def test_alpha_images_give_png_and_webp(rel: str) -> None:
    for spec in SPECS:
        out = render(path_of(rel), spec, LIMITS)
        expected = "image/webp" if spec.name == "optimized" else "image/png"
        assert out.content_type == expected
        im = decode(out)
        assert im.mode == "RGBA"
        assert im.getchannel("A").getextrema()[0] < 255


@pytest.mark.parametrize(
    "rel",
    [
        "photos/chelsea.png",
        "pillow/iss634.apng",  # RGBA, but every pixel is opaque
        "pillow/iss634.webp",  # ditto, animated WebP
        "pillow/hopper.gif",
        "pillow/pil_sample_cmyk.jpg",
        "pillow/tiff_tiled_cmyk_jpeg.tif",
        "pillow/hopper.bmp",
    ],
)
def test_opaque_images_give_jpeg(rel: str) -> None:
    for spec in SPECS:
        out = render(path_of(rel), spec, LIMITS)
        assert out.content_type == "image/jpeg"
        assert decode(out).mode in ("RGB", "L")


def test_optimized_jpeg_is_progressive_and_small_ones_are_not() -> None:
    rel = "photos/rocket.jpg"
    assert decode(render(path_of(rel), PIPELINE_V1_SPECS["optimized"], LIMITS)).info.get("progressive")
    assert not decode(render(path_of(rel), PIPELINE_V1_SPECS["thumbnail"], LIMITS)).info.get("progressive")


def test_grayscale_stays_grayscale() -> None:
    out = render(path_of("photos/camera.jpg"), PIPELINE_V1_SPECS["thumbnail"], LIMITS)
    assert decode(out).mode == "L"


def test_embedded_icc_profile_is_converted_not_copied() -> None:
    rel = "pillow/icc_profile_big.jpg"  # ~400 KB profile
    for spec in SPECS:
        out = render(path_of(rel), spec, LIMITS)
        assert len(out.data) < 200_000
        assert_no_metadata(out)


def test_unparseable_icc_profile_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "bad_icc.jpg"
    Image.new("RGB", (40, 30), (200, 30, 30)).save(path, "JPEG", icc_profile=b"not a profile" * 10)
    out = render(path, PIPELINE_V1_SPECS["optimized"], LIMITS)
    r, g, b = decode(out).getpixel((20, 15))
    assert r > 180 and g < 60 and b < 60


def test_cmyk_becomes_rgb() -> None:
    with Image.open(path_of("pillow/pil_sample_cmyk.jpg")) as src:
        ref = src.convert("RGB")
    out = decode(render(path_of("pillow/pil_sample_cmyk.jpg"), PIPELINE_V1_SPECS["optimized"], LIMITS))
    assert out.mode == "RGB"
    assert mean_abs_diff(out, ref) < 10  # an inverted-CMYK mistake gives > 100


def test_16_bit_is_scaled_not_clipped(tmp_path: Path) -> None:
    path = tmp_path / "gradient16.png"
    gradient = Image.linear_gradient("L").resize((256, 256)).convert("I")
    gradient.point(lambda v: v * 257).convert("I;16").save(path)
    with Image.open(path) as check:
        assert check.mode == "I;16" and check.getextrema() == (0, 65535)
    out = decode(render(path, PIPELINE_V1_SPECS["optimized"], LIMITS))
    assert out.mode == "L"
    low, high = out.getextrema()
    assert low <= 2 and high >= 253
    assert 115 < ImageStat.Stat(out).mean[0] < 140  # a clip would give ~254


def test_a_float_image_with_nan_or_infinite_pixels_is_stretched_over_its_finite_ones(tmp_path: Path) -> None:
    """A GeoTIFF's "no data" is often NaN: one NaN made the extrema NaN and every variant black (an adversarial
    run). The finite values are stretched as before; NaN and infinities show as the darkest."""
    path = tmp_path / "float.tif"
    gradient = Image.linear_gradient("L").resize((256, 256)).convert("F").point(lambda v: v * 10.0 + 1000.0)
    gradient.putpixel((0, 0), float("nan"))
    gradient.putpixel((5, 5), float("inf"))
    gradient.putpixel((9, 9), float("-inf"))
    gradient.save(path)
    with Image.open(path) as check:
        assert check.mode == "F"
    out = decode(render(path, PIPELINE_V1_SPECS["optimized"], LIMITS))
    assert out.mode == "L"
    low, high = out.getextrema()
    assert low <= 2 and high >= 253
    assert 115 < ImageStat.Stat(out).mean[0] < 140, "a gradient, not black"


def test_palette_transparency_becomes_alpha(tmp_path: Path) -> None:
    path = tmp_path / "transparent.gif"
    im = Image.new("P", (64, 64), 1)
    im.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    im.paste(0, (0, 0, 32, 64))
    im.save(path, transparency=0)
    out = render(path, PIPELINE_V1_SPECS["thumbnail"], LIMITS)
    assert out.content_type == "image/png"
    px = decode(out)
    assert px.getpixel((10, 10))[3] == 0 and px.getpixel((50, 10)) == (255, 0, 0, 255)


def _png_with_trailing_chunk(path: Path, kind: bytes, data: bytes, size=(40, 20)) -> Path:
    """A valid PNG with one extra chunk after the pixel data (before IEND)."""
    buf = io.BytesIO()
    Image.linear_gradient("L").resize(size).convert("RGB").save(buf, "PNG")
    png = buf.getvalue()
    chunk = len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    assert png[-12:-8] == b"\x00\x00\x00\x00" and png[-8:-4] == b"IEND"
    path.write_bytes(png[:-12] + chunk + png[-12:])
    return path


def test_png_text_chunk_bomb_after_pixel_data(tmp_path: Path) -> None:
    # zTXt that inflates past Pillow's MAX_TEXT_CHUNK, placed after IDAT, so
    # only decoding reaches it: the header probe passes, render refuses it.
    payload = b"Comment\x00\x00" + zlib.compress(b"\x00" * (8 * 1024 * 1024))
    path = _png_with_trailing_chunk(tmp_path / "ztxt_bomb.png", b"zTXt", payload)
    probe(path, LIMITS)
    with pytest.raises(DecompressionBomb):
        render(path, PIPELINE_V1_SPECS["thumbnail"], LIMITS)


def test_png_exif_after_pixel_data_is_honoured_by_render(tmp_path: Path) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6
    path = _png_with_trailing_chunk(tmp_path / "late_exif.png", b"eXIf", exif.tobytes()[6:])
    # probe reads headers only and cannot see it (documented) ...
    assert probe(path, LIMITS).orientation == 1
    # ... render decodes the file anyway and applies it
    out = render(path, PIPELINE_V1_SPECS["optimized"], LIMITS)
    assert (out.width, out.height) == (20, 40)


def test_animated_gif_renders_first_frame_only() -> None:
    # the second frame declares 4.3 gigapixels; it must never be reached
    out = render(path_of("pillow/decompression_bomb_extents.gif"), PIPELINE_V1_SPECS["crop"], LIMITS)
    assert (out.width, out.height) == (512, 512)
    with Image.open(path_of("pillow/iss634.gif")) as src:
        first = src.convert("RGB")
    out = decode(render(path_of("pillow/iss634.gif"), PIPELINE_V1_SPECS["optimized"], LIMITS))
    assert mean_abs_diff(out, first) < 6


def test_cover_upscales_small_images_to_exact_size() -> None:
    out = render(path_of("synthetic/png_1x1_rgba.png"), PIPELINE_V1_SPECS["crop"], LIMITS)
    assert (out.width, out.height) == (512, 512)
    out = render(path_of("pillow/hopper.jpg"), PIPELINE_V1_SPECS["crop"], LIMITS)
    assert (out.width, out.height) == (512, 512)


def test_cover_crops_the_centre() -> None:
    rel = "photos/chelsea.jpg"
    spec = PIPELINE_V1_SPECS["crop"]
    out = decode(render(path_of(rel), spec, LIMITS))
    assert mean_abs_diff(out, reference(rel, spec, (512, 512))) < 4


# --- determinism ------------------------------------------------------------


@pytest.mark.parametrize(
    "rel",
    [
        "photos/astronaut_12mp_3464x3464.jpg",
        "pillow/icc_profile_big.jpg",
        "pillow/pil123rgba.png",  # PNG + WebP output
        "pillow/xmp_tags_orientation.png",
        "pillow/tiff_tiled_cmyk_jpeg.tif",
        "synthetic/exif_gps_orientation6.jpg",
    ],
)
def test_output_is_deterministic(rel: str) -> None:
    for spec in SPECS:
        first = render(path_of(rel), spec, LIMITS)
        second = render(path_of(rel), spec, LIMITS)
        assert first == second


# --- phone photos: HEIC and AVIF --------------------------------------------

CARDS = ["phones/card_p3_orientation6.heic", "phones/card_p3_orientation6.avif"]
AVIF_SPECS = [
    VariantSpec("avif-fit", "fit", 256, 256, output="avif"),
    VariantSpec("avif-cover", "cover", 512, 512, output="avif"),
    VariantSpec("avif-bounded", "bounded", 2048, 2048, output="avif"),
]
#: How far a quadrant of a derivative may be from its sRGB colour (lossy
#: HEVC/AV1 and JPEG/AVIF out); ignoring the P3 profile is off by up to 40.
COLOUR_TOLERANCE = 6


def quadrant_colours(image: Image.Image) -> dict[str, tuple[float, ...]]:
    """The mean colour of the middle of each quadrant (away from the edges' ringing)."""
    image = image.convert("RGB")
    width, height = image.size
    colours = {}
    for name in phone_images.QUADRANTS:
        left = 0 if name.endswith("left") else width // 2
        top = 0 if name.startswith("top") else height // 2
        box = (left + width // 8, top + height // 8, left + width // 2 - width // 8, top + height // 2 - height // 8)
        colours[name] = tuple(ImageStat.Stat(image.crop(box)).mean)
    return colours


def assert_upright_srgb_card(image: Image.Image) -> None:
    for name, colour in quadrant_colours(image).items():
        expected = phone_images.QUADRANTS[name]
        assert max(abs(a - b) for a, b in zip(colour, expected)) <= COLOUR_TOLERANCE, (name, colour, expected)


def test_the_card_tells_a_wrong_rendering_apart() -> None:
    """The P3 numbers and every quarter turn of the card are far from the right answer."""
    p3 = {name: phone_images.p3_numbers(colour) for name, colour in phone_images.QUADRANTS.items()}
    assert max(max(abs(a - b) for a, b in zip(p3[n], c)) for n, c in phone_images.QUADRANTS.items()) >= 35
    assert len(set(phone_images.QUADRANTS.values())) == 4  # any turn or flip moves a colour


@pytest.mark.parametrize("rel", CARDS)
def test_phone_photos_come_out_upright_in_srgb(rel: str) -> None:
    with Image.open(path_of(rel)) as src:  # as stored: turned left, P3 numbers
        assert src.info.get("icc_profile") == phone_images.DISPLAY_P3.read_bytes()
    for spec in [*SPECS, *AVIF_SPECS]:
        out = render(path_of(rel), spec, LIMITS)
        im = decode(out)
        if spec.kind == "cover":
            assert im.size == (spec.width, spec.height)
        else:
            assert im.size == (min(spec.width, 600), round(min(spec.width, 600) * 2 / 3)), spec  # landscape, 3:2
        assert_upright_srgb_card(im)


def test_heic_rotation_is_applied_once() -> None:
    """An iPhone writes the turn twice, as irot and as EXIF orientation; libheif applies irot only."""
    rel = "phones/card_p3_orientation6.heic"
    with Image.open(path_of(rel)) as src:
        assert src.info["original_orientation"] == 6  # the EXIF in the file says 6 ...
        assert src.getexif().get(ExifTags.Base.Orientation, 1) == 1  # ... pillow-heif resets it: irot rules
    info = probe(path_of(rel), LIMITS)
    assert (info.format, info.content_type, info.width, info.height, info.orientation, info.frames) == \
        ("HEIF", "image/heic", 600, 400, 1, 1)


def test_avif_rotation_is_reported_like_a_jpeg() -> None:
    info = probe(path_of("phones/card_p3_orientation6.avif"), LIMITS)
    assert (info.format, info.content_type, info.width, info.height, info.orientation, info.frames) == \
        ("AVIF", "image/avif", 400, 600, 6, 1)


def test_heic_and_avif_sizes_are_checked_from_the_container(monkeypatch) -> None:
    spy = LoadSpy(monkeypatch)
    for rel in CARDS:  # 400x600 as stored: both sides are in the container
        with pytest.raises(ImageTooLarge):
            probe(path_of(rel), Limits(max_dimension=500))
        with pytest.raises(DecompressionBomb):
            probe(path_of(rel), Limits(max_pixels=200_000))
    assert spy.calls == []


def test_container_layout_is_read_from_box_headers() -> None:
    with open(path_of("phones/card_p3_orientation6.heic"), "rb") as fp:
        fp.seek(7)
        layout = bmff.read_layout(fp)
        assert fp.tell() == 7, "the walk restores the file position"
    # the grid (stored 400x600, its canvas) and its 256 px tiles, six of them decoded whole; HEVC 4:2:0 at 8 bits
    assert layout == bmff.Layout(sizes=((400, 600), (256, 256)), truncated=False, picture_bytes=1.5,
                                 item_pixels=6 * 256 * 256, canvas_pixels=400 * 600,
                                 heif_bytes=(6 * 256 * 256 + 400 * 600) * 1.5, largest_picture=400 * 600,
                                 profile_bytes=layout.profile_bytes, metadata_bytes=36,
                                 file_bytes=path_of("phones/card_p3_orientation6.heic").stat().st_size)
    assert 0 < layout.profile_bytes < 10_000, "its Display P3 profile, once for each item it is associated with"
    # (its Exif item: 36 bytes, the orientation)
    with open(path_of("phones/card_truncated60.avif"), "rb") as fp:
        assert bmff.read_layout(fp).truncated


@pytest.mark.parametrize(("kind", "config", "expected"), [
    # byte 16: 6 reserved bits (set), chroma_format_idc; 17, 18: 5 reserved bits, bit depth - 8
    (b"hvcC", bytes(16) + bytes([0xFC, 0xF8, 0xF8]), 1.0),  # grey, 8 bits
    (b"hvcC", bytes(16) + bytes([0xFC | 1, 0xF8, 0xF8]), 1.5),  # 4:2:0, 8 bits
    (b"hvcC", bytes(16) + bytes([0xFC | 1, 0xF8 | 2, 0xF8 | 2]), 3.0),  # 4:2:0, 10 bits
    (b"hvcC", bytes(16) + bytes([0xFC | 3, 0xF8 | 4, 0xF8 | 4]), 6.0),  # 4:4:4, 12 bits
    (b"av1C", bytes([0x81, 0x00, 0b0000_1100]), 1.5),  # 4:2:0, 8 bits
    (b"av1C", bytes([0x81, 0x00, 0b0100_1000]), 4.0),  # 4:2:2, 10 bits
    (b"av1C", bytes([0x81, 0x00, 0b0100_0000]), 6.0),  # 4:4:4, 10 bits
    (b"av1C", bytes([0x81, 0x00, 0b0001_1100]), 1.0),  # monochrome
    (b"av1C", bytes([0x81]), None),  # too short to say
])
def test_codec_configurations_price_the_decoded_picture(kind: bytes, config: bytes, expected: float | None) -> None:
    assert bmff.picture_bytes(kind, config) == expected


def test_libheif_security_limits_are_bombs() -> None:
    error = RuntimeError("Memory allocation error: Security limit exceeded: Image size 65000x65000 exceeds the "
                         "maximum image size 1073741824")
    assert isinstance(translate_decode_error(error), DecompressionBomb)
    assert isinstance(translate_decode_error(RuntimeError("Decoder plugin generated an error")), CorruptImage)


@pytest.mark.parametrize("rel", ["photos/chelsea.jpg", "pillow/pil123rgba.png", *CARDS])
def test_avif_output(rel: str) -> None:
    for spec in AVIF_SPECS:
        out = render(path_of(rel), spec, LIMITS)
        assert (out.content_type, out.extension) == ("image/avif", "avif")
        assert out.data[4:12] == b"ftypavif"
        im = decode(out)
        assert (im.format, im.size) == ("AVIF", (out.width, out.height))
        assert im.mode == ("RGBA" if rel.endswith("rgba.png") else "RGB")  # alpha kept where there is some
        assert "icc_profile" not in im.info and "xmp" not in im.info
        assert len(im.getexif()) == 0, "nothing from the source, no orientation either: the pixels are upright"
        assert render(path_of(rel), spec, LIMITS) == out, "deterministic"


@pytest.mark.parametrize("family", ["JPEG", "WEBP", "TIFF", "PNG"])
def test_an_images_metadata_is_priced_in_its_budget(tmp_path: Path, family: str) -> None:
    """64x64 images carrying 45 MB of ICC profile or XMP took 92-189 MB a render, priced as 64x64 pixels (an
    adversarial run): what Pillow keeps of the metadata is priced, and the render stays within the price."""
    from PIL import ImageCms

    from app.adapters.imaging import budget, segments

    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    icc = profile + bytes(20_000_000)  # a valid header and tags, padded: 20 MB that Pillow keeps
    path = tmp_path / f"meta.{family.lower()}"
    if family == "PNG":  # a compressed iCCP inflates to at most 1 MB in Pillow: a private chunk instead, kept too
        import zlib

        Image.new("RGB", (64, 64), (10, 200, 30)).save(path, family)
        data, private = path.read_bytes(), bytes(20_000_000)
        chunk = struct.pack(">I", len(private)) + b"prIv" + private + struct.pack(">I", zlib.crc32(b"prIv" + private))
        path.write_bytes(data[:-12] + chunk + data[-12:])
    else:
        Image.new("RGB", (64, 64), (10, 200, 30)).save(path, family, icc_profile=icc)
    with open(path, "rb") as fp:
        found = segments.metadata_bytes(fp, family)
        assert fp.tell() == 0
        with Image.open(path) as img:
            priced = budget.estimate(img, family, fp, PIPELINE_V1_SPECS["optimized"])
    assert found >= 20_000_000, found
    assert priced.total >= budget.METADATA_COPIES * 20_000_000
    used = _peak_rss_delta_mb(f"render({str(path)!r}, PIPELINE_V1_SPECS['optimized'], Limits())\n")
    assert used * 2**20 <= priced.total, (used, priced.describe())


def _lossless_jpeg(path: Path, width: int, height: int, components: int) -> Path:
    """A lossless JPEG (SOF3, predictor 1, every difference 0: one bit a sample), which Pillow cannot write."""
    def segment(marker: int, payload: bytes) -> bytes:
        return b"\xff" + bytes([marker]) + struct.pack(">H", len(payload) + 2) + payload

    frame = struct.pack(">BHHB", 8, height, width, components) + b"".join(
        bytes([i + 1, 0x11, 0]) for i in range(components))
    table = bytes([0x00]) + bytes([1] + [0] * 15) + bytes([0])  # one code of one bit: difference 0
    scan = bytes([components]) + b"".join(bytes([i + 1, 0x00]) for i in range(components)) + bytes([1, 0, 0])
    path.write_bytes(b"\xff\xd8" + segment(0xC3, frame) + segment(0xC4, table) + segment(0xDA, scan)
                     + bytes((width * height * components + 7) // 8) + b"\xff\xd9")
    return path


def test_a_lossless_jpeg_large_enough_to_be_drafted_renders(tmp_path) -> None:
    """libjpeg cannot decode a lossless JPEG at a reduced scale: asked to (``Image.draft``), its decode broke, and
    every variant of a 3000x3000 or 8000x4000 one failed ``corrupt_image`` after a 202 (an adversarial run). It is
    decoded whole, and priced so."""
    for path in (_lossless_jpeg(tmp_path / "grey.jpg", 3000, 2000, 1),
                 _lossless_jpeg(tmp_path / "rgb.jpg", 1600, 1200, 3)):
        probe(path, LIMITS)
        longest = max(Image.open(path).size)
        for spec in SPECS:
            out = render(path, spec, LIMITS)
            size = (out.width, out.height)
            if spec.name == "crop":
                assert size == (512, 512), (path.name, size)
            else:
                assert max(size) == min(256 if spec.name == "thumbnail" else 2048, longest), (path.name, spec.name, size)
            grey = decode(out).convert("L")  # every sample 128: the predictor's first, and no difference after it
            assert abs(ImageStat.Stat(grey).mean[0] - 128) < 2, (path.name, spec.name)
