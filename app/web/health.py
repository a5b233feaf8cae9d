"""``/healthz`` (the process answers) and ``/readyz`` (its dependencies answer)."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify
from sqlalchemy import text

from app.errors import AttacheError

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz():
    services = current_app.extensions["attache"]
    checks: dict[str, str] = {}

    def check(name, probe):
        try:
            probe()
            checks[name] = "ok"
        except AttacheError as exc:
            checks[name] = f"unavailable: {exc.error_code}"
        except Exception as exc:  # a readiness probe reports, it never raises
            checks[name] = f"unavailable: {type(exc).__name__}"

    def database():
        with services.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    check("database", database)
    check("broker", services.broker.ping)
    check("storage", services.storage.check)
    ready = all(value == "ok" for value in checks.values())
    return jsonify(status="ready" if ready else "unavailable", checks=checks), 200 if ready else 503
