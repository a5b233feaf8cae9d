"""``/ops``: the operator console, server-rendered HTML for people (``/v1/ops`` is the JSON API).

Login
    ``POST /ops/login`` takes an operator's API token once and keeps only
    ``principal`` and ``role`` in the signed session cookie (never the token).
    GET pages also accept ``Authorization: Bearer <operator token>`` so curl
    works without a session. A session stays valid only while the token it
    signed in with is still an operator's (replacing or revoking the token
    ends the session), for at most :data:`SESSION_MAX_AGE_SECONDS`, and until
    ``POST /ops/logout`` (which ends every copy of the cookie).
CSRF
    Every POST (login included) carries ``csrf_token``, compared in constant
    time with the token in the session; a mismatch is 400 and changes nothing.
    ``SameSite=Lax`` cookies and ``form-action 'self'`` are a second fence.
No JavaScript
    Confirmations are form fields (purge needs its ``confirm`` box ticked),
    so the pages work with the strict Content-Security-Policy below.
Dead letters
    Requeue and purge act on the ticked message ids, or on "all" with the
    queue's depth as the page showed it (a hidden ``expected`` field): a
    queue holding more by then is refused with 409 and nothing is done.
Finding an upload
    The search box on every page (``/ops/search?q=``, :mod:`app.core.search`)
    goes straight to the attachment's page when one attachment matches
    (``/ops/attachments/<id>``: every pipeline version's job with its
    timeline and derivatives, :mod:`app.core.timeline`), else lists the
    matches. ``/ops/jobs`` lists jobs with filters, a page at a time
    (:func:`app.core.operations.find_jobs`).
Webhooks
    ``/ops/webhooks`` (:mod:`app.web.console_webhooks`, on this blueprint):
    subscriptions, failing deliveries, register, disable and redeliver
    through :mod:`app.core.webhooks`.
Charts
    The dashboard draws the last hour or day (``?window=day``) from
    PostgreSQL as inline SVG (:mod:`app.web.activity_charts`), so the CSP
    needs nothing more. Dashboards asked for the same window at the same
    time share one read of their numbers (:func:`dashboard`). Thumbnails
    are the download endpoints'; when those redirect to presigned S3 URLs,
    ``img-src`` names the storage's origin.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timezone
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    url_for,
)

from app.adapters.postgres.models import JobState
from app.core import activity, operations, timeline
from app.core import search as finder
from app.core.auth import Identity, authenticate, token_for
from app.errors import (
    AttacheError,
    AttachmentNotFound,
    BadSelection,
    BrokerUnavailable,
    DatabaseUnavailable,
    JobConflict,
    JobNotFound,
    MissingReason,
    MoreThanExpected,
    OutcomeUnknown,
    QueryTimeout,
    QueueBusy,
    StorageUnavailable,
    UnknownQueue,
)
from app.web.access import (
    NOT_SIGNED_OUT,
    csrf_token,
    end_session,
    form_csrf_ok,
    local_developer,
    session_identity,
    start_session,
)
from app.web.activity_charts import dashboard_charts
from app.web.responses import status_of
from app.web.shared_reads import SharedReads

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
#: dead letters shown on a queue's page (the page also shows how many the queue holds)
LISTED = 200
#: jobs on a page of the console's job list
JOBS_PAGE = 50


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
    origin = _image_origin()
    if origin:
        response.headers["Content-Security-Policy"] += f"; img-src 'self' {origin}"
    return response


def _image_origin() -> str:
    """Where thumbnails come from besides this site: the storage's origin when downloads redirect to it.

    With S3 and ``ATTACHE_PRESIGN_SECONDS`` the download endpoints answer
    with a presigned URL on the storage host; ``img-src 'self'`` would block
    the image. Computed once per process from one presigned URL (made
    locally, nothing is fetched); empty for the filesystem store.
    """
    found = current_app.extensions.get("attache_console_image_origin")
    if found is None:
        services = _services()
        found = ""
        if services.settings.presign_seconds:
            try:
                url = services.storage.presigned_url("attachments/console-probe", 60)
            except AttacheError:
                return ""  # asked again on the next page
            if url:
                parts = urlsplit(url)
                found = f"{parts.scheme}://{parts.netloc}"
        current_app.extensions["attache_console_image_origin"] = found
    return found


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


@bp.app_template_filter("when_ms")
def when_ms(value) -> str:
    """An ISO timestamp as ``YYYY-MM-DD HH:MM:SS.mmm UTC``: steps of one second stay apart."""
    if not value:
        return "—"
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(timezone.utc)
    return parsed.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


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
    found = token_for(_tokens(), f"Bearer {presented}") if presented else None
    if found is None:
        log.info("console: login refused (unknown token)")
        return _page("login.html", 401, error="That token is not valid.")
    if found.identity.role != OPERATOR:
        log.info("console: login refused for %s (role %s)", found.identity.principal, found.identity.role)
        return _page("login.html", 403, error="This console is for operators; that token has another role.")
    start_session(found)
    return redirect(url_for("console.dashboard"), code=303)


@bp.post("/logout")
def logout():
    try:
        end_session()
    except DatabaseUnavailable:
        return _message(503, "Not signed out", NOT_SIGNED_OUT) + ({"Retry-After": "5"},)
    return redirect(url_for("console.login_form"), code=303)


# --- dashboard and jobs -------------------------------------------------------------


def _dead_letters():
    return _services().dead_letters


def _broker_down(exc: Exception) -> str:
    """Which service a dead-letter page could not reach: PostgreSQL (the tools' lock and audit rows are there) or
    RabbitMQ. Every failure was called RabbitMQ's, PostgreSQL outages included (an adversarial run)."""
    service = "PostgreSQL" if isinstance(exc, DatabaseUnavailable) else "RabbitMQ"
    log.warning("console: %s unavailable: %s", service, exc)
    return f"{service} is unavailable"


def _queue_busy(queue: str):
    return _message(status_of(QueueBusy), "Queue busy",
                    f"Another operator's listing, requeue or purge of {queue} is under way: nothing was done. "
                    "Try again when it is over.")


#: where a web process keeps each window's :class:`SharedReads` of the dashboard
DASHBOARD_READS = "attache.dashboard"


def _dashboard_numbers(window: str) -> dict:
    """Everything the dashboard shows for ``window``: the dead-letter queues (or why not), the jobs per state, the
    outbox and the leases, the failed jobs and the charts (or why not)."""
    services = _services()
    queues, dlq_error = None, None
    try:
        queues = _dead_letters().queues()
    except (AttacheError, OSError) as exc:
        dlq_error = _broker_down(exc)
    charts, charts_error = None, None
    try:
        charts = dashboard_charts(activity.activity(services.engine, window))
    except QueryTimeout as exc:
        log.warning("console: charts not drawn: %s", exc)
        charts_error = f"The charts took too long to compute ({exc})."
    counts, counts_error = None, None
    try:  # kept counts, under a time limit: a lock on them (a migration, a VACUUM FULL) is a line, not a 500
        counts = operations.counts_by_state(services)
    except QueryTimeout as exc:
        log.warning("console: jobs by state not counted: %s", exc)
        counts_error = f"The jobs by state took too long to count ({exc})."
    return {"counts": counts, "counts_error": counts_error, "outbox": operations.outbox_status(services),
            "leases": operations.lease_status(services), "queues": queues, "dlq_error": dlq_error,
            "failed": operations.list_jobs(services, state=JobState.FAILED), "charts": charts,
            "charts_error": charts_error}


@bp.get("/")
@bp.get("")  # registered first (decorators apply bottom-up): url_for gives /ops
def dashboard():
    """The dashboard, its numbers read once for the requests for the same window that arrive together
    (:class:`~app.web.shared_reads.SharedReads`, as ``/metrics``): its day took some 0.5 s (360 ms of it in
    PostgreSQL at 200,000 jobs), and 20 loads at once made an upload's 202 take 1.7-2.3 s (an adversarial review)."""
    window = request.args.get("window", "hour")
    if window not in activity.WINDOWS:
        return _message(404, "No such window", f"Charts cover {' or '.join(activity.WINDOWS)}.")
    reads = current_app.extensions.setdefault(DASHBOARD_READS, {}).setdefault(window, SharedReads())
    return _page("dashboard.html", window=window, windows=list(activity.WINDOWS),
                 **reads.get(lambda: _dashboard_numbers(window)))


# --- search, attachments and job lists ------------------------------------------------


@bp.get("/search")
def search():
    typed = request.args.get("q", "")
    if not typed.strip():
        return _page("search.html", q="", result=None)
    try:
        result = finder.search(_services().engine, typed)
    except (ValueError, QueryTimeout) as exc:  # nothing to search for, or too broad to finish
        return _page("search.html", 400, q=typed, result=None, error=str(exc))
    one = finder.landing(result)
    if one is not None:
        typed_jobs = one["matched_job_ids"]
        return redirect(url_for("console.attachment", attachment_id=one["attachment_id"],
                                _anchor=f"job-{typed_jobs[0]}" if typed_jobs else None))
    return _page("search.html", 404 if not result["matches"] else 200, q=typed, result=result)


@bp.get("/attachments/<uuid:attachment_id>")
def attachment(attachment_id: uuid.UUID):
    try:
        overview = timeline.attachment_overview(_services().engine, attachment_id)
    except AttachmentNotFound as exc:
        return _message(status_of(exc), "No such attachment", f"There is no attachment {attachment_id}.")
    return _page("attachment.html", attachment=overview["attachment"], jobs=overview["jobs"])


@bp.get("/jobs")
def jobs():
    args = request.args
    try:
        filters = operations.JobFilter.parse(args)
        page = operations.find_jobs(_services().engine, filters, cursor=args.get("cursor") or None, limit=JOBS_PAGE)
    except ValueError as exc:
        return _page("jobs.html", 400, args=args, page=None, error=str(exc), states=list(JobState))
    next_url = url_for("console.jobs", **filters.as_params(), cursor=page["next_cursor"]) \
        if page["next_cursor"] else None
    first_url = url_for("console.jobs", **filters.as_params()) if args.get("cursor") else None
    return _page("jobs.html", args=args, page=page, next_url=next_url, first_url=first_url,
                 states=list(JobState))


def _job_page(job_id: uuid.UUID, status: int = 200, **context):
    try:
        job = operations.show_job(_services(), job_id)
        detail = timeline.job_detail(_services().engine, job_id)
    except JobNotFound as exc:
        return _message(status_of(exc), "No such job", f"There is no job {job_id}.")
    return _page("job.html", status, job=job, detail=detail, **context)


@bp.get("/jobs/<uuid:job_id>")
def job(job_id: uuid.UUID):
    return _job_page(job_id)


@bp.post("/jobs/<uuid:job_id>/replay")
def replay(job_id: uuid.UUID):
    reason = request.form.get("reason", "")
    try:
        operations.replay(_services(), job_id, operator=principal(), reason=reason)
    except MissingReason as exc:
        return _job_page(job_id, status_of(exc), error="A replay needs a reason: say why it should work this time.",
                         reason=reason)
    except JobNotFound as exc:
        return _message(status_of(exc), "No such job", f"There is no job {job_id}.")
    except JobConflict as exc:
        return _message(status_of(exc), "Cannot replay", str(exc))
    except StorageUnavailable as exc:
        return _message(status_of(exc), "Cannot replay now",
                        exc.detail if exc.where is None else "Storage is unavailable; try again in a while.")
    log.info("console: %s replayed job %s", principal(), job_id)
    flash(f"Job {job_id} replayed: it is queued again.")
    return redirect(url_for("console.job", job_id=job_id), code=303)


# --- dead letters -------------------------------------------------------------------


def _unknown_queue(queue: str):
    return _message(status_of(UnknownQueue), "No such queue", f"{queue} is not an attache dead-letter queue.")


@bp.get("/dlq")
def dlq():
    try:
        queues = _dead_letters().queues()
    except (AttacheError, OSError) as exc:
        return _page("dlq.html", status_of(BrokerUnavailable), queues=None, dlq_error=_broker_down(exc))
    return _page("dlq.html", queues=queues)


@bp.get("/dlq/<queue>")
def dlq_queue(queue: str):
    try:
        listing = _dead_letters().listing(queue, limit=LISTED)
    except UnknownQueue:
        return _unknown_queue(queue)
    except QueueBusy:
        return _queue_busy(queue)
    except (AttacheError, OSError) as exc:
        return _page("dlq.html", status_of(BrokerUnavailable), queue=queue, messages=None,
                     dlq_error=_broker_down(exc))
    messages = listing["messages"]
    for message in messages:
        body = message.get("body")
        job_id = (message.get("recorded") or {}).get("job_id") or (body.get("job_id") if isinstance(body, dict)
                                                                     else None)
        message["job_id"] = job_id if _is_uuid(job_id) else None
    return _page("dlq.html", queue=queue, messages=messages, depth=listing["depth"])


def _is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return value is not None


def _reason() -> str | None:
    return request.form.get("reason", "").strip()[:1000] or None


def _chosen(verb: str) -> dict:
    """The form's choice as keyword arguments of the action; BadSelection when there is none."""
    scope = request.form.get("scope")
    if scope == "selected":
        ids = [i for i in request.form.getlist("message_id") if i]
        if not ids:
            raise BadSelection(f"Tick the messages to {verb}, or use “{verb.capitalize()} all”.")
        return {"message_ids": ids}
    if scope == "all":
        expected = request.form.get("expected", type=int)
        if expected is None or expected < 1:
            raise BadSelection("“All” needs the count this page showed; reload the page and try again.")
        return {"expected": expected}
    raise BadSelection(f"Choose “{verb.capitalize()} selected” or “{verb.capitalize()} all”.")


def _act(verb: str, queue: str):
    """Requeue or purge what the form chose; a flash and back to the queue, or a page saying why not."""
    try:
        chosen = _chosen(verb)
        action = getattr(_dead_letters(), verb)
        result = action(queue, actor=f"operator:{principal()}", reason=_reason(), **chosen)
    except UnknownQueue:
        return _unknown_queue(queue)
    except BadSelection as exc:
        return _message(status_of(exc), "Nothing chosen", str(exc))
    except MoreThanExpected as exc:
        return _message(status_of(exc), "The queue has changed",
                        f"{exc.xq} now holds {exc.depth} message(s), more than the {exc.expected} this page showed: "
                        f"nothing was {verb}d. Look at the queue again.")
    except QueueBusy:
        return _queue_busy(queue)
    except OutcomeUnknown as exc:  # the PostgreSQL broker's COMMIT went unanswered: done, or not at all
        return _message(status_of(exc), f"Maybe {verb}d",
                        f"{exc}. The audit log's row for this action says unknown and lists them.")
    except DatabaseUnavailable as exc:  # the audit row may not say what was done: it is in PostgreSQL
        return _message(status_of(exc), "PostgreSQL unavailable",
                        f"{_broker_down(exc)}; nothing more was {verb}d. What was done before is in the audit "
                        "log once PostgreSQL is back, unless its row still says intent: then look at the queue.")
    except (AttacheError, OSError) as exc:
        return _message(status_of(BrokerUnavailable), "RabbitMQ unavailable",
                        f"{_broker_down(exc)}; nothing more was {verb}d. What was already done is in the audit log.")
    text = f"{verb.capitalize()}d {result[verb + 'd']} message(s) from {queue}."
    if result["not_found"]:
        text += f" Not found (already gone or held by another operator): {', '.join(result['not_found'])}."
    log.info("console: %s %sd %s message(s) from %s", principal(), verb, result[verb + "d"], queue)
    flash(text)
    return redirect(url_for("console.dlq_queue", queue=queue), code=303)


@bp.post("/dlq/<queue>/requeue")
def dlq_requeue(queue: str):
    return _act("requeue", queue)


@bp.post("/dlq/<queue>/purge")
def dlq_purge(queue: str):
    if request.form.get("confirm") != "yes":
        return _message(400, "Not confirmed", "Purging deletes the messages for good: tick the confirmation box.")
    return _act("purge", queue)
