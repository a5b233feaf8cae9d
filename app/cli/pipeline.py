"""``attache pipeline``: the registered pipeline versions, and backfill into a newer one."""

from __future__ import annotations

import click
from rich.progress import Progress

from app.cli.output import console, emit, json_option, say
from app.cli.runtime import fail_on_attache_errors, operator, reason_option, services
from app.cli.tables import Column, show


@click.group()
def pipeline() -> None:
    """Pipeline versions and backfill."""


@pipeline.command("list")
@json_option
def pipeline_list(as_json: bool) -> None:
    """The registered versions and their variants."""
    from app.core import pipeline as registry

    listed = [{"version": v.version, "variants": list(v.variants), "fingerprint": v.fingerprint,
               "newest": v.version == registry.NEWEST} for v in registry.REGISTRY.values()]
    emit(listed, as_json, lambda rows: show(
        "pipeline versions", [Column("version"), Column("variants"), Column("fingerprint", whole=True, optional=True)],
        [[r["version"], ", ".join(r["variants"]), r["fingerprint"]] for r in rows]))


@pipeline.command("backfill")
@click.option("--to", "to_version", type=int, required=True, help="The pipeline version to reprocess into.")
@click.option("--dry-run", is_flag=True, help="Count and estimate; change nothing.")
@click.option("--batch", type=click.IntRange(1, 10_000), default=100, show_default=True)
@reason_option('Why; kept in the audit log and each new job\'s history (else "backfill to version N").')
@json_option
@fail_on_attache_errors
def pipeline_backfill(to_version: int, dry_run: bool, batch: int, reason: str | None, as_json: bool) -> None:
    """Create jobs at version N for every attachment ready at an older one (idempotent, resumable)."""
    from app.core import backfill

    svc = services()
    try:
        estimate = backfill.estimate(svc, to_version)
    except LookupError as exc:
        raise click.ClickException(str(exc))
    if dry_run:
        emit({"dry_run": True, **estimate.as_dict()}, as_json, lambda e: say(
            f"dry run: {e['candidates']} attachment(s) to reprocess into v{to_version}, {e['renders']} render(s)"
            + (f", about {e['estimated_worker_seconds']} worker-seconds" if e["estimated_worker_seconds"] else "")))
        return
    with Progress(console=console(), disable=as_json) as progress:
        task = progress.add_task(f"backfill to v{to_version}", total=estimate.candidates)
        result = backfill.run(svc, to_version, batch=batch, actor=f"backfill:{operator()}",
                              reason=reason, progress=lambda n: progress.advance(task, n))
    emit({"dry_run": False, "to_version": to_version, **result}, as_json,
         lambda r: say(f"created {r['created']} job(s) at v{to_version}, published {r['published']}"))
