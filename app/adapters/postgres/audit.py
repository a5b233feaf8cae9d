"""The operators' audit trail: one row per action.

Most actions write their row in their own transaction. An action outside
PostgreSQL (the dead-letter tools acting on RabbitMQ) writes it *before*
acting, with ``details.status = "intent"``, and :func:`complete`s it after.
"""

from __future__ import annotations

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from app.adapters.postgres.models import audit_log


def clean(text: str | None, limit: int = 1000) -> str | None:
    """Operator-typed text made storable: no NUL or other control characters but newlines, bounded."""
    if text is None:
        return None
    return "".join(ch for ch in str(text) if ch in "\n\t" or ch.isprintable())[:limit]


def _refused(ch: str) -> bool:
    """A character PostgreSQL's ``text`` and JSONB cannot hold: NUL, or a lone surrogate."""
    return ch == "\x00" or "\ud800" <= ch <= "\udfff"


def storable(text: str, *, printable: bool = False) -> str:
    """``text`` as PostgreSQL can hold it, every other character as it is: the characters it refuses (NUL, a lone
    surrogate) written as their escapes (``\\x00``, ``\\ud800``), and with ``printable`` every character that is
    not printable, and the backslash (so no two texts are written alike: ``a\\x00`` is not ``a`` and a NUL). For
    what must stay recognisable, such as a message id someone else chose, where :func:`clean` would drop them."""
    escape = (lambda ch: ch == "\\" or not ch.isprintable()) if printable else _refused
    if not any(map(escape, text)):
        return text
    return "".join(ch.encode("unicode_escape").decode("ascii") if escape(ch) else ch for ch in text)


def record(conn: Connection, *, actor: str, action: str, target: str, reason: str | None = None,
           details: dict | None = None) -> int:
    reason = clean(reason)
    return conn.execute(insert(audit_log).values(actor=actor, action=action, target=target, reason=reason,
                                                 details=details).returning(audit_log.c.id)).scalar_one()


def for_target(conn: Connection, target: str) -> list[dict]:
    rows = conn.execute(select(audit_log).where(audit_log.c.target == target).order_by(audit_log.c.id)).all()
    return [{"at": r.at.isoformat(), "actor": r.actor, "action": r.action, "reason": r.reason,
             "details": r.details} for r in rows]


def complete(conn: Connection, audit_id: int, details: dict) -> None:
    """Replace the details of an ``intent`` row written before the action with what the action did."""
    conn.execute(update(audit_log).where(audit_log.c.id == audit_id).values(details=details))
