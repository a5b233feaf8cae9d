"""``attache gc``: the staging cleanup and the object GC, run once, now."""

from __future__ import annotations

import click
from rich.progress import Progress

from app.cli.output import console, emit, json_option
from app.cli.runtime import fail_on_attache_errors, services
from app.cli.tables import Column, show


@click.group()
def gc() -> None:
    """Cleanup of orphaned staging and unreferenced objects."""


@gc.command("run")
@click.option("--dry-run", is_flag=True, help="Count what would be removed; remove nothing.")
@json_option
@fail_on_attache_errors
def gc_run(dry_run: bool, as_json: bool) -> None:
    """Run the staging cleanup and the object GC once, now."""
    from scheduler.sweepers import cleanups as scheduled_cleanups

    cleanups = scheduled_cleanups(services())
    results = {}
    with Progress(console=console(), transient=True, disable=as_json) as progress:
        task = progress.add_task("cleaning up", total=len(cleanups))
        for cleanup in cleanups:
            results[cleanup.name] = cleanup.run_once(dry_run=dry_run)
            progress.advance(task)
    removed = {name: counts for name, counts in results.items() if not counts.get("skipped")}
    if not dry_run and removed:  # an operator's removal: audited as every other action that changes something
        from app.adapters.postgres import audit
        from app.adapters.postgres.db import transaction
        from app.cli.runtime import operator

        with transaction(services().engine) as conn:
            audit.record(conn, actor=f"operator:{operator()}", action="gc.run", target="storage", details=removed)
    emit({"dry_run": dry_run, **results}, as_json, lambda r: show(
        "cleanup" + (" (dry run)" if dry_run else ""), [Column("service", whole=True), Column("counts")],
        [[name, ", ".join(f"{k}={v}" for k, v in counts.items())] for name, counts in results.items()]))
    skipped = [name for name, counts in results.items() if counts.get("skipped")]
    if skipped:  # it exited 0, saying only skipped=1 (an adversarial run)
        raise click.ClickException(f"{', '.join(skipped)} did not run: another run of it (the scheduler's, or another "
                                   "attache gc run) holds its lock; run it again in a moment")
