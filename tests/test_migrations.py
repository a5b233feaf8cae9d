"""The migrations create exactly the schema app/models.py describes, and re-running them is harmless."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from app import db
from app.models import metadata


def test_models_and_migrations_agree(database_url):
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == [], diff


def test_upgrade_is_idempotent(database_url):
    db.upgrade(database_url)
    db.upgrade(database_url)
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0007"
    engine.dispose()
