"""The worker caps glibc's malloc arenas (app.adapters.imaging.malloc_arenas): its render threads share one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from app.adapters.imaging.malloc_arenas import WORKER_ARENAS, cap_malloc_arenas
from tests.processes import REPO

#: eight threads allocate at once, then the process counts its arenas (glibc's malloc_info: one <heap> each)
ARENAS_AFTER_EIGHT_THREADS = r"""
import ctypes, sys, tempfile, threading
if sys.argv[1] == "cap":
    from app.adapters.imaging.malloc_arenas import cap_malloc_arenas
    cap_malloc_arenas()
elif sys.argv[1] == "worker":
    import actors  # noqa: F401  (what the worker process imports before it starts its threads)
together = threading.Barrier(8)
kept = []

def allocate():
    together.wait()
    kept.append(bytearray(64 * 1024))

threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile("r") as out:
    stream = ctypes.c_void_p(libc.fopen(out.name.encode(), b"w"))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(out.read().count("<heap nr="))
"""


def arenas_after_eight_threads(mode: str, env: dict[str, str] | None = None) -> int:
    """In a new process whose environment sets no ``MALLOC_ARENA_MAX`` (which would decide instead)."""
    env = {key: value for key, value in (env or os.environ).items() if key != "MALLOC_ARENA_MAX"}
    done = subprocess.run([sys.executable, "-c", ARENAS_AFTER_EIGHT_THREADS, mode], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_without_the_cap_eight_threads_get_arenas_of_their_own():
    """The control: what the cap changes (glibc makes up to eight arenas per core)."""
    assert arenas_after_eight_threads("none") > WORKER_ARENAS


def test_capped_the_threads_share_one_arena():
    assert arenas_after_eight_threads("cap") <= WORKER_ARENAS


def test_the_worker_process_caps_them_before_its_threads_start(env):
    assert arenas_after_eight_threads("worker", {**os.environ, **env}) <= WORKER_ARENAS


def test_an_operator_s_malloc_arena_max_is_left_alone():
    assert cap_malloc_arenas(environ={"MALLOC_ARENA_MAX": "8"}) is None


#: four threads render pipeline v2 of four large PNGs under the default budget; how much the process grew, and the
#: most the renders reserved at once
GROWTH_OF_FOUR_RENDERS = r"""
import json, re, sys, threading
from pathlib import Path
from app.adapters.imaging.malloc_arenas import cap_malloc_arenas
cap_malloc_arenas()
from app.adapters.imaging import Limits, budget, load_codecs, render
from app.core import pipeline
load_codecs()

def status(field):
    return int(re.search(field + r":\s+(\d+) kB", Path("/proc/self/status").read_text())[1]) * 1024

specs = list(pipeline.get(2).specs.values())
base = status("VmRSS")
threads = [threading.Thread(target=lambda path=path: [render(path, spec, Limits(), sha256=path) for spec in specs])
           for path in sys.argv[1:]]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"grown": status("VmHWM") - base, "reserved": budget.RESERVATIONS.peak}))
"""


def test_the_renders_of_a_worker_grow_it_by_what_they_reserve(tmp_path):
    """Two arenas each kept the freed buffers of a full-size decode: four threads rendering four 30 MP PNGs grew a
    process by 412-426 MB while they reserved 265, a worker to 473-587 MB (an adversarial run). The threads share
    one arena, and what they free one of them reuses."""
    from PIL import Image

    paths = []
    for n in range(4):
        paths.append(tmp_path / f"gradient{n}.png")
        Image.linear_gradient("L").resize((6000, 5000)).point(lambda v, n=n: min(255, v + n)).convert("RGB") \
            .save(paths[-1], compress_level=1)
    done = subprocess.run([sys.executable, "-c", GROWTH_OF_FOUR_RENDERS, *map(str, paths)], cwd=REPO,
                          env={k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    assert measured["grown"] <= 1.15 * measured["reserved"], measured
