"""HEIF and AVIF containers (ISO base media file format): brands and declared sizes.

HEIC and AVIF are the same container, boxes of ``size, type, payload``,
holding different codecs (HEVC, AV1). Two questions are answered here,
from the container alone, before libheif or libavif see the bytes:

* :func:`family` - which of the two a file is, from its ``ftyp`` box (the
  major brand, or for the generic ``mif1``/``msf1``/``miaf`` brands the
  compatible brands that follow), for :func:`~app.adapters.imaging.sniff.sniff`.
* :func:`read_layout` - every image size the file declares (each ``ispe``
  property: the primary image, grid tiles, thumbnails, auxiliary images;
  an image sequence's track sizes; and the largest frame an AV1 sequence
  header allows, in each AV1 item's data, in a sequence's first sample and in
  each ``av1C``, which is what libavif decodes whatever ``ispe`` says),
  whether the top-level boxes run past the end of the file, and how large
  the codec's decoded pictures are (bit depth and chroma subsampling from
  each ``hvcC``/``av1C`` property), for
  :func:`~app.adapters.imaging.probe.open_checked` and the memory budget.
  libavif refuses an image larger than its own limit as a generic parse
  failure and libheif only at decode time; reading the sizes here holds
  both to attache's limits, and refuses them as the bombs they are,
  whatever the library would say.

Only box headers, the few bytes of those properties and the OBU headers of
the AV1 data are read, a few hundred bytes for a phone photo; at most
:data:`MAX_BOXES` boxes, :data:`MAX_EXTENTS` extents and :data:`MAX_OBUS`
OBUs are looked at.
"""

from __future__ import annotations

import bisect
import itertools
import os
import struct
from dataclasses import dataclass, field
from typing import BinaryIO

from app.errors import CorruptImage, DecompressionBomb

#: Brands that name the codec: an HEVC-coded HEIF still image or sequence, an AV1 one.
HEIF_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs"})
AVIF_BRANDS = frozenset({b"avif", b"avis"})
#: Structural brands that say "HEIF" without saying which codec; the compatible brands decide.
GENERIC_BRANDS = frozenset({b"mif1", b"msf1", b"miaf"})

#: The most boxes in one file, and items in its ``iloc``: a phone photo has a few dozen (a grid of 48 tiles some
#: 200). More is a bomb: libavif reads on where a walk that stopped would not (4,096 empty boxes before ``meta`` hid
#: an 8000x8000 frame; 100,000 items took libavif 11 s of CPU to look up: an adversarial run).
MAX_BOXES = 4096
#: Bytes a pixel of a decoded picture takes when no codec configuration says
#: (the worst case: more than 8 bits, stored in 16, at 4:4:4).
UNKNOWN_PICTURE_BYTES = 6.0
#: The most bytes of an ``iloc`` box (a phone photo's holds a few dozen items: some 16 bytes each); more is a bomb.
MAX_ILOC_BYTES = 1 << 16
#: The most extents of all items in a file's ``iloc`` (a phone photo's items have one each); more is a bomb: libavif
#: keeps 16 bytes for each, though fields 0 bytes wide cost the file nothing (1,000 items of 65,535 took 1 GB).
MAX_EXTENTS = 1 << 16
#: The most samples (and chunks) of an image sequence's track: libavif keeps 56 bytes for each, though one sample
#: size in ``stsz`` serves them all (2,569,017 samples took 577 MB from a 1.3 MB file: an adversarial run). An
#: animated photo has a few hundred.
MAX_SAMPLES = 1 << 16
#: The most bytes of one AV1 sequence header read (some 10-20 in a photo; 32 operating points make a few hundred).
SEQUENCE_HEADER_BYTES = 1024
#: Boxes nested in boxes, at most (an image sequence's av1C is 8 deep); deeper is corrupt (2,000 nested ``moov``
#: raised a RecursionError out of the probe: a review).
MAX_DEPTH = 32
#: Distinct AV1 sequence headers read in one file, at most (a photo's items share one; each takes the walk up to
#: 0.4 ms in Python: 16,000 of them took 6 s a read, a review); more is a bomb.
MAX_SEQUENCE_HEADERS = 256
#: Frames in one AV1 item's data (or a sequence's first sample), at most: a photo's has one, a video frame's a few
#: (hidden ones it refers to); the decoder decodes each until it shows one (1,000 hidden key frames in one item
#: took 21 s of CPU an open: an adversarial run).
MAX_FRAMES = 16
#: the pictures of an item's frames the decoder holds at once, at most: AV1's eight reference slots. A layered
#: ("progressive") item's frames are each a picture: four layers of 4800x4800 took 377 MiB a render priced 250 as
#: one (an adversarial run)
HELD_PICTURES = 8
#: The most bytes of an ``hvcC`` box (a photo's is some 100-200 bytes); more is a bomb: libheif reads it whole, and a
#: parameter set placed past a bound on what is read here went unpriced (an adversarial run).
MAX_HVCC_BYTES = 1 << 16
#: The most NAL units of a file's ``hvcC`` boxes and HEVC items walked for parameter sets: a photo has a few per
#: configuration and per item. More is a bomb (90 configurations of 32,700 empty NAL units took 1.9 s a walk, and the
#: worker walks once a variant: an adversarial run).
MAX_NAL_UNITS = 1 << 14
#: HEVC sequence parameter sets read in one file, at most (a photo's items share one); more is a bomb.
MAX_HEVC_SPS = 256
#: The item types whose data is a coded picture, decoded at its ``ispe``'s size whatever the image it makes.
CODED_ITEMS = frozenset({b"hvc1", b"av01"})
#: The most OBUs of a file's AV1 items (and image sequences' first samples) walked for sequence headers: each of a
#: photo's has 3-5 (a temporal delimiter, a sequence header, a frame, or a frame header and its tile groups), and a
#: grid a few hundred items. More is a bomb: the frames they make could not be priced.
MAX_OBUS = 1 << 14
# Boxes whose payload is more boxes, after the bytes given here: a version and flags for ``meta``, and an entry
# count too for ``stsd``; a track's boxes down to its sample table.
_CONTAINERS = {b"meta": 4, b"iprp": 0, b"ipco": 0, b"moov": 0, b"trak": 0, b"mdia": 0, b"minf": 0, b"stsd": 8}
#: The fields of a visual sample entry (``av01``) before its boxes (ISO/IEC 14496-12, 12.1.3): width and height at 24.
_SAMPLE_ENTRY_BYTES = 78


def family(head: bytes) -> str | None:
    """``"HEIF"``, ``"AVIF"`` or ``None``, from the ``ftyp`` box at the start of *head*."""
    if len(head) < 16 or head[4:8] != b"ftyp":
        return None
    size = int.from_bytes(head[:4], "big")
    major = head[8:12]
    compatible = [head[i:i + 4] for i in range(16, min(size, len(head)) - 3, 4)]
    for brand in (major, *compatible) if major in GENERIC_BRANDS else (major,):
        if brand in AVIF_BRANDS:
            return "AVIF"
        if brand in HEIF_BRANDS:
            return "HEIF"
    return None


@dataclass(frozen=True)
class Layout:
    """What :func:`read_layout` found."""

    #: (width, height) of every ``ispe`` property, in file order, then of each track's header and AV1 sample entry,
    #: of each frame an AV1 sequence header allows, and of each picture an HEVC sequence parameter set does (one
    #: no ``ispe`` gives).
    sizes: tuple[tuple[int, int], ...]
    #: a top-level box runs past the end of the file (a cut-off upload).
    truncated: bool
    #: bytes per pixel of the largest decoded picture the codec configurations
    #: describe (Y plus subsampled Cb/Cr, 1 byte a sample at 8 bits, 2 above),
    #: or :data:`UNKNOWN_PICTURE_BYTES` when there is none.
    picture_bytes: float
    #: the size of the file (libheif and libavif read all of it into memory).
    file_bytes: int
    #: (width, height) of the largest frame an AV1 sequence header allows (its ``max_frame_width`` and
    #: ``max_frame_height``: every one in an AV1 item's data, in an image sequence's first sample, in an ``av1C``),
    #: or None: what libavif decodes, whatever ``ispe`` or a track header says. A 1,953-byte AVIF whose ``ispe``
    #: said 256x256 held a 12000x12000 frame: 520 MB a render, priced as 256x256 (an adversarial run).
    coded: tuple[int, int] | None = None
    #: pixels of the largest frame of each AV1 item, summed (or of each image sequence track's first sample, if
    #: more: libavif decodes the items or the tracks, not both): libavif decodes a grid's every tile, each with a
    #: decoder of its own, and holds them together (a one-row grid of tall tiles under a small ``ispe`` was priced
    #: as one tile: an adversarial run), and an alpha item beside its colour item
    coded_pixels: int = 0
    #: the bytes of those pictures (each frame's pixels at its own sequence header's bytes per pixel: an alpha
    #: item's are grey)
    coded_bytes: float = 0.0
    #: pixels of every coded item (HEVC or AV1), by the ``ispe`` associated with it, summed: libheif decodes each
    #: picture the image is made of at its own size, whatever crop (``clap``), grid, overlay or alpha makes of it
    #: (a 1x1 crop of an 8000x8000 picture rendered in 341 MB priced as 1x1: an adversarial run)
    item_pixels: int = 0
    #: pixels of the canvas of every grid and overlay the primary image is made from, summed: libheif allocates
    #: each at its picture's bytes per pixel, though a crop (``clap``), an ``iden`` or an outer grid makes a small
    #: image of it (a 996-byte grid of 8000x8000, cropped to 64x64, took 387 MB a render priced 17; nested under
    #: a 1x1 grid, 734 MB: an adversarial run)
    canvas_pixels: int = 0
    #: what libheif holds for the primary image's pictures and canvases, in bytes: each coded item's picture at
    #: its own bytes per pixel, once for each reference a grid or an overlay makes to it (libheif decodes a tile
    #: each time it is named); each grid's canvas at the pictures' bytes per pixel; each overlay's canvas at
    #: :data:`OVERLAY_CANVAS_BYTES` and its inputs at :data:`OVERLAY_INPUT_BYTES` (HEIC only: libavif makes no
    #: canvas but a grid's, priced by its tiles)
    heif_bytes: float = 0.0
    #: pixels of the largest of those pictures and canvases: libheif converts a picture to RGB before a crop
    #: makes it small (a 1x1 crop of an 8000x8000 picture took 341 MB: an adversarial run)
    largest_picture: int = 0
    #: bytes of the colour profiles (``colr`` properties) in ``ipco``, each once for every item it is associated
    #: with: pillow-heif copies a profile into the info of each top-level image it opens (16 images sharing one 47
    #: MB profile took 846 MB an open, priced 102: a re-attack)
    profile_bytes: int = 0
    #: bytes of the metadata items' data, each item's ``iloc`` extents (each cut at the file's end) once for every
    #: ``cdsc`` reference that names it: libheif reads every item a ``cdsc`` reference names, whatever its type,
    #: joins its extents and attaches it once a reference, and pillow-heif copies each when it opens the file,
    #: before a price (a 40 MB Exif item took 241 MB a probe, unreserved, eight at once 1.5 GB of the web; a ``uri ``
    #: item 160 MB; a 4 MB file listing its item's bytes 32 times 388 MB, one naming a 10 MB Exif item 32 times 370
    #: MB: re-attacks). ``Exif`` and ``mime`` items are counted once even with no reference.
    metadata_bytes: int = 0
    #: the AV1 decoders (dav1d instances) libavif opens for the primary image, all alive until the image is done:
    #: one shared by every tile of the colour item and its alpha, unless the tiles differ in operating point
    #: (``a1op``) or in decoding all layers (``lsel``), or one of the two is a single tile beside the other, when
    #: each tile gets its own (:func:`_av1_decoders`); an image sequence's, one a track (colour, alpha). A 134 KB
    #: grid of 3,072 64x64 tiles, every second one tagged with operating point 1, took 3.2 GB of a worker priced
    #: 122 MB, holding a decoder and its threads per tile (an adversarial run).
    av1_decoders: int = 0
    #: :attr:`coded_bytes` with each frame's rows as dav1d lays them out, padded to
    #: :data:`DAV1D_ROW_ALIGNMENT` pixels: what each of several decoders holds at once (a 130-pixel-wide tile takes
    #: 256 columns)
    padded_coded_bytes: float = 0.0


#: An overlay's canvas: libheif draws it in RGB planes at its first input's bit depth, up to 16 bits (a 5400x5400
#: canvas over a 64x64 10-bit input took 334 MiB priced 286 at 8 bits: a re-attack).
OVERLAY_CANVAS_BYTES = 6
#: Each input of an overlay, per pixel, besides its coded picture: libheif converts it to RGB 4:4:4 at its own
#: bit depth before it draws it, through a second copy (a 7500x7500 10-bit grey input cropped to 64x64 took 926
#: MiB a render priced 277: an adversarial run of 2026-12-07).
OVERLAY_INPUT_BYTES = 12


#: The auxiliary types (``auxC``) of an alpha plane, which the decoder decodes with its image.
ALPHA_TYPES = frozenset({b"urn:mpeg:mpegB:cicp:systems:auxiliary:alpha", b"urn:mpeg:hevc:2015:auxid:1",
                         b"urn:mpeg:avc:2015:auxid:1"})  # libheif's three (the last was missed: an adversarial run)


def _decoded_items(found: "_Found") -> set[int] | None:
    """The items decoding the primary image decodes (``pitm``): it, the items it is derived from (``dimg``: a
    grid's tiles, an overlay's inputs, theirs in turn), and its alpha (``auxl`` with an alpha ``auxC``), but not
    its thumbnails, depth or gain map; None without a primary (then every item counts)."""
    if found.primary is None:
        return None
    decoded, todo = set(), [found.primary]
    alphas_of: dict[int, set[int]] = {}  # an item's alphas, by the item (a lookup in every alpha's targets per item
    for alpha, targets in found.references.get(b"auxl", {}).items():  # took seconds: an adversarial run)
        if any(found.aux_types.get(index) in ALPHA_TYPES for index in found.associations.get(alpha, ())):
            for target in set(targets):
                alphas_of.setdefault(target, set()).add(alpha)
    while todo and len(decoded) <= MAX_BOXES:
        item = todo.pop()
        if item in decoded:
            continue
        decoded.add(item)
        todo += found.references.get(b"dimg", {}).get(item, [])
        todo += alphas_of.get(item, ())
    return decoded


#: ``lsel``'s layer_id that selects no layer (all of them): as absent, the decoder outputs its usual frame.
ALL_LAYERS = 0xFFFF


#: dav1d allocates a picture's rows padded to a multiple of this many pixels (its planes' stride)
DAV1D_ROW_ALIGNMENT = 128


def _dav1d_row(width: int) -> int:
    """The pixels of a ``width``-wide frame's row as dav1d allocates it."""
    return -(-width // DAV1D_ROW_ALIGNMENT) * DAV1D_ROW_ALIGNMENT


def _av1_decoders(found: "_Found", wanted: set[int] | None) -> int:
    """:attr:`Layout.av1_decoders`, by libavif's rule (``avifDecoderCreateCodecs`` and
    ``avifTilesCanBeDecodedWithSameCodecInstance`` in its src/read.c, v1.4.2, the version Pillow bundles): the
    image's tiles (a grid's cells, or the item itself; then its alpha's) share one codec when there is one tile, or
    when no category (colour, alpha) is a single tile beside the other and every tile has the first's operating
    point (its first ``a1op``'s op_index, 0 without one) and the first's all-layers setting (an ``lsel`` whose
    layer_id is not :data:`ALL_LAYERS`); otherwise each tile has a codec of its own. Pillow never asks for
    progressive decoding nor for a gain map, so neither makes a tile here. An image sequence is decoded with a
    codec for its colour track and one for its alpha."""
    av1 = [item for item, kind in found.item_types.items() if kind == b"av01" and (wanted is None or item in wanted)]
    colour: set[int] = set()
    todo = [found.primary] if found.primary is not None else list(av1)
    while todo and len(colour) <= MAX_BOXES:  # the primary and what it is derived from (a grid's tiles)
        item = todo.pop()
        if item not in colour:
            colour.add(item)
            todo += found.references.get(b"dimg", {}).get(item, [])
    categories = [[item for item in av1 if item in colour], [item for item in av1 if item not in colour]]
    tiles = [(_first_property(found, item, found.operating_points, 0),
              _first_property(found, item, found.layer_selections, ALL_LAYERS) != ALL_LAYERS)
             for category in categories for item in category]
    tracks = min(2, sum(isinstance(item, tuple) for item, _, _ in found.items))
    if len(tiles) <= 1:
        return max(len(tiles), tracks)
    stolen = all(categories) and any(len(category) == 1 for category in categories)
    shared = not stolen and all(tile == tiles[0] for tile in tiles)
    return max(1 if shared else len(tiles), tracks)


def _first_property(found: "_Found", item: int, values: dict[int, int], default: int) -> int:
    """The value of the first of an item's properties (in ``ipma`` order) that ``values`` holds, as libavif's
    ``avifPropertyArrayFind`` finds it; ``default`` without one."""
    return next((values[index] for index in found.associations.get(item, ()) if index in values), default)


def _item_size(found: "_Found", item: int) -> int:
    """Pixels of a coded item's largest picture: its ``ispe`` and configurations' sizes, its own data's."""
    sizes = [found.properties[index - 1] for index in found.associations.get(item, ())
             if 0 < index <= len(found.properties) and found.properties[index - 1]]
    sizes += [found.item_sizes[item]] if item in found.item_sizes else []
    return max((width * height for width, height in sizes), default=0)


def _item_pixels(found: "_Found", decoded: set[int] | None) -> int:
    return sum(_item_size(found, item) for item, kind in found.item_types.items()
               if kind in CODED_ITEMS and (decoded is None or item in decoded))


def _picture_pixels(found: "_Found", item: int, depth: int = 0) -> int:
    """Pixels of the picture an item gives: a grid's or overlay's canvas, a coded item's largest picture, or for
    another derived item (an ``iden``) the largest of what it is derived from, whatever ``ispe`` it lacks (an
    overlay over an ``iden`` with none, over 7500x7500 pixels, was priced as no input: 604 MiB a render priced 277,
    a re-attack)."""
    if item in found.canvases:
        return found.canvases[item][0] * found.canvases[item][1]
    own = _item_size(found, item)
    if found.item_types.get(item) in CODED_ITEMS or depth >= MAX_DEPTH:
        return own
    targets = found.references.get(b"dimg", {}).get(item, ())[:MAX_BOXES]
    return max([own, *(_picture_pixels(found, target, depth + 1) for target in targets)])


def _profile_bytes(found: "_Found") -> int:
    """:attr:`Layout.profile_bytes`."""
    uses = {index: 0 for index in found.profile_sizes}
    for indices in found.associations.values():
        for index in set(indices):
            if index in uses:
                uses[index] += 1
    return sum(size * max(1, uses[index]) for index, size in found.profile_sizes.items())


#: The item types of a HEIF's metadata: Exif, and XMP (a ``mime`` item)
METADATA_ITEMS = frozenset({b"Exif", b"mime"})


def _metadata_bytes(found: "_Found", file_end: int) -> int:
    """:attr:`Layout.metadata_bytes`."""
    described = found.references.get(b"cdsc", {})
    total = 0
    for item, _method, extents in found.items:
        uses = len(described.get(item, ()))
        if uses or found.item_types.get(item) in METADATA_ITEMS:
            total += max(1, uses) * sum(min(length or file_end, max(0, file_end - offset))
                                        for offset, length in extents)
    return total


def _heif_bytes(found: "_Found", picture: float, decoded: set[int] | None) -> tuple[float, int]:
    """:attr:`Layout.heif_bytes` and :attr:`Layout.largest_picture`, over the items ``decoded``
    (:func:`_decoded_items`)."""
    if decoded is None:
        decoded = set(found.item_types)
    inputs = found.references.get(b"dimg", {})
    named: dict[int, int] = {}  # how many times a decoded grid or overlay names each item
    for item in decoded:
        if found.item_types.get(item) in DERIVED_CANVASES:
            for target in inputs.get(item, ())[:MAX_BOXES]:
                named[target] = named.get(target, 0) + 1
    total, largest = 0.0, 0
    for item in decoded:
        kind = found.item_types.get(item)
        if kind in CODED_ITEMS:
            own = [found.property_bytes[index] for index in found.associations.get(item, ())
                   if index in found.property_bytes]
            own += [found.item_bytes[item]] if item in found.item_bytes else []
            pixels = _item_size(found, item)
            total += pixels * max(own, default=picture) * max(1, named.get(item, 0))
        elif kind in DERIVED_CANVASES and item in found.canvases:
            pixels = found.canvases[item][0] * found.canvases[item][1]
            if kind == b"grid":
                total += pixels * picture
            else:
                total += pixels * OVERLAY_CANVAS_BYTES
                for target in inputs.get(item, ())[:MAX_BOXES]:
                    total += _picture_pixels(found, target) * OVERLAY_INPUT_BYTES
        else:
            continue
        largest = max(largest, pixels)
    return total, largest


def read_layout(fp: BinaryIO) -> Layout:
    """Walk the top-level boxes and the ``meta`` box; the file position is restored.

    A box that cannot be parsed stops the walk (libheif or libavif will say
    what is wrong with it); what was found until then is returned.
    """
    position = fp.tell()
    try:
        end = fp.seek(0, os.SEEK_END)
        found = _Found()
        truncated = _walk(fp, 0, end, end, found, budget=[MAX_BOXES])
        reading = _Reading()
        frames = [frame for config in found.configs for frame in _sequence_headers(_Data.of(config), reading)]
        decoded: dict[bool, list[tuple[int, int, float]]] = {False: [], True: []}  # an item's, a track's
        wanted = _decoded_items(found)
        for item_id, method, extents in found.items:
            if found.item_types.get(item_id) in DERIVED_CANVASES:
                _canvas(item_id, _Data(fp, _placed(method, extents, found.idat, end)), found)
                continue
            if found.item_types.get(item_id) == b"hvc1" and (wanted is None or item_id in wanted):
                _hevc_item(item_id, _Data(fp, _placed(method, extents, found.idat, end)), found)
                continue
            track = isinstance(item_id, tuple)  # a track's first sample (only AV1 tracks are kept): always decoded
            if track or (found.item_types.get(item_id) == b"av01" and (wanted is None or item_id in wanted)):
                item_frames = _sequence_headers(_Data(fp, _placed(method, extents, found.idat, end)), reading)
                frames += item_frames
                if item_frames:
                    width, height, per_pixel = max(item_frames, key=lambda f: f[0] * f[1] * f[2])
                    held = min(max(1, reading.frames), HELD_PICTURES)
                    decoded[track].append((width, height, per_pixel * held))
        picture = max([*found.pictures, *(frame[2] for frame in frames)], default=UNKNOWN_PICTURE_BYTES)
        coded = max((frame[:2] for frame in frames), key=lambda size: size[0] * size[1], default=None)
        sizes = tuple(found.sizes) + tuple(dict.fromkeys(frame[:2] for frame in frames)) + tuple(
            size for size in dict.fromkeys(found.hevc_sizes) if size not in found.sizes)
        coded_pixels = max(sum(w * h for w, h, _ in source) for source in decoded.values())
        coded_bytes = max(sum(w * h * bpp for w, h, bpp in source) for source in decoded.values())
        padded_coded_bytes = max(sum(_dav1d_row(w) * h * bpp for w, h, bpp in source) for source in decoded.values())
        canvas_pixels = sum(width * height for item, (width, height) in found.canvases.items()
                            if wanted is None or item in wanted)
        return Layout(sizes, truncated, picture, end, coded, coded_pixels, coded_bytes, _item_pixels(found, wanted),
                      canvas_pixels, *_heif_bytes(found, picture, wanted), _profile_bytes(found),
                      _metadata_bytes(found, end), _av1_decoders(found, wanted), padded_coded_bytes)
    finally:
        fp.seek(position)


@dataclass
class _Found:
    sizes: list[tuple[int, int]] = field(default_factory=list)
    pictures: list[float] = field(default_factory=list)
    #: each item's data (``iloc``), and each AV1 track's first sample: (item ID, construction method, extents of
    #: (offset, length), a length of 0 running to the end of the file); an AV1 track's ID is ``("track", n)``
    items: list[tuple[object, int, list[tuple[int, int]]]] = field(default_factory=list)
    #: the OBUs each ``av1C`` carries (its ``configOBUs``: a sequence header, if any)
    configs: list[bytes] = field(default_factory=list)
    #: where the ``idat`` box's data starts (items of construction method 1 are in it), or None
    idat: int | None = None
    #: the sample table being walked: its first sample's size and chunk offset, whether its entries are AV1
    table: dict = field(default_factory=dict)
    #: each item's type (``iinf``), the ``ipco`` properties in order (an ``ispe``'s size, or None), and each item's
    #: properties by their index from 1 (``ipma``)
    item_types: dict[int, bytes] = field(default_factory=dict)
    properties: list[tuple[int, int] | None] = field(default_factory=list)
    associations: dict[int, list[int]] = field(default_factory=dict)
    #: the primary item (``pitm``), the items' references by type (``iref``: {type: {from: [to, ...]}}) and the
    #: ``auxC`` types of the properties, by index
    primary: int | None = None
    references: dict[bytes, dict[int, list[int]]] = field(default_factory=dict)
    aux_types: dict[int, bytes] = field(default_factory=dict)
    #: the top-level ``meta`` boxes seen (libheif reads the last, libavif the first: a second is refused)
    metas: int = 0
    #: extents left to read of :data:`MAX_EXTENTS`, across every ``iloc`` box (4,095 of them, each of 65,535
    #: extents of fields 0 bytes wide, took 169 s a probe: an adversarial review)
    extents_left: list[int] = field(default_factory=lambda: [MAX_EXTENTS])
    #: the indices (from 1) of the ``ipco`` properties that are ``ispe``
    ispe_properties: set[int] = field(default_factory=set)
    #: the HEVC sequence parameter sets read (:func:`_hevc_sps`), and the NAL units left to walk
    sps_read: int = 0
    nal_units_left: int = MAX_NAL_UNITS
    #: the size of each HEVC item's largest picture its own data's parameter sets allow, by item; the sizes of all
    #: the HEVC parameter sets read
    item_sizes: dict[int, tuple[int, int]] = field(default_factory=dict)
    hevc_sizes: list[tuple[int, int]] = field(default_factory=list)
    #: the canvas of each grid and overlay item (:func:`_canvas`), by item: the largest, if ``iloc`` lists an
    #: item twice (a grid listed again as 64x64 after its 8000x8000 had the smaller priced: a re-attack)
    canvases: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: bytes per pixel of the pictures of each codec configuration in ``ipco`` (its summary's and its parameter
    #: sets'), by property index; and of each HEVC item's own parameter sets, by item
    property_bytes: dict[int, float] = field(default_factory=dict)
    item_bytes: dict[int, float] = field(default_factory=dict)
    #: the size of each ``colr`` property in ``ipco``, by property index
    profile_sizes: dict[int, int] = field(default_factory=dict)
    #: each ``a1op`` property's op_index and each ``lsel``'s layer_id, by property index (:func:`_av1_decoders`)
    operating_points: dict[int, int] = field(default_factory=dict)
    layer_selections: dict[int, int] = field(default_factory=dict)


def picture_bytes(kind: bytes, config: bytes) -> float | None:
    """Bytes per pixel of the pictures an ``hvcC`` or ``av1C`` configuration decodes to.

    ``hvcC``: ``chroma_format_idc`` (0 grey, 1 4:2:0, 2 4:2:2, 3 4:4:4) in
    byte 16, the luma bit depth minus 8 in byte 17 (ISO/IEC 14496-15).
    ``av1C``: byte 2 holds ``high_bitdepth``, ``twelve_bit``, ``monochrome``
    and the two subsampling flags (AV1 ISOBMFF binding, section 2.3).
    """
    if kind == b"hvcC" and len(config) >= 19:
        chroma = config[16] & 0x03
        deep = (config[17] & 0x07) > 0 or (config[18] & 0x07) > 0
        planes = {0: 1.0, 1: 1.5, 2: 2.0, 3: 3.0}[chroma]
    elif kind == b"av1C" and len(config) >= 3:
        flags = config[2]
        deep = bool(flags & 0x40)
        if flags & 0x10:
            planes = 1.0
        else:
            sub_x, sub_y = bool(flags & 0x08), bool(flags & 0x04)
            planes = 1 + 2 / ((1 + sub_x) * (1 + sub_y))
    else:
        return None
    return planes * (2 if deep else 1)


_CONFIG_READ = {b"hvcC": 19, b"av1C": 3}


def _walk(fp: BinaryIO, start: int, stop: int, file_end: int, found: _Found, budget: list[int],
          parent: bytes = b"") -> bool:
    """Read the boxes in ``[start, stop)``, inside the boxes named by ``parent`` (``b"/meta/iinf"``); return whether
    one runs past *file_end*. Boxes are read where libavif reads them: the items' (``iinf``, ``iloc``, ``idat``) in
    the file's own ``meta`` (a track's ``meta`` is another's), a sample table's in ``stbl``: a decoy elsewhere is
    not what libavif reads."""
    if parent.count(b"/") > MAX_DEPTH:
        raise CorruptImage(f"boxes nested more than {MAX_DEPTH} deep")
    offset = start
    while offset + 8 <= stop:
        if budget[0] <= 0:
            raise DecompressionBomb(f"the file has more than {MAX_BOXES} boxes")
        budget[0] -= 1
        fp.seek(offset)
        header = fp.read(16)
        if len(header) < 8:
            return False
        size, kind = struct.unpack(">I4s", header[:8])
        header_size = 8
        if size == 1:  # a 64-bit size follows
            if len(header) < 16:
                return False
            (size,) = struct.unpack(">Q", header[8:16])
            header_size = 16
        elif size == 0:  # to the end of the enclosing box
            size = stop - offset
        if size < header_size:
            return False  # malformed: let the decoder report it
        box_end = offset + size
        if box_end > file_end:
            return True
        if parent == b"/meta/iprp/ipco":
            found.properties.append(None)
        if kind == b"meta" and not parent:
            found.metas += 1
            if found.metas > 1:  # a decoy meta before the one libheif reads lent its ispe to the other's items
                raise CorruptImage("the file has more than one meta box")
        if kind == b"ispe":
            fp.seek(offset + header_size)
            payload = fp.read(12)
            if len(payload) == 12:
                found.sizes.append(struct.unpack(">II", payload[4:12]))
                if parent == b"/meta/iprp/ipco":
                    found.properties[-1] = found.sizes[-1]
                    found.ispe_properties.add(len(found.properties))
        elif kind == b"ipma" and parent == b"/meta/iprp":
            if size - header_size > MAX_ILOC_BYTES:
                raise DecompressionBomb(f"an item property association box of more than {MAX_ILOC_BYTES} bytes")
            fp.seek(offset + header_size)
            _associate(fp.read(size - header_size), found.associations)
        elif kind in _CONFIG_READ:
            fp.seek(offset + header_size)
            config = fp.read(min(size - header_size, MAX_HVCC_BYTES if kind == b"hvcC" else 4 + SEQUENCE_HEADER_BYTES))
            bpp = picture_bytes(kind, config[:_CONFIG_READ[kind]])
            if bpp is not None:
                found.pictures.append(bpp)
            if kind == b"av1C" and len(config) > 4:
                found.configs.append(config[4:])
            if kind == b"hvcC" and parent == b"/meta/iprp/ipco":  # the only ones libheif reads
                if size - header_size > MAX_HVCC_BYTES:  # (libheif reads it whole: a parameter set past a bound
                    raise DecompressionBomb(f"an HEVC configuration of more than {MAX_HVCC_BYTES} bytes")  # hid)
                pictures = [_hevc_sps(nal, found) for nal in _hvcc_nal_units(config, found)]
                found.pictures += [bpp for _, _, bpp in filter(None, pictures)]
                found.property_bytes[len(found.properties)] = max(
                    [bpp or 0.0, *(picture[2] for picture in filter(None, pictures))]) or UNKNOWN_PICTURE_BYTES
                found.hevc_sizes += [(width, height) for width, height, _ in filter(None, pictures)]
                if any(pictures):  # priced as its items' size (_item_pixels)
                    found.properties[-1] = max((picture[:2] for picture in pictures if picture),
                                               key=lambda size: size[0] * size[1])
        elif kind == b"iloc" and parent == b"/meta":
            if size - header_size > MAX_ILOC_BYTES:
                raise DecompressionBomb(f"an item location box of more than {MAX_ILOC_BYTES} bytes")
            fp.seek(offset + header_size)
            found.items.extend(_item_locations(fp.read(size - header_size), found.extents_left))
        elif kind == b"colr" and parent == b"/meta/iprp/ipco":
            found.profile_sizes[len(found.properties)] = size - header_size
        elif kind in (b"a1op", b"lsel") and parent == b"/meta/iprp/ipco":  # neither a full box: the value is first
            fp.seek(offset + header_size)
            width = 1 if kind == b"a1op" else 2
            value = fp.read(min(width, size - header_size))
            if len(value) == width:
                (found.operating_points if kind == b"a1op" else found.layer_selections)[len(found.properties)] = \
                    int.from_bytes(value, "big")
        elif kind == b"auxC" and parent == b"/meta/iprp/ipco":
            fp.seek(offset + header_size + 4)
            found.aux_types[len(found.properties)] = fp.read(min(size - header_size - 4, 256)).split(b"\x00")[0]
        elif kind == b"pitm" and parent == b"/meta" and found.primary is None:
            fp.seek(offset + header_size)
            head = fp.read(8)
            if len(head) >= 6:
                found.primary = int.from_bytes(head[4:6] if head[0] == 0 else head[4:8], "big")
        elif kind == b"iref" and parent == b"/meta":
            if size - header_size > MAX_ILOC_BYTES:
                raise DecompressionBomb(f"an item reference box of more than {MAX_ILOC_BYTES} bytes")
            fp.seek(offset + header_size)
            _refer(fp.read(size - header_size), found.references)
        elif kind == b"iinf" and parent == b"/meta" and not found.item_types:
            fp.seek(offset + header_size)
            version = fp.read(1)[:1]
            inner = offset + header_size + 4 + (2 if version == b"\x00" else 4)
            if _walk(fp, inner, min(box_end, stop), file_end, found, budget, parent + b"/" + kind):
                return True
        elif kind == b"infe" and parent == b"/meta/iinf":
            fp.seek(offset + header_size)
            entry = fp.read(14)
            if len(entry) >= 12 and entry[0] >= 2:  # versions 2 and 3 name the item's type
                item_id, item_type = (entry[4:6], entry[8:12]) if entry[0] == 2 else (entry[4:8], entry[10:14])
                item = int.from_bytes(item_id, "big")
                found.item_types.setdefault(item, item_type)  # libheif keeps an item's first entry (a decoy after it)
        elif kind == b"idat" and parent == b"/meta" and found.idat is None:
            found.idat = offset + header_size
        elif kind == b"tkhd":
            fp.seek(offset + header_size)
            header = fp.read(96)
            at = 88 if header[:1] == b"\x01" else 76
            if len(header) >= at + 8:
                width, height = struct.unpack_from(">II", header, at)
                found.sizes.append((width >> 16, height >> 16))  # 16.16 fixed point: what libavif reports
        elif kind == b"av01" and parent.endswith(b"/stsd"):  # a track's sample entry: its size, then its boxes
            fp.seek(offset + header_size + 24)
            entry = fp.read(4)
            if len(entry) == 4:
                found.sizes.append(struct.unpack(">HH", entry))
            found.table["av1"] = True
            if _walk(fp, offset + header_size + _SAMPLE_ENTRY_BYTES, min(box_end, stop), file_end, found, budget,
                     parent + b"/" + kind):
                return True
        elif kind == b"stbl" and parent.endswith(b"/minf"):
            found.table = {}
            if _walk(fp, offset + header_size, min(box_end, stop), file_end, found, budget, parent + b"/" + kind):
                return True
            if found.table.get("av1") and "offset" in found.table:
                track = ("track", len(found.items))
                found.items.append((track, 0, [(found.table["offset"], found.table.get("size", 0))]))
        elif kind in (b"stsz", b"stco", b"co64") and parent.endswith(b"/stbl"):
            _sample_table(kind, fp, offset + header_size, found.table)
        elif kind in _CONTAINERS:
            inner = offset + header_size + _CONTAINERS[kind]
            if _walk(fp, inner, min(box_end, stop), file_end, found, budget, parent + b"/" + kind):
                return True
        offset = box_end
    return False


def _refer(payload: bytes, references: dict[bytes, dict[int, list[int]]]) -> None:
    """The item references of an ``iref`` box (ISO/IEC 14496-12, 8.11.12): {type: {from: [to, ...]}}."""
    reader = _Bytes(payload)
    try:
        width = 2 if reader.int(1) == 0 else 4
        reader.int(3)
        while reader.pos + 8 <= len(payload):
            size, kind = reader.int(4), reader.data[reader.pos:reader.pos + 4]
            end = reader.pos - 4 + size
            reader.int(4)
            if size < 8 or end > len(payload):
                return
            source = reader.int(width)
            targets = [reader.int(width) for _ in range(reader.int(2))]
            references.setdefault(kind, {}).setdefault(source, []).extend(targets)
            reader.pos = end
    except IndexError:
        return


def _associate(payload: bytes, associations: dict[int, list[int]]) -> None:
    """Each item's property indices from an ``ipma`` box (ISO/IEC 23008-12, 9.3); what cannot be read ends it."""
    reader = _Bytes(payload)
    try:
        version, flags = reader.int(1), reader.int(3)
        count = reader.int(4)
        if count > MAX_BOXES:
            raise DecompressionBomb(f"more than {MAX_BOXES} items")
        for _ in range(count):
            item = reader.int(2 if version < 1 else 4)
            for _ in range(reader.int(1)):
                value = reader.int(2 if flags & 1 else 1)
                associations.setdefault(item, []).append(value & (0x7FFF if flags & 1 else 0x7F))
    except IndexError:
        return


def _sample_table(kind: bytes, fp: BinaryIO, payload: int, table: dict) -> None:
    """Where a track's first sample is, into ``table``: the first chunk of its first ``stco``/``co64`` (libavif
    adds the chunks of each in file order), the largest size an ``stsz`` gives it (the walk reads on); more than
    :data:`MAX_SAMPLES` samples or chunks is a bomb."""
    fp.seek(payload)
    head = fp.read(20)
    if kind == b"stsz" and len(head) >= 12:
        sample_size, count = struct.unpack_from(">II", head, 4)
        first = sample_size or (struct.unpack_from(">I", head, 12)[0] if count and len(head) >= 16 else 0)
        table["size"] = max(table.get("size", 0), first)
    elif kind in (b"stco", b"co64") and len(head) >= 8:
        count = struct.unpack_from(">I", head, 4)[0]
        unit = ">I" if kind == b"stco" else ">Q"
        if count and len(head) >= 8 + struct.calcsize(unit):
            table.setdefault("offset", struct.unpack_from(unit, head, 8)[0])
    else:
        return
    if count > MAX_SAMPLES:
        raise DecompressionBomb(f"an image sequence of more than {MAX_SAMPLES} samples or chunks")


def _item_locations(payload: bytes, extents_left: list[int]) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """(item ID, construction method, extents of (offset, length)) of each item an ``iloc`` box lists (ISO/IEC
    14496-12, 8.11.3); what cannot be read ends the list. More than :data:`MAX_BOXES` items, or extents than
    ``extents_left[0]``, is a bomb."""
    reader, located = _Bytes(payload), []
    try:
        version = reader.int(1)
        reader.int(3)
        sizes = reader.int(1)
        offset_size, length_size = sizes >> 4, sizes & 0x0F
        sizes = reader.int(1)
        base_offset_size, index_size = sizes >> 4, (sizes & 0x0F if version in (1, 2) else 0)
        count = reader.int(4 if version == 2 else 2)
        if count > MAX_BOXES:
            raise DecompressionBomb(f"more than {MAX_BOXES} items")
        for _ in range(count):
            item_id = reader.int(4 if version == 2 else 2)
            method = reader.int(2) & 0x0F if version in (1, 2) else 0
            reader.int(2)  # data_reference_index
            base = reader.int(base_offset_size)
            extents = reader.int(2)
            extents_left[0] -= extents  # field sizes of 0 never run out of bytes: 4096 x 65535 extents took 178 s
            if extents_left[0] < 0:
                raise DecompressionBomb(f"items of more than {MAX_EXTENTS} extents")
            placed = []
            for _ in range(extents):
                reader.int(index_size)
                extent_offset = reader.int(offset_size)
                placed.append((base + extent_offset, reader.int(length_size)))
            located.append((item_id, method, placed))
        return located
    except IndexError:
        return located


def _placed(method: int, extents: list[tuple[int, int]], idat: int | None, file_end: int) -> list[tuple[int, int]]:
    """An item's extents as (offset, length) in the file, within it; none for items built from other items
    (construction method 2: left to libavif), or in an ``idat`` there is not. Extents past the end of the file
    are libavif's to refuse."""
    if method == 1 and idat is not None:
        extents = [(idat + offset, length) for offset, length in extents]
    elif method != 0:
        return []
    placed = []
    for offset, length in extents:
        if offset >= file_end:
            break
        placed.append((offset, min(length or file_end - offset, file_end - offset)))
    return placed


class _Data:
    """An item's data, its extents one after another (as libavif joins them), read a few bytes at a time."""

    def __init__(self, fp: BinaryIO | None, extents: list[tuple[int, int]], data: bytes = b""):
        self.fp, self.extents, self.data = fp, extents, data
        self.starts = list(itertools.accumulate((length for _, length in extents), initial=0))
        self.size = self.starts[-1] if fp is not None else len(data)

    @classmethod
    def of(cls, data: bytes) -> "_Data":
        return cls(None, [], data)

    def read(self, pos: int, count: int) -> bytes:
        if self.fp is None:
            return self.data[pos:pos + count]
        out = bytearray()
        index = bisect.bisect_right(self.starts, pos) - 1
        while len(out) < count and 0 <= index < len(self.extents):
            offset, length = self.extents[index]
            skip = pos + len(out) - self.starts[index]
            self.fp.seek(offset + skip)
            out += self.fp.read(min(count - len(out), length - skip))
            index += 1
        return bytes(out)


@dataclass
class _Reading:
    """What the OBU walks of one file have left and have read: OBUs (:data:`MAX_OBUS`), and each distinct
    sequence header's payload, parsed once (a grid's tiles share one)."""

    obus: int = MAX_OBUS
    headers: dict[bytes, tuple[int, int, float] | None] = field(default_factory=dict)
    #: the frames (frame and frame header OBUs) of the data the last walk read
    frames: int = 0

    def header(self, payload: bytes) -> tuple[int, int, float] | None:
        if payload not in self.headers:
            if len(self.headers) >= MAX_SEQUENCE_HEADERS:
                raise DecompressionBomb(f"more than {MAX_SEQUENCE_HEADERS} AV1 sequence headers")
            self.headers[payload] = sequence_header(payload)
        return self.headers[payload]


def _sequence_headers(data: _Data, reading: _Reading) -> list[tuple[int, int, float]]:
    """(``max_frame_width``, ``max_frame_height``, bytes per pixel of the decoded picture) of every sequence header
    OBU in ``data`` (AV1, 5.3 and 5.5): the decoder takes the last before a frame, so a small one first is no
    promise. An OBU that cannot be read ends the walk; more than the ``reading`` has left is a bomb."""
    found, pos = [], 0
    reading.frames = 0
    while reading.obus > 0:
        reading.obus -= 1
        if pos >= data.size:
            return found
        head = data.read(pos, 10)
        if not head:
            return found  # (the forbidden bit is no stop: dav1d decodes on past an OBU that sets it)
        kind, used = (head[0] >> 3) & 0x0F, 2 if head[0] & 0x04 else 1
        if head[0] & 0x02:
            size, length = _leb128(head[used:])
            if length is None:
                return found
            used += length
        else:
            size = data.size - pos - used  # to the end of the data
        if kind in (3, 6):  # a frame header, or a frame
            reading.frames += 1
            if reading.frames > MAX_FRAMES:
                raise DecompressionBomb(f"an AV1 image of more than {MAX_FRAMES} frames")
        if kind == 1:
            frame = reading.header(data.read(pos + used, min(size, SEQUENCE_HEADER_BYTES)))
            if frame is not None:
                found.append(frame)
        pos += used + size
    raise DecompressionBomb(f"AV1 images of more than {MAX_OBUS} OBUs")


def _leb128(data: bytes) -> tuple[int, int | None]:
    """A ``leb128()`` value and its length in bytes, or (0, None) if ``data`` ends inside it."""
    value = 0
    for index, byte in enumerate(data[:8]):
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value, index + 1
    return 0, None


def sequence_header(payload: bytes) -> tuple[int, int, float] | None:
    """(``max_frame_width``, ``max_frame_height``, bytes per pixel of the pictures decoded) of a sequence header
    OBU's payload (AV1, 5.5), or None if it ends before the size. The decoder allocates by its colour
    configuration, not by ``av1C``'s copy; one cut short after the size is priced as the worst picture
    (:data:`UNKNOWN_PICTURE_BYTES`)."""
    reader = _Bits(payload)
    try:
        profile, reduced, size = _frame_size(reader)
    except IndexError:
        return None
    try:
        return (*size, _colour_bytes(reader, profile, reduced))
    except IndexError:
        return (*size, UNKNOWN_PICTURE_BYTES)


def _frame_size(reader: "_Bits") -> tuple[int, bool, tuple[int, int]]:
    """``seq_profile``, ``reduced_still_picture_header`` and the largest frame, from a sequence header's start."""
    profile = reader.bits(3)  # seq_profile
    reader.bits(1)  # still_picture
    reduced = bool(reader.bits(1))  # reduced_still_picture_header
    if reduced:
        reader.bits(5)  # seq_level_idx[0]
    else:
        model = False
        if reader.bits(1):  # timing_info_present_flag
            reader.bits(32)
            reader.bits(32)
            if reader.bits(1):  # equal_picture_interval
                reader.uvlc()
            model = bool(reader.bits(1))  # decoder_model_info_present_flag
            if model:
                delay = reader.bits(5) + 1  # buffer_delay_length_minus_1
                reader.bits(32)
                reader.bits(5)
                reader.bits(5)
        display_delay = reader.bits(1)  # initial_display_delay_present_flag
        for _ in range(reader.bits(5) + 1):  # operating_points_cnt_minus_1
            reader.bits(12)  # operating_point_idc
            if reader.bits(5) > 7:  # seq_level_idx
                reader.bits(1)  # seq_tier
            if model and reader.bits(1):  # decoder_model_present_for_this_op
                reader.bits(delay)
                reader.bits(delay)
                reader.bits(1)
            if display_delay and reader.bits(1):
                reader.bits(4)
    width_bits, height_bits = reader.bits(4) + 1, reader.bits(4) + 1
    return profile, reduced, (reader.bits(width_bits) + 1, reader.bits(height_bits) + 1)


def _colour_bytes(reader: "_Bits", profile: int, reduced: bool) -> float:
    """Bytes per pixel of the decoded picture, from the fields after the frame size to ``color_config``
    (AV1, 5.5.1 and 5.5.2)."""
    if not reduced and reader.bits(1):  # frame_id_numbers_present_flag
        reader.bits(7)  # delta_frame_id_length_minus_2, additional_frame_id_length_minus_1
    reader.bits(3)  # use_128x128_superblock, enable_filter_intra, enable_intra_edge_filter
    if not reduced:
        reader.bits(4)  # enable_interintra_compound, enable_masked_compound, enable_warped_motion, enable_dual_filter
        order_hint = reader.bits(1)
        if order_hint:
            reader.bits(2)  # enable_jnt_comp, enable_ref_frame_mvs
        if reader.bits(1) or reader.bits(1):  # seq_choose_screen_content_tools, else seq_force_screen_content_tools
            if not reader.bits(1):  # seq_choose_integer_mv
                reader.bits(1)  # seq_force_integer_mv
        if order_hint:
            reader.bits(3)  # order_hint_bits_minus_1
    reader.bits(3)  # enable_superres, enable_cdef, enable_restoration
    if profile > 2:
        return UNKNOWN_PICTURE_BYTES
    high = reader.bits(1)
    depth = (12 if reader.bits(1) else 10) if profile == 2 and high else (10 if high else 8)
    mono = reader.bits(1) if profile != 1 else 0
    primaries = transfer = matrix = 2  # unspecified
    if reader.bits(1):  # color_description_present_flag
        primaries, transfer, matrix = reader.bits(8), reader.bits(8), reader.bits(8)
    if mono:
        planes = 1.0
    elif (primaries, transfer, matrix) == (1, 13, 0):  # BT.709, sRGB, identity: 4:4:4
        planes = 3.0
    else:
        reader.bits(1)  # color_range
        if profile == 0:
            sub_x = sub_y = 1
        elif profile == 1:
            sub_x = sub_y = 0
        elif depth == 12:
            sub_x = reader.bits(1)
            sub_y = reader.bits(1) if sub_x else 0
        else:
            sub_x, sub_y = 1, 0
        planes = 1 + 2 / ((1 + sub_x) * (1 + sub_y))
    return planes * (2 if depth > 8 else 1)


#: The derived image items whose data gives the size of a canvas the decoder allocates (ISO/IEC 23008-12, 6.6.2.3
#: ``grid``, 6.6.2.2 ``iovl``), and the bytes before that size in it: version and flags, and an overlay's fill value.
DERIVED_CANVASES = {b"grid": 4, b"iovl": 10}


def _canvas(item: int, data: "_Data", found: _Found) -> None:
    """A grid's or an overlay's canvas, from its item's data: held to the limits as an ``ispe`` is, and refused when
    it is not its ``ispe``'s size. libheif allocates the canvas its data says, whatever ``ispe`` says, and fails
    once it has made it: a 472-byte overlay of a 16000x16000 canvas under a 64x64 ``ispe`` took 1.3-1.5 GB a
    render, priced as 64x64 (an adversarial run)."""
    skip = DERIVED_CANVASES[found.item_types[item]]
    head = data.read(0, skip + 8)
    if len(head) < skip + 4:
        return  # cut short: the decoder's to refuse
    wide = head[1] & 1  # flags: 32-bit sizes
    if len(head) < skip + (8 if wide else 4):
        return
    width, height = struct.unpack_from(">II" if wide else ">HH", head, skip)
    known = found.canvases.get(item, (0, 0))
    if width * height >= known[0] * known[1]:
        found.canvases[item] = (width, height)
    declared = [found.properties[index - 1] for index in found.associations.get(item, ())
                if index in found.ispe_properties]
    if not declared:
        found.sizes.append((width, height))
    # every ispe: libheif takes the last, and one matching the canvas before one of 64x64 had the image priced
    # as 64x64 and an 8000x8000 canvas decoded, ready, in 841-945 MB (a re-attack)
    for size in declared:
        if size != (width, height):
            raise CorruptImage(f"a derived image's canvas of {width}x{height} is not the size its ispe gives "
                               f"({size[0]}x{size[1]})")


def _hvcc_nal_units(config: bytes, found: _Found) -> list[bytes]:
    """The NAL units of an ``hvcC``'s arrays (ISO/IEC 14496-15, 8.3.3.1), whatever type an array says: libheif
    hands each to the decoder before the item's data. What cannot be read ends the list."""
    units, reader = [], _Bytes(config)
    try:
        reader.pos = 22
        for _ in range(reader.int(1)):
            reader.int(1)  # completeness, and the array's NAL unit type
            for _ in range(reader.int(2)):
                _count_nal_unit(found)
                length = reader.int(2)
                if reader.pos + length > len(config):
                    return units
                units.append(config[reader.pos:reader.pos + length])
                reader.pos += length
    except IndexError:
        pass
    return units


def _count_nal_unit(found: _Found) -> None:
    found.nal_units_left -= 1
    if found.nal_units_left < 0:
        raise DecompressionBomb(f"HEVC configurations and images of more than {MAX_NAL_UNITS} NAL units")


#: the bytes of the length before each NAL unit of an HEVC item's data, as libheif reads them whatever the ``hvcC``
#: says (a file whose ``hvcC`` said 1 hid a parameter set from a walk that believed it: an adversarial run)
NAL_LENGTH_BYTES = 4


def _hevc_item(item: int, data: "_Data", found: _Found) -> None:
    """The parameter sets in an HEVC item's own data (NAL units, each after its length): libde265 takes one there
    over the ``hvcC``'s, so its picture is priced too, and its size is the item's."""
    pos = 0
    while pos + NAL_LENGTH_BYTES <= data.size:
        _count_nal_unit(found)
        length = int.from_bytes(data.read(pos, NAL_LENGTH_BYTES), "big")
        picture = _hevc_sps(data.read(pos + NAL_LENGTH_BYTES, min(length, SEQUENCE_HEADER_BYTES)), found) \
            if length else None
        if picture is not None:
            found.pictures.append(picture[2])
            found.hevc_sizes.append(picture[:2])
            found.item_bytes[item] = max(found.item_bytes.get(item, 0.0), picture[2])
            known = found.item_sizes.get(item, (0, 0))
            if picture[0] * picture[1] > known[0] * known[1]:
                found.item_sizes[item] = picture[:2]
        pos += NAL_LENGTH_BYTES + length


def _hevc_sps(nal: bytes, found: _Found) -> tuple[int, int, float] | None:
    """(width, height, bytes per pixel of the pictures decoded) of an HEVC sequence parameter set NAL unit
    (H.265, 7.3.2.2), or None for another NAL unit or one of another layer (libde265 decodes the base layer
    only). libde265 decodes by it, not by the ``hvcC``'s summary of it (an 8 KB HEIC whose ``hvcC`` said 4:2:0
    over a 4:4:4 10-bit picture took 550-720 MB a render: an adversarial run). One cut short after its size is
    priced as the worst picture (:data:`UNKNOWN_PICTURE_BYTES`); one cut short before it, or naming no chroma
    format there is, decodes nothing."""
    if len(nal) < 3 or (nal[0] >> 1) & 0x3F != 33 or ((nal[0] & 1) << 5 | nal[1] >> 3):
        return None
    found.sps_read += 1
    if found.sps_read > MAX_HEVC_SPS:
        raise DecompressionBomb(f"more than {MAX_HEVC_SPS} HEVC sequence parameter sets")
    rbsp = nal[2:].replace(b"\x00\x00\x03", b"\x00\x00")  # emulation prevention bytes (7.4.2)
    reader = _Bits(rbsp)
    try:
        reader.bits(4)  # sps_video_parameter_set_id
        sub_layers = reader.bits(3)  # sps_max_sub_layers_minus1
        reader.bits(1)
        reader.bits(96)  # profile_tier_level's general part: profile, flags, level
        present = [(reader.bits(1), reader.bits(1)) for _ in range(sub_layers)]
        if sub_layers:
            reader.bits(2 * (8 - sub_layers))
        for profile, level in present:
            reader.bits(88 * profile + 8 * level)
        reader.uvlc()  # sps_seq_parameter_set_id
        chroma = reader.uvlc()
        if chroma > 3:
            return None
        separate = chroma == 3 and reader.bits(1)
        width, height = reader.uvlc(), reader.uvlc()
    except IndexError:
        return None
    planes = 3.0 if separate else {0: 1.0, 1: 1.5, 2: 2.0, 3: 3.0}[chroma]
    try:
        if reader.bits(1):  # conformance_window_flag
            for _ in range(4):
                reader.uvlc()
        deep = reader.uvlc() > 0 or reader.uvlc() > 0  # bit_depth_luma_minus8, bit_depth_chroma_minus8
    except IndexError:
        return width, height, UNKNOWN_PICTURE_BYTES
    return width, height, planes * (2 if deep else 1)


class _Bytes:
    """Big-endian unsigned integers of 0-8 bytes read in turn; IndexError past the end."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def int(self, size: int) -> int:
        if self.pos + size > len(self.data):
            raise IndexError("past the end")
        value = int.from_bytes(self.data[self.pos:self.pos + size], "big")
        self.pos += size
        return value


class _Bits:
    """AV1's bit reader (most significant bit first; ``uvlc``); IndexError past the end."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def bits(self, count: int) -> int:
        value = 0
        for _ in range(count):
            byte = self.data[self.pos >> 3]
            value = (value << 1) | ((byte >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return value

    def uvlc(self) -> int:
        zeros = 0
        while not self.bits(1):
            zeros += 1
            if zeros >= 32:
                return (1 << 32) - 1
        return self.bits(zeros) + (1 << zeros) - 1
