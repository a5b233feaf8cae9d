"""The worker caps glibc's malloc arenas (app.adapters.imaging.malloc_arenas): its render threads share two."""

from __future__ import annotations

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


def test_capped_the_threads_share_two_arenas():
    assert arenas_after_eight_threads("cap") <= WORKER_ARENAS


def test_the_worker_process_caps_them_before_its_threads_start(env):
    assert arenas_after_eight_threads("worker", {**os.environ, **env}) <= WORKER_ARENAS


def test_an_operator_s_malloc_arena_max_is_left_alone():
    assert cap_malloc_arenas(environ={"MALLOC_ARENA_MAX": "8"}) is None
