"""Access control for the blueprints: 401 without a valid token, 403 for the wrong role.

Blueprints call :func:`protect` to install a ``before_request`` hook; views
read the caller from :func:`identity`.
"""

from __future__ import annotations

from flask import Blueprint, current_app, g, jsonify, request

from app.auth import Identity, authenticate


def identity() -> Identity:
    return g.attache_identity


def _deny(status: int, code: str, message: str):
    response = jsonify(error=code, message=message)
    response.status_code = status
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="attache"'
    return response


def protect(blueprint: Blueprint, *, role: str | None = None) -> None:
    """Every view of ``blueprint`` needs a valid token, and ``role`` if given."""

    @blueprint.before_request
    def check():
        tokens = current_app.extensions["attache_tokens"]
        found = authenticate(tokens, request.headers.get("Authorization"))
        if found is None:
            return _deny(401, "unauthorized", "send Authorization: Bearer <token>")
        if role is not None and found.role != role:
            return _deny(403, "forbidden", f"this needs the {role} role")
        g.attache_identity = found
        return None
