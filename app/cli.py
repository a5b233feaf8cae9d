"""The ``attache`` command for operators and deploys."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from app.config import Settings
from app.errors import AttacheError, ConfigError

console = Console()


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise click.ClickException(f"configuration error: {exc}")


@click.group()
def main() -> None:
    """attache: a durable attachment pipeline."""


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.option("--create/--no-create", default=True, help="Create the database if it is missing.")
def db_upgrade(create: bool) -> None:
    """Apply every migration (idempotent); the Procfile's `release`."""
    from app import db as database

    settings = _settings()
    try:
        if create and database.ensure_database(settings.database_url):
            console.print("created the database")
        database.upgrade(settings.database_url)
    except Exception as exc:
        raise click.ClickException(f"migration failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    console.print("database is at the newest migration")


@main.group()
def outbox() -> None:
    """The transactional outbox."""


@outbox.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def outbox_status(as_json: bool) -> None:
    """Unpublished rows and the age of the oldest."""
    from app import outbox as outbox_module
    from app.db import make_engine, transaction

    engine = make_engine(_settings().database_url, pool_size=1)
    try:
        with transaction(engine) as conn:
            status = outbox_module.status(conn)
    except AttacheError as exc:
        raise click.ClickException(str(exc))
    if as_json:
        click.echo(json.dumps(status))
        return
    table = Table("pending", "oldest created", "oldest age (s)")
    table.add_row(str(status["pending"]), status["oldest_created_at"] or "-", f"{status['oldest_age_seconds']:.1f}")
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
