"""Browser sessions signed out: a signed cookie's copy refused after its session ended.

The session of the upload page and the ``/ops`` console is a signed cookie
(:mod:`app.web.access`); nothing of it is stored. Signing out names the
session's id in ``ended_sessions`` until the cookie would have expired
anyway, and a request riding on a named session is refused.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection

from app.adapters.postgres.models import ended_sessions


def end(conn: Connection, session_id: str, expires_at: datetime) -> None:
    """Refuse the session ``session_id`` from now on (its cookie is good until ``expires_at``); forget the
    sessions whose cookies are past their own."""
    conn.execute(delete(ended_sessions).where(ended_sessions.c.expires_at < func.now()))
    conn.execute(insert(ended_sessions).values(id=session_id, expires_at=expires_at).on_conflict_do_nothing())


def ended(conn: Connection, session_id: str) -> bool:
    return conn.execute(select(ended_sessions.c.id).where(ended_sessions.c.id == session_id)).first() is not None
