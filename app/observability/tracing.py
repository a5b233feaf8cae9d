"""W3C trace context (``traceparent``/``tracestate``) without an SDK.

attache depends only on ``opentelemetry-api``: the carrier is parsed and
generated here so it flows request -> job row -> outbox -> AMQP headers ->
worker logs even when no OpenTelemetry SDK is configured.
"""

from __future__ import annotations

import re
import secrets

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def valid_traceparent(value: str | None) -> bool:
    if not value:
        return False
    match = _TRACEPARENT.match(value.strip())
    return bool(match) and match.group(1) != "0" * 32 and match.group(2) != "0" * 16


def new_traceparent(trace_id: str | None = None) -> str:
    return f"00-{trace_id or secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def accept_traceparent(value: str | None) -> str:
    """The caller's traceparent when valid, else a fresh one."""
    return value.strip() if valid_traceparent(value) else new_traceparent()


def trace_id(traceparent: str) -> str:
    match = _TRACEPARENT.match(traceparent)
    return match.group(1) if match else ""


def child_of(traceparent: str) -> str:
    """Same trace, new span id: what a producer puts on an outgoing message."""
    tid = trace_id(traceparent)
    return new_traceparent(tid or None)


_TRACESTATE_MEMBER = re.compile(r"^[a-z0-9][_0-9a-z\-*/@]{0,255}=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]$")


def accept_tracestate(value: str | None) -> str | None:
    """The caller's W3C ``tracestate`` when well-formed (at most 32 members, 512 characters), else None.

    A malformed ``tracestate`` is dropped, as the W3C spec asks, never a reason to refuse an upload.
    """
    if not value:
        return None
    value = value.strip()
    members = [m.strip() for m in value.split(",") if m.strip()]
    if not members or len(value) > 512 or len(members) > 32 or not all(_TRACESTATE_MEMBER.match(m) for m in members):
        return None
    return ",".join(members)
