"""What an engine sends to PostgreSQL while a block runs: its statements, and where each COMMIT fell."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

from sqlalchemy import event


@dataclass
class SqlLog:
    statements: list[str] = field(default_factory=list)
    #: for each COMMIT, how many statements had been sent before it
    commits: list[int] = field(default_factory=list)


@contextlib.contextmanager
def sql_log(engine) -> Iterator[SqlLog]:
    log = SqlLog()

    def executed(conn, cursor, statement, *args):
        log.statements.append(statement)

    def committed(conn):
        log.commits.append(len(log.statements))

    event.listen(engine, "before_cursor_execute", executed)
    event.listen(engine, "commit", committed)
    try:
        yield log
    finally:
        event.remove(engine, "before_cursor_execute", executed)
        event.remove(engine, "commit", committed)
