"""Webhooks and the replay cursor against what the world sends: odd query strings, slow endpoints, races.

Each test here once failed against the code it guards (found by an adversarial review).
"""

from __future__ import annotations

import pytest

from tests.conftest import OPERATOR_TOKEN, authed
from tests.test_webhooks import make_app


@pytest.fixture
def broker_kind() -> str:
    return "postgres"  # no vhost needed: these tests never publish


@pytest.fixture
def app(env):
    app = make_app(env, ATTACHE_WEBHOOK_ALLOW_PRIVATE="1")
    yield app
    app.extensions["attache"].engine.dispose()


def test_a_cursor_that_is_not_an_ascii_integer_is_400_never_500(app):
    ops = authed(app, OPERATOR_TOKEN)
    # str.isdigit() is true for superscripts and other Unicode digits that int() refuses
    for query in ("after=%C2%B2", "limit=%C2%B9", "after=%E2%91%A0", "after=%EF%BC%91", "after=%D9%A1",
                  "after=1.5", "after=", "limit=0x10", "after=+1", "after=%201"):
        response = ops.get(f"/v1/events?{query}")
        assert response.status_code == 400, (query, response.status_code)
        assert response.json["error"] == "bad_request"
    assert ops.get("/v1/events?after=0&limit=5").status_code == 200
