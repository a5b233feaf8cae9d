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

That last check and the delete are two steps, and a job may come back in
between (an operator's replay, a backfill): the decision to remove is
committed before the delete, under the attachment's lock, and a job's claim
waits while its attachment has one (``app/core/objects.py``). A decision
left by a GC that died before its delete is finished by the first round
``decision_grace_seconds`` after it.

Each round, still under its lock, also removes what crashes and deletes
left behind in storage, once untouched for the same grace
(:meth:`Storage.remove_leftovers`): a worker killed mid-write leaves a
``.tmp-*`` file in file storage (``abandoned_writes``), and a finished
resumable upload or a retired version an empty directory
(``empty_directories``).

An object whose delete the store refuses stays decided, is counted in
``not_removed`` and passed over: the round goes on with its other keys and
phases, and the next round tries it again after them (:class:`Refusals`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import select
from sqlalchemy.engine import Engine

from app import faults
from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import UNFINISHED, jobs, variants
from app.adapters.storage import Storage
from app.core import objects
from scheduler.locking import exclusive, sweep_storage
from scheduler.refusals import NOT_REMOVED, Refusals

log = logging.getLogger("attache.scheduler.objects")

PREFIX = "attachments/"

def referenced_query(keys: list[str]):
    """The keys among ``keys`` that a live variant row points at (an index lookup: ``variants_storage_key_idx``).

    A retired row is no reference: its version is served no more, and retirement removed its objects once, never
    to look at the row again. An object written under its key afterwards (a late attempt of the retired version,
    paused in its render, woken after retirement; an adversarial run) would otherwise stay for good; one shared
    with a live row (an original) is kept by that row."""
    return select(variants.c.storage_key).where(variants.c.storage_key.in_(keys), variants.c.retired_at.is_(None))


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
    #: how old a removal decision must be before a round finishes it for a GC that did not
    #: (``ATTACHE_OBJECT_DECISION_GRACE_SECONDS``)
    decision_grace_seconds: float = 300.0


class ObjectGc:
    name = "object_gc"

    def __init__(self, engine: Engine, storage: Storage, config: ObjectGcConfig):
        self.engine = engine
        self.storage = storage
        self.config = config
        self.refusals = Refusals(storage, log)

    def run_once(self, *, dry_run: bool = False) -> dict[str, int]:
        counts = {"examined": 0, "removed": 0, "referenced": 0, "young": 0, "in_flight": 0, "decided_elsewhere": 0,
                  "abandoned_writes": 0, "empty_directories": 0, NOT_REMOVED: 0, "skipped": 0}
        with exclusive(self.engine, self.name) as lock:
            if not lock:
                counts["skipped"] = 1
                return counts
            with self.refusals.round(dry_run=dry_run):
                # a key refused last round is decided still: tried again after the round's other keys and phases
                first, later = self.refusals.split(self._decided()) if not dry_run else ([], [])
                self._finish_decided(first, counts)
                sweep_storage(lock, self.storage.list_objects(PREFIX), self.config.batch,
                              lambda chunk: self._process(chunk, counts, dry_run))
                lock.renew()
                self.refusals.phase("leftovers", lambda: counts.update(
                    self.storage.remove_leftovers(self.config.grace_seconds, dry_run=dry_run)), counts)
                if later:
                    lock.renew()
                    self._finish_decided(later, counts)
        if counts["removed"] or counts["abandoned_writes"] or counts["empty_directories"]:
            log.info("object gc removed %(removed)d unreferenced objects, %(abandoned_writes)d abandoned writes "
                     "and %(empty_directories)d empty directories", counts, extra=counts)
        if counts[NOT_REMOVED]:
            log.warning("object gc could not remove %(not_removed)d objects; the next round tries them again",
                        counts, extra=counts)
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
        with transaction(self.engine) as conn:  # a first look at the candidates' jobs, for the batch at once
            busy = self._in_flight([info.key for info in candidates], conn)
        counts["in_flight"] += len(busy)
        for info in candidates:
            if info.key in busy:
                continue
            verdict = self._decide(info.key, now, grace, dry_run)
            if verdict != "removed":
                counts[verdict] += 1
                continue
            if dry_run or self._remove(info.key, counts):
                counts["removed"] += 1

    def _decide(self, key: str, now: datetime, grace: timedelta, dry_run: bool) -> str:
        """Check the key again (a rewrite since it was listed; then, under the lock of its attachment, a reference
        and an unfinished job of its attachment) and commit the decision to remove it: ``removed``, or the count
        the key goes to instead. A key with a decision already is another GC's, which may still be deleting it
        (its session lost): it is left to :meth:`_finish_decided`. The object is looked at before the lock: a
        claim of the attachment would wait for a slow storage call with its job's row locked."""
        current = self.storage.stat(key)
        if current is None or (current.last_modified and now - current.last_modified < grace):
            return "young"
        with transaction(self.engine) as conn:
            objects.lock_for_removal(conn, _owner(key))
            if self._referenced([key], conn):
                return "referenced"
            if self._in_flight([key], conn):
                return "in_flight"
            if not dry_run and not objects.decide_removal(conn, key, _owner(key)):
                return "decided_elsewhere"
        return "removed"

    def _remove(self, key: str, counts: dict[str, int]) -> bool:
        """Delete an object whose removal is decided (committed), then forget the decision. False when the store
        refused this object (:class:`Refusals`): the decision stands, and the claims of its attachment wait."""
        faults.point("object_gc_before_delete")
        if not self.refusals.delete(key, counts):
            return False
        log.info("removed unreferenced object %s", key, extra={"key": key})
        with transaction(self.engine) as conn:
            objects.removed(conn, key)
        return True

    def _decided(self) -> list[str]:
        """The removals a GC decided ``decision_grace_seconds`` ago and did not finish, oldest first."""
        with transaction(self.engine) as conn:
            return objects.decided(conn, older_than_seconds=self.config.decision_grace_seconds)

    def _finish_decided(self, keys: list[str], counts) -> None:
        """First in a round, under the GC's lock: removals a GC decided and did not finish (it died between its
        decision and its delete, or the store refused its delete); those the store refused last round, at the
        end of the round (:class:`Refusals`). No job of their attachments has been claimed since, so they are
        removed as decided. Only those decided ``decision_grace_seconds`` ago (:meth:`_decided`): a GC whose
        session was lost (a PostgreSQL restart) may still be in its delete, and a second delete after the claims
        went on would remove what they write. However long ago, that GC may be frozen in its delete: each key is
        tainted first, in a transaction that finds its decision still standing (a GC that thawed and finished it
        meanwhile let the claims go on, and a replay may have written the key since), and the claims' steps write
        its variant under another key."""
        for key in keys:
            with transaction(self.engine) as conn:
                standing = objects.taint_if_decided(conn, key, _owner(key))
            if standing and self._remove(key, counts):
                counts["removed"] += 1


def _owner(key: str) -> str:
    """What the key's removal is locked and recorded by: its attachment's id, or the key itself."""
    attachment = attachment_of(key)
    return str(attachment) if attachment is not None else key
