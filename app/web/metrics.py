"""``GET /metrics`` in the Prometheus text format (role ``operator``: scrape with a bearer token)."""

from __future__ import annotations

from flask import Blueprint, Response, current_app
from prometheus_client import CONTENT_TYPE_LATEST

from app.core.steps import Step
from app.observability import metrics
from app.web.access import protect

bp = Blueprint("metrics", __name__)
protect(bp, role="operator")


@bp.get("/metrics")
def scrape():
    return Response(metrics.render(current_app.extensions["attache"], [step.queue for step in Step]),
                    mimetype=CONTENT_TYPE_LATEST)
