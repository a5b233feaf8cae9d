"""Render benchmarks, each case in a fresh subprocess so its peak memory (VmHWM) is its own.

1. attache's thumbnail of a 12 MP JPEG against a naive baseline, same run.
   The baseline decodes at full size and then thumbnails (what a plain
   ``Image.open(...).thumbnail(...)`` does without draft mode); attache's
   ``render`` uses JPEG draft decoding, ``reduce`` and orientation after
   downscaling.
2. The worker's peak RSS for one job's renders (probe, then every variant of
   the newest pipeline, in a process that has imported the worker's code)
   on small hostile files (tests/hostile_images.py) and on a 24 MP JPEG,
   with the memory budget (``ATTACHE_MAX_DECODE_BYTES``, default) and
   without it (a budget of 1 TB: what the worker did before the budget).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHOTO = REPO / "tests" / "data" / "photos" / "rocket_12mp_4241x2830.jpg"
PHOTO_24MP = REPO / "tests" / "data" / "photos" / "coffee_24mp_6000x4000.jpg"
RUNS = 5
HOSTILE_TARGET_MB = 300
PHOTO_TARGET_MB = 120

CASE = r"""
import io, json, sys, time
from pathlib import Path
from PIL import Image, ImageOps
path, mode, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
times = []
for _ in range(runs):
    began = time.perf_counter()
    if mode == "attache":
        from app.adapters.imaging import PIPELINE_V1_SPECS, Limits, render
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


JOB = r"""
import json, re, sys, threading, time
from pathlib import Path
import app.core.workflow  # what a worker process has loaded before its first job
from app.core import pipeline
from app.errors import PermanentError
from app.adapters.imaging import Limits, probe, render
path, budget, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
limits = Limits() if budget == 0 else Limits(max_decode_bytes=budget)
outcomes = []

def job():
    try:
        probe(path, limits)
        for spec in pipeline.get(pipeline.NEWEST).specs.values():
            render(path, spec, limits)
        outcomes.append("ready")
    except PermanentError as exc:
        outcomes.append(exc.error_code)

began = time.perf_counter()
workers = [threading.Thread(target=job) for _ in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
peak_kb = int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())[1])
print(json.dumps({"peak_mb": peak_kb / 1024, "outcome": ",".join(sorted(set(outcomes))),
                  "seconds": time.perf_counter() - began}))
"""


def measure_job(path: Path, budget: int, threads: int = 1) -> dict:
    out = subprocess.run([sys.executable, "-c", JOB, str(path), str(budget), str(threads)], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def worker_peaks() -> None:
    sys.path.insert(0, str(REPO))
    from tests import hostile_images

    with tempfile.TemporaryDirectory(prefix="attache-bench-") as tmp:
        progressive = hostile_images.progressive_jpeg(Path(tmp) / "progressive.jpg")
        cases = [  # (name, file, target, jobs at once on as many threads)
            ("8000x8000 palette PNG + tRNS", hostile_images.palette_png(Path(tmp) / "palette.png"),
             HOSTILE_TARGET_MB, 1),
            ("8000x8000 float TIFF", hostile_images.float_tiff(Path(tmp) / "float.tif"), HOSTILE_TARGET_MB, 1),
            ("8000x8000 progressive JPEG", progressive, HOSTILE_TARGET_MB, 1),
            ("  the same, 4 jobs, 4 threads", progressive, HOSTILE_TARGET_MB, 4),
            ("24 MP JPEG (6000x4000)", PHOTO_24MP, PHOTO_TARGET_MB, 1),
        ]
        print()
        print("worker peak RSS for one job (probe + every variant of the newest pipeline), fresh process each")
        print(f"{'file':<30} {'size':>8} {'budget':>8} {'peak MB':>8} {'target':>8} {'outcome':>16} {'no budget':>10}")
        for name, path, target, threads in cases:
            ours, unbounded = measure_job(path, 0, threads), measure_job(path, 10**12, threads)
            verdict = "ok" if ours["peak_mb"] <= target else "OVER"
            print(f"{name:<30} {path.stat().st_size / 1024:>6.0f}KB {'default':>8} {ours['peak_mb']:>8.0f} "
                  f"{'<= ' + str(target):>8} {ours['outcome']:>16} {unbounded['peak_mb']:>8.0f}MB  {verdict}")


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
    worker_peaks()
    from bench import sweeps

    return sweeps.main()


if __name__ == "__main__":
    sys.exit(main())
