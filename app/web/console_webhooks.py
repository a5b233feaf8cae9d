"""``/ops/webhooks``: the console's page of webhook subscriptions and the deliveries that keep failing.

Every action calls the function the JSON API (``/v1/ops/webhooks``) and
``attache webhooks`` call, in :mod:`app.core.webhooks`, so the checks
(SSRF, known events, a redelivery's reason) and the audit rows are the same
whichever door an operator uses. The routes hang on the console's blueprint,
so its login, CSRF check and security headers apply unchanged.

Register
    The answer page shows the new subscription's secret, this once: it is
    rendered into that response only (never a flash message, which would
    put it in the session cookie, and never the list). A URL refused as
    internal (SSRF) answers ``422`` with the reason on the form, an invalid
    form ``400``; nothing is registered either way.
Disable
    Stops every delivery until the subscription is enabled again, so it
    needs its ``confirm`` box ticked; the reason is optional and audited
    (as for the dead letters).
Enable
    On a disabled subscription (an operator's disable, or a ``410 Gone``):
    its pending deliveries go out, with the events it missed meanwhile;
    the reason is optional, audited.
Redeliver
    Needs a reason (as the API does), audited.
"""

from __future__ import annotations

import logging
import uuid

from flask import current_app, flash, redirect, request, url_for

from app.adapters.postgres.db import transaction
from app.core import webhooks
from app.core.events import TYPES
from app.errors import DeliveryInFlight, InvalidWebhook, MissingReason, WebhookNotFound, WebhookTargetRefused
from app.web.console import _message, _page, _reason, bp, principal
from app.web.responses import status_of

log = logging.getLogger(__name__)

#: failing deliveries listed on the page, most recently tried first
FAILING_LISTED = 50


def _engine():
    return current_app.extensions["attache"].engine


def _actor() -> str:
    return f"operator:{principal()}"


def _webhooks_page(status: int = 200, **context):
    """The page: subscriptions, the register form, failing deliveries; ``context`` adds an answer or an error."""
    with transaction(_engine()) as conn:
        subscriptions = webhooks.subscriptions(conn)
        failing = webhooks.failing(conn, limit=FAILING_LISTED)
    urls = {s["id"]: s["url"] for s in subscriptions}
    for delivery in failing:
        delivery["url"] = urls.get(delivery["subscription_id"])
    context.setdefault("form", {"url": "", "events": list(TYPES), "uploader": ""})
    return _page("webhooks.html", status, subscriptions=subscriptions, failing=failing, event_types=TYPES, **context)


@bp.get("/webhooks")
def webhooks_page():
    return _webhooks_page()


@bp.post("/webhooks")
def webhook_register():
    form = {"url": request.form.get("url", "").strip(), "events": request.form.getlist("event"),
            "uploader": request.form.get("uploader", "").strip()}
    try:
        with transaction(_engine()) as conn:
            created = webhooks.register(conn, url=form["url"], kinds=form["events"], uploader=form["uploader"] or None,
                                        actor=_actor(),
                                        allow_private=current_app.extensions["attache"].settings.webhook_allow_private)
    except (InvalidWebhook, WebhookTargetRefused) as exc:
        log.info("console: %s's webhook %s refused: %s", principal(), form["url"], exc)
        return _webhooks_page(status_of(exc), form=form, register_error=str(exc))
    log.info("console: %s registered webhook %s for %s", principal(), created["id"], created["url"])
    return _webhooks_page(201, created=created)


@bp.post("/webhooks/<uuid:subscription_id>/disable")
def webhook_disable(subscription_id: uuid.UUID):
    if request.form.get("confirm") != "yes":
        return _message(400, "Not confirmed",
                        "Disabling stops every delivery to the endpoint until it is enabled again: "
                        "tick the confirmation box.")
    try:
        with transaction(_engine()) as conn:
            disabled = webhooks.disable(conn, subscription_id, actor=_actor(), reason=_reason())
    except WebhookNotFound as exc:
        return _message(status_of(exc), "No such webhook", str(exc))
    log.info("console: %s disabled webhook %s", principal(), subscription_id)
    flash(f"Webhook {subscription_id} ({disabled['url']}) is disabled: nothing more is delivered to it.")
    return redirect(url_for("console.webhooks_page"), code=303)


@bp.post("/webhooks/<uuid:subscription_id>/enable")
def webhook_enable(subscription_id: uuid.UUID):
    try:
        enabled = webhooks.enable(_engine(), subscription_id, actor=_actor(), reason=_reason())
    except WebhookNotFound as exc:
        return _message(status_of(exc), "No such webhook", str(exc))
    log.info("console: %s enabled webhook %s", principal(), subscription_id)
    flash(f"Webhook {subscription_id} ({enabled['url']}) is enabled: {enabled['deliveries']['pending']} "
          "deliveries pending, the events it missed while disabled among them.")
    return redirect(url_for("console.webhooks_page"), code=303)


@bp.post("/webhooks/deliveries/<int:delivery_id>/redeliver")
def webhook_redeliver(delivery_id: int):
    try:
        with transaction(_engine()) as conn:
            delivery = webhooks.redeliver(conn, delivery_id, actor=_actor(), reason=_reason())
    except MissingReason as exc:
        return _webhooks_page(status_of(exc), redeliver_error=(delivery_id, "A redelivery needs a reason."))
    except WebhookNotFound as exc:
        return _message(status_of(exc), "No such delivery", str(exc))
    except DeliveryInFlight as exc:
        return _message(status_of(exc), "Delivery being sent", str(exc))
    log.info("console: %s redelivered webhook delivery %s", principal(), delivery_id)
    flash(f"Delivery {delivery_id} (sequence {delivery['sequence']}, {delivery['event_id']}) is pending again "
          "with a fresh attempt budget.")
    return redirect(url_for("console.webhooks_page"), code=303)
