"""Alembic environment: migrations run against ``DATABASE_URL``."""

from alembic import context
from sqlalchemy import create_engine, make_url, pool

from app.adapters.postgres.db import release_connect_args
from app.adapters.postgres.models import metadata

config = context.config
url = config.get_main_option("sqlalchemy.url")


def run_migrations_online() -> None:
    engine = create_engine(url, poolclass=pool.NullPool, connect_args=release_connect_args(make_url(url)))
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata)
        with context.begin_transaction():
            # Two `release` processes at once must not race each other.
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(727274)")
            context.run_migrations()
    engine.dispose()


run_migrations_online()
