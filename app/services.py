"""What every process needs, built once from :class:`Settings`."""

from __future__ import annotations

import os
import socket
import threading
from functools import cached_property

from app.config import Settings


class Services:
    def __init__(self, settings: Settings, *, pool_size: int = 5):
        self.settings = settings
        self._pool_size = pool_size

    @cached_property
    def engine(self):
        from app.adapters.postgres.db import make_engine

        return make_engine(self.settings.database_url, pool_size=self._pool_size)

    @cached_property
    def storage(self):
        from app.adapters.storage import storage_from_url

        return storage_from_url(self.settings.storage_url, access_key=self.settings.s3_access_key,
                                secret_key=self.settings.s3_secret_key)

    @cached_property
    def broker(self):
        from app.adapters.broker.rabbitmq import AttacheBroker

        return AttacheBroker(url=self.settings.broker_url, delivery_limit=self.settings.broker_delivery_limit,
                             socket_timeout=self.settings.publish_timeout_seconds, middleware=[])

    @cached_property
    def publisher(self):
        from app.core.outbox import OutboxPublisher

        return OutboxPublisher(self.engine, self.broker)

    @cached_property
    def limits(self):
        from app.adapters.imaging import Limits

        return Limits(max_pixels=self.settings.max_pixels, max_dimension=self.settings.max_dimension,
                      formats=self.settings.accepted_formats, max_decode_bytes=self.settings.max_decode_bytes)


def identity(process: str) -> str:
    """Who is acting, as written into job history and lease owners."""
    return f"{process}:{socket.gethostname()}:{os.getpid()}:{threading.get_ident() % 100000}"
