"""Unreferenced objects: bytes under ``attachments/`` that no variant row points at.

They come from renders whose attempt lost its lease, or from a worker that
died between its object write and its COMMIT in a later-abandoned attempt.
An object is removed only when it is older than
``ATTACHE_OBJECT_GRACE_SECONDS`` (a render writes its object seconds before
recording it; every write or copy makes a new object whose age starts
then) and, on a fresh query right before the delete, no row of
``variants`` references its key and no job of its attachment is
``queued`` or ``processing``: a render that finds the original already
there (from an earlier try) records it without rewriting it, so an old,
unreferenced object may be about to be referenced while its job runs.

Each round, still under its lock, also removes what crashes and deletes
left behind in storage, once untouched for the same grace
(:meth:`Storage.remove_leftovers`): a worker killed mid-write leaves a
``.tmp-*`` file in file storage (``abandoned_writes``), and a finished
resumable upload or a retired version an empty directory
(``empty_directories``).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import UNFINISHED, jobs, variants
from app.adapters.storage import Storage
from scheduler.locking import sweep_storage

log = logging.getLogger("attache.scheduler.objects")

PREFIX = "attachments/"


def referenced_query(keys: list[str]):
    """The keys among ``keys`` that a variant row points at (an index lookup: ``variants_storage_key_idx``)."""
    return select(variants.c.storage_key).where(variants.c.storage_key.in_(keys))


def in_flight_query(attachment_ids):
    """The attachments among ``attachment_ids`` with a ``queued`` or ``processing`` job.

    An index lookup through ``jobs_attachment_version_key``.
    """
    return select(jobs.c.attachment_id).where(jobs.c.attachment_id.in_(list(attachment_ids)),
                                              jobs.c.state.in_(UNFINISHED)).distinct()


def attachment_of(key: str) -> uuid.UUID | None:
    """``attachments/{attachment_id}/...`` -> the id (None for a key of any other shape)."""
    parts = key.split("/", 2)
    try:
        return uuid.UUID(parts[1]) if len(parts) == 3 and parts[0] == "attachments" else None
    except ValueError:
        return None


@dataclass(frozen=True)
class ObjectGcConfig:
    grace_seconds: float = 3600.0
    batch: int = 500


class ObjectGc:
    name = "object_gc"

    def __init__(self, engine: Engine, storage: Storage, config: ObjectGcConfig):
        self.engine = engine
        self.storage = storage
        self.config = config

    def run_once(self, *, dry_run: bool = False) -> dict[str, int]:
        counts = {"examined": 0, "removed": 0, "referenced": 0, "young": 0, "in_flight": 0, "abandoned_writes": 0,
                  "empty_directories": 0, "skipped": 0}
        sweep_storage(self.engine, self.name, self.storage.list_objects(PREFIX), self.config.batch,
                      lambda chunk: self._process(chunk, counts, dry_run), counts,
                      then=lambda: counts.update(self.storage.remove_leftovers(self.config.grace_seconds,
                                                                               dry_run=dry_run)))
        if counts["removed"] or counts["abandoned_writes"] or counts["empty_directories"]:
            log.info("object gc removed %(removed)d unreferenced objects, %(abandoned_writes)d abandoned writes "
                     "and %(empty_directories)d empty directories", counts, extra=counts)
        return counts

    def _referenced(self, keys: list[str], conn=None) -> set[str]:
        if conn is not None:  # READ COMMITTED: every statement sees what is committed when it starts
            return set(conn.execute(referenced_query(keys)).scalars())
        with transaction(self.engine) as conn:
            return set(conn.execute(referenced_query(keys)).scalars())

    def _in_flight(self, keys: list[str], conn) -> set[str]:
        owners = {key: attachment_of(key) for key in keys}
        ids = {owner for owner in owners.values() if owner is not None}
        busy = set(conn.execute(in_flight_query(ids)).scalars()) if ids else set()
        return {key for key, owner in owners.items() if owner in busy}

    def _process(self, batch, counts, dry_run: bool) -> None:
        now = datetime.now(timezone.utc)
        counts["examined"] += len(batch)
        grace = timedelta(seconds=self.config.grace_seconds)
        old = [info for info in batch if now - (info.last_modified or now) >= grace]
        counts["young"] += len(batch) - len(old)
        referenced = self._referenced([info.key for info in old]) if old else set()
        counts["referenced"] += len(referenced)
        candidates = [info for info in old if info.key not in referenced]
        if not candidates:
            return
        with transaction(self.engine) as conn:  # one connection for the batch's re-checks
            busy = self._in_flight([info.key for info in candidates], conn)
            counts["in_flight"] += len(busy)
            for info in candidates:
                if info.key in busy:
                    continue
                # re-check this one key, its attachment's jobs, and that it was not rewritten since it was listed
                if self._referenced([info.key], conn):
                    counts["referenced"] += 1
                    continue
                if self._in_flight([info.key], conn):
                    counts["in_flight"] += 1
                    continue
                current = self.storage.stat(info.key)
                if current is None or (current.last_modified and now - current.last_modified < grace):
                    counts["young"] += 1
                    continue
                if not dry_run:
                    self.storage.delete(info.key)
                    log.info("removed unreferenced object %s", info.key, extra={"key": info.key})
                counts["removed"] += 1
