"""Access control for the blueprints: 401 without a valid token, 403 for the wrong role.

Blueprints call :func:`protect` to install a ``before_request`` hook; views
read the caller from :func:`identity`.

Callers send ``Authorization: Bearer <token>``. A request with no
``Authorization`` header may instead ride on the signed-in Flask session of
the upload page or the ``/ops`` console (``principal``, ``role``, ``since``, the
session's id ``sid`` and ``key``, a keyed hash of the token it signed in with),
which counts only while that token is still configured for that principal and
role, for at most :data:`SESSION_MAX_AGE_SECONDS`, and until it signs out
(:func:`end_session`: any copy of the cookie is refused from then on, see
:mod:`app.core.browser_sessions`); an unsafe method (POST…)
from a session must also carry the session's CSRF token in ``X-CSRF-Token``,
else ``403 csrf``. The session is what lets a browser's ``<img>`` and XHRs in
— they cannot add a bearer header.
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import urlsplit

from flask import Blueprint, current_app, g, request, session

from app.adapters.postgres.db import transaction
from app.core import browser_sessions
from app.core.auth import ROLES, Identity, Token, authenticate
from app.web.responses import error

#: how long a browser sign-in lasts (the console and the upload page share the session)
SESSION_MAX_AGE_SECONDS = 12 * 3600
#: how far ahead of this web's clock a session's sign-in time may be (another web signed it in; hosts' clocks differ
#: by this much at most); a sign-in time further ahead is made up, and would never expire
CLOCK_SKEW_SECONDS = 300
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
LOOPBACK = ("127.0.0.1", "::1")
#: the names the local developer's browser reaches a development server by; a page of another site whose name
#: resolves to 127.0.0.1 (DNS rebinding) sends its own name in ``Host`` and is not signed in
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
SESSION_KEYS = ("principal", "role", "since", "sid", "key")
#: what a sign-out that could not be recorded tells the browser
NOT_SIGNED_OUT = ("The database is unavailable, so this session could not be ended: you are still signed in, here "
                  "and wherever this session's cookie was copied. Try signing out again in a moment.")
#: a session's id, as :func:`start_session` makes it (``secrets.token_urlsafe(24)``)
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{32}")

log = logging.getLogger("attache.access")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def identity() -> Identity:
    return g.attache_identity


def _deny(status: int, code: str, message: str):
    if status == 401:
        return error(status, code, message, **{"WWW-Authenticate": 'Bearer realm="attache"'})
    return error(status, code, message)


def session_identity() -> Identity | None:
    """The signed-in principal of this browser session, or None.

    Valid while the token it signed in with is still configured for that
    principal and role (replacing or revoking the token ends its sessions),
    for at most :data:`SESSION_MAX_AGE_SECONDS`, and until it signs out.
    """
    principal, role, since, sid, key = (session.get(name) for name in SESSION_KEYS)
    if not isinstance(principal, str) or role not in ROLES or not isinstance(since, int) \
            or not isinstance(sid, str) or not SESSION_ID.fullmatch(sid) or not isinstance(key, str):
        return None
    claimed = Identity(principal, role)
    held = False
    for token in current_app.extensions["attache_tokens"]:  # every one compared, as authenticate() does
        held |= hmac.compare_digest(_fingerprint(token), key) and token.identity == claimed
    if not held or not -CLOCK_SKEW_SECONDS <= time.time() - since <= SESSION_MAX_AGE_SECONDS or _ended(sid):
        for name in SESSION_KEYS:
            session.pop(name, None)
        return None
    return claimed


def _fingerprint(token: Token) -> str:
    """What a session keeps of the token it signed in with: a hash keyed by the session's signing key (the
    cookie can be read by whoever holds it; a weak token cannot be guessed from it)."""
    return hmac.new(current_app.secret_key.encode(), b"attache-session-token:" + token.secret.encode(),
                    "sha256").hexdigest()


def _ended(sid: str) -> bool:
    """The session ``sid`` signed out (looked up once a request)."""
    if g.get("attache_session_ended") is None:
        with transaction(current_app.extensions["attache"].engine) as conn:
            g.attache_session_ended = browser_sessions.ended(conn, sid)
    return g.attache_session_ended


def end_session() -> None:
    """Sign this browser out: its session is refused from now on, this cookie's copies too. Raises
    :class:`DatabaseUnavailable` when that cannot be recorded; the browser then stays signed in (its callers say
    so), rather than believe itself signed out while a copy of its cookie still works."""
    sid, since = session.get("sid"), session.get("since")
    if session_identity() is not None:  # a valid session (an ended or made-up one has nothing to end)
        expires = datetime.fromtimestamp(since + SESSION_MAX_AGE_SECONDS, timezone.utc)
        with transaction(current_app.extensions["attache"].engine) as conn:
            browser_sessions.end(conn, sid, expires)
        log.info("%s signed out", session.get("principal"))
    session.clear()


def session_csrf_ok(presented: str | None) -> bool:
    """``presented`` equals this session's CSRF token (constant-time)."""
    expected = session.get("csrf")
    if not isinstance(expected, str) or not expected or not presented:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


def csrf_token() -> str:
    """This session's CSRF token, created on first use (also before sign-in, for the sign-in form)."""
    token = session.get("csrf")
    if not isinstance(token, str) or not token:
        token = session["csrf"] = secrets.token_urlsafe(32)
    return token


def form_csrf_ok() -> bool:
    """A form POST carries this session's CSRF token in its ``csrf_token`` field."""
    return session_csrf_ok(request.form.get(CSRF_FIELD, ""))


def start_session(token: Token) -> None:
    """Sign a browser in with ``token``: a fresh session (no fixation) with a fresh id and CSRF token; never the
    token itself."""
    session.clear()
    found = token.identity
    session["principal"], session["role"], session["since"] = found.principal, found.role, int(time.time())
    session["sid"], session["key"] = secrets.token_urlsafe(24), _fingerprint(token)
    session["csrf"] = secrets.token_urlsafe(32)
    log.info("%s signed in (%s)", found.principal, found.role)


def local_developer(role: str | None = None) -> Token | None:
    """Development mode with no tokens configured: the local user is signed in without typing (a request from
    this machine, to this machine by a local name)."""
    settings = current_app.extensions["attache"].settings
    if not settings.dev_mode or settings.api_tokens or request.remote_addr not in LOOPBACK \
            or _host_name() not in LOCAL_HOSTS:
        return None
    return next((t for t in current_app.extensions["attache_tokens"] if role is None or t.identity.role == role), None)


def _host_name() -> str | None:
    try:
        return urlsplit(f"//{request.host}").hostname
    except ValueError:  # an unbalanced "[" in Host
        return None


@dataclass(frozen=True)
class Protection:
    """What :func:`protect` requires of a blueprint's callers: a valid token, and ``role`` if not None; the API
    document also says where a read counts against ``ATTACHE_MAX_READS_PER_CLIENT`` (:mod:`app.web.reads_in_flight`)."""

    role: str | None
    reads_bounded: bool = False


def protection(blueprint: Blueprint | None) -> Protection | None:
    """What ``blueprint``'s views require (None: they are public); the API document states it."""
    return getattr(blueprint, "attache_protection", None)


def protect(blueprint: Blueprint, *, role: str | None = None) -> None:
    """Every view of ``blueprint`` needs a valid token (or session), and ``role`` if given."""
    blueprint.attache_protection = Protection(role)

    @blueprint.before_request
    def check():
        tokens = current_app.extensions["attache_tokens"]
        header = request.headers.get("Authorization")
        found = authenticate(tokens, header)
        if found is None and not header:
            found = session_identity()
            if found is not None and request.method not in SAFE_METHODS \
                    and not session_csrf_ok(request.headers.get(CSRF_HEADER)):
                return _deny(403, "csrf", f"a request from a browser session needs its {CSRF_HEADER} header")
        if found is None:
            return _deny(401, "unauthorized", "send Authorization: Bearer <token>")
        if role is not None and found.role != role:
            return _deny(403, "forbidden", f"this needs the {role} role")
        g.attache_identity = found
        return None
