"""The Flask session cookie (the upload page and the ``/ops`` console): ``Secure`` whenever served over HTTPS.

The cookie is ``HttpOnly`` and ``SameSite=Lax`` always, and ``Secure`` when
the request came over HTTPS (``request.is_secure``, i.e. the WSGI URL scheme
is ``https``). Behind a TLS-terminating proxy, gunicorn sets that scheme from
the proxy's ``X-Forwarded-Proto: https`` only for proxies it trusts: the
addresses in ``FORWARDED_ALLOW_IPS`` (gunicorn's setting; default the local
machine). A browser on plain HTTP (``make up``) still signs in.
"""

from __future__ import annotations

from flask import Flask, request
from flask.sessions import SecureCookieSessionInterface


class SessionInterface(SecureCookieSessionInterface):
    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or request.is_secure
