"""Who may do what: bearer tokens from ``ATTACHE_API_TOKENS``.

``TOKEN=PRINCIPAL:ROLE`` entries, comma-separated; roles ``uploader`` (its
own attachments only) and ``operator`` (everything, and ``/v1/ops``).
Tokens are compared in constant time and never logged. In development mode
(``ATTACHE_DEV=1``, what ``make up`` sets) with no tokens configured, one
operator token for the principal ``dev`` is created once under ``var/``.
Outside development mode, no tokens means no access.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from app.errors import ConfigError

ROLES = ("uploader", "operator")
_PRINCIPAL = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")
DEV_TOKEN_PATH = Path("var/dev-token")


@dataclass(frozen=True)
class Identity:
    principal: str
    role: str

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"

    def __repr__(self) -> str:  # never carries the token
        return f"Identity({self.principal}:{self.role})"


@dataclass(frozen=True)
class Token:
    secret: str
    identity: Identity

    def __repr__(self) -> str:
        return f"Token(<hidden>, {self.identity!r})"


def parse_tokens(name: str, raw: str) -> tuple[Token, ...]:
    tokens = []
    for index, entry in enumerate(item.strip() for item in raw.split(",")):
        if not entry:
            continue
        secret, sep, rest = entry.partition("=")
        principal, sep2, role = rest.partition(":")
        where = f"{name} entry {index + 1}"
        if not sep or not sep2:
            raise ConfigError(f"{where} must look like TOKEN=PRINCIPAL:ROLE")
        if len(secret) < 8 or any(ch.isspace() for ch in secret):
            raise ConfigError(f"{where}: a token must be at least 8 characters with no spaces")
        if not _PRINCIPAL.match(principal):
            raise ConfigError(f"{where}: principal must match {_PRINCIPAL.pattern}")
        if role not in ROLES:
            raise ConfigError(f"{where}: role must be one of {', '.join(ROLES)}")
        tokens.append(Token(secret, Identity(principal, role)))
    if len({t.secret for t in tokens}) != len(tokens):
        raise ConfigError(f"{name} lists the same token twice")
    return tuple(tokens)


def dev_token(path: Path = DEV_TOKEN_PATH) -> Token:
    """The development token, created once (atomically) and then reused."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        secret = path.read_text().strip()
    else:
        secret = "dev-" + secrets.token_urlsafe(24)
        with os.fdopen(fd, "w") as fh:
            fh.write(secret + "\n")
    return Token(secret, Identity("dev", "operator"))


def effective_tokens(configured: tuple[Token, ...], dev_mode: bool) -> tuple[Token, ...]:
    if configured or not dev_mode:
        return configured
    return (dev_token(),)


def token_for(tokens: tuple[Token, ...], header: str | None) -> Token | None:
    """The configured token an ``Authorization: Bearer …`` header presents, or None."""
    if not header:
        return None
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return None
    presented_bytes = presented.strip().encode()
    found = None
    for token in tokens:  # compare against every token: time does not depend on which matched
        if hmac.compare_digest(token.secret.encode(), presented_bytes):
            found = token
    return found


def authenticate(tokens: tuple[Token, ...], header: str | None) -> Identity | None:
    """The identity for an ``Authorization: Bearer …`` header, or None."""
    found = token_for(tokens, header)
    return found.identity if found is not None else None
