"""``attache db``: the database schema (the Procfile's ``release``)."""

from __future__ import annotations

import click

from app.cli.output import say
from app.cli.runtime import settings


@click.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.option("--create/--no-create", default=True, help="Create the database if it is missing.")
def db_upgrade(create: bool) -> None:
    """Apply every migration (idempotent); the Procfile's `release`."""
    from app.adapters.postgres import db as database

    current = settings()
    try:
        if create and database.ensure_database(current.database_url):
            say("created the database")
        database.upgrade(current.database_url)
    except Exception as exc:
        raise click.ClickException(f"migration failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    say("database is at the newest migration")
