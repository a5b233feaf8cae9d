"""``attache outbox``: the transactional outbox's backlog."""

from __future__ import annotations

import click

from app.cli.output import emit, json_option
from app.cli.runtime import fail_on_attache_errors, services
from app.cli.tables import Column, show


@click.group()
def outbox() -> None:
    """The transactional outbox."""


@outbox.command("status")
@json_option
@fail_on_attache_errors
def outbox_status(as_json: bool) -> None:
    """Unpublished rows and the age of the oldest."""
    from app.core import operations

    status = operations.outbox_status(services())
    emit(status, as_json, lambda s: show(
        "outbox", [Column("pending"), Column("oldest created", whole=True), Column("oldest age (s)")],
        [[s["pending"], s["oldest_created_at"], f"{s['oldest_age_seconds']:.1f}"]]))
