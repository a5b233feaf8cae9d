"""``attache jobs``: list jobs, show one with its history, replay a failed one."""

from __future__ import annotations

import click

from app.adapters.postgres.models import JobState
from app.cli.ids import UUID_PREFIX
from app.cli.output import console, emit, json_option, say
from app.cli.runtime import fail_on_attache_errors, operator, reason_option, services
from app.cli.tables import Column, record, show


@click.group()
def jobs() -> None:
    """Jobs, their history, and replay."""


@jobs.command("list")
@click.option("--state", type=click.Choice([state.value for state in JobState]))
@click.option("--pipeline-version", type=int)
@click.option("--uploader", help="Only the jobs of this uploader's attachments.")
@click.option("--error-code", help="Only jobs with this error code (failed, or waiting to retry).")
@click.option("--since", help="Created at or after this ISO 8601 time (UTC unless it says).")
@click.option("--until", help="Created before this ISO 8601 time.")
@click.option("--cursor", help="Where the previous page ended (printed under it).")
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
@fail_on_attache_errors
def jobs_list(state, pipeline_version, uploader, error_code, since, until, cursor, limit, as_json) -> None:
    """List jobs, newest first, a page at a time.

    --json prints the page's jobs as a list; the next page's cursor, if there
    is one, goes to standard error.
    """
    from app.core import operations

    version = None if pipeline_version is None else str(pipeline_version)
    filters = operations.JobFilter.parse({"state": state, "pipeline_version": version, "uploader": uploader,
                                          "error_code": error_code, "since": since, "until": until})
    page = operations.find_jobs(services().engine, filters, cursor=cursor, limit=limit)
    emit(page["jobs"], as_json, lambda rows: show(
        f"{len(rows)} job(s)",
        [Column("job", whole=True), Column("attachment", whole=True, optional=True), Column("v"), Column("state"),
         Column("attempt"), Column("error"), Column("updated", whole=True),
         Column("created", whole=True, optional=True)],
        [[r["job_id"], r["attachment_id"], r["pipeline_version"], r["state"], f"{r['attempt']}/{r['max_attempts']}",
          r["error_code"], r["updated_at"], r["created_at"]] for r in rows]))
    if page["next_cursor"]:
        click.echo(f"more: the next page is --cursor {page['next_cursor']}", err=as_json)


@jobs.command("show")
@click.argument("job_id", type=UUID_PREFIX)
@json_option
@fail_on_attache_errors
def jobs_show(job_id: str, as_json: bool) -> None:
    """A job with its full history, trace context and its variants' provenance. JOB_ID may be a unique prefix."""
    from app.core import operations

    svc = services()
    job = operations.show_job(svc, operations.resolve_job_id(svc, job_id))

    def render(job):
        record([("job", job["job_id"]), ("attachment", job["attachment_id"]), ("version", job["pipeline_version"]),
                ("state", job["state"]), ("attempt", f"{job['attempt']}/{job['max_attempts']}"),
                ("error", job["error_code"]), ("reason", job["error_reason"]), ("created", job["created_at"]),
                ("updated", job["updated_at"]), ("traceparent", job["trace"]["traceparent"])])
        console().print()
        show("history", [Column("at", whole=True), Column("from"), Column("to"), Column("attempt"), Column("who"),
                         Column("error"), Column("reason")],
             [[h["at"], h["from"], h["to"], h["attempt"], h["who"], h["error_code"], h["reason"]]
              for h in job["history"]])
        if job["variants"]:
            console().print()
            show("variants and their provenance",
                 [Column("variant"), Column("published"), Column("sha256"), Column("source sha256"),
                  Column("pipeline"), Column("spec"), Column("encoder"), Column("libraries"), Column("stripped")],
                 [_provenance_row(v) for v in job["variants"]])

    emit(job, as_json, render)


def _compact(value) -> str:
    if not value:
        return "-"
    return ", ".join(f"{k}={v}" for k, v in value.items() if v not in (None, [], False)) or "-"


def _provenance_row(variant: dict) -> list:
    made = variant["provenance"] or {}
    pipeline = made.get("pipeline") or {}
    stripped = dict(made.get("stripped") or {})
    if stripped.get("exif_tags"):
        stripped["exif_tags"] = " ".join(stripped["exif_tags"])
    return [variant["variant"], "yes" if variant["published"] else "no", variant["sha256"][:16],
            (made.get("source") or {}).get("sha256", "-")[:16],
            f"v{pipeline.get('version')} {str(pipeline.get('fingerprint'))[:12]}" if pipeline else "-",
            _compact(made.get("spec")) if made.get("spec") else (made.get("copy") or "-"),
            _compact(made.get("encoder")), _compact(made.get("libraries")), _compact(stripped)]


@jobs.command("replay")
@click.argument("job_id", type=UUID_PREFIX)
@reason_option("Why; kept in the audit trail.", required=True)
@json_option
@fail_on_attache_errors
def jobs_replay(job_id: str, reason: str, as_json: bool) -> None:
    """Replay a failed job (failed -> queued) with a fresh attempt budget. JOB_ID may be a unique prefix."""
    from app.core import operations

    svc = services()
    job = operations.replay(svc, operations.resolve_job_id(svc, job_id), operator=operator(), reason=reason)
    emit(job, as_json, lambda j: say(f"{j['job_id']} is {j['state']} (attempt budget up to {j['max_attempts']})"))
