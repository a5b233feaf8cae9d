"""Orphaned staging: staged originals that no current work needs.

A staged object ``staging/{attachment_id}`` is removed when, on a fresh
look at the database taken right before the delete:

* no attachment row points at it and it is older than
  ``ATTACHE_STAGING_GRACE_SECONDS`` (window 1: the web died between staging
  and COMMIT, or a refused upload's delete failed); or
* no job of its attachment is ``queued`` or ``processing`` and one is
  ``ready`` (the worker's own removal after publish did not happen, or was
  left to a job of another version that then failed): a version published
  the kept original, which a replay reads; or
* every job of its attachment is ``failed`` and has been for longer than
  ``ATTACHE_FAILED_RETENTION_SECONDS`` (after that a replay is impossible).

A job in ``queued`` or ``processing`` always keeps its staging, and so does
an upload whose transaction is still open, however long it has been
paused (the look and the delete hold the object's lock, which the upload
holds until its COMMIT: :mod:`app.core.staging`).

It also ends resumable uploads (:mod:`app.core.resumable`): an expired
upload is forgotten with its partial bytes (``partial/{upload_id}/…``), and
a part whose upload is gone or finished is removed.

An object whose delete the store refuses keeps its decision, is counted in
``not_removed`` and passed over: the round goes on with its other objects,
the expired uploads and the parts, and the next round tries it again after
them (:class:`scheduler.refusals.Refusals`: one immutable staged file
among 30 orphans kept all 30, and every expired upload, round after round).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import UNFINISHED, JobState, attachments, jobs
from app.adapters.storage import Storage
from app.core import resumable, staging
from scheduler.locking import exclusive, sweep_storage
from scheduler.refusals import NOT_REMOVED, Refusals

log = logging.getLogger("attache.scheduler.staging")

PREFIX = "staging/"


def owner_query(key: str):
    """The attachment whose staged original is ``key`` (an index lookup: ``attachments_staging_key_idx``)."""
    return select(attachments.c.id).where(attachments.c.staging_key == key)


def busy_query(keys: list[str]):
    """Those of ``keys`` whose attachment has a job ``queued`` or ``processing``: kept this round, whatever else
    holds (one read per batch; a backlog of queued uploads took a transaction per object)."""
    return (select(attachments.c.staging_key).join(jobs, jobs.c.attachment_id == attachments.c.id)
            .where(attachments.c.staging_key.in_(keys), jobs.c.state.in_(UNFINISHED)).distinct())


@dataclass(frozen=True)
class StagingCleanupConfig:
    grace_seconds: float = 3600.0
    failed_retention_seconds: float = 7 * 24 * 3600.0
    batch: int = 200


class StagingCleanup:
    name = "staging_cleanup"

    def __init__(self, engine: Engine, storage: Storage, config: StagingCleanupConfig):
        self.engine = engine
        self.storage = storage
        self.config = config
        self.refusals = Refusals(storage, log)

    def run_once(self, *, dry_run: bool = False) -> dict[str, int]:
        counts = {"examined": 0, "removed": 0, "kept": 0, "skipped": 0, "uploads_expired": 0, "parts_removed": 0,
                  NOT_REMOVED: 0}
        with exclusive(self.engine, self.name) as lock:  # one lock for the round: its parts are one round's
            if not lock:
                counts["skipped"] = 1
                return counts
            with self.refusals.round(dry_run=dry_run):
                # what the store refused to delete last round is set aside, and tried again at the round's end
                staged, parts = [], []
                sweep_storage(lock, self.storage.list_objects(PREFIX), self.config.batch,
                              lambda chunk: self._process(self._aside(chunk, staged), counts, dry_run))
                lock.renew()
                self.refusals.phase("expired uploads' parts", lambda: self._forget_expired(counts, dry_run), counts)
                sweep_storage(lock, self.storage.list_objects(resumable.PREFIX), self.config.batch,
                              lambda chunk: self._process_parts(self._aside(chunk, parts), counts, dry_run))
                sweep_storage(lock, staged, self.config.batch, lambda chunk: self._process(chunk, counts, dry_run))
                sweep_storage(lock, parts, self.config.batch,
                              lambda chunk: self._process_parts(chunk, counts, dry_run))
        if counts["removed"] or counts["uploads_expired"] or counts["parts_removed"]:
            log.info("staging cleanup removed %(removed)d of %(examined)d staged objects, forgot "
                     "%(uploads_expired)d expired uploads and removed %(parts_removed)d unneeded parts",
                     counts, extra=counts)
        if counts[NOT_REMOVED]:
            log.warning("staging cleanup could not remove %(not_removed)d objects; the next round tries them again",
                        counts, extra=counts)
        return counts

    def _aside(self, batch, later: list) -> list:
        """The batch without the objects the store refused to delete last round, which go to ``later``."""
        now, refused = self.refusals.split(batch, key=lambda info: info.key)
        later.extend(refused)
        return now

    def _forget_expired(self, counts, dry_run: bool) -> None:
        counts["uploads_expired"] = resumable.forget_expired(
            self.engine, self.storage, batch=self.config.batch, dry_run=dry_run,
            refused=self.refusals.told("the parts of expired upload", counts))

    def _process_parts(self, batch, counts, dry_run: bool) -> None:
        now = datetime.now(timezone.utc)
        for info in batch:
            removable = resumable.part_removable(self.engine, info.key)
            if removable is None:  # not a part this version wrote: an orphan after the grace period
                removable = now - (info.last_modified or now) >= timedelta(seconds=self.config.grace_seconds)
            if removable and (dry_run or self.refusals.delete(info.key, counts)):
                counts["parts_removed"] += 1

    def _process(self, batch, counts, dry_run: bool) -> None:
        if not batch:  # every object of it set aside (_aside)
            return
        now = datetime.now(timezone.utc)
        with self.engine.connect() as conn:
            busy = set(conn.execute(busy_query([info.key for info in batch])).scalars())
        for info in batch:
            counts["examined"] += 1
            if info.key in busy:  # current work: kept without a look under the lock (looked at again next round)
                counts["kept"] += 1
                continue
            # the look under the object's lock, and the decision committed before the delete: an upload holds
            # the lock from its check that the object is there (and not decided on) to its COMMIT, and a paused
            # one is left alone; a decision made holds whatever becomes of this session (app.core.staging)
            with transaction(self.engine) as conn:
                removable = staging.try_lock(conn, info.key) and self._removable(conn, info, now)
                if removable and not dry_run:
                    staging.decide_removal(conn, info.key)
            if not removable:
                counts["kept"] += 1
            elif dry_run:
                counts["removed"] += 1
            elif self.refusals.delete(info.key, counts):  # refused: the decision stands, for the next round's try
                log.info("removed staged object %s", info.key, extra={"key": info.key})
                with transaction(self.engine) as conn:
                    staging.removed(conn, info.key)
                counts["removed"] += 1

    def _removable(self, conn, info, now: datetime) -> bool:
        try:
            attachment_id = uuid.UUID(info.key[len(PREFIX):])
        except ValueError:
            attachment_id = None
        owner = None if attachment_id is None else conn.execute(owner_query(info.key)).scalar()
        if owner is None:
            age = now - (info.last_modified or now)
            return age >= timedelta(seconds=self.config.grace_seconds)
        states = conn.execute(select(jobs.c.state, jobs.c.updated_at).where(jobs.c.attachment_id == owner)).all()
        if not states or any(state in UNFINISHED for state, _ in states):
            return False
        if any(state == JobState.READY for state, _ in states):
            return True
        retention = timedelta(seconds=self.config.failed_retention_seconds)
        return all(state == JobState.FAILED and now - updated >= retention for state, updated in states)
