"""``/healthz`` (the process answers) and ``/readyz`` (its dependencies answer).

``/readyz`` is cheap, however often an orchestrator probes it: PostgreSQL
answers ``SELECT 1`` on a pooled connection, RabbitMQ a passive declare on
the checker's open connection (no new connection per probe), storage a
probe write without fsync (or a bucket HEAD), the web's temporary directory
an empty file made and removed; one answer serves every probe
of the process for :data:`READY_CACHE_SECONDS`, and no probe waits longer
than :data:`READY_DEADLINE_SECONDS` (see :class:`Readiness`).
"""

from __future__ import annotations

import threading
import time

from flask import Blueprint, current_app
from sqlalchemy import text

from app.errors import AttacheError
from app.web import schemas, spool
from app.web.contract import ok, operation
from app.web.responses import answer

bp = Blueprint("health", __name__)

#: how long one readiness answer serves the probes of a process
READY_CACHE_SECONDS = 1.0
#: how long a probe waits for the checks before it answers 503 for what did not answer
READY_DEADLINE_SECONDS = 3.0
NO_ANSWER = f"unavailable: no answer within {READY_DEADLINE_SECONDS:g} s"


@bp.get("/healthz")
@operation("healthz", "Liveness: the process answers", tag="meta", database=False,
           answers={200: ok("Alive.", schemas.Liveness)})
def healthz():
    return answer(schemas.Liveness(status="ok"))


@bp.get("/readyz")
@operation("readyz", "Readiness: PostgreSQL, RabbitMQ and storage answer, and the temporary directory takes a file",
           tag="meta", database=False,
           answers={200: ok("Every dependency answers.", schemas.Readiness),
                    503: ok("At least one dependency does not answer (no Retry-After).", schemas.Readiness)})
def readyz():
    checks = _readiness().answer()
    ready = all(value == "ok" for value in checks.values())
    return answer(schemas.Readiness(status="ready" if ready else "unavailable", checks=checks), 200 if ready else 503)


_CREATE = threading.Lock()


def _readiness() -> "Readiness":
    with _CREATE:
        return current_app.extensions.setdefault("attache_readiness", Readiness(current_app.extensions["attache"]))


class Readiness:
    """A thread of its own per check runs it; probes wait for their answers at most a deadline.

    A dependency that stops answering mid-connection (a frozen host, a
    partition) blocks a read with no client-side deadline. Run in the probe's
    own thread, that hung every probe and, once the web's threads were all
    waiting, the whole process, ``/healthz`` included. Here only that check's
    thread waits; a probe gets ``503`` naming what did not answer within
    :data:`READY_DEADLINE_SECONDS`, and the others' answers. The checks ran one
    after another in one thread, so one that hung left the later ones unrun,
    and a probe named healthy dependencies as down: RabbitMQ black-holed,
    storage and the spool too (an adversarial run). The broker's thread keeps
    one broker connection for every check.
    """

    def __init__(self, services):
        self.changed = threading.Condition()
        self.checks = {name: _Check(probe) for name, probe in _probes(services).items()}
        self.answered: dict[str, str] = {}
        self.at: float | None = None

    def answer(self) -> dict[str, str]:
        deadline = time.monotonic() + READY_DEADLINE_SECONDS
        with self.changed:
            if self.at is not None and time.monotonic() - self.at < READY_CACHE_SECONDS:
                return dict(self.answered)
            asked = {}
            for name, check in self.checks.items():
                if check.thread is None:
                    check.thread = threading.Thread(target=self._run, args=(check,), name=f"readiness-{name}",
                                                    daemon=True)
                    check.thread.start()
                asked[name], check.wanted = check.rounds, True
            self.changed.notify_all()
            while any(check.rounds == asked[name] for name, check in self.checks.items()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {name: check.result if check.rounds != asked[name] else NO_ANSWER
                            for name, check in self.checks.items()}
                self.changed.wait(remaining)
            self.answered, self.at = {name: check.result for name, check in self.checks.items()}, time.monotonic()
            return dict(self.answered)

    def _run(self, check: "_Check") -> None:
        while True:
            with self.changed:
                while not check.wanted:
                    self.changed.wait()
                check.wanted = False
            result = _outcome(check.probe)
            with self.changed:
                check.result, check.rounds = result, check.rounds + 1
                self.changed.notify_all()


class _Check:
    def __init__(self, probe):
        self.probe = probe
        self.result = NO_ANSWER
        self.rounds = 0
        self.wanted = False
        self.thread: threading.Thread | None = None


def _outcome(probe) -> str:
    try:
        probe()
        return "ok"
    except AttacheError as exc:
        return f"unavailable: {exc.error_code}"
    except Exception as exc:  # a readiness probe reports, it never raises
        return f"unavailable: {type(exc).__name__}"


def _probes(services) -> dict:
    """Each check, by the name ``/readyz`` gives it."""

    def database():
        with services.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    return {"database": database, "broker": services.broker.ping, "storage": services.storage.check,
            "spool": spool.check_directory}
