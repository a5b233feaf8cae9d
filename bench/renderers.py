"""The renderer's ideas side by side (``python -m bench.renderers``; not part of ``make bench``).

On one core, in CPU seconds, over the 12 MP photos of ``tests/data/photos``
(a new job per photo: the shared resampled images are cleared), each
pipeline version's throughput with:

* the renderer before issue 11 (``reference_render`` of
  ``tests/test_render_quality.py``: LANCZOS everywhere, one decode and
  resample per variant);
* today's renderer (the resampled pixels shared between variants) with
  each filter (LANCZOS, the one v1 and v2 promise; BICUBIC; BILINEAR), with
  the worst PSNR of the ``optimized`` copy against the reference renderer
  on the photos and on a sharp text image;

then the WebP encoder's ``method`` on a 2048 px copy: time, size and PSNR
against method 4 (the setting pinned in the v1/v2 fingerprints) and against
the pixels encoded. ``docs/performance.md`` quotes a run.
"""

from __future__ import annotations

import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
PHOTOS = sorted((REPO / "tests" / "data" / "photos").glob("*_12mp_*.jpg"))
ROUNDS = 3
FILTERS = ("LANCZOS", "BICUBIC", "BILINEAR")


def text_image(folder: Path) -> Path:
    """A 2121x1414 PNG of text: the sharp content a screenshot has."""
    from PIL import ImageDraw

    img = Image.new("RGB", (2121, 1414), "white")
    draw = ImageDraw.Draw(img)
    for y in range(0, img.height, 14):
        draw.text((y % 17, y), "The quick brown fox jumps over the lazy dog 0123456789 " * 8, fill="black")
    img.save(folder / "text.png", compress_level=1)
    return folder / "text.png"


def main() -> int:
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    sys.path.insert(0, str(REPO))
    from app.adapters.imaging import Limits
    from app.adapters.imaging.shared import SHARED
    from app.core import pipeline
    from tests.test_render_quality import decoded, psnr, reference_render

    renderer = sys.modules["app.adapters.imaging.render"]  # the package's ``render`` name is the function
    limits = Limits()
    chosen = renderer.RESAMPLE

    def rate(render, version: int) -> float:
        specs = list(pipeline.get(version).specs.values())
        spent = []
        for _ in range(ROUNDS):
            began = time.process_time()
            for path in PHOTOS:
                SHARED.clear()
                for spec in specs:
                    render(path, spec, limits)
            spent.append(time.process_time() - began)
        return len(PHOTOS) / statistics.median(spent)

    print(f"one core, CPU time, {len(PHOTOS)} photos x {ROUNDS} rounds (median)")
    print(f"{'renderer':<36} {'v1 img/s':>9} {'v2 img/s':>9} {'worst PSNR of optimized: photos, text':>38}")
    print(f"{'before issue 11 (reference_render)':<36} {rate(reference_render, 1):>9.2f} "
          f"{rate(reference_render, 2):>9.2f}")
    optimized = pipeline.get(1).specs["optimized"]

    def worst(paths) -> float:
        return min(psnr(decoded(reference_render(p, optimized, limits)),
                        decoded((SHARED.clear(), renderer.render(p, optimized, limits))[1])) for p in paths)

    with tempfile.TemporaryDirectory() as tmp:
        text = text_image(Path(tmp))
        try:
            for name in FILTERS:
                renderer.RESAMPLE = getattr(Image.Resampling, name)
                print(f"{'shared pixels, ' + name:<36} {rate(renderer.render, 1):>9.2f} "
                      f"{rate(renderer.render, 2):>9.2f} {worst(PHOTOS):>20.1f} dB {worst([text]):>11.1f} dB")
        finally:
            renderer.RESAMPLE = chosen

    SHARED.clear()
    with Image.open(PHOTOS[-1]) as img:
        pixels = renderer._upright(img, "JPEG", pipeline.get(2).specs["webp"])
    print(f"\nWebP q85 of the {pixels.width}x{pixels.height} copy of {PHOTOS[-1].name}")
    base = None
    for method in (4, 3, 2, 1, 0):
        times = []
        for _ in range(ROUNDS):
            buf = io.BytesIO()
            began = time.process_time()
            pixels.save(buf, "WEBP", quality=85, method=method)
            times.append(time.process_time() - began)
        out = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
        base = base or out
        print(f"method {method}: {statistics.median(times) * 1000:5.0f} ms {len(buf.getvalue()) / 1024:5.0f} KB  "
              f"PSNR vs method 4 {psnr(base, out):5.1f} dB, vs the pixels {psnr(pixels.convert('RGB'), out):5.1f} dB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
