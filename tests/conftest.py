"""Test fixtures: real PostgreSQL, real RabbitMQ, real filesystem, real processes.

Every test that touches a service gets its own PostgreSQL database (cloned
from a migrated template) and its own RabbitMQ vhost, so tests, parallel
runs and a developer's ``make up`` never see each other's rows or queues.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from app.adapters.postgres import db
from app.config import Settings
from app.services import Services

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
ADMIN_URL = os.environ.get("ATTACHE_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
UPLOADER_TOKEN = "alice-uploader-token"
OTHER_UPLOADER_TOKEN = "bob-uploader-token"
OPERATOR_TOKEN = "olga-operator-token"
API_TOKENS = f"{UPLOADER_TOKEN}=alice:uploader,{OTHER_UPLOADER_TOKEN}=bob:uploader,{OPERATOR_TOKEN}=olga:operator"


def authed(app, token: str = UPLOADER_TOKEN):
    """A Flask test client that sends a bearer token on every request."""
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client


AMQP_HOST = os.environ.get("ATTACHE_TEST_AMQP", "guest:guest@127.0.0.1:5672")


def _admin():
    return create_engine(ADMIN_URL.replace("postgresql://", "postgresql+psycopg2://"), isolation_level="AUTOCOMMIT")


def _db_url(name: str) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def pg_template():
    name = f"attache_tpl_{uuid.uuid4().hex[:10]}"
    admin = _admin()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    db.upgrade(_db_url(name))
    yield name
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


@pytest.fixture(scope="session")
def database_clones(pg_template):
    from tests.databases import DatabaseClones

    databases = DatabaseClones(ADMIN_URL, pg_template)
    yield databases
    databases.close()


@pytest.fixture
def database_url(database_clones):
    name = database_clones.take()  # cloned from the template ahead of the test (tests/databases.py)
    yield _db_url(name)
    database_clones.give_back(name)  # dropped behind the next tests


@pytest.fixture(scope="session")
def vhost_pool():
    from tests.vhosts import VhostPool

    pool = VhostPool()
    yield pool
    pool.close()


@pytest.fixture
def broker_url(vhost_pool):
    vhost = vhost_pool.take()
    yield f"amqp://{AMQP_HOST}/{vhost}"
    vhost_pool.give_back(vhost)


@pytest.fixture
def storage_dir(tmp_path):
    path = tmp_path / "storage"
    path.mkdir()
    return path


#: the two brokers a test parametrized over ``broker_kind`` runs against (``BROKER_KINDS`` below)
BROKER_KINDS = ("rabbitmq", "postgres")


@pytest.fixture
def broker_kind() -> str:
    """Which broker ``env`` uses; a test proves both with ``@pytest.mark.parametrize("broker_kind", BROKER_KINDS)``."""
    return "rabbitmq"


@pytest.fixture
def env(request, database_url, broker_kind, storage_dir) -> dict[str, str]:
    """The environment of a test deployment, with short leases and sweeps.

    ``broker_kind`` ``postgres``: the PostgreSQL broker in the test's own database (no vhost is made).
    """
    broker = request.getfixturevalue("broker_url") if broker_kind == "rabbitmq" else database_url
    return {
        "DATABASE_URL": database_url,
        "BROKER_URL": broker,
        "STORAGE_URL": f"file://{storage_dir}",
        "ATTACHE_LEASE_SECONDS": "6",
        "ATTACHE_LEASE_INTERVAL_SECONDS": "0.5",
        "ATTACHE_OUTBOX_PUBLISH_AFTER_SECONDS": "1",
        "ATTACHE_OUTBOX_INTERVAL_SECONDS": "0.5",
        "ATTACHE_BROKER_MIN_BACKOFF_MS": "100",
        "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "2",
        "ATTACHE_API_TOKENS": API_TOKENS,
        "ATTACHE_PIPELINE_VERSION": "1",  # tests of version 2 say so
        # the test photos are small: a render message per variant, unless a test of inspect making them says so
        "ATTACHE_ONE_STEP_MAX_PIXELS": "0",
    }


@pytest.fixture
def settings(env) -> Settings:
    return Settings.from_env(env)


@pytest.fixture
def services(settings):
    from app.services import Services

    services = Services(settings)
    yield services
    if "engine" in services.__dict__:
        services.engine.dispose()
    if "broker" in services.__dict__:
        services.broker.close()


@pytest.fixture
def engine(services):
    return services.engine


@pytest.fixture
def data_file():
    def find(relative: str) -> Path:
        path = DATA / relative
        assert path.exists(), f"missing test data {relative}"
        return path

    return find


@pytest.fixture(scope="session", autouse=True)
def _tools_present():
    missing = [tool for tool in ("rabbitmqctl",) if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"test prerequisites missing: {missing} (run via make test / .ci/run)")


@pytest.fixture(autouse=True)
def _no_shared_images():
    """Each test renders from scratch: no resampled image kept by an earlier test's render."""
    from app.adapters.imaging.shared import SHARED

    SHARED.clear()


@pytest.fixture(autouse=True, scope="session")
def _quiet_pika():
    """Tests that point at a closed broker port on purpose would flood the report with pika's errors."""
    import logging

    logging.getLogger("pika").setLevel(logging.CRITICAL)


@pytest.fixture
def quiet_services(env):
    """Services whose broker is unreachable: the tests deliver messages themselves."""
    services = Services(Settings.from_env({**env, "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                           "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5",
                                           "ATTACHE_RETRY_INITIAL_SECONDS": "0"}))
    yield services
    services.engine.dispose()


@pytest.fixture
def client(settings):
    """The Flask app of ``settings`` in this process, with the uploader's token."""
    from app.web import create_app

    app = create_app(settings)
    yield authed(app)
    app.extensions["attache"].close()


@pytest.fixture
def web(env, tmp_path):
    """A real gunicorn ``web`` process of this test's deployment."""
    from tests.processes import Deployment

    deployment = Deployment(env, tmp_path)
    deployment.start("web")
    yield deployment
    deployment.stop_all()
