"""The migrations create exactly the schema app/adapters/postgres/models.py describes, and re-running them is harmless."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from app.adapters.postgres import db
from app.adapters.postgres.models import metadata


def test_models_and_migrations_agree(database_url):
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == [], diff


def head() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(db.alembic_config("postgresql://unused/none")).get_current_head()


def test_upgrade_is_idempotent(database_url):
    db.upgrade(database_url)
    db.upgrade(database_url)
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head()
    engine.dispose()
