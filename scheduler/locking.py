"""One scheduler at a time per cleanup: a PostgreSQL advisory lock per service.

Row-level services (outbox relay, lease recovery) use ``SKIP LOCKED``
instead; the cleanups walk object storage, so two schedulers would only
repeat each other's listing. The second one skips its round.
"""

from __future__ import annotations

import contextlib
import itertools
import zlib
from typing import Callable, Iterable, Iterator

from sqlalchemy import text
from sqlalchemy.engine import Engine


def lock_key(name: str) -> int:
    return zlib.crc32(f"attache:{name}".encode())


@contextlib.contextmanager
def exclusive(engine: Engine, name: str) -> Iterator[bool]:
    """Yields True if this process holds the lock for ``name`` (released on exit)."""
    key = lock_key(name)
    with engine.connect() as conn:
        held = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
        conn.commit()
        try:
            yield held
        finally:
            if held:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()


def sweep_storage(engine: Engine, name: str, objects: Iterable, batch: int,
                  process: Callable[[list], None], counts: dict[str, int],
                  then: Callable[[], None] | None = None, first: Callable[[], None] | None = None) -> dict[str, int]:
    """The common shape of the storage cleanups: under ``name``'s lock, call ``first``, hand listed objects on in
    batches, then call ``then`` (all under the lock).

    ``counts["skipped"]`` is 1 when another scheduler holds the lock (this round does nothing).
    """
    with exclusive(engine, name) as held:
        if not held:
            counts["skipped"] = 1
            return counts
        if first is not None:
            first()
        listing = iter(objects)
        while chunk := list(itertools.islice(listing, batch)):
            process(chunk)
        if then is not None:
            then()
    return counts
