"""The Flask application factory (``web`` in the Procfile, under gunicorn).

Blueprints never import the app: they reach shared objects through
``current_app.extensions["attache"]`` (a :class:`~app.services.Services`).
"""

from __future__ import annotations

import hashlib

from flask import Flask
from flask import request as current_request  # the package's own ``request`` is app.web.request
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from werkzeug.exceptions import HTTPException

from app.config import Settings
from app.core.auth import effective_tokens
from app.errors import (
    DatabaseUnavailable,
    MadeUnread,
    OutcomeUnknown,
    StorageUnavailable,
    TooManyDownloadsAtOnce,
    TooManyReadsAtOnce,
    UploadRejected,
)
from app.observability import logs
from app.services import Services, exit_on_config_error, settings_or_exit
from app.web import lingering_close, parse_errors, reads_in_flight, request_head
from app.web.bodies_in_flight import BodiesInFlight
from app.web.connection import UNREAD_BODY, CloseUnreadBodies
from app.web.expect_continue import ContinueOnFirstRead
from app.web.request import ABANDONED_SPOOLS, UploadRequest
from app.web.responses import error, refusal
from app.web.session import SessionInterface


def create_app(settings: Settings | None = None) -> Flask:
    if settings is None:
        settings = settings_or_exit("web")
        logs.configure("web")
    app = Flask(__name__)
    app.request_class = UploadRequest
    # body limits per route, spooling only for the upload view, spools removed at the request's end
    with exit_on_config_error("web"):  # a storage URL it cannot use stops it here, not in its first request
        app.extensions["attache"] = Services(settings, pool_size=10, process="web")
        app.extensions["attache"].storage  # noqa: B018 - built now (no request is made)
    # spools of a process killed mid-upload (the one this worker may replace)
    ABANDONED_SPOOLS.sweep(settings.body_idle_seconds)
    app.extensions["attache_tokens"] = effective_tokens(settings.api_tokens, settings.dev_mode)
    # one uploader's bodies arriving at once, bounded per process (ATTACHE_MAX_BODIES_PER_UPLOADER)
    app.extensions["attache_bodies"] = BodiesInFlight(settings.max_bodies_per_uploader)
    app.extensions["attache_answers"] = BodiesInFlight(  # and the downloads it streams to one client at once
        settings.max_downloads_per_client, TooManyDownloadsAtOnce, "downloads being sent by this server at once")
    app.extensions["attache_reads"] = BodiesInFlight(  # and the reads of the API and console it answers one at once
        settings.max_reads_per_client, TooManyReadsAtOnce, "reads being answered by this server at once")
    lingering_close.install()  # under gunicorn gthread: a client that keeps its side open never holds the accept loop
    request_head.install(settings.body_idle_seconds)  # under gunicorn gthread: a thread only for a request here
    parse_errors.install()  # under gunicorn: what it cannot parse is refused in JSON, as the API refuses
    # signs the /ops console's session cookie; derived from the tokens when unset, so every worker agrees
    app.secret_key = settings.secret_key or hashlib.sha256(
        b"attache-session:" + ",".join(sorted(t.secret for t in app.extensions["attache_tokens"])).encode()
    ).hexdigest()
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax")
    app.session_interface = SessionInterface()  # Secure over HTTPS

    from app.web import attachments, events, health, metrics, openapi, ops, tus

    # each client's reads in flight, bounded per process (ATTACHE_MAX_READS_PER_CLIENT): uploads and downloads aside
    for bounded in (attachments.bp, ops.bp, events.bp):
        reads_in_flight.bound(bounded)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(attachments.bp)
    app.register_blueprint(tus.bp)  # resumable uploads (tus 1.0)
    app.register_blueprint(tus.discovery)
    # 100 Continue on the body's first read (the route refuses on the head first)
    app.wsgi_app = CloseUnreadBodies(ContinueOnFirstRead(tus.MethodOverride(app.wsgi_app)))
    app.register_blueprint(health.bp)
    app.register_blueprint(ops.bp)
    app.register_blueprint(events.bp)  # the replay cursor of completion events
    app.register_blueprint(metrics.bp)
    from app.web import console  # the /ops operator console (HTML, login session)
    from app.web import console_webhooks  # noqa: F401  its webhooks page, on the same blueprint

    reads_in_flight.bound(console.bp)  # its pages, operators' reads too
    app.register_blueprint(console.bp)
    from app.web import (
        page,  # the upload page at / (HTML + static/upload.js, same session)
    )

    app.register_blueprint(page.bp)

    @app.after_request
    def close_after_an_unread_body(response):
        if current_request.body_unread():
            current_request.environ[UNREAD_BODY] = True
        return response

    @app.errorhandler(DatabaseUnavailable)
    @app.errorhandler(OperationalError)
    @app.errorhandler(PoolTimeout)  # every connection of the process's pool busy (long queries): not a bug, a 503
    def database_unavailable(exc):  # psycopg2's text never reaches a client
        return refusal(DatabaseUnavailable(), "the database is unavailable; retry later")

    @app.errorhandler(OutcomeUnknown)
    @app.errorhandler(MadeUnread)
    def database_unavailable_saying_what_was_done(exc: DatabaseUnavailable):  # their words are attache's own
        return refusal(exc)

    @app.errorhandler(StorageUnavailable)
    def storage_unavailable(exc: StorageUnavailable):  # an operator's replay, say: a 503, never a 500
        return refusal(exc, exc.detail if exc.where is None else "storage is unavailable; retry later")

    @app.errorhandler(UploadRejected)
    def upload_rejected(exc: UploadRejected):  # a body refused outside the upload view's own handling
        return refusal(exc)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        code = {413: "too_large", 404: "not_found", 405: "method_not_allowed"}.get(exc.code, "http_error")
        return error(exc.code, code, exc.description)

    return app
