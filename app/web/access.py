"""Access control for the blueprints: 401 without a valid token, 403 for the wrong role.

Blueprints call :func:`protect` to install a ``before_request`` hook; views
read the caller from :func:`identity`.

Callers send ``Authorization: Bearer <token>``. A request with no
``Authorization`` header may instead ride on the signed-in Flask session of
the upload page or the ``/ops`` console (``principal``, ``role``, ``since``),
which counts only while that principal still holds a configured token of that
role and for at most :data:`SESSION_MAX_AGE_SECONDS`; an unsafe method (POST…)
from a session must also carry the session's CSRF token in ``X-CSRF-Token``,
else ``403 csrf``. The session is what lets a browser's ``<img>`` and XHRs in
— they cannot add a bearer header.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from dataclasses import dataclass

from flask import Blueprint, current_app, g, request, session

from app.core.auth import ROLES, Identity, authenticate
from app.web.responses import error

#: how long a browser sign-in lasts (the console and the upload page share the session)
SESSION_MAX_AGE_SECONDS = 12 * 3600
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
LOOPBACK = ("127.0.0.1", "::1")

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

    Valid while a configured token still gives that principal that role (revoking
    the token ends its sessions) and for at most :data:`SESSION_MAX_AGE_SECONDS`.
    """
    principal, role, since = session.get("principal"), session.get("role"), session.get("since")
    if not isinstance(principal, str) or role not in ROLES or not isinstance(since, (int, float)):
        return None
    held = any(t.identity.principal == principal and t.identity.role == role
               for t in current_app.extensions["attache_tokens"])
    if not held or time.time() - since > SESSION_MAX_AGE_SECONDS:
        for key in ("principal", "role", "since"):
            session.pop(key, None)
        return None
    return Identity(principal, role)


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


def start_session(found: Identity) -> None:
    """Sign a browser in: a fresh session (no fixation) with a fresh CSRF token; never the token itself."""
    session.clear()
    session["principal"], session["role"], session["since"] = found.principal, found.role, int(time.time())
    session["csrf"] = secrets.token_urlsafe(32)
    log.info("%s signed in (%s)", found.principal, found.role)


def local_developer(role: str | None = None) -> Identity | None:
    """Development mode with no tokens configured: the local user is signed in without typing."""
    settings = current_app.extensions["attache"].settings
    if not settings.dev_mode or settings.api_tokens or request.remote_addr not in LOOPBACK:
        return None
    return next((t.identity for t in current_app.extensions["attache_tokens"]
                 if role is None or t.identity.role == role), None)


@dataclass(frozen=True)
class Protection:
    """What :func:`protect` requires of a blueprint's callers: a valid token, and ``role`` if not None."""

    role: str | None


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
