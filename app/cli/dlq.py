"""``attache dlq``: list, show, requeue and purge dead letters (every action audited)."""

from __future__ import annotations

import sys
import uuid

import click
from rich.progress import Progress

from app.cli.output import console, emit, json_option, say
from app.cli.runtime import fail_on_attache_errors, operator, reason_option, services
from app.cli.tables import Column, show
from app.core import id_prefixes

#: the most dead letters looked at to find which one a typed message id prefix names
PREFIX_SCAN = 1000


@click.group()
def dlq() -> None:
    """Dead-letter queues: list, show, requeue, purge (every action audited)."""


def _dead_letters():
    return services().dead_letters


@dlq.command("list")
@json_option
@fail_on_attache_errors
def dlq_list(as_json: bool) -> None:
    """The dead-letter queues and their depths."""
    queues = _dead_letters().queues()
    emit(queues, as_json, lambda qs: show("dead-letter queues",
                                          [Column("queue", whole=True), Column("of", whole=True), Column("messages")],
                                          [[q["name"], q["queue"], q["messages"]] for q in qs]))


@dlq.command("show")
@click.argument("queue")
@click.option("--limit", type=int, default=50, show_default=True)
@json_option
@fail_on_attache_errors
def dlq_show(queue: str, limit: int, as_json: bool) -> None:
    """Decoded dead letters with why they died (they stay in the queue)."""
    listing = _dead_letters().listing(queue, limit=limit)

    def render(items):
        show(f"{len(items)} of {listing['depth']} dead letter(s) in {queue}",
             [Column("message", whole=True), Column("job", whole=True), Column("job now"), Column("death"),
              Column("recorded error"), Column("reason")],
             [[m["message_id"], (m["body"] or {}).get("job_id") if isinstance(m["body"], dict) else None,
               m["job_state"], ", ".join(f"{d['reason']}×{d['count']}" for d in m["death"]),
               (m["recorded"] or {}).get("error_code"), (m["recorded"] or {}).get("reason")] for m in items])

    emit(listing["messages"], as_json, render)


def _whole(message_id: str) -> bool:
    """Whether ``message_id`` is a whole Dramatiq message id (a UUID as text), so no prefix to resolve."""
    try:
        return len(message_id) == 36 and str(uuid.UUID(message_id)) == message_id.lower()
    except ValueError:
        return False


def _message_ids(dead_letters, queue: str, typed: tuple[str, ...]) -> list[str]:
    """Each typed message id, or the one id in ``queue`` it is a unique prefix of.

    A typed id that starts none is kept as typed: the requeue or purge then
    reports it ``not_found``.
    """
    if all(_whole(m) for m in typed):
        return list(typed)
    listing = dead_letters.listing(queue, limit=PREFIX_SCAN)
    if listing["depth"] > len(listing["messages"]):
        raise click.ClickException(f"{queue} holds {listing['depth']} dead letters, more than the {PREFIX_SCAN} "
                                   "a message id prefix is looked up in: name whole message ids")
    present = [m["message_id"] for m in listing["messages"] if m["message_id"]]
    return [id_prefixes.unique_among(m, present, what="message") or m for m in typed]


def _chosen(queue: str, message_ids: tuple[str, ...], everything: bool, expect: int | None):
    """The dead-letter tools, and what to act on: the keyword arguments of a requeue or purge.

    Either the message ids (each prefix resolved), or ``--all --expect N``.
    """
    if message_ids and everything:
        raise click.UsageError("name message ids, or pass --all --expect N, not both")
    if everything:
        if expect is None:
            raise click.UsageError("--all needs --expect N: the count you saw (dlq list / dlq show); "
                                   "a queue holding more is refused and nothing is done")
        return _dead_letters(), {"expected": expect}
    if expect is not None:
        raise click.UsageError("--expect goes with --all")
    if not message_ids:
        raise click.UsageError("name message ids, or pass --all --expect N")
    dead_letters = _dead_letters()
    return dead_letters, {"message_ids": _message_ids(dead_letters, queue, message_ids)}


def _selection_options(verb: str):
    def decorate(fn):
        fn = click.option("--expect", type=click.IntRange(min=1), metavar="N",
                          help=f"With --all: the count you saw. If the queue holds more, nothing is {verb}d.")(fn)
        fn = click.option("--all", "everything", is_flag=True,
                          help=f"{verb.capitalize()} every dead letter, at most --expect N of them.")(fn)
        return click.argument("message_ids", nargs=-1)(fn)

    return decorate


def _outcome(verb: str, result: dict, as_json: bool) -> None:
    emit(result, as_json, lambda r: say(
        f"{verb}d {r[verb + 'd']}" + (f"; not found: {', '.join(r['not_found'])}" if r["not_found"] else "")))
    if result["not_found"]:
        sys.exit(1)


@dlq.command("requeue")
@click.argument("queue")
@_selection_options("requeue")
@reason_option("Why; kept in the audit trail.")
@json_option
@fail_on_attache_errors
def dlq_requeue(queue: str, message_ids: tuple[str, ...], everything: bool, expect: int | None, reason: str | None,
                as_json: bool) -> None:
    """Move chosen dead letters (or --all --expect N) back to their original queue.

    A message id may be a unique prefix of one in the queue. Exits 1 if an
    id was not found, or if the queue holds more than N (then nothing is done).
    """
    dead_letters, chosen = _chosen(queue, message_ids, everything, expect)
    with Progress(console=console(), transient=True, disable=as_json) as progress:
        progress.add_task(f"requeueing from {queue}", total=None)
        result = dead_letters.requeue(queue, actor=f"operator:{operator()}", reason=reason, **chosen)
    _outcome("requeue", result, as_json)


@dlq.command("purge")
@click.argument("queue")
@_selection_options("purge")
@reason_option("Why; kept in the audit trail.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@fail_on_attache_errors
def dlq_purge(queue: str, message_ids: tuple[str, ...], everything: bool, expect: int | None, reason: str | None,
              yes: bool, as_json: bool) -> None:
    """Delete chosen dead letters (or --all --expect N) for good.

    A message id may be a unique prefix of one in the queue. Exits 1 if an
    id was not found, or if the queue holds more than N (then nothing is deleted).
    """
    dead_letters, chosen = _chosen(queue, message_ids, everything, expect)
    if not yes:
        what = (f"{len(chosen['message_ids'])} chosen message(s)" if "message_ids" in chosen
                else f"every message (at most {expect})")
        click.confirm(f"delete {what} of {queue} for good?", abort=True)
    result = dead_letters.purge(queue, actor=f"operator:{operator()}", reason=reason, **chosen)
    _outcome("purge", result, as_json)
