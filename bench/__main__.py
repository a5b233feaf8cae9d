"""Render benchmark: attache's thumbnail of a 12 MP JPEG against a naive baseline, same run.

Each case runs in a fresh subprocess so its peak memory (VmHWM) is its own.
The baseline decodes at full size and then thumbnails (what a plain
``Image.open(...).thumbnail(...)`` does without draft mode); attache's
``render`` uses JPEG draft decoding, ``reduce`` and orientation after
downscaling.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHOTO = REPO / "tests" / "data" / "photos" / "rocket_12mp_4241x2830.jpg"
RUNS = 5

CASE = r"""
import io, json, sys, time
from pathlib import Path
from PIL import Image, ImageOps
path, mode, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
times = []
for _ in range(runs):
    began = time.perf_counter()
    if mode == "attache":
        from app.imaging import PIPELINE_V1_SPECS, Limits, render
        out = render(path, PIPELINE_V1_SPECS["thumbnail"], Limits())
        size = (out.width, out.height)
    else:
        with Image.open(path) as img:
            img = ImageOps.exif_transpose(img)
            img.thumbnail((256, 256))
            buf = io.BytesIO()
            img.convert("RGB").save(buf, "JPEG", quality=85)
            size = img.size
    times.append(time.perf_counter() - began)
peak_kb = next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
print(json.dumps({"times": times, "peak_mb": peak_kb / 1024, "size": size}))
"""


def measure(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CASE, str(PHOTO), mode, str(RUNS)], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> int:
    baseline, attache = measure("baseline"), measure("attache")
    base_t, ours_t = statistics.median(baseline["times"]), statistics.median(attache["times"])
    print(f"thumbnail of {PHOTO.name} (12 MP JPEG), median of {RUNS} runs, fresh process each")
    print(f"{'case':<10} {'seconds':>9} {'peak MB':>9} {'output':>10}")
    for name, data, t in (("baseline", baseline, base_t), ("attache", attache, ours_t)):
        print(f"{name:<10} {t:>9.3f} {data['peak_mb']:>9.1f} {'x'.join(map(str, data['size'])):>10}")
    print(f"speed-up: {base_t / ours_t:.1f}x   memory: {attache['peak_mb'] / baseline['peak_mb']:.2f} of baseline")
    from bench import sweeps

    return sweeps.main()


if __name__ == "__main__":
    sys.exit(main())
