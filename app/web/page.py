"""``/``: the upload page for people (server-rendered HTML + ``static/upload.js``).

Sign-in
    Without a session, ``/`` shows a small sign-in form: an API token of either
    role (uploader or operator), sent once with the form's CSRF token. The
    Flask session then holds ``principal``, ``role``, ``since`` and its id exactly like
    the ``/ops`` console's (never the token), so an operator signed in on one is
    signed in on the other; an uploader's session is refused by the console.
    In development mode with no tokens configured, a request from the local
    machine is signed in as the development token's identity without typing.
Uploads
    The page's JavaScript sends each file as a resumable upload to
    ``/v1/uploads`` with tus-js-client (``static/tus.min.js``, vendored: see
    ``docs/dependencies.md``), in PATCHes of ``ATTACHE_UPLOAD_CHUNK_BYTES``, and
    polls ``GET /v1/attachments/{id}`` for the attachment the last PATCH names;
    all ride on the session (see :mod:`app.web.access`), the POST and PATCHes
    with the session's CSRF token in ``X-CSRF-Token``. The thumbnail ``<img>``
    does too. Both scripts are files: the page's CSP allows no inline script.
"""

from __future__ import annotations

import logging

from flask import (
    Blueprint,
    current_app,
    redirect,
    render_template,
    request,
    session,
    url_for,
)

from app.core.auth import Identity, token_for
from app.errors import DatabaseUnavailable
from app.web.access import (
    NOT_SIGNED_OUT,
    csrf_token,
    end_session,
    form_csrf_ok,
    local_developer,
    session_identity,
    start_session,
)

log = logging.getLogger(__name__)

bp = Blueprint("page", __name__)

SECURITY_HEADERS = {
    # img-src *: on S3 a thumbnail URL redirects to a presigned URL on the storage host
    "Content-Security-Policy": ("default-src 'self'; img-src 'self' data: blob: *; script-src 'self'; "
                                "style-src 'self' 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _tokens():
    return current_app.extensions["attache_tokens"]


def _settings():
    return current_app.extensions["attache"].settings


def limit_in_mb(max_bytes: int) -> str:
    """``50`` for 50 MiB, ``2.5`` for 2.5 MiB: the size limit as people read it."""
    megabytes = max_bytes / (1024 * 1024)
    return f"{megabytes:.1f}".removesuffix(".0") if megabytes >= 1 else f"{megabytes:.2g}"


def _sign_in_form(status: int = 200, error: str | None = None):
    return render_template("upload.html", who=None, error=error, csrf=csrf_token()), status


@bp.after_request
def security_headers(response):
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


@bp.get("/")
def index():
    who = session_identity()
    if who is None:
        developer = local_developer()
        if developer is None:
            return _sign_in_form()
        start_session(developer)
        who = developer.identity
    return _upload_page(who)


def _upload_page(who, status: int = 200, error: str | None = None, **headers):
    settings = _settings()
    return render_template("upload.html", who=who, csrf=csrf_token(), chunk_bytes=settings.upload_chunk_bytes,
                           max_bytes=settings.max_upload_bytes, max_mb=limit_in_mb(settings.max_upload_bytes),
                           error=error), status, headers


@bp.post("/")
def sign_in():
    if not form_csrf_ok():
        log.warning("page: CSRF check failed on sign-in")
        return _sign_in_form(400, "This form was not sent from this page (CSRF check failed). "
                                  "Reload the page and try again.")
    presented = request.form.get("token", "").strip()
    found = token_for(_tokens(), f"Bearer {presented}") if presented else None
    if found is None:
        log.info("page: sign-in refused (unknown token)")
        return _sign_in_form(401, "That token is not valid.")
    start_session(found)
    return redirect(url_for("page.index"), code=303)


@bp.post("/sign-out")
def sign_out():
    if form_csrf_ok():
        try:
            end_session()
        except DatabaseUnavailable:  # still signed in: the page says so (its principal as the cookie names it)
            who = Identity(session.get("principal"), session.get("role"))
            return _upload_page(who, 503, NOT_SIGNED_OUT, **{"Retry-After": "5"})
    return redirect(url_for("page.index"), code=303)
