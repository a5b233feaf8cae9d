"""The worker's cap on glibc's malloc arenas: pixel buffers reused, not handed back to the kernel and faulted in again.

glibc gives each new thread an arena of its own, up to eight per core. A worker process renders on many threads
(``WORKER_THREADS`` jobs, two renders each), and every render allocates and frees buffers of megabytes: decoded
rows, resampled copies, encoders' output. Spread over a dozen arenas, those freed buffers are trimmed back to the
kernel and the next render faults fresh zeroed pages in. Measured here (``docs/performance.md``), four threads
making v2 of 12 MP photos, two renders each: 11,200-11,800 page faults and 23-31 ms of system CPU per image,
and a 333-360 MB peak, with glibc's default; 3,200-5,600 faults, 10-16 ms and 249-261 MB with two arenas,
and 6 % less wall time. Two arenas each kept the freed buffers of a full-size decode: four threads rendering four
30 MP PNGs grew a process by 412-441 MB while they reserved 265-279 (an adversarial run); the threads share one,
which measured as two did on the 12 MP photos, and the process grows by what its renders reserve.

The cap is glibc's ``M_ARENA_MAX``, set with ``mallopt`` before the worker starts its threads. An operator's
``MALLOC_ARENA_MAX`` (glibc's own variable, read when the process starts) wins: then nothing is set here. Other C
libraries have no such knob; nothing is done there.
"""

from __future__ import annotations

import ctypes
import os
from typing import Mapping

#: the worker's cap, unless ``MALLOC_ARENA_MAX`` is set
WORKER_ARENAS = 1
#: ``M_ARENA_MAX`` in glibc's ``malloc.h``
_M_ARENA_MAX = -8


def cap_malloc_arenas(arenas: int = WORKER_ARENAS, environ: Mapping[str, str] | None = None) -> int | None:
    """Cap glibc's malloc arenas at ``arenas``; the cap set, or ``None`` (``MALLOC_ARENA_MAX`` is set, or the C
    library is not glibc)."""
    if "MALLOC_ARENA_MAX" in (os.environ if environ is None else environ):
        return None
    libc = ctypes.CDLL(None)  # the symbols the process has loaded: its C library's among them
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return arenas if mallopt(_M_ARENA_MAX, arenas) == 1 else None
