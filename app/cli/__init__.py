"""The ``attache`` command for operators and deploys: the same powers as ``/v1/ops``.

Readable tables by default that never cut an id or a timestamp
(:mod:`app.cli.tables`), ``--json`` where a script would want it, a unique
prefix wherever a job or message id is typed (:mod:`app.cli.ids`), and a
non-zero exit status on any failure. One module per command group; this one
puts them together as ``main``, the ``attache`` console script.
"""

from __future__ import annotations

import click

from app.cli import db, dev, dlq, find, gc, jobs, outbox, pipeline, webhooks


@click.group()
def main() -> None:
    """attache: a durable attachment pipeline."""


for command in (db.db, dev.dev_token, find.find, jobs.jobs, dlq.dlq, outbox.outbox, gc.gc, pipeline.pipeline,
                webhooks.webhooks):
    main.add_command(command)
