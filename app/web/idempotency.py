"""The ``Idempotency-Key`` header, read and checked once for every route that takes one."""

from __future__ import annotations

from app.core import resumable
from app.errors import UploadRejected


def idempotency_key(headers) -> str | None:
    """The request's ``Idempotency-Key``, checked (``400 bad_idempotency_key``); ``None`` without one. An upload's
    (``POST /v1/attachments``) and a resumable upload's creation's (``POST /v1/uploads``)."""
    raw = headers.get("Idempotency-Key")
    if raw is None:
        return None
    raw = raw.strip(" \t")  # a header's own whitespace (str.strip() took a no-break space off a key: a re-attack)
    quoted = len(raw) >= 2 and raw[0] == raw[-1] == '"'
    key = raw[1:-1] if quoted else raw
    # one key: gunicorn joins a header sent twice with a comma, so two keys reached intake as one, "a,b", and a
    # retry that sent them the other way round made a second attachment of one upload. A comma is refused
    # anywhere, quoted or not ('"k7' and 'k8"' sent twice were joined into one quoted key: a re-attack), and so
    # are a quote and a backslash (a structured field's escapes, which would make '"k\\1"' and 'k\1' one key
    # or two)
    if any(mark in key for mark in ',"\\'):
        raise UploadRejected("send one Idempotency-Key, without commas, quotes or backslashes in it: the header "
                             "came as a list (sent twice), or with a character a list or an escape is made of",
                             error_code="bad_idempotency_key")
    # ASCII, as a structured field's string is (RFC 8941): a header's bytes reach WSGI as Latin-1, so a UTF-8 key
    # was kept as mojibake, or refused, by its bytes (an adversarial run)
    if not key or len(key) > 255 or not key.isascii() or not key.isprintable():
        raise UploadRejected("Idempotency-Key must be 1-255 printable ASCII characters",
                             error_code="bad_idempotency_key")
    if key.startswith(resumable.HANDOFF_KEY_PREFIX):  # a POST under a tus upload's key made its last PATCH fail
        raise UploadRejected(f"an Idempotency-Key may not begin with {resumable.HANDOFF_KEY_PREFIX!r} (resumable "
                             "uploads' own)", error_code="bad_idempotency_key")
    return key
