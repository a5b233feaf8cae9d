"""``/ops``: the operator console, server-rendered HTML for people (``/v1/ops`` is the JSON API).

Login
    ``POST /ops/login`` takes an operator's API token once and keeps only
    ``principal`` and ``role`` in the signed session cookie (never the token).
    GET pages also accept ``Authorization: Bearer <operator token>`` so curl
    works without a session. A session stays valid only while its principal
    still holds an operator token (revoking the token ends the session) and
    for at most :data:`SESSION_MAX_AGE_SECONDS`.
CSRF
    Every POST (login included) carries ``csrf_token``, compared in constant
    time with the token in the session; a mismatch is 400 and changes nothing.
    ``SameSite=Lax`` cookies and ``form-action 'self'`` are a second fence.
No JavaScript
    Confirmations are form fields (purge needs its ``confirm`` box ticked),
    so the pages work with the strict Content-Security-Policy below.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timezone

from flask import (Blueprint, current_app, flash, g, redirect, render_template, request, session,
                   url_for)

from app import operations
from app.auth import Identity, authenticate
from app.errors import AttacheError
from app.web.access import csrf_token, form_csrf_ok, local_developer, session_identity, start_session

log = logging.getLogger(__name__)

bp = Blueprint("console", __name__, url_prefix="/ops")

SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; style-src 'self' 'unsafe-inline'; form-action 'self'; "
                                "frame-ancestors 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
OPERATOR = "operator"
#: views reachable without an operator session
PUBLIC_ENDPOINTS = {"console.login", "console.login_form"}


def _services():
    return current_app.extensions["attache"]


def _tokens():
    return current_app.extensions["attache_tokens"]


# --- session, identity and CSRF --------------------------------------------------


def _session_identity() -> Identity | None:
    """The signed-in operator, or None (an uploader's session does not open the console)."""
    found = session_identity()
    return found if found is not None and found.role == OPERATOR else None


def _page(template: str, status: int = 200, **context):
    return render_template(template, **context), status


def _message(status: int, title: str, message: str):
    return _page("error.html", status, title=title, message=message)


@bp.app_template_global("csrf_token")
def _csrf_token_global() -> str:
    return csrf_token()


@bp.before_request
def require_operator():
    if request.endpoint in PUBLIC_ENDPOINTS:
        return None
    found = _session_identity()
    if found is not None:
        g.console_identity, g.console_via = found, "session"
        return None
    header = request.headers.get("Authorization")
    if header and request.method in ("GET", "HEAD"):
        found = authenticate(_tokens(), header)
        if found is None:
            response = _message(401, "Not signed in", "That token is not valid.")
            return response[0], 401, {"WWW-Authenticate": 'Bearer realm="attache"'}
        if found.role != OPERATOR:
            return _message(403, "Forbidden", "The operator console needs the operator role.")
        g.console_identity, g.console_via = found, "token"
        return None
    return redirect(url_for("console.login_form"), code=303 if request.method == "POST" else 302)


@bp.before_request
def check_csrf():
    if request.method == "POST" and not form_csrf_ok():
        log.warning("console: CSRF check failed on %s", request.path)
        return _message(400, "Form rejected",
                        "This form was not sent from this console session (CSRF check failed). "
                        "Reload the page and try again.")
    return None


@bp.after_request
def security_headers(response):
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


@bp.context_processor
def console_context():
    who = g.get("console_identity")
    return {"operator": who.principal if who else None, "signed_in": g.get("console_via") == "session"}


def principal() -> str:
    return g.console_identity.principal


# --- filters ------------------------------------------------------------------------


@bp.app_template_filter("when")
def when(value) -> str:
    """An ISO timestamp as ``YYYY-MM-DD HH:MM:SS UTC`` (or an em dash)."""
    if not value:
        return "—"
    try:
        parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    except ValueError:
        return str(value)
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(timezone.utc)
    return parsed.strftime("%Y-%m-%d %H:%M:%S UTC")


@bp.app_template_filter("age")
def age(seconds) -> str:
    seconds = float(seconds or 0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


# --- login / logout -----------------------------------------------------------------


@bp.get("/login")
def login_form():
    if _session_identity() is not None:
        return redirect(url_for("console.dashboard"))
    developer = local_developer(OPERATOR)
    if developer is not None:
        start_session(developer)
        return redirect(url_for("console.dashboard"))
    return _page("login.html")


@bp.post("/login")
def login():
    presented = request.form.get("token", "").strip()
    found = authenticate(_tokens(), f"Bearer {presented}") if presented else None
    if found is None:
        log.info("console: login refused (unknown token)")
        return _page("login.html", 401, error="That token is not valid.")
    if found.role != OPERATOR:
        log.info("console: login refused for %s (role %s)", found.principal, found.role)
        return _page("login.html", 403, error="This console is for operators; that token has another role.")
    start_session(found)
    return redirect(url_for("console.dashboard"), code=303)


@bp.post("/logout")
def logout():
    session.clear()
    return redirect(url_for("console.login_form"), code=303)


# --- dashboard and jobs -------------------------------------------------------------


def _dead_letters():
    from app.dlq import DeadLetters

    services = _services()
    return DeadLetters(services.settings.broker_url, services.engine,
                       socket_timeout=services.settings.publish_timeout_seconds)


def _broker_down(exc: Exception) -> str:
    log.warning("console: RabbitMQ unavailable: %s", exc)
    return "RabbitMQ is unavailable"


@bp.get("/")
@bp.get("")  # registered first (decorators apply bottom-up): url_for gives /ops
def dashboard():
    services = _services()
    queues, dlq_error = None, None
    try:
        queues = _dead_letters().queues()
    except (AttacheError, OSError) as exc:
        dlq_error = _broker_down(exc)
    return _page("dashboard.html", counts=operations.counts_by_state(services),
                 outbox=operations.outbox_status(services), leases=operations.lease_status(services),
                 queues=queues, dlq_error=dlq_error, failed=operations.list_jobs(services, state="failed"))


def _job_page(job_id: uuid.UUID, status: int = 200, **context):
    try:
        job = operations.show_job(_services(), job_id)
    except operations.NotFound:
        return _message(404, "No such job", f"There is no job {job_id}.")
    return _page("job.html", status, job=job, **context)


@bp.get("/jobs/<uuid:job_id>")
def job(job_id: uuid.UUID):
    return _job_page(job_id)


@bp.post("/jobs/<uuid:job_id>/replay")
def replay(job_id: uuid.UUID):
    reason = request.form.get("reason", "")
    try:
        operations.replay(_services(), job_id, operator=principal(), reason=reason)
    except operations.MissingReason:
        return _job_page(job_id, 400, error="A replay needs a reason: say why it should work this time.",
                         reason=reason)
    except operations.NotFound:
        return _message(404, "No such job", f"There is no job {job_id}.")
    except operations.Conflict as exc:
        return _message(409, "Cannot replay", str(exc))
    log.info("console: %s replayed job %s", principal(), job_id)
    flash(f"Job {job_id} replayed: it is queued again.")
    return redirect(url_for("console.job", job_id=job_id), code=303)


# --- dead letters -------------------------------------------------------------------


def _unknown_queue(queue: str):
    return _message(404, "No such queue", f"{queue} is not an attache dead-letter queue.")


@bp.get("/dlq")
def dlq():
    try:
        queues = _dead_letters().queues()
    except (AttacheError, OSError) as exc:
        return _page("dlq.html", 503, queues=None, dlq_error=_broker_down(exc))
    return _page("dlq.html", queues=queues)


@bp.get("/dlq/<queue>")
def dlq_queue(queue: str):
    try:
        messages = _dead_letters().messages(queue, limit=200)
    except ValueError:
        return _unknown_queue(queue)
    except (AttacheError, OSError) as exc:
        return _page("dlq.html", 503, queue=queue, messages=None, dlq_error=_broker_down(exc))
    for message in messages:
        body = message.get("body")
        job_id = (message.get("recorded") or {}).get("job_id") or (body.get("job_id") if isinstance(body, dict)
                                                                     else None)
        message["job_id"] = job_id if _is_uuid(job_id) else None
    return _page("dlq.html", queue=queue, messages=messages)


def _is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return value is not None


def _reason() -> str | None:
    return request.form.get("reason", "").strip()[:1000] or None


@bp.post("/dlq/<queue>/requeue")
def dlq_requeue(queue: str):
    scope = request.form.get("scope")
    ids = None
    if scope == "selected":
        ids = [i for i in request.form.getlist("message_id") if i]
        if not ids:
            return _message(400, "Nothing selected", "Tick the messages to requeue, or use “Requeue all”.")
    elif scope != "all":
        return _message(400, "Bad request", "Choose “Requeue selected” or “Requeue all”.")
    try:
        result = _dead_letters().requeue(queue, actor=f"operator:{principal()}", message_ids=ids, reason=_reason())
    except ValueError:
        return _unknown_queue(queue)
    except (AttacheError, OSError) as exc:
        return _message(503, "RabbitMQ unavailable", f"{_broker_down(exc)}; nothing more was requeued. "
                                                     "Any part already moved is in the audit log.")
    text = f"Requeued {result['requeued']} message(s) from {queue}."
    if result["not_found"]:
        text += f" Not found (already gone or held by another operator): {', '.join(result['not_found'])}."
    flash(text)
    return redirect(url_for("console.dlq_queue", queue=queue), code=303)


@bp.post("/dlq/<queue>/purge")
def dlq_purge(queue: str):
    if request.form.get("confirm") != "yes":
        return _message(400, "Not confirmed", "Purging deletes the messages for good: tick the confirmation box.")
    try:
        result = _dead_letters().purge(queue, actor=f"operator:{principal()}", reason=_reason())
    except ValueError:
        return _unknown_queue(queue)
    except (AttacheError, OSError) as exc:
        return _message(503, "RabbitMQ unavailable", f"{_broker_down(exc)}; nothing was purged.")
    flash(f"Purged {result['purged']} message(s) from {queue}.")
    return redirect(url_for("console.dlq_queue", queue=queue), code=303)
