"""``/healthz`` (the process answers) and ``/readyz`` (its dependencies answer).

``/readyz`` is cheap, however often an orchestrator probes it: PostgreSQL
answers ``SELECT 1`` on a pooled connection, RabbitMQ a passive declare on
the thread's open connection (no new connection per probe), storage a probe
write without fsync (or a bucket HEAD); and one answer serves every probe of
the process for :data:`READY_CACHE_SECONDS`.
"""

from __future__ import annotations

import threading
import time

from flask import Blueprint, current_app, jsonify
from sqlalchemy import text

from app.errors import AttacheError

bp = Blueprint("health", __name__)

#: how long one readiness answer serves the probes of a process
READY_CACHE_SECONDS = 1.0


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz():
    checks = _cached_checks()
    ready = all(value == "ok" for value in checks.values())
    return jsonify(status="ready" if ready else "unavailable", checks=checks), 200 if ready else 503


def _cached_checks() -> dict[str, str]:
    cache = current_app.extensions.setdefault("attache_readiness", {"lock": threading.Lock(), "at": None})
    with cache["lock"]:  # concurrent probes wait for the one check in flight
        if cache["at"] is None or time.monotonic() - cache["at"] >= READY_CACHE_SECONDS:
            cache["checks"] = _checks(current_app.extensions["attache"])
            cache["at"] = time.monotonic()
        return dict(cache["checks"])


def _checks(services) -> dict[str, str]:
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
    return checks
