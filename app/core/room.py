"""Room on the storage's disk for the work accepted and not yet done.

An accepted upload's job writes to the storage after the ``202``: a copy of its original (at publish) and its
variants. On the filesystem backend the uploads themselves take that room: their staged originals are on the same
disk. The spool's floor (``ATTACHE_SPOOL_MIN_FREE_BYTES``, :mod:`app.web.spool`) left that much free on the web's
temporary directory's disk alone. Uploads kept coming until the storage's disk was full; the workers then could
write nothing, and every upload accepted ended ``failed storage_unavailable`` (an adversarial run: 48 of 48 with
TMPDIR on another disk, and 26 of 48 with both on one, the floor's 16 MiB gone in 22 jobs' variants).

So the upload's transaction asks :func:`admit` before it commits, as it asks :func:`app.core.pending.admit`. The
upload is refused, ``503 storage_unavailable`` with ``Retry-After``, unless the disk's free inodes less the
floor's (:data:`FLOOR_BYTES_PER_INODE`) hold the files every unfinished job and this one may make, and its free
space less the floor
holds what every unfinished job still needs (uploads', backfills' and replays' alike: a backfill's renders took the
room counted for the uploads accepted beside it, which failed, a re-attack) and what this one needs. A job is
counted to need :func:`need`: its original's size (the copy) and, for each of its version's variants, the pixels of
the smaller of the spec's largest output and the image, at :data:`BYTES_PER_OUTPUT_PIXEL` (one byte a pixel was too
few for noise: 1.66 measured, and too many for a small image, counted as if it were large: re-attacks). A backfill
asks it before each batch, an operator's replay before it is accepted (replays took the room counted for uploads
accepted beside them, which failed: a re-attack), and a resumable upload's part before it is stored (with TMPDIR on
another disk the parts had filled the storage's disk to its last byte). A bucket reports no free space and is never
refused so.

What the unfinished jobs need is read at most once a :data:`FRESH_SECONDS` by a process while it is under half of
the room, and on every request nearer the bound; a sum read just before gets what each request this process admits
with it needs, so one process's requests in that second cannot pass the bound; other processes' can, by a
second's uploads. Each job carries the need it was made with (``jobs.room_bytes``), and triggers keep the
unfinished jobs' sum as they change (:mod:`app.adapters.postgres.room_held`): the read costs what two small tables
cost. It summed every unfinished job joined to its attachment: 0.5-0.6 s of PostgreSQL for a backlog of 100,000
jobs among a million attachments (what a long outage leaves), each second per web process and on each request
near the bound. Jobs made without ``room_bytes`` (before migration 0030, or by the release before it while it
rolls out) are read from an index of those alone, a few by their keys.

The check at the upload's commit comes after its body. A spool on the storage's disk (TMPDIR there, as under
``make up``) took the room held before it: one uploader's two raw POSTs, sized to the free space less the floor and
sent to their last bytes, then a byte every 4 s, held the disk full while five jobs accepted before them waited, and
3 of the 5 ended ``failed storage_unavailable`` (an adversarial run, twice; with the defaults one token holds 8 bodies
of 50 MB per web process so). Such a spool now leaves free the floor and :func:`held_lately`, the sum this process
read last (no query on a write); one made when it is older than :data:`SPOOL_READ_AFTER_SECONDS`, or never read,
reads it first (:func:`read_held`) (:mod:`app.web.spool`, :meth:`app.web.request.UploadRequest.spool`).
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.adapters.postgres import room_held
from app.adapters.postgres.models import JobState
from app.errors import StorageUnavailable

#: the bytes a variant is counted to take per pixel of its output: JPEG and WebP at their qualities here make 0.1-0.6
#: of photos (a 12 MP photo's version 2 variants, 0.67 MB, of 8.9 M such pixels), up to 1.66 of noise
BYTES_PER_OUTPUT_PIXEL = 2
#: the floor is kept free in files too, one inode for each of this many of its bytes (ext4's default ratio): 8,192
#: for the default 128 MiB. Above it, the files every unfinished job may still make (:func:`files_per_job`) and
#: the new jobs' are counted, as their bytes are. Out of inodes with bytes to spare, uploads were accepted whose
#: variants could not be written: 20 of 27 ended ``failed storage_unavailable`` with 190 MB free (an adversarial
#: run); with a fixed floor of files alone, 40 of 90 stood still, their partial files holding the last inodes (a
#: re-attack).
FLOOR_BYTES_PER_INODE = 16 * 1024
#: how long a sum of what the unfinished jobs need is used by a process before it is read again (far from the bound)
FRESH_SECONDS = 1.0
#: a spool made on the storage's disk reads the sum first when this process read it longer ago than this (or never):
#: an upload's commit reads it each :data:`FRESH_SECONDS` under load, so a busy process's spools read nothing, and a
#: quiet one's first upload pays one read (two small tables) before its body
SPOOL_READ_AFTER_SECONDS = 5.0

NO_ROOM = "the storage's disk has no room for the work still being done; retry later"

#: by database: (when the sum was read, what it was with what this process admitted since); and the files
_seen: dict[object, tuple[float, int]] = {}
_files_seen: dict[object, tuple[float, int]] = {}
_seen_lock = threading.Lock()
_statements: dict[tuple[int, ...], tuple] = {}


def need(version, *, size: int, pixels: int) -> int:
    """What one job of ``version`` writes for an original of ``size`` bytes and ``pixels`` pixels (``size`` 0: its
    original is kept already)."""
    return size + BYTES_PER_OUTPUT_PIXEL * sum(min(spec.width * spec.height, pixels) for spec in version.specs.values())


#: uncounted jobs (made before migration 0030, or by the release before it while it rolls out, or replayed since)
#: read one by one, by their keys, up to this many; more are summed in one join as before the migration
FEW_UNCOUNTED = 1000


def _statements_of(version) -> tuple:
    """What the unfinished jobs need, as two statements: those the triggers count, with the need of at most
    :data:`FEW_UNCOUNTED` jobs made without ``room_bytes`` and how many there were; and the need of every such job.
    An uncounted job's need is :func:`need`'s with ``version``'s specs (integers from the code)."""
    outputs = tuple(spec.width * spec.height for spec in version.specs.values())
    statements = _statements.get(outputs)
    if statements is None:
        pixels = " + ".join(f"LEAST({output}, a.width::bigint * a.height)" for output in outputs) or "0"
        needing = f"a.size + {BYTES_PER_OUTPUT_PIXEL} * ({pixels})"
        uncounted = f"j.room_bytes IS NULL AND j.state IN ('{JobState.QUEUED.value}', '{JobState.PROCESSING.value}')"
        # the few by their own index, in its order, each attachment by its key: the planner, which takes the two
        # conditions for independent, guessed most unfinished jobs uncounted (most jobs made before the migration
        # are done, and have no room_bytes) and joined every attachment for one such job (65-112 ms with 400,000
        # attachments: a re-attack)
        statements = _statements[outputs] = (
            text(f"SELECT {room_held.COUNTED}, coalesce(sum(few.need), 0), count(*) FROM (SELECT (SELECT {needing} "
                 f"FROM attachments a WHERE a.id = j.attachment_id) AS need FROM (SELECT j.attachment_id FROM jobs j "
                 f"WHERE {uncounted} ORDER BY j.id LIMIT {FEW_UNCOUNTED}) j) few"),
            text(f"SELECT coalesce(sum({needing}), 0) FROM jobs j JOIN attachments a ON a.id = j.attachment_id "
                 f"WHERE {uncounted}"))
    return statements


def _read_held(conn: Connection, version) -> int:
    few, every = _statements_of(version)
    counted, uncounted, how_many = conn.execute(few).one()
    if how_many >= FEW_UNCOUNTED:
        uncounted = conn.execute(every).scalar_one()
    return int(counted) + int(uncounted)


def admit(conn: Connection, services, *, version, needing: int, adding: int = 0, jobs: int = 1) -> None:
    """Raise :class:`StorageUnavailable` unless the storage has room above ``ATTACHE_SPOOL_MIN_FREE_BYTES`` for
    ``adding`` bytes about to be written, what every unfinished job needs, and ``needing`` more (the ``jobs`` about
    to be made); and files for them all, above the floor's. A floor of 0: nothing refused."""
    min_free_bytes = services.settings.spool_min_free_bytes
    if not min_free_bytes:
        return
    space = services.storage.free_space()
    if space is None:
        return
    if space.files is not None:
        per_job = files_per_job(version)
        spare = space.files - min_free_bytes // FLOOR_BYTES_PER_INODE - per_job * jobs - (1 if adding else 0)
        if spare < 0 or _recent(_files_seen, conn, lambda c: per_job * _unfinished(c, spare // per_job + 1),
                                room=spare, adding=per_job * jobs) > spare:
            raise StorageUnavailable(NO_ROOM)
    room = space.bytes - adding - min_free_bytes - needing
    if room < 0 or _recent(_seen, conn, lambda c: _read_held(c, version), room=room, adding=needing) > room:
        raise StorageUnavailable(NO_ROOM)


def files_per_job(version) -> int:
    """The files a job of ``version`` may make on the storage's disk: its staged original, a file for each of its
    variants (the original's copy among them) and two directories."""
    return 1 + len(version.variants) + 2


#: the unfinished jobs, counted up to a bound (an index-only scan of ``jobs_state_idx``)
_UNFINISHED = text(f"SELECT count(*) FROM (SELECT 1 FROM jobs WHERE state IN ('{JobState.QUEUED.value}', "
                   f"'{JobState.PROCESSING.value}') LIMIT :up_to) unfinished")


def _unfinished(conn: Connection, up_to: int) -> int:
    return conn.execute(_UNFINISHED, {"up_to": max(up_to, 0)}).scalar_one()


def _recent(seen: dict, conn: Connection, read, *, room: int, adding: int) -> int:
    """``read(conn)``, or what this process read of it less than :data:`FRESH_SECONDS` ago while it was under half
    of ``room``, with what the process admitted since; ``adding`` counted with it from here on."""
    database, now = conn.engine.url, time.monotonic()
    with _seen_lock:
        last = seen.get(database)
        if last is not None and now - last[0] < FRESH_SECONDS and last[1] <= room // 2:
            seen[database] = (last[0], last[1] + adding)
            return last[1]
    value = read(conn)
    with _seen_lock:
        seen[database] = (now, value + adding)
    return value


def held_lately(database, *, within: float | None = None) -> int | None:
    """What the unfinished jobs need, as this process read it last for ``database`` (an engine's URL), with what
    it admitted since; ``None`` if it has not read it, or not in the last ``within`` seconds. No query: a spool on
    the storage's disk asks it on each write."""
    with _seen_lock:
        last = _seen.get(database)
    if last is None or (within is not None and time.monotonic() - last[0] >= within):
        return None
    return last[1]


def read_held(engine, version) -> int:
    """Read what the unfinished jobs need now (``version``'s specs for the jobs made without their need), kept as
    :func:`admit`'s sum is: :func:`held_lately` gives it, and the next check of :func:`admit` may use it."""
    now = time.monotonic()
    with engine.connect() as conn:
        value = _read_held(conn, version)
    with _seen_lock:
        last = _seen.get(engine.url)
        if last is None or last[0] <= now:  # a sum another thread read after this one began is newer: kept
            _seen[engine.url] = (now, value)
    return value
