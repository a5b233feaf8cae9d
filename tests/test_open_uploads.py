"""ATTACHE_MAX_OPEN_UPLOADS_PER_UPLOADER and ATTACHE_MAX_OPEN_UPLOAD_BYTES_PER_UPLOADER: what one uploader's unfinished
resumable uploads may hold; and ATTACHE_MAX_BODIES_PER_UPLOADER on their bodies.

Nothing bounded them: an adversarial run made 3,200 uploads in 10.6 s from one token, each kept for a day after its
last PATCH, and filled a disk to the spool's floor with their parts, so every uploader's uploads were refused.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select, update

from app.adapters.postgres.models import uploads
from app.config import Settings
from app.web import create_app
from tests.conftest import OTHER_UPLOADER_TOKEN, authed
from tests.test_tus_api import PART, PHOTO, TUS, create, patch, send

MOST = 3
MOST_BYTES = 1_000_000


@pytest.fixture
def app(env):
    app = create_app(Settings.from_env({**env, "ATTACHE_MAX_OPEN_UPLOADS_PER_UPLOADER": str(MOST),
                                        "ATTACHE_MAX_OPEN_UPLOAD_BYTES_PER_UPLOADER": str(MOST_BYTES),
                                        "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                        "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5"}))
    yield app
    app.extensions["attache"].close()


def open_uploads(engine, owner_like: str = "%") -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(uploads)
                            .where(uploads.c.attachment_id.is_(None), uploads.c.owner.like(owner_like))).scalar_one()


def test_an_uploader_with_its_fill_of_unfinished_uploads_is_refused_a_creation(app, engine, data_file):
    alice, bob = authed(app), authed(app, OTHER_UPLOADER_TOKEN)
    made = [create(alice, 1000) for _ in range(MOST)]
    assert [m.status_code for m in made] == [201] * MOST
    refused = create(alice, 1000)
    assert refused.status_code == 429 and refused.json["error"] == "too_many_open_uploads"
    assert refused.headers["Retry-After"]
    assert open_uploads(engine) == MOST, "a refused creation makes no upload"
    assert create(bob, 1000).status_code == 201, "another uploader's share is its own"

    assert alice.delete(made[0].headers["Location"], headers=TUS).status_code == 204
    photo = data_file(PHOTO).read_bytes()
    finishing = create(alice, len(photo))
    assert finishing.status_code == 201, "a terminated upload makes room"
    send(alice, finishing.headers["Location"], photo, 64 * 1024)
    assert create(alice, 1000).status_code == 201, "so does a finished one"


def test_expired_uploads_make_room(app, engine):
    alice = authed(app)
    for _ in range(MOST):
        assert create(alice, 1000).status_code == 201
    with engine.begin() as conn:
        conn.execute(update(uploads).values(expires_at=func.now() - func.make_interval(0, 0, 0, 0, 0, 1)))
    assert create(alice, 1000).status_code == 201


def test_the_declared_bytes_of_unfinished_uploads_are_bounded(app, engine):
    alice = authed(app)
    assert create(alice, MOST_BYTES - 10).status_code == 201
    over = create(alice, 11)
    assert over.status_code == 429 and over.json["error"] == "too_many_open_uploads"
    assert create(alice, 10).status_code == 201


def test_creations_at_once_cannot_pass_the_limit_together(app, engine):
    clients = [authed(app) for _ in range(12)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda client: create(client, 1000).status_code, clients))
    assert sorted(answers) == [201] * MOST + [429] * (12 - MOST)
    assert open_uploads(engine) == MOST


def test_a_patch_counts_among_its_uploaders_bodies_arriving_at_once(app, data_file):
    """ATTACHE_MAX_BODIES_PER_UPLOADER (8) holds for tus bodies as for POSTs (tests/test_hostile_clients.py)."""
    alice, photo = authed(app), data_file(PHOTO).read_bytes()
    location = create(alice, len(photo)).headers["Location"]
    bodies = app.extensions["attache_bodies"]
    with contextlib.ExitStack() as sending:
        for _ in range(app.extensions["attache"].settings.max_bodies_per_uploader):
            sending.enter_context(bodies.hold("alice"))
        refused = patch(alice, location, 0, photo)
        assert refused.status_code == 429 and refused.json["error"] == "too_many_uploads_at_once"
        assert create(authed(app, OTHER_UPLOADER_TOKEN), len(photo), data=photo,
                      headers={"Content-Type": PART}).status_code == 201, "another uploader's bodies are its own"
    assert bodies.sending("alice") == 0
    assert patch(alice, location, 0, photo).status_code == 204
