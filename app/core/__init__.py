"""The core: what attache promises. The state machine, outbox and unit of work, workflow steps, intake, pipeline versions, retry policies, operator operations, search, backfill."""
