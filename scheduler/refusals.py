"""The storage cleanups' deletes the store refuses for one object: counted, logged and passed over.

Shared by ``scheduler/object_gc.py`` and ``scheduler/staging_cleanup.py``: see :class:`Refusals`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator

from app.adapters.storage import Storage
from app.errors import StorageError, StorageUnavailable

#: the count, in a storage cleanup's result, of deletes the store refused (``scheduler/runs.py`` records a round
#: with one ``failed``, its counts added up)
NOT_REMOVED = "not_removed"


class Refusals:
    """A storage cleanup's deletes that the store refused for the object alone: counted in ``not_removed``, logged
    with the key, and passed over, so that one object the store will not delete no longer stops the round.

    Before, the first refused delete raised out of the round. With one file made immutable (``chattr +i``) among
    30 orphan objects and among 30 orphan staged files, all 30 + 30 stayed, and a ``.tmp-`` leftover, round after
    round, and an expired resumable upload was never forgotten (the later phases never ran); on S3, a bucket that
    refused the DELETE of one key (403 AccessDenied: Object Lock, a bucket policy) kept 25 of 25 deletable
    orphans (an adversarial run). Only ``outcome="failed"`` and a warning said so, while storage filled up.

    Whose failure it is, by the error's class (``app/adapters/storage/``):

    * a :class:`StorageError` other than :class:`StorageUnavailable` (S3's 403; a file store's error outside its
      transient errnos): the object's own. Counted; the round goes on.
    * :class:`StorageUnavailable`: the store's, or the object's. A file store raises it for ``EPERM``/``EACCES``
      on one file's unlink (``chattr +i``, a directory made read-only) as for a read-only or failing filesystem;
      S3 for a 5xx or an unanswered DELETE of one key as for an unreachable endpoint. So the store is asked, once
      (:meth:`Storage.check`: a probe file; a HEAD of the bucket): down, the delete's error ends the round, as
      before, rather than sending the round's other deletes to a dead store; answering, the object's own.
    * anything else (the database, a bug): ends the round, as before.

    A refused key keeps its decision (``object_removals``, ``staging_removals``): its delete may not have been
    refused in full (an unanswered DELETE may still be carried out), and only a delete that went through forgets
    it. It is tried again by every later round, after that round's other keys and phases (this process's
    memory: a scheduler started again tries it in its place once, and goes on). Every round rather than at a
    backoff: the operator's fix (``chattr -i``, a retention lifted) works at the next round, and the object GC's
    standing decision holds its attachment's claims (``app/core/objects.py``), which a backoff would hold longer.
    Last rather than first: a delete that runs to its deadline (90 s on S3) and the probe after it delay no other
    key, and a probe that finds the store down ends a round whose other work is done.
    """

    def __init__(self, storage: Storage, log: logging.Logger):
        self.storage = storage
        self.log = log
        #: the keys refused in the last round (and in rounds that ended early since): tried after the others
        self.last: set[str] = set()
        self._now: set[str] = set()

    @contextlib.contextmanager
    def round(self, *, dry_run: bool) -> Iterator[None]:
        """One round's refusals become the next round's :attr:`last` (a dry run deletes nothing: it keeps them)."""
        self._now = set()
        try:
            yield
        except BaseException:
            self.last |= self._now
            raise
        if not dry_run:
            self.last = self._now

    def split(self, items: Iterable, key: Callable = lambda item: item) -> tuple[list, list]:
        """``items`` as (those to try now, those refused in the last round: to try at the end of the round)."""
        now, later = [], []
        for item in items:
            (later if key(item) in self.last else now).append(item)
        return now, later

    def delete(self, key: str, counts: dict[str, int]) -> bool:
        """Delete ``key``: True once it is gone; False when the store refused this object alone (counted, logged);
        raises when the store is down, and for any other error."""
        try:
            self.storage.delete(key)
        except StorageError as exc:
            if not self.object_alone(exc):
                raise
            self.refused(key, exc, counts, key=key)
            return False
        self.last.discard(key)
        return True

    def phase(self, what: str, run: Callable[[], None], counts: dict[str, int]) -> None:
        """Run a phase that deletes what it finds (:func:`resumable.forget_expired`,
        :meth:`Storage.remove_leftovers`), which stops at its first refused delete: that refusal counts, and the
        round goes on to its next phase; the store down, or any other error, ends the round."""
        try:
            run()
        except StorageError as exc:
            if not self.object_alone(exc):
                raise
            self.refused(what, exc, counts)

    def told(self, what: str, counts: dict[str, int]) -> Callable[[object, Exception], None]:
        """A callback for a phase that passes over what the store refuses (:func:`resumable.forget_expired`'s
        ``refused``): counts the refusal of ``what`` (and the item) when it is the object's alone, re-raises it
        when the store is down or the error is another's."""
        def refused(item, exc: Exception) -> None:
            if not isinstance(exc, StorageError) or not self.object_alone(exc):
                raise exc
            self.refused(f"{what} {item}", exc, counts)
        return refused

    def object_alone(self, exc: StorageError) -> bool:
        """Whether ``exc``, raised by a delete, is its object's alone (the round goes on), not the store's."""
        if not isinstance(exc, StorageUnavailable):
            return True
        try:
            self.storage.check()
        except StorageError:
            return False
        return True

    def refused(self, what: str, exc: StorageError, counts: dict[str, int], *, key: str | None = None) -> None:
        counts[NOT_REMOVED] += 1
        extra = {"error_code": exc.error_code}
        if key is not None:
            self._now.add(key)
            extra["key"] = key
        self.log.warning("could not remove %s, left for the next round: %s", what, exc, extra=extra)
