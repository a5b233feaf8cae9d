"""attache: a durable attachment pipeline.

The map. Each layer may import its own and those above it in this list,
never one below (``tests/test_layers.py`` checks it):

foundation     ``app/errors.py`` (the one exception tree), ``app/faults.py`` (named fault points)
adapters       ``app/adapters/``: the outside world behind our own interfaces, vendor errors
               translated at the edge: ``postgres/`` (engine, tables, migrations, audit rows),
               ``broker/`` (Dramatiq over RabbitMQ, dead-letter recorder and tools),
               ``storage/`` (filesystem, S3), ``imaging/`` (sniff, probe, render with Pillow)
observability  ``app/observability/``: JSON logs, W3C trace context, OpenTelemetry spans, ``/metrics``
core           ``app/core/``: what attache promises: the state machine, outbox, workflow steps,
               intake, pipeline versions, retry policies, operator operations, backfill
wiring         ``app/config.py`` (``Settings`` from the environment) and ``app/services.py``
               (builds each process's adapters from ``Settings``)
entry points   ``app/web/`` (Flask: API, upload page, console), ``app/cli/`` (the ``attache``
               command), ``actors/`` (the Dramatiq worker), ``scheduler/`` (maintenance services)

Nothing outside ``app/web/`` is web-only. ``docs/architecture.md`` follows one
upload through these folders.
"""
