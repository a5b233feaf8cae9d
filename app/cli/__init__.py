"""The ``attache`` command for operators and deploys: the same powers as ``/v1/ops``.

Readable tables by default, ``--json`` where a script would want it, and a
non-zero exit status on any failure.
"""

from __future__ import annotations

import getpass
import json
import sys
import uuid

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from app.adapters.postgres.models import JobState
from app.config import Settings
from app.errors import AttacheError, ConfigError

console = Console()


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise click.ClickException(f"configuration error: {exc}")


def _services():
    from app.services import Services

    return Services(_settings(), pool_size=2)


def _operator() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli:unknown"


def _emit(data, as_json: bool, render) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        render(data)


def _table(title: str, columns: list[str], rows: list[list]) -> None:
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*["-" if v is None else str(v) for v in row])
    console.print(table)


def _fail_on_attache_errors(fn):
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (AttacheError, ValueError) as exc:
            raise click.ClickException(str(exc))

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group()
def main() -> None:
    """attache: a durable attachment pipeline."""


# --- db ----------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.option("--create/--no-create", default=True, help="Create the database if it is missing.")
def db_upgrade(create: bool) -> None:
    """Apply every migration (idempotent); the Procfile's `release`."""
    from app.adapters.postgres import db as database

    settings = _settings()
    try:
        if create and database.ensure_database(settings.database_url):
            console.print("created the database")
        database.upgrade(settings.database_url)
    except Exception as exc:
        raise click.ClickException(f"migration failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    console.print("database is at the newest migration")


# --- dev -------------------------------------------------------------------------------


@main.command("dev-token")
def dev_token() -> None:
    """Create (once) and print the development token, with a ready-to-paste curl line."""
    from app.core.auth import dev_token as make

    settings = _settings()
    if settings.api_tokens:
        console.print("ATTACHE_API_TOKENS is set: no development token is used")
        return
    token = make().secret
    click.echo(f"development token (operator 'dev'): {token}")
    click.echo(f"  curl -H 'Authorization: Bearer {token}' -F file=@photo.jpg http://127.0.0.1:{settings.port}/v1/attachments")


# --- jobs ------------------------------------------------------------------------------


@main.group()
def jobs() -> None:
    """Jobs, their history, and replay."""


@jobs.command("list")
@click.option("--state", type=click.Choice([state.value for state in JobState]))
@click.option("--pipeline-version", type=int)
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
@_fail_on_attache_errors
def jobs_list(state, pipeline_version, limit, as_json) -> None:
    """List jobs, newest first."""
    from app.core import operations

    listed = operations.list_jobs(_services(), state=state, pipeline_version=pipeline_version, limit=limit)
    _emit(listed, as_json, lambda rows: _table(
        f"{len(rows)} job(s)", ["job", "attachment", "v", "state", "attempt", "error", "updated"],
        [[r["job_id"], r["attachment_id"], r["pipeline_version"], r["state"], f"{r['attempt']}/{r['max_attempts']}",
          r["error_code"], r["updated_at"]] for r in rows]))


@jobs.command("show")
@click.argument("job_id", type=click.UUID)
@json_option
@_fail_on_attache_errors
def jobs_show(job_id: uuid.UUID, as_json: bool) -> None:
    """A job with its full history and trace context."""
    from app.core import operations

    job = operations.show_job(_services(), job_id)

    def render(job):
        console.print(f"[bold]{job['job_id']}[/] {job['state']} attempt {job['attempt']}/{job['max_attempts']}"
                      f" error={job['error_code'] or '-'}  trace={job['trace']['traceparent']}")
        _table("history", ["at", "from", "to", "attempt", "who", "error", "reason"],
               [[h["at"], h["from"], h["to"], h["attempt"], h["who"], h["error_code"], h["reason"]]
                for h in job["history"]])

    _emit(job, as_json, render)


@jobs.command("replay")
@click.argument("job_id", type=click.UUID)
@click.option("--reason", required=True, help="Why; kept in the audit trail.")
@json_option
@_fail_on_attache_errors
def jobs_replay(job_id: uuid.UUID, reason: str, as_json: bool) -> None:
    """Replay a failed job (failed -> queued) with a fresh attempt budget."""
    from app.core import operations

    job = operations.replay(_services(), job_id, operator=_operator(), reason=reason)
    _emit(job, as_json, lambda j: console.print(f"{j['job_id']} is {j['state']} (attempt budget up to {j['max_attempts']})"))


# --- dead letters ---------------------------------------------------------------------------


@main.group()
def dlq() -> None:
    """Dead-letter queues: list, show, requeue, purge (every action audited)."""


def _dead_letters():
    from app.adapters.broker.dead_letter_tools import DeadLetters
    from app.adapters.postgres.db import make_engine
    from app.core.steps import Step

    settings = _settings()
    return DeadLetters(settings.broker_url, make_engine(settings.database_url, pool_size=1),
                       queues=[step.queue for step in Step], socket_timeout=settings.publish_timeout_seconds)


@dlq.command("list")
@json_option
@_fail_on_attache_errors
def dlq_list(as_json: bool) -> None:
    """The dead-letter queues and their depths."""
    queues = _dead_letters().queues()
    _emit(queues, as_json, lambda qs: _table("dead-letter queues", ["queue", "of", "messages"],
                                             [[q["name"], q["queue"], q["messages"]] for q in qs]))


@dlq.command("show")
@click.argument("queue")
@click.option("--limit", type=int, default=50, show_default=True)
@json_option
@_fail_on_attache_errors
def dlq_show(queue: str, limit: int, as_json: bool) -> None:
    """Decoded dead letters with why they died (they stay in the queue)."""
    listing = _dead_letters().listing(queue, limit=limit)

    def render(items):
        _table(f"{len(items)} of {listing['depth']} dead letter(s) in {queue}",
               ["message", "job", "death", "recorded error", "reason"],
               [[m["message_id"], (m["body"] or {}).get("job_id") if isinstance(m["body"], dict) else None,
                 ", ".join(f"{d['reason']}×{d['count']}" for d in m["death"]),
                 (m["recorded"] or {}).get("error_code"), (m["recorded"] or {}).get("reason")] for m in items])

    _emit(listing["messages"], as_json, render)


def _chosen(message_ids: tuple[str, ...], everything: bool, expect: int | None) -> dict:
    """Message ids, or ``--all --expect N``: the keyword arguments of a requeue or purge."""
    if message_ids and everything:
        raise click.UsageError("name message ids, or pass --all --expect N, not both")
    if everything:
        if expect is None:
            raise click.UsageError("--all needs --expect N: the count you saw (dlq list / dlq show); "
                                   "a queue holding more is refused and nothing is done")
        return {"expected": expect}
    if expect is not None:
        raise click.UsageError("--expect goes with --all")
    if not message_ids:
        raise click.UsageError("name message ids, or pass --all --expect N")
    return {"message_ids": list(message_ids)}


def _selection_options(verb: str):
    def decorate(fn):
        fn = click.option("--expect", type=click.IntRange(min=1), metavar="N",
                          help=f"With --all: the count you saw. If the queue holds more, nothing is {verb}d.")(fn)
        fn = click.option("--all", "everything", is_flag=True,
                          help=f"{verb.capitalize()} every dead letter, at most --expect N of them.")(fn)
        return click.argument("message_ids", nargs=-1)(fn)

    return decorate


def _outcome(verb: str, result: dict, as_json: bool) -> None:
    _emit(result, as_json, lambda r: console.print(
        f"{verb}d {r[verb + 'd']}" + (f"; not found: {', '.join(r['not_found'])}" if r["not_found"] else "")))
    if result["not_found"]:
        sys.exit(1)


@dlq.command("requeue")
@click.argument("queue")
@_selection_options("requeue")
@click.option("--reason", help="Why; kept in the audit trail.")
@json_option
@_fail_on_attache_errors
def dlq_requeue(queue: str, message_ids: tuple[str, ...], everything: bool, expect: int | None, reason: str | None,
                as_json: bool) -> None:
    """Move chosen dead letters (or --all --expect N) back to their original queue.

    Exits 1 if an id was not found, or if the queue holds more than N (then nothing is done).
    """
    chosen = _chosen(message_ids, everything, expect)
    with Progress(console=console, transient=True, disable=as_json) as progress:
        progress.add_task(f"requeueing from {queue}", total=None)
        result = _dead_letters().requeue(queue, actor=f"operator:{_operator()}", reason=reason, **chosen)
    _outcome("requeue", result, as_json)


@dlq.command("purge")
@click.argument("queue")
@_selection_options("purge")
@click.option("--reason", help="Why; kept in the audit trail.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@_fail_on_attache_errors
def dlq_purge(queue: str, message_ids: tuple[str, ...], everything: bool, expect: int | None, reason: str | None,
              yes: bool, as_json: bool) -> None:
    """Delete chosen dead letters (or --all --expect N) for good.

    Exits 1 if an id was not found, or if the queue holds more than N (then nothing is deleted).
    """
    chosen = _chosen(message_ids, everything, expect)
    if not yes:
        what = (f"{len(chosen['message_ids'])} chosen message(s)" if "message_ids" in chosen
                else f"every message (at most {expect})")
        click.confirm(f"delete {what} of {queue} for good?", abort=True)
    result = _dead_letters().purge(queue, actor=f"operator:{_operator()}", reason=reason, **chosen)
    _outcome("purge", result, as_json)


# --- outbox and cleanup -------------------------------------------------------------------------


@main.group()
def outbox() -> None:
    """The transactional outbox."""


@outbox.command("status")
@json_option
@_fail_on_attache_errors
def outbox_status(as_json: bool) -> None:
    """Unpublished rows and the age of the oldest."""
    from app.core import operations

    status = operations.outbox_status(_services())
    _emit(status, as_json, lambda s: _table("outbox", ["pending", "oldest created", "oldest age (s)"],
                                            [[s["pending"], s["oldest_created_at"], f"{s['oldest_age_seconds']:.1f}"]]))


@main.group()
def gc() -> None:
    """Cleanup of orphaned staging and unreferenced objects."""


@gc.command("run")
@click.option("--dry-run", is_flag=True, help="Count what would be removed; remove nothing.")
@json_option
@_fail_on_attache_errors
def gc_run(dry_run: bool, as_json: bool) -> None:
    """Run the staging cleanup and the object GC once, now."""
    from scheduler.object_gc import ObjectGc, ObjectGcConfig
    from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig

    services = _services()
    settings = services.settings
    cleanups = [
        StagingCleanup(services, StagingCleanupConfig(grace_seconds=settings.staging_grace_seconds,
                                                      failed_retention_seconds=settings.failed_retention_seconds)),
        ObjectGc(services, ObjectGcConfig(grace_seconds=settings.object_grace_seconds)),
    ]
    results = {}
    with Progress(console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task("cleaning up", total=len(cleanups))
        for cleanup in cleanups:
            results[cleanup.name] = cleanup.run_once(dry_run=dry_run)
            progress.advance(task)
    _emit({"dry_run": dry_run, **results}, as_json, lambda r: _table(
        "cleanup" + (" (dry run)" if dry_run else ""), ["service", "counts"],
        [[name, ", ".join(f"{k}={v}" for k, v in counts.items())] for name, counts in results.items()]))


# --- pipeline versions ----------------------------------------------------------------


@main.group()
def pipeline() -> None:
    """Pipeline versions and backfill."""


@pipeline.command("list")
@json_option
def pipeline_list(as_json: bool) -> None:
    """The registered versions and their variants."""
    from app.core import pipeline as registry

    listed = [{"version": v.version, "variants": list(v.variants), "fingerprint": v.fingerprint,
               "newest": v.version == registry.NEWEST} for v in registry.REGISTRY.values()]
    _emit(listed, as_json, lambda rows: _table("pipeline versions", ["version", "variants", "fingerprint"],
                                               [[r["version"], ", ".join(r["variants"]), r["fingerprint"][:16]]
                                                for r in rows]))


@pipeline.command("backfill")
@click.option("--to", "to_version", type=int, required=True, help="The pipeline version to reprocess into.")
@click.option("--dry-run", is_flag=True, help="Count and estimate; change nothing.")
@click.option("--batch", type=click.IntRange(1, 10_000), default=100, show_default=True)
@json_option
@_fail_on_attache_errors
def pipeline_backfill(to_version: int, dry_run: bool, batch: int, as_json: bool) -> None:
    """Create jobs at version N for every attachment ready at an older one (idempotent, resumable)."""
    from app.core import backfill

    services = _services()
    try:
        estimate = backfill.estimate(services, to_version)
    except LookupError as exc:
        raise click.ClickException(str(exc))
    if dry_run:
        _emit({"dry_run": True, **estimate.as_dict()}, as_json, lambda e: console.print(
            f"dry run: {e['candidates']} attachment(s) to reprocess into v{to_version}, {e['renders']} render(s)"
            + (f", about {e['estimated_worker_seconds']} worker-seconds" if e["estimated_worker_seconds"] else "")))
        return
    with Progress(console=console, disable=as_json) as progress:
        task = progress.add_task(f"backfill to v{to_version}", total=estimate.candidates)
        result = backfill.run(services, to_version, batch=batch, actor=f"backfill:{_operator()}",
                              progress=lambda n: progress.advance(task, n))
    _emit({"dry_run": False, "to_version": to_version, **result}, as_json,
          lambda r: console.print(f"created {r['created']} job(s) at v{to_version}, published {r['published']}"))


if __name__ == "__main__":
    sys.exit(main())
