"""The browser session cookie is Secure when the page is served over HTTPS, against real gunicorn.

gunicorn sets the request's scheme from ``X-Forwarded-Proto`` for trusted
proxies (``FORWARDED_ALLOW_IPS``, by default the local machine): the test
plays a TLS-terminating proxy on 127.0.0.1.
"""

from __future__ import annotations

import pytest
import requests

pytestmark = pytest.mark.processes



def session_cookie(web, path: str, **headers) -> str:
    response = requests.get(web.url + path, headers=headers, timeout=10, allow_redirects=False)
    cookie = response.headers.get("Set-Cookie", "")
    assert cookie.startswith("session="), (path, response.status_code, response.headers)
    return cookie


@pytest.mark.parametrize("path", ["/", "/ops/login"])
def test_session_cookie_is_secure_over_https_only(web, path):
    over_https = session_cookie(web, path, **{"X-Forwarded-Proto": "https"})
    assert "; Secure" in over_https and "; HttpOnly" in over_https and "SameSite=Lax" in over_https
    over_http = session_cookie(web, path)
    assert "; Secure" not in over_http, "a plain-HTTP page (make up) must still be able to sign in"
    assert "; HttpOnly" in over_http
