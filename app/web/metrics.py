"""``GET /metrics`` in the Prometheus text format (role ``operator``: scrape with a bearer token)."""

from __future__ import annotations

from flask import Blueprint, Response, current_app
from prometheus_client import CONTENT_TYPE_LATEST

from app.observability import metrics
from app.web.access import protect
from app.web.contract import operation, raw

bp = Blueprint("metrics", __name__)
protect(bp, role="operator")


@bp.get("/metrics")
@operation("metrics", "Prometheus metrics (operator token)", tag="meta",
           answers={200: raw("The Prometheus text exposition format.", {"text/plain": {"schema": {"type": "string"}}})})
def scrape():
    return Response(metrics.render(current_app.extensions["attache"]),
                    mimetype=CONTENT_TYPE_LATEST)
