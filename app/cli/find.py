"""``attache find TEXT``: one search for an upload (:mod:`app.core.search`), as the console's search box.

One match: the attachment with every pipeline version's job, what each
waits for now, and its timeline (:mod:`app.core.timeline`). Several: a
table of them. None: exit status 1.
"""

from __future__ import annotations

import uuid

import click

from app.cli.output import console, emit, json_option, say
from app.cli.runtime import fail_on_attache_errors, services
from app.cli.tables import Column, record, show


def _details(event: dict) -> str:
    if event["kind"] == "step":
        return f"{event['step']}{' ' + event['variant'] if event['variant'] else ''}: {event['seconds']:.3f} s, " \
               f"{event['outcome']}"
    text = " ".join(part for part in (event["error_code"], event["reason"]) if part)
    if event["kind"] == "retry_scheduled":
        text += f"; next attempt due {event['next_attempt_at']}"
    return text


def _overview(overview: dict) -> None:
    a = overview["attachment"]
    record([("attachment", a["attachment_id"]), ("filename", a["filename"]), ("uploader", a["uploader"]),
            ("uploaded", a["created_at"]), ("size", a["size"]), ("sha256", a["sha256"])])
    for job in overview["jobs"]:
        console().print()
        record([(f"v{job['pipeline_version']} job", job["job_id"]), ("state", job["state"]),
                ("attempt", f"{job['attempt']}/{job['max_attempts']}"), ("now", job["now"]["text"]),
                ("trace id", job["trace_id"]),
                ("derivatives", ", ".join(v["variant"] for v in job["variants"] if v["published_at"]) or None)])
        show(f"v{job['pipeline_version']} timeline",
             [Column("at", whole=True), Column("event"), Column("attempt"), Column("who", optional=True),
              Column("details")],
             [[e["at"], e["kind"], e["attempt"], e["who"], _details(e)] for e in job["timeline"]])


@click.command("find")
@click.argument("text")
@json_option
@fail_on_attache_errors
def find(text: str, as_json: bool) -> None:
    """Find an upload by attachment or job id (or a unique start of one), sha256, uploader or part of its filename.

    One match shows the attachment with each pipeline version's job and its
    timeline; several are listed, newest first.
    """
    from app.core import search, timeline

    svc = services()
    result = search.search(svc.engine, text)
    one = search.landing(result)
    result["attachment"] = timeline.attachment_overview(svc.engine, uuid.UUID(one["attachment_id"])) if one else None

    def render(result):
        if result["attachment"] is not None:
            _overview(result["attachment"])
            return
        show(f"{len(result['matches'])} attachment(s) match" + (" (the newest; type more for the rest)"
                                                                 if result["more"] else ""),
             [Column("attachment", whole=True), Column("filename"), Column("uploader"),
              Column("uploaded", whole=True, optional=True), Column("matched by"), Column("jobs", optional=True)],
             [[m["attachment_id"], m["filename"], m["uploader"], m["created_at"], ", ".join(m["matched_by"]),
               " ".join(f"v{j['pipeline_version']}:{j['state']}" for j in m["jobs"])] for m in result["matches"]])

    if not result["matches"]:
        if as_json:
            emit(result, True, render)
        raise click.ClickException(f"nothing matches {text!r}")
    emit(result, as_json, render)
    if not as_json and result["attachment"] is None:
        say("type more of it, or one of the attachment ids, to see one")
