"""The renderer's ideas side by side (``python -m bench.renderers``; not part of ``make bench``).

On one core, in CPU seconds, over the 12 MP photos of ``tests/data/photos``
(a new job per photo: the shared resampled images are cleared), each
pipeline version's throughput with:

* the renderer before issue 11 (``reference_render`` of
  ``tests/test_render_quality.py``: LANCZOS everywhere, one decode and
  resample per variant);
* today's renderer with each filter for outputs above ``SHARP_MAX_SIDE``
  (LANCZOS, BICUBIC: the one applied, BILINEAR), with the worst PSNR of the
  ``optimized`` copy against the reference renderer;

then the WebP encoder's ``method`` on a 2048 px copy: time, size and PSNR
against method 4 (the setting pinned in the v1/v2 fingerprints) and against
the pixels encoded. ``docs/performance.md`` quotes a run.
"""

from __future__ import annotations

import io
import os
import statistics
import sys
import time
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
PHOTOS = sorted((REPO / "tests" / "data" / "photos").glob("*_12mp_*.jpg"))
ROUNDS = 3
FILTERS = ("LANCZOS", "BICUBIC", "BILINEAR")


def main() -> int:
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    sys.path.insert(0, str(REPO))
    from app.adapters.imaging import Limits
    from app.adapters.imaging.shared import SHARED
    from app.core import pipeline
    from tests.test_render_quality import decoded, psnr, reference_render

    renderer = sys.modules["app.adapters.imaging.render"]  # the package's ``render`` name is the function
    limits = Limits()
    chosen = renderer.resample_filter

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
    print(f"{'renderer':<46} {'v1 img/s':>9} {'v2 img/s':>9} {'worst PSNR optimized':>21}")
    print(f"{'before issue 11 (reference_render)':<46} {rate(reference_render, 1):>9.2f} "
          f"{rate(reference_render, 2):>9.2f} {'':>21}")
    optimized = pipeline.get(1).specs["optimized"]
    try:
        for name in FILTERS:
            large = getattr(Image.Resampling, name)
            renderer.resample_filter = lambda out, large=large: (
                Image.Resampling.LANCZOS if max(out) <= renderer.SHARP_MAX_SIDE else large)
            worst = min(psnr(decoded(reference_render(p, optimized, limits)),
                             decoded((SHARED.clear(), renderer.render(p, optimized, limits))[1])) for p in PHOTOS)
            print(f"{'shared pixels, ' + name + ' above ' + str(renderer.SHARP_MAX_SIDE) + ' px':<46} "
                  f"{rate(renderer.render, 1):>9.2f} {rate(renderer.render, 2):>9.2f} {worst:>18.1f} dB")
    finally:
        renderer.resample_filter = chosen

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
