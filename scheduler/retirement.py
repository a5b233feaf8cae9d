"""Retirement: objects of superseded pipeline versions, collected after a grace period.

A variant of version *v* is superseded once a newer version of the same
attachment is ``ready``: from then on the status and downloads serve the
newer one by default. After ``ATTACHE_RETIRE_GRACE_SECONDS`` (7 days by
default, so caches and clients holding old URLs drain) the old rows are
marked ``retired_at`` in a transaction that re-checks the condition, and
their objects are deleted unless a row that is not retired still points
at the same key (the original is shared by every version, so it stays).
``?version=v`` then answers with the job and no variants.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import and_, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import aliased

from app.adapters.postgres.db import interval, transaction
from app.adapters.postgres.models import JobState, jobs, variants
from app.adapters.storage import Storage
from scheduler.locking import exclusive

log = logging.getLogger("attache.scheduler.retirement")


def oldest_live_version_query():
    """The lowest pipeline version with a published, unretired row (``variants_live_version_idx``: one index entry)."""
    return select(func.min(variants.c.pipeline_version)).where(variants.c.published_at.is_not(None),
                                                               variants.c.retired_at.is_(None))


def candidates_query(grace_seconds: float, batch: int, oldest_live_version: int):
    """Up to ``batch`` published, unretired rows superseded for ``grace_seconds`` (locked, skipping locked ones).

    Driven from the newer side: only ``ready`` jobs of a version above the
    oldest live one can supersede anything (``jobs_state_idx``), and each
    probes its attachment's older rows (``variants_effect_key``). So a
    round costs what is in transition between versions, not a scan of
    every live row (see ``make bench``).
    """
    newer = aliased(jobs)
    return (select(variants.c.id)
            .join(newer, and_(newer.c.attachment_id == variants.c.attachment_id,
                              newer.c.pipeline_version > variants.c.pipeline_version))
            .where(newer.c.state == JobState.READY, newer.c.pipeline_version > oldest_live_version,
                   newer.c.ready_at <= func.now() - interval(grace_seconds),
                   variants.c.published_at.is_not(None), variants.c.retired_at.is_(None))
            .limit(batch).with_for_update(of=variants, skip_locked=True))


def still_used_query(key: str):
    """How many rows that are not retired point at ``key`` (an index lookup: ``variants_storage_key_idx``)."""
    return select(func.count()).select_from(variants).where(variants.c.storage_key == key,
                                                            variants.c.retired_at.is_(None))


@dataclass(frozen=True)
class RetirementConfig:
    grace_seconds: float = 7 * 24 * 3600.0
    batch: int = 500


class Retirement:
    name = "retirement"

    def __init__(self, engine: Engine, storage: Storage, config: RetirementConfig):
        self.engine = engine
        self.storage = storage
        self.config = config

    def run_once(self, *, dry_run: bool = False) -> dict[str, int]:
        counts = {"retired": 0, "objects_removed": 0, "objects_kept": 0, "skipped": 0}
        with exclusive(self.engine, self.name) as lock:
            if not lock:
                counts["skipped"] = 1
                return counts
            while True:
                lock.renew()
                with transaction(self.engine) as conn:
                    oldest = conn.execute(oldest_live_version_query()).scalar()
                    if oldest is None:  # nothing is published and unretired
                        break
                    candidates = candidates_query(self.config.grace_seconds, self.config.batch, oldest)
                    if dry_run:
                        counts["retired"] += len(set(conn.execute(candidates).scalars()))  # a row may join twice
                        return counts
                    retired = conn.execute(
                        update(variants).where(variants.c.id.in_(candidates.scalar_subquery()))
                        .values(retired_at=func.now()).returning(variants.c.storage_key)).scalars().all()
                if not retired:
                    break
                counts["retired"] += len(retired)
                with transaction(self.engine) as conn:  # READ COMMITTED: each check sees fresh rows
                    for key in set(retired):
                        self._collect(conn, key, counts)
        if counts["retired"]:
            log.info("retired %(retired)d superseded variants, removed %(objects_removed)d objects", counts,
                     extra=counts)
        return counts

    def _collect(self, conn, key: str, counts: dict) -> None:
        still_used = conn.execute(still_used_query(key)).scalar()  # re-checked right before the delete
        if still_used:
            counts["objects_kept"] += 1
            return
        self.storage.delete(key)
        counts["objects_removed"] += 1
