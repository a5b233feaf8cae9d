"""Unreferenced objects: bytes under ``attachments/`` that no variant row points at.

They come from renders whose attempt lost its lease, or from a worker that
died between its object write and its COMMIT in a later-abandoned attempt.
An object is removed only when it is older than
``ATTACHE_OBJECT_GRACE_SECONDS`` (a render writes its object seconds before
recording it) and, on a fresh query right before the delete, no row of
``variants`` references its key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import select

from app.db import transaction
from app.models import variants
from app.services import Services
from scheduler.locking import sweep_storage

log = logging.getLogger("attache.scheduler.objects")

PREFIX = "attachments/"


def referenced_query(keys: list[str]):
    """The keys among ``keys`` that a variant row points at (an index lookup: ``variants_storage_key_idx``)."""
    return select(variants.c.storage_key).where(variants.c.storage_key.in_(keys))


@dataclass(frozen=True)
class ObjectGcConfig:
    grace_seconds: float = 3600.0
    batch: int = 500


class ObjectGc:
    name = "object_gc"

    def __init__(self, services: Services, config: ObjectGcConfig):
        self.services = services
        self.config = config

    def run_once(self, *, dry_run: bool = False) -> dict[str, int]:
        counts = {"examined": 0, "removed": 0, "referenced": 0, "young": 0, "skipped": 0}
        sweep_storage(self.services.engine, self.name, self.services.storage.list_objects(PREFIX), self.config.batch,
                      lambda chunk: self._process(chunk, counts, dry_run), counts)
        if counts["removed"]:
            log.info("object gc removed %(removed)d unreferenced objects", counts, extra=counts)
        return counts

    def _referenced(self, keys: list[str], conn=None) -> set[str]:
        if conn is not None:  # READ COMMITTED: every statement sees what is committed when it starts
            return set(conn.execute(referenced_query(keys)).scalars())
        with transaction(self.services.engine) as conn:
            return set(conn.execute(referenced_query(keys)).scalars())

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
        with transaction(self.services.engine) as conn:  # one connection for the batch's re-checks
            for info in candidates:
                # re-check this one key, and that it was not rewritten since it was listed
                if self._referenced([info.key], conn):
                    counts["referenced"] += 1
                    continue
                current = self.services.storage.stat(info.key)
                if current is None or (current.last_modified and now - current.last_modified < grace):
                    counts["young"] += 1
                    continue
                if not dry_run:
                    self.services.storage.delete(info.key)
                    log.info("removed unreferenced object %s", info.key, extra={"key": info.key})
                counts["removed"] += 1
