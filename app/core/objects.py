"""A stored object's removal and its attachment's jobs exclude each other.

The object GC (``scheduler/object_gc.py``) removes an object under
``attachments/{id}/`` that no variant row references once no job of the
attachment is ``queued`` or ``processing``. It checked, then deleted: a job
that came back between the two (an operator's replay of a ``worker_lost``
job; a backfill) was claimed, rendered the same content-addressed key,
recorded it and was published ``ready``, and the GC's delete, slow on its
storage, then removed the fresh object: a ready attachment's variant gone
for good (an adversarial run, with a 15 s ``unlink``). A lock held across
the delete is no answer: a lock is its session's, and a session ends under
a slow delete (``idle_in_transaction_session_timeout``) or a PostgreSQL
restart (``app/core/staging.py`` met the same).

So the GC commits its decision before it deletes, and a claim respects it:

* :func:`decide_removal` - the GC, under the attachment's lock
  (:func:`lock_for_removal`, exclusive), checks again that nothing
  references the key and no job of the attachment is unfinished, and
  commits a row of ``object_removals``; then it deletes the object, then
  forgets the row (:func:`removed`). A row whose GC died before forgetting
  it is finished by a round a few minutes later (:func:`decided`: the
  object is deleted again, which is harmless, and the row forgotten); the
  attachment's claims wait until then. A GC that finds a row for a key
  leaves it: its GC may still be deleting.
* :func:`await_removals` - a job's claim (``queued`` -> ``processing``),
  in the claim's transaction, under the same lock (shared: claims do not
  wait for each other), raises :class:`RemovalUnderWay` while a decision
  of its attachment stands. The step runs again when the GC is done
  (``Workflow._outlasting_outages``); a claim that commits first is seen
  by the GC's check, which then leaves the object alone.

Only a claim needs it: an attachment's objects are written by its jobs'
steps, and every attempt starts with its claim.

A decision finished by another GC is the one case no lock covers: its
GC may be frozen between its decision and its delete (a paused VM; its
session, and so its lock, ended), and thaw after the claims went on. A
replayed attempt rendered the same content-addressed key, was published
``ready``, and lost the object to the thawed GC's delete (an adversarial
run). So :func:`taint_if_decided` marks such a key for good, before the delete, and the steps write a
tainted key's variant under another one (:func:`untainted`: ``-r1``
before its extension), which that late delete does not name.
"""

from __future__ import annotations

from sqlalchemy import delete, func, select, text
from sqlalchemy.dialects.postgresql import insert

from app.adapters.postgres.db import interval
from app.adapters.postgres.models import object_removals, object_taints
from app.errors import RemovalUnderWay

#: the first key of the two-key advisory locks of attachments' objects (a key space of its own in PostgreSQL)
NAMESPACE = 727276


def lock_for_removal(conn, owner: str) -> None:
    """The GC's lock on the objects of ``owner`` (an attachment id, or the key of an object of no attachment)."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:ns, hashtext(:owner))"), {"ns": NAMESPACE, "owner": owner})


def decide_removal(conn, key: str, owner: str) -> bool:
    """Under :func:`lock_for_removal`, in a transaction that commits before the object is deleted. False if the key
    has a decision already (another GC's, which may still be deleting it)."""
    return conn.execute(insert(object_removals).values(key=key, owner=owner).on_conflict_do_nothing()
                        .returning(object_removals.c.key)).first() is not None


def removed(conn, key: str) -> None:
    """The object ``key`` is gone: its decision is forgotten."""
    conn.execute(delete(object_removals).where(object_removals.c.key == key))


def decided(conn, *, older_than_seconds: float) -> list[str]:
    """The keys whose removal was decided that long ago and not yet forgotten (a GC died in between)."""
    return list(conn.execute(select(object_removals.c.key)
                             .where(object_removals.c.decided_at <= func.now() - interval(older_than_seconds))
                             .order_by(object_removals.c.decided_at)).scalars())


def await_removals(conn, attachment_id) -> None:
    """In a claim's transaction: raise :class:`RemovalUnderWay` while the GC removes one of the attachment's
    objects; once this returns, the GC sees the claim (its check waits for this transaction's lock)."""
    owner = str(attachment_id)
    conn.execute(text("SELECT pg_advisory_xact_lock_shared(:ns, hashtext(:owner))"), {"ns": NAMESPACE, "owner": owner})
    if conn.execute(select(object_removals.c.key).where(object_removals.c.owner == owner).limit(1)).first():
        raise RemovalUnderWay(f"the object GC is removing an object of attachment {owner}")


def taint_if_decided(conn, key: str, owner: str) -> bool:
    """Before a GC finishes another's decision to remove ``key``: that GC may still delete it, so the key is never
    written again (a step's ``Workflow._ATTACHMENT`` reads the taints). False, and nothing tainted, if the decision
    is gone (its GC finished it: the claims may have gone on and written the key); its row stays locked until the
    transaction ends."""
    standing = select(object_removals.c.key).where(object_removals.c.key == key).with_for_update()
    if conn.execute(standing).first() is None:
        return False
    conn.execute(insert(object_taints).values(key=key, owner=owner).on_conflict_do_nothing())
    return True


def untainted(key: str, taints: frozenset[str]) -> str:
    """``key``, or the first of ``-r1``, ``-r2`` ... inserted before its extension that is not tainted: the same for
    every rerun of a step, so the object is written once."""
    if key not in taints:
        return key
    head, name = key.rsplit("/", 1)
    stem, dot, extension = name.rpartition(".") if "." in name else (name, "", "")
    n = 1
    while (candidate := f"{head}/{stem}-r{n}{dot}{extension}") in taints:
        n += 1
    return candidate
