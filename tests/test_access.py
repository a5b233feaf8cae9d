"""Access control: anonymous / uploader A / uploader B / operator × every endpoint."""

from __future__ import annotations

import pytest

from app.web import create_app
from tests.conftest import OPERATOR_TOKEN, OTHER_UPLOADER_TOKEN, UPLOADER_TOKEN

ANONYMOUS, ALICE, BOB, OPERATOR = None, UPLOADER_TOKEN, OTHER_UPLOADER_TOKEN, OPERATOR_TOKEN
WHO = {"anonymous": ANONYMOUS, "alice": ALICE, "bob": BOB, "operator": OPERATOR}


@pytest.fixture
def app(settings):
    app = create_app(settings)
    yield app
    app.extensions["attache"].close()


def call(app, who, method, path, **kwargs):
    client = app.test_client()
    headers = kwargs.pop("headers", {})
    if WHO[who]:
        headers["Authorization"] = f"Bearer {WHO[who]}"
    return getattr(client, method)(path, headers=headers, **kwargs)


@pytest.fixture
def alices_upload(app, data_file):
    with open(data_file("photos/chelsea.jpg"), "rb") as fh:
        response = call(app, "alice", "post", "/v1/attachments", data={"file": (fh, "c.jpg")},
                        content_type="multipart/form-data")
    assert response.status_code == 202
    return response.json


def expected(who, owner_only, operator_only, ok):
    if who == "anonymous":
        return 401
    if operator_only and who != "operator":
        return 403
    if owner_only and who == "bob":
        return 404
    return ok


ENDPOINTS = [
    # method, path template, owner_only, operator_only, status for an allowed caller
    ("get", "/v1/attachments/{id}", True, False, 200),
    ("get", "/v1/attachments/{id}/original", True, False, 409),        # not ready yet
    ("get", "/v1/attachments/{id}/variants/thumbnail", True, False, 409),
    ("get", "/v1/ops/jobs", False, True, 200),
    ("get", "/v1/ops/jobs/{job_id}", False, True, 200),
    ("post", "/v1/ops/jobs/{job_id}/replay", False, True, 409),          # queued, not failed
    ("get", "/v1/ops/outbox", False, True, 200),
    ("get", "/v1/ops/leases", False, True, 200),
    ("get", "/v1/ops/dlq", False, True, 200),
    ("get", "/v1/ops/dlq/attache.inspect.XQ/messages", False, True, 200),
    ("post", "/v1/ops/dlq/attache.inspect.XQ/requeue", False, True, 400),  # no message ids chosen
    ("post", "/v1/ops/dlq/attache.inspect.XQ/purge", False, True, 400),
    ("get", "/metrics", False, True, 200),
]


@pytest.mark.parametrize("who", list(WHO))
def test_access_matrix(app, alices_upload, who):
    failures = []
    for method, template, owner_only, operator_only, ok in ENDPOINTS:
        path = template.format(id=alices_upload["id"], job_id=alices_upload["job_id"])
        kwargs = {"json": {"reason": "matrix"}} if method == "post" else {}
        status = call(app, who, method, path, **kwargs).status_code
        want = expected(who, owner_only, operator_only, ok)
        if status != want:
            failures.append(f"{who} {method.upper()} {template}: {status}, expected {want}")
    upload = call(app, who, "post", "/v1/attachments", data=b"GIF89a", content_type="image/gif").status_code
    if upload != (401 if who == "anonymous" else 415):  # authenticated callers reach the upload checks
        failures.append(f"{who} POST /v1/attachments: {upload}")
    for public in ("/healthz", "/readyz"):
        if call(app, who, "get", public).status_code != 200:
            failures.append(f"{who} GET {public} should be public")
    assert failures == [], "\n".join(failures)


def test_bad_tokens_are_401_and_never_echoed(app, alices_upload):
    for header in ("Bearer nope", "Bearer", "Basic YWxpY2U6eA==", f"Bearer {UPLOADER_TOKEN}x", UPLOADER_TOKEN):
        response = app.test_client().get(f"/v1/attachments/{alices_upload['id']}", headers={"Authorization": header})
        assert response.status_code == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")
        assert UPLOADER_TOKEN.encode() not in response.data


def test_no_tokens_outside_dev_mode_means_no_access(env, data_file):
    from app.config import Settings

    app = create_app(Settings.from_env({k: v for k, v in env.items() if k != "ATTACHE_API_TOKENS"}))
    response = app.test_client().get("/v1/ops/jobs", headers={"Authorization": "Bearer anything-at-all"})
    assert response.status_code == 401
    app.extensions["attache"].close()


def test_dev_mode_creates_one_token_once(env, tmp_path, monkeypatch):
    from app.config import Settings

    monkeypatch.chdir(tmp_path)
    settings = Settings.from_env({**{k: v for k, v in env.items() if k != "ATTACHE_API_TOKENS"}, "ATTACHE_DEV": "1"})
    first = create_app(settings)
    token = (tmp_path / "var" / "dev-token").read_text().strip()
    assert oct((tmp_path / "var" / "dev-token").stat().st_mode & 0o777) == "0o600"
    second = create_app(settings)
    assert (tmp_path / "var" / "dev-token").read_text().strip() == token, "created once, then reused"
    for app in (first, second):
        assert app.test_client().get("/v1/ops/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        app.extensions["attache"].close()


def test_uploads_belong_to_their_uploader(app, alices_upload, engine):
    from sqlalchemy import select

    from app.adapters.postgres.models import attachments

    with engine.connect() as conn:
        assert conn.execute(select(attachments.c.owner)).scalar() == "alice"
    assert call(app, "operator", "get", f"/v1/attachments/{alices_upload['id']}").json["id"] == alices_upload["id"]
