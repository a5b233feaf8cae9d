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
