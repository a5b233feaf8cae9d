"""Render throughput against pyvips, and the worker's peak memory; each in a fresh subprocess.

1. **Throughput, one core.** A subprocess pinned to one CPU (libvips told
   to use one thread) makes every variant of a pipeline version from each
   12 MP photo of ``tests/data/photos``, the way the worker does: one
   :func:`~app.adapters.imaging.render` call per variant, the shared
   resampled images (:mod:`app.adapters.imaging.shared`) cleared between
   photos so each photo is a new job, with the photo's SHA-256 (the worker
   passes the attachment's; here it is hashed once a photo, in the timed
   part). The reference, timed in the same
   loop (photo by photo, so a load on the machine weighs on both), is
   pyvips making the same specs via ``thumbnail``, one call per variant:
   the same sizes, JPEG q85 with optimised Huffman tables (progressive
   for ``bounded``), WebP q85 effort 4, metadata stripped, libvips's
   operation cache off. Both are timed in CPU seconds of the process (all
   its threads): on one core that is the wall time of an idle machine, and
   it holds when other work shares the machine.
2. **Worker peak RSS** for one job's renders (probe, then every variant of
   the newest pipeline, in a process that has imported the worker's code)
   of the 24 MP photo, with the default memory budget.
3. With ``ATTACHE_BENCH_EXTRA=1`` also the hostile files of
   ``tests/hostile_images.py``, with the budget and without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.figures import Figure

REPO = Path(__file__).resolve().parents[1]
PHOTOS = sorted((REPO / "tests" / "data" / "photos").glob("*_12mp_*.jpg"))
PHOTO_24MP = REPO / "tests" / "data" / "photos" / "coffee_24mp_6000x4000.jpg"
ROUNDS = int(os.environ.get("ATTACHE_BENCH_ROUNDS", "3"))
HOSTILE_TARGET_MB = 300
PHOTO_TARGET_MB = 120

THROUGHPUT = r"""
import json, os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
import pyvips
pyvips.cache_set_max(0)
from app.adapters.imaging import Limits, render
from app.adapters.imaging.shared import SHARED, content_key
from app.core import pipeline
photos, rounds = json.loads(sys.argv[2]), int(sys.argv[3])
limits = Limits()

def vips(path, spec):
    if spec.kind == "cover":
        image = pyvips.Image.thumbnail(path, spec.width, height=spec.height, crop="centre")
    else:
        side = max(spec.width, spec.height) if spec.kind == "bounded" else spec.width
        image = pyvips.Image.thumbnail(path, side, height=side if spec.kind == "bounded" else spec.height,
                                       size="down")
    if spec.output == "webp":
        image.webpsave_buffer(Q=85, effort=4, keep="none")
    else:
        image.jpegsave_buffer(Q=85, optimize_coding=True, interlace=spec.kind == "bounded", keep="none")
    return image.width, image.height

results = {}
for version in sorted(pipeline.REGISTRY):
    specs = list(pipeline.get(version).specs.values())
    ours = theirs = 0.0
    jobs, differ = 0, set()
    for round_ in range(rounds + 1):  # the first round warms both up and is not counted
        for path in photos:
            SHARED.clear()
            began = time.process_time()
            digest = content_key(path)  # the worker has it from the attachment's row; hashed here, and timed
            mine = [(out.width, out.height) for out in (render(path, spec, limits, sha256=digest) for spec in specs)]
            middle = time.process_time()
            theirs_sizes = [vips(path, spec) for spec in specs]
            ended = time.process_time()
            if round_:
                ours, theirs, jobs = ours + middle - began, theirs + ended - middle, jobs + 1
            differ |= {f"{spec.name} {a[0]}x{a[1]} vs {b[0]}x{b[1]}"
                       for spec, a, b in zip(specs, mine, theirs_sizes) if a != b}
    results[version] = {"ours": jobs / ours, "vips": jobs / theirs, "variants": len(specs),
                        "differ": sorted(differ)}
print(json.dumps(results))
"""

JOB = r"""
import json, re, sys, threading, time
from pathlib import Path
import app.core.workflow  # what a worker process has loaded before its first job
from app.adapters.imaging.malloc_arenas import cap_malloc_arenas
cap_malloc_arenas()  # as the worker does (actors), before its threads start
from app.core import pipeline
from app.errors import PermanentError
from app.adapters.imaging import Limits, load_codecs, probe, render
load_codecs()  # as the worker does at boot
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


def one_cpu() -> int:
    """The CPU the single-core figures run on: the last one this process may use."""
    return max(os.sched_getaffinity(0))


def throughput() -> list[Figure]:
    out = subprocess.run([sys.executable, "-c", THROUGHPUT, str(one_cpu()), json.dumps([str(p) for p in PHOTOS]),
                          str(ROUNDS)], cwd=REPO, check=True, capture_output=True, text=True,
                         env={**os.environ, "VIPS_CONCURRENCY": "1"}).stdout
    figures = []
    for version, data in sorted(json.loads(out).items()):
        note = f"{len(PHOTOS)} photos x {ROUNDS} rounds"
        if data["differ"]:
            note += "; sizes differ from libvips's: " + ", ".join(data["differ"])
        figures.append(Figure(f"render v{version} ({data['variants']} variants), 12 MP, one core", data["ours"],
                              "img/s", "pyvips 8.18 thumbnail", data["vips"], at_least=1.0, note=note))
    return figures


def measure_job(path: Path, budget: int, threads: int = 1) -> dict:
    out = subprocess.run([sys.executable, "-c", JOB, str(path), str(budget), str(threads)], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def worker_peak() -> Figure:
    measured = measure_job(PHOTO_24MP, 0)
    assert measured["outcome"] == "ready", measured
    return Figure("worker peak RSS, one v2 job of the 24 MP photo", measured["peak_mb"], "MB",
                  "the target", at_most=PHOTO_TARGET_MB)


def hostile_peaks() -> None:
    """The memory budget on hostile files (``ATTACHE_BENCH_EXTRA=1``)."""
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
