"""``attache db``: the database schema (the Procfile's ``release``), and the embedded server of single-node mode."""

from __future__ import annotations

import click

from app.cli.output import say
from app.cli.runtime import settings


@click.group()
def db() -> None:
    """Database schema; the embedded PostgreSQL of single-node mode."""


@db.command("upgrade")
@click.option("--create/--no-create", default=True, help="Create the database if it is missing.")
def db_upgrade(create: bool) -> None:
    """Apply every migration (idempotent); the Procfile's `release`.

    With the PostgreSQL broker, also creates the broker's tables (schema
    `dramatiq`) in its database if they are missing.
    """
    from app.adapters.postgres import db as database
    from app.services import Services

    current = settings()
    services = Services(current, pool_size=1, process="cli")
    try:
        url = services.database_url
        if create and database.ensure_database(url):
            say("created the database")
        database.upgrade(url)
        if current.broker_kind == "postgres":
            services.broker.ensure_schema()
    except Exception as exc:
        raise click.ClickException(f"migration failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    finally:
        if "broker" in services.__dict__:
            services.broker.close()
    say("database is at the newest migration")


@db.command("where")
def db_where() -> None:
    """Say which mode the settings choose and where the data lives (`make up` prints it)."""
    from app.services import mode

    say(mode(settings()))


@db.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL of ATTACHE_DATA_DIR (it also stops when the last process using it exits)."""
    from app.adapters.postgres import embedded

    current = settings()
    if embedded.stop(current.data_dir):
        say(f"stopped the embedded PostgreSQL of {embedded.pgdata(current.data_dir)}")
    else:
        say(f"no embedded PostgreSQL runs on {embedded.pgdata(current.data_dir)}")
