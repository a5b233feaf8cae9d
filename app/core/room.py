"""Room on the storage's disk for the uploads accepted and not yet processed.

An accepted upload's job writes its variants to the storage after the ``202``. On the filesystem backend the
uploads themselves take that room: their staged originals are on the same disk. The spool's floor
(``ATTACHE_SPOOL_MIN_FREE_BYTES``, :mod:`app.web.spool`) left that much free on the web's temporary directory's disk
alone. Uploads kept coming until the storage's disk was full; the workers then could write no variant, and every
upload accepted ended ``failed storage_unavailable`` (an adversarial run: 48 of 48 with TMPDIR on another disk, and
26 of 48 with both on one, the floor's 16 MiB gone in 22 jobs' variants).

So the upload's transaction asks :func:`admit` before it commits, as it asks :func:`app.core.pending.admit`. The
upload is refused, ``503 storage_unavailable`` with ``Retry-After``, unless the disk's free space less the floor
holds the variants of every upload still pending and of this one. Each is counted at its pipeline version's
:attr:`~app.core.pipeline.PipelineVersion.room_bytes` (8.9 MB for version 2, some 13 times a 12 MP photo's). A
bucket reports no free space and is never refused so. A resumable upload's part is refused where storing it would
leave less than that room (with TMPDIR on another disk the parts had filled the storage's disk to its last byte).

The count of pending uploads (``pending_uploads``, which backfills and replays are not in) is read at most once a
:data:`FRESH_SECONDS` by a process while its disk has room for many more, and on every upload once it nears the
bound. A count read just before gets one more for each upload this process admits with it, so one process's
uploads in that second can not pass the bound; those of other processes can, by a second's uploads.
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from app.adapters.postgres.models import pending_uploads
from app.errors import StorageUnavailable

#: how long a count of the pending uploads is used by a process before it is read again (while far from the bound)
FRESH_SECONDS = 1.0

_SOME = select(pending_uploads.c.job_id).limit(bindparam("b_up_to")).subquery()
_COUNT = select(func.count()).select_from(_SOME)  # built once, as uploads ask it
#: by database: (when the count was read, what it was with the uploads this process admitted since)
_seen: dict[object, tuple[float, int]] = {}
_seen_lock = threading.Lock()

NO_ROOM = "the storage's disk has no room for the uploads still being processed; retry later"


def admit(conn: Connection, storage, *, min_free_bytes: int, room_bytes: int, adding: int = 0,
          uploads: int = 1) -> None:
    """Raise :class:`StorageUnavailable` unless the storage has room above ``min_free_bytes`` for ``adding`` bytes
    about to be written and ``room_bytes`` for each pending upload and ``uploads`` more (the one being accepted; a
    resumable upload's part, 0). ``min_free_bytes`` 0: no floor, nothing refused."""
    if not min_free_bytes or room_bytes <= 0:
        return
    free = storage.free_bytes()
    if free is None:
        return
    headroom = free - adding - min_free_bytes
    fit = headroom // room_bytes - uploads  # how many pending uploads' variants fit beside these
    if headroom < 0 or fit < 0 or _pending(conn, up_to=fit + 1, admitting=uploads) > fit:
        raise StorageUnavailable(NO_ROOM)


def _pending(conn: Connection, *, up_to: int, admitting: int) -> int:
    """The uploads pending, counting no further than ``up_to``; the ``admitting`` ones counted from here on (a count
    far from ``up_to`` is read at most once a :data:`FRESH_SECONDS`)."""
    database, now = conn.engine.url, time.monotonic()
    with _seen_lock:
        seen = _seen.get(database)
        if seen is not None and now - seen[0] < FRESH_SECONDS and seen[1] + 1 < up_to:
            _seen[database] = (seen[0], seen[1] + admitting)
            return seen[1]
    counted = conn.execute(_COUNT, {"b_up_to": up_to}).scalar_one()
    with _seen_lock:
        _seen[database] = (now, counted + admitting)
    return counted
