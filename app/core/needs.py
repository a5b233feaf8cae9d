"""What core needs from the process that runs it, as small protocols.

Core never imports the wiring (``tests/test_layers.py``). Each core function
or class says here which few things it uses; the entry points pass their
process's :class:`app.services.Services`, which has them all, and a test may
pass anything that has them.

* :class:`Database`: reads (operations' views, the backfill's estimate);
* :class:`Producer`: writes state changes with their messages, through the
  unit of work (replay, backfill);
* :class:`StoringProducer`: a producer that also reads the storage (replay);
* :class:`ImageProducer`: a producer that also holds the image bytes (the
  upload's intake, the workflow's steps).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from app.adapters.imaging import Limits
    from app.adapters.storage import Storage
    from app.core.unit_of_work import UnitOfWork


class JobSettings(Protocol):
    """The settings core reads (``app.config.Settings`` has them; the workflow's retry policies read more)."""

    @property
    def max_attempts(self) -> int: ...

    @property
    def pipeline_version(self) -> int: ...

    @property
    def idempotency_ttl_seconds(self) -> float: ...

    @property
    def lease_seconds(self) -> float: ...


class Database(Protocol):
    @property
    def engine(self) -> Engine: ...


class Producer(Database, Protocol):
    @property
    def unit_of_work(self) -> UnitOfWork: ...

    @property
    def settings(self) -> JobSettings: ...


class StoringProducer(Producer, Protocol):
    @property
    def storage(self) -> Storage: ...


class ImageProducer(StoringProducer, Protocol):

    @property
    def limits(self) -> Limits: ...
