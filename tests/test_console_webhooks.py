"""/ops/webhooks: the console registers, lists, disables and redelivers through app.core.webhooks, audited."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from app.adapters.postgres.models import webhook_deliveries, webhook_subscriptions
from app.config import Settings
from app.core import webhooks
from app.core.webhooks import Deliverer, DelivererConfig
from app.web import create_app
from tests.test_console import NOWHERE, audit_rows, csrf_of, make_failed_job, signed_in

PUBLIC = "http://8.8.8.8/hooks/attache"  # a public literal address: nothing is resolved, nothing is sent


@pytest.fixture
def app(env):
    # private targets refused, as in production; RabbitMQ unreachable (the page does not need it)
    app = create_app(Settings.from_env({**env, "BROKER_URL": NOWHERE, "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "0.5"}))
    yield app
    app.extensions["attache"].close()


def register_form(client, url, events=("attachment.ready", "attachment.failed"), uploader=""):
    token = csrf_of(client.get("/ops/webhooks").text)
    return client.post("/ops/webhooks", data={"csrf_token": token, "url": url, "event": list(events),
                                              "uploader": uploader})


def failed_delivery(engine) -> int:
    """A subscription to a closed local port, a failed job, and its one delivery failed for good."""
    with engine.begin() as conn:
        webhooks.register(conn, url="http://127.0.0.1:1/hook", kinds=["attachment.failed"], uploader=None,
                          actor="test", allow_private=True)
    make_failed_job(engine)
    deliverer = Deliverer(engine, DelivererConfig(max_attempts=1, allow_private=False))
    deliverer.run_once(wait=True)
    deliverer.close()
    with engine.connect() as conn:
        row = conn.execute(select(webhook_deliveries)).one()
    assert row.state == "failed" and row.attempts == 1
    return row.id


def test_the_console_links_the_page_and_it_needs_an_operator(app):
    assert app.test_client().get("/ops/webhooks").status_code == 302
    page = signed_in(app).get("/ops")
    assert 'href="/ops/webhooks"' in page.text
    listing = signed_in(app).get("/ops/webhooks")
    assert listing.status_code == 200 and 'id="no-webhooks"' in listing.text and 'id="register-form"' in listing.text


def test_register_shows_the_secret_once_and_the_list_never(app, engine):
    client = signed_in(app)
    answer = register_form(client, PUBLIC, events=["attachment.ready"], uploader="alice")
    assert answer.status_code == 201
    [secret] = re.findall(r"whsec_[A-Za-z0-9+/=]+", answer.text)
    assert "it will not be shown again" in answer.text
    with engine.connect() as conn:
        row = conn.execute(select(webhook_subscriptions)).one()
    assert (row.secret, row.url, list(row.events), row.uploader) == (secret, PUBLIC, ["attachment.ready"], "alice")
    with client.session_transaction() as session:
        assert secret not in repr(dict(session)), "never kept in the session (a flash would be)"
    listing = client.get("/ops/webhooks")
    assert listing.status_code == 200 and PUBLIC in listing.text and "alice" in listing.text
    assert "whsec_" not in listing.text
    [entry] = audit_rows(engine)
    assert (entry.actor, entry.action, entry.target) == ("operator:olga", "webhook.register", f"webhook:{row.id}")


def test_an_internal_url_is_refused_with_its_message_and_nothing_is_registered(app, engine):
    client = signed_in(app)
    refused = register_form(client, "http://169.254.169.254/latest/meta-data")
    assert refused.status_code == 422
    assert 'id="register-error"' in refused.text and "internal addresses are refused" in refused.text
    assert 'value="http://169.254.169.254/latest/meta-data"' in refused.text, "the form keeps what was typed"
    invalid = register_form(client, PUBLIC, events=[])
    assert invalid.status_code == 400 and "events must be a non-empty list" in invalid.text
    forged = client.post("/ops/webhooks", data={"csrf_token": "forged", "url": PUBLIC, "event": ["attachment.ready"]})
    assert forged.status_code == 400
    with engine.connect() as conn:
        assert conn.execute(select(webhook_subscriptions)).all() == []
    assert audit_rows(engine) == []


def test_a_failing_delivery_is_listed_and_redelivered_with_a_reason_audited(app, engine):
    delivery_id = failed_delivery(engine)
    client = signed_in(app)
    page = client.get("/ops/webhooks")
    row = re.search(rf'<tr id="delivery-{delivery_id}">.*?</tr>', page.text, re.S).group(0)
    assert "attachment.failed" in row and ">failed<" in row and "internal addresses are refused" in row
    path = f"/ops/webhooks/deliveries/{delivery_id}/redeliver"
    token = csrf_of(page.text)
    missing = client.post(path, data={"csrf_token": token, "reason": "  "})
    assert missing.status_code == 400 and 'id="redeliver-error"' in missing.text
    done = client.post(path, data={"csrf_token": token, "reason": "endpoint back"})
    assert done.status_code == 303 and done.headers["Location"].endswith("/ops/webhooks")
    with engine.connect() as conn:
        again = conn.execute(select(webhook_deliveries)).one()
    assert (again.state, again.attempts) == ("pending", 0)
    entry = audit_rows(engine)[-1]
    assert (entry.actor, entry.action, entry.reason) == ("operator:olga", "webhook.redeliver", "endpoint back")
    assert entry.details["delivery_id"] == delivery_id
    assert f'id="delivery-{delivery_id}"' not in client.get("/ops/webhooks").text, "pending, never tried: not failing"
    assert client.post("/ops/webhooks/deliveries/999999/redeliver",
                       data={"csrf_token": token, "reason": "x"}).status_code == 404


def test_disable_needs_its_confirmation_then_stops_the_subscription_until_enabled_audited(app, engine):
    client = signed_in(app)
    assert register_form(client, PUBLIC).status_code == 201
    with engine.connect() as conn:
        subscription_id = conn.execute(select(webhook_subscriptions.c.id)).scalar_one()
    page = client.get("/ops/webhooks")
    path = f"/ops/webhooks/{subscription_id}/disable"
    assert f'action="{path}"' in page.text
    token = csrf_of(page.text)
    unconfirmed = client.post(path, data={"csrf_token": token, "reason": "moved"})
    assert unconfirmed.status_code == 400
    done = client.post(path, data={"csrf_token": token, "reason": "endpoint moved", "confirm": "yes"})
    assert done.status_code == 303
    with engine.connect() as conn:
        assert conn.execute(select(webhook_subscriptions.c.disabled_at)).scalar_one() is not None
    listing = client.get("/ops/webhooks")
    assert "is disabled" in listing.text and f'action="{path}"' not in listing.text and ">disabled<" in listing.text
    entry = audit_rows(engine)[-1]
    assert (entry.actor, entry.action, entry.reason) == ("operator:olga", "webhook.disable", "endpoint moved")

    enable = f"/ops/webhooks/{subscription_id}/enable"
    assert f'action="{enable}"' in listing.text
    assert client.post(enable, data={"csrf_token": token, "reason": "endpoint back"}).status_code == 303
    with engine.connect() as conn:
        assert conn.execute(select(webhook_subscriptions.c.disabled_at)).scalar_one() is None
    listing = client.get("/ops/webhooks")
    assert "is enabled" in listing.text and f'action="{path}"' in listing.text
    assert f'action="{enable}"' not in listing.text
    entry = audit_rows(engine)[-1]
    assert (entry.actor, entry.action, entry.reason) == ("operator:olga", "webhook.enable", "endpoint back")
    assert client.post("/ops/webhooks/00000000-0000-0000-0000-000000000000/enable",
                       data={"csrf_token": token}).status_code == 404
