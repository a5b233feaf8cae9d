"""``GET /metrics`` in the Prometheus text format (role ``operator``: scrape with a bearer token).

A scrape reads PostgreSQL (``app/observability/metrics.py``), some of it
whole: 0.12-0.17 s at 500,000 transitions. Scrapes that arrive together
(two Prometheus servers, a dashboard, a script) each held a thread and a
connection for that long: forty at once took 3.6 s each, and an upload
between them 3.2 s instead of 0.05 (an adversarial run). A web process now
reads for one scrape at a time, and a scrape that arrived while another
was reading waits for the next read and shares it: never a result read
before it arrived, and never more than two reads for any number of
scrapes at once.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app
from prometheus_client import CONTENT_TYPE_LATEST

from app.observability import metrics
from app.web.access import protect
from app.web.contract import operation, raw
from app.web.shared_reads import SharedReads

bp = Blueprint("metrics", __name__)
protect(bp, role="operator")


@bp.get("/metrics")
@operation("metrics", "Prometheus metrics (operator token)", tag="meta",
           answers={200: raw("The Prometheus text exposition format.", {"text/plain": {"schema": {"type": "string"}}})})
def scrape():
    services = current_app.extensions["attache"]
    reads = current_app.extensions.setdefault("attache.metrics", SharedReads())
    return Response(reads.get(lambda: metrics.render(services)), mimetype=CONTENT_TYPE_LATEST)
