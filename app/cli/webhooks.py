"""``attache webhooks``: register endpoints, list them and their deliveries, redeliver, disable."""

from __future__ import annotations

import uuid

import click

from app.cli.output import emit, json_option, say
from app.cli.runtime import fail_on_attache_errors, operator, reason_option, services
from app.cli.tables import Column, show
from app.core.events import TYPES


def _conn():
    from app.adapters.postgres.db import transaction

    return transaction(services().engine)


@click.group()
def webhooks() -> None:
    """Webhook subscriptions and their deliveries."""


@webhooks.command("add")
@click.argument("url")
@click.option("--event", "kinds", multiple=True, required=True, type=click.Choice(TYPES),
              help="An event to deliver (repeat for several).")
@click.option("--uploader", help="Only this uploader's attachments.")
@json_option
@fail_on_attache_errors
def webhooks_add(url: str, kinds: tuple[str, ...], uploader: str | None, as_json: bool) -> None:
    """Register URL; prints the signing secret, which is shown this once."""
    from app.core import webhooks as core

    with _conn() as conn:
        created = core.register(conn, url=url, kinds=list(kinds), uploader=uploader, actor=f"operator:{operator()}",
                                allow_private=services().settings.webhook_allow_private)
    emit(created, as_json, lambda c: say(f"webhook {c['id']} registered for {', '.join(c['events'])}\n"
                                         f"secret (shown once): {c['secret']}"))


@webhooks.command("list")
@json_option
@fail_on_attache_errors
def webhooks_list(as_json: bool) -> None:
    """Subscriptions with their delivery counts."""
    from app.core import webhooks as core

    with _conn() as conn:
        rows = core.subscriptions(conn)
    emit(rows, as_json, lambda rows: show(
        f"{len(rows)} webhook(s)",
        [Column("id", whole=True), Column("url", whole=True), Column("events"), Column("uploader"),
         Column("seq"), Column("pending"), Column("delivered"), Column("failed"), Column("disabled", whole=True)],
        [[r["id"], r["url"], " ".join(r["events"]), r["uploader"], r["last_sequence"], r["deliveries"]["pending"],
          r["deliveries"]["delivered"], r["deliveries"]["failed"], r["disabled_at"]] for r in rows]))


def _deliveries_table(title: str, rows: list[dict]) -> None:
    show(title, [Column("delivery"), Column("webhook", whole=True, optional=True), Column("seq"), Column("event"),
                 Column("state"), Column("attempts"), Column("status"), Column("error"),
                 Column("next attempt", whole=True)],
         [[r["id"], r["subscription_id"], r["sequence"], r["event_type"], r["state"], r["attempts"],
           r["last_status"], r["last_error"], r["next_attempt_at"]] for r in rows])


@webhooks.command("deliveries")
@click.argument("subscription_id", type=click.UUID, required=False)
@click.option("--state", type=click.Choice(["pending", "delivered", "failed"]))
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
@fail_on_attache_errors
def webhooks_deliveries(subscription_id: uuid.UUID | None, state: str | None, limit: int, as_json: bool) -> None:
    """A subscription's deliveries, newest first; without SUBSCRIPTION_ID, those failing anywhere."""
    from app.core import webhooks as core

    with _conn() as conn:
        rows = (core.deliveries(conn, subscription_id, state=state, limit=limit) if subscription_id
                else core.failing(conn, limit=limit))
    emit(rows, as_json, lambda rows: _deliveries_table(f"{len(rows)} deliveries", rows))


@webhooks.command("redeliver")
@click.argument("delivery_id", type=int)
@reason_option("Why; kept in the audit trail.", required=True)
@json_option
@fail_on_attache_errors
def webhooks_redeliver(delivery_id: int, reason: str, as_json: bool) -> None:
    """Send a delivery again (same event id and sequence) with a fresh attempt budget."""
    from app.core import webhooks as core

    with _conn() as conn:
        row = core.redeliver(conn, delivery_id, actor=f"operator:{operator()}", reason=reason)
    emit(row, as_json, lambda r: say(f"delivery {r['id']} is {r['state']}"))


@webhooks.command("disable")
@click.argument("subscription_id", type=click.UUID)
@reason_option("Why; kept in the audit trail.")
@json_option
@fail_on_attache_errors
def webhooks_disable(subscription_id: uuid.UUID, reason: str | None, as_json: bool) -> None:
    """Stop delivering to a subscription."""
    from app.core import webhooks as core

    with _conn() as conn:
        row = core.disable(conn, subscription_id, actor=f"operator:{operator()}", reason=reason)
    emit(row, as_json, lambda r: say(f"webhook {r['id']} disabled at {r['disabled_at']}"))


@webhooks.command("enable")
@click.argument("subscription_id", type=click.UUID)
@reason_option("Why; kept in the audit trail.")
@json_option
@fail_on_attache_errors
def webhooks_enable(subscription_id: uuid.UUID, reason: str | None, as_json: bool) -> None:
    """Deliver to a disabled subscription again, with the events it missed meanwhile."""
    from app.core import webhooks as core

    row = core.enable(services().engine, subscription_id, actor=f"operator:{operator()}", reason=reason)
    emit(row, as_json, lambda r: say(f"webhook {r['id']} enabled: {r['deliveries']['pending']} deliveries pending"))
