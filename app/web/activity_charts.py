"""The dashboard's charts: which numbers of :func:`app.core.activity.activity` go in which chart."""

from __future__ import annotations

from datetime import timedelta

from markupsafe import Markup

from app.web.charts import PALETTE, Series, bar_chart, line_chart

BLUE, GREEN, RED, AMBER = PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[3]
#: x-axis labels: every 10 minutes over an hour, every 3 hours over a day
TICK_EVERY = {"hour": timedelta(minutes=10), "day": timedelta(hours=3)}


def dashboard_charts(data: dict) -> list[Markup]:
    times, per, ticks = data["times"], data["per"], TICK_EVERY[data["window"]]
    queues = data["dead_letters"]
    failures = data["failures_by_code"]
    return [
        line_chart("chart-throughput", f"Uploads accepted, ready and failed {per}", times, [
            Series("Uploads accepted", data["uploads"], BLUE),
            Series("Ready", data["ready"], GREEN),
            Series("Failed", data["failed"], RED),
        ], tick_every=ticks),
        line_chart("chart-latency", f"Upload → ready, p50 and p99 of the jobs ready {per}", times, [
            Series("p50", data["latency_p50"], BLUE, summed=False),
            Series("p99", data["latency_p99"], RED, summed=False),
        ], unit=" s", tick_every=ticks, whole=False),
        line_chart("chart-outbox", "Outbox backlog (messages not yet confirmed by RabbitMQ)", times, [
            Series("Backlog", data["outbox_backlog"], AMBER, summed=False),
        ], tick_every=ticks),
        line_chart("chart-dead-letters", f"Dead letters recorded per queue, {per}", times, [
            Series(queue, values, PALETTE[index % len(PALETTE)]) for index, (queue, values) in
            enumerate(sorted(queues.items()))
        ], tick_every=ticks, note=None if queues else "No dead letters recorded in this window."),
        bar_chart("chart-failures", "Failures by error code", [
            (row["error_code"], [row["failed"], row["retried"]]) for row in failures
        ], [("failed", RED), ("retried", AMBER)],
            note=None if failures else "No failures or retries in this window."),
    ]
