"""Webhook subscriptions and their deliveries: durable, at least once, signed, numbered per subscription.

* :func:`register` - an operator's endpoint (URL checked against SSRF,
  events, an optional uploader), with a fresh ``whsec_`` secret shown
  once; audited. :func:`disable` stops it, :func:`enable` resumes it and
  makes the deliveries of the events it missed meanwhile; both audited.
* :func:`fan_out` - called by :func:`app.core.events.emit` in the
  transaction of the transition: one ``pending`` delivery per matching
  subscription, numbered from the subscription's own counter
  (``UPDATE ... RETURNING``), so the numbers are gapless per subscription.
* :class:`Deliverer` - the scheduler's ``webhooks`` service: claims due
  deliveries, at most one in flight per subscription, posts them from its
  own bounded thread pool with a short timeout (a dead endpoint holds one
  thread, never the pipeline and never another subscription), and records
  each outcome: ``delivered`` on a 2xx; a ``410 Gone`` disables the
  subscription (audited); a throttling answer (``429``, ``502``, ``503``,
  ``504``, or any ``Retry-After``) holds all of the subscription's
  deliveries back; otherwise the next attempt after the retry policy's
  backoff, or ``failed`` once the attempts are spent.
* :func:`redeliver` - an operator sends a delivery again (``failed`` or
  ``delivered`` -> ``pending`` with a fresh budget), audited.

Every attempt of a delivery carries the same ``webhook-id`` (the event's id)
and body; ``webhook-timestamp`` is the attempt's time (receivers refuse old
timestamps). The body is the event's document with ``delivery`` added: the
subscription and its per-subscription number, signed with the rest; the
``webhook-sequence`` header repeats that number.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import and_, case, func, select, text, update
from sqlalchemy.engine import Connection, Engine

from app.adapters import webhooks as endpoints
from app.adapters.postgres import audit
from app.adapters.postgres.db import hold_briefly, interval, transaction
from app.adapters.postgres.models import (
    event_counter,
    events,
    webhook_deliveries,
    webhook_endpoints,
    webhook_subscriptions,
)
from app.core.events import TYPES, body
from app.core.retry import RetryPolicy
from app.errors import DeliveryInFlight, InvalidWebhook, MissingReason, WebhookNotFound

log = logging.getLogger("attache.webhooks")

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
AUDIT_TARGET = "webhook:{}"


def delivered(document: dict, subscription_id, sequence: int) -> dict:
    """What a delivery's body holds: the event's document (as ``/v1/events`` returns it) and, under
    ``delivery``, the subscription and its gapless number, inside the signed bytes."""
    return {**document, "delivery": {"subscription": str(subscription_id), "sequence": sequence}}


# --- subscriptions ----------------------------------------------------------------------


def _events(kinds) -> list[str]:
    if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
        raise InvalidWebhook(f"events must be a non-empty list of: {', '.join(TYPES)}")
    unknown = sorted(set(kinds) - set(TYPES))
    if unknown:
        raise InvalidWebhook(f"unknown event(s) {', '.join(unknown)}; known: {', '.join(TYPES)}")
    return sorted(set(kinds))


def register(conn: Connection, *, url, kinds, uploader, actor: str, allow_private: bool) -> dict:
    """A new subscription; the answer holds its secret, which is never shown again."""
    if uploader is not None and (not isinstance(uploader, str) or not uploader.strip()
                                 or not uploader.isprintable() or len(uploader) > 200):
        raise InvalidWebhook("uploader must be a principal's name")
    kinds = _events(kinds)
    endpoints.check_target(url, allow_private=allow_private)
    subscription_id, secret = uuid.uuid4(), endpoints.new_secret()
    conn.execute(webhook_subscriptions.insert().values(id=subscription_id, url=url, events=kinds, uploader=uploader,
                                                       secret=secret, created_by=actor))
    audit.record(conn, actor=actor, action="webhook.register", target=AUDIT_TARGET.format(subscription_id),
                 details={"url": url, "events": kinds, "uploader": uploader})
    return {**subscription(conn, subscription_id), "secret": secret}


def _counts():
    return (select(webhook_deliveries.c.subscription_id,
                   *[func.count().filter(webhook_deliveries.c.state == state).label(state)
                     for state in (PENDING, DELIVERED, FAILED)])
            .group_by(webhook_deliveries.c.subscription_id).subquery())


def _subscription_view(row) -> dict:
    return {"id": str(row.id), "url": row.url, "events": list(row.events), "uploader": row.uploader,
            "created_by": row.created_by, "created_at": row.created_at.isoformat(),
            "disabled_at": row.disabled_at.isoformat() if row.disabled_at else None,
            "last_sequence": row.last_sequence,
            "deliveries": {state: int(getattr(row, state) or 0) for state in (PENDING, DELIVERED, FAILED)}}


def _subscriptions_query():
    counts = _counts()
    return (select(webhook_subscriptions, counts.c.pending, counts.c.delivered, counts.c.failed)
            .select_from(webhook_subscriptions.outerjoin(counts, counts.c.subscription_id == webhook_subscriptions.c.id)))


def subscriptions(conn: Connection) -> list[dict]:
    rows = conn.execute(_subscriptions_query().order_by(webhook_subscriptions.c.created_at)).all()
    return [_subscription_view(row) for row in rows]


def subscription(conn: Connection, subscription_id) -> dict:
    row = conn.execute(_subscriptions_query().where(webhook_subscriptions.c.id == subscription_id)).one_or_none()
    if row is None:
        raise WebhookNotFound(f"no webhook subscription {subscription_id}")
    return _subscription_view(row)


#: the events' counter (its one row): read by a disable, locked by an enable as an event's transaction locks it
_EVENT_COUNTER = select(event_counter.c.last_sequence).where(event_counter.c.id == 1)
#: the longest a disable's or an enable's transaction may sit idle: it holds the subscription's row, which every
#: event's transaction may wait for while it holds the events' counter, and with it every job's move to ``ready``
#: or ``failed`` (a web paused in a disable held every completion for as long as it stayed paused: 40 and 60 s in
#: an adversarial run). The web's engine has no such bound of its own (``app.services``)
IDLE_HOLDING_SECONDS = 5.0
#: the longest a disable's or an enable's statement waits for a lock: the transactions of a paused web, queued in
#: PostgreSQL behind the one holding the row, took it in turn when its session was ended, each for
#: IDLE_HOLDING_SECONDS (completions held 15 s by a 20 s pause; an adversarial run). Events hold the counter for
#: a few statements, other operators' disables and enables for as long: 2 s is ample
LOCK_WAIT_SECONDS = 2.0


def _hold_briefly(conn: Connection) -> None:
    hold_briefly(conn, idle_seconds=IDLE_HOLDING_SECONDS, lock_seconds=LOCK_WAIT_SECONDS)


def disable(conn: Connection, subscription_id, *, actor: str, reason: str | None) -> dict:
    """No new deliveries, and pending ones are no longer sent; audited. Disabling twice is harmless.

    The first disable keeps the event counter as it stands (``disabled_after_event``): the events after it are the
    gap :func:`enable` makes deliveries for.
    """
    _hold_briefly(conn)
    table = webhook_subscriptions.c
    found = conn.execute(update(webhook_subscriptions).where(table.id == subscription_id)
                         .values(disabled_at=func.coalesce(table.disabled_at, func.now()),
                                 disabled_after_event=case(
                                     (table.disabled_at.is_(None), _EVENT_COUNTER.scalar_subquery()),
                                     else_=table.disabled_after_event))
                         .returning(table.id)).first()
    if found is None:
        raise WebhookNotFound(f"no webhook subscription {subscription_id}")
    audit.record(conn, actor=actor, action="webhook.disable", target=AUDIT_TARGET.format(subscription_id),
                 reason=reason)
    return subscription(conn, subscription_id)


#: the deliveries a disabled subscription's events after ``:after`` (up to ``:up_to``, if not NULL) would have had,
#: numbered on from ``:last``; an event that has its delivery (made by a transaction that took the subscription's
#: row before the disable) is left
_RECOVER = text("""
    INSERT INTO webhook_deliveries (subscription_id, event_sequence, sequence)
    SELECT :id, e.sequence, :last + row_number() OVER (ORDER BY e.sequence)
    FROM events e
    WHERE e.sequence > :after AND (CAST(:up_to AS bigint) IS NULL OR e.sequence <= :up_to)
      AND e.type = ANY(:kinds) AND (CAST(:uploader AS text) IS NULL OR e.owner = :uploader)
      AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                      WHERE d.subscription_id = :id AND d.event_sequence = e.sequence)
    ORDER BY e.sequence
""")


def _locked_subscription(conn: Connection, subscription_id):
    table = webhook_subscriptions.c
    row = conn.execute(select(table.disabled_at, table.disabled_after_event, table.events, table.uploader,
                              table.last_sequence)
                       .where(table.id == subscription_id).with_for_update()).one_or_none()
    if row is None:
        raise WebhookNotFound(f"no webhook subscription {subscription_id}")
    return row


def _recover(conn: Connection, subscription_id, row, up_to: int | None) -> int:
    """Make the missed deliveries after ``row.disabled_after_event``; how many."""
    return conn.execute(_RECOVER, dict(id=subscription_id, after=row.disabled_after_event, up_to=up_to,
                                       kinds=list(row.events), uploader=row.uploader, last=row.last_sequence)
                        ).rowcount


def enable(engine: Engine, subscription_id, *, actor: str, reason: str | None) -> dict:
    """Deliver to a disabled subscription again (an operator's disable, or the deliverer's on ``410 Gone``); audited.

    Its pending deliveries go out, and the events it missed while disabled get their deliveries, numbered on from
    its last one, in event order: the endpoint sees what it would have seen, later. A subscription disabled before
    the gap was recorded (``disabled_after_event`` is NULL: before migration 0018) recovers nothing; the audit
    entry says so. Enabling an enabled subscription changes nothing (audited all the same, as a second disable is).

    Two transactions. The first makes the deliveries of the events committed so far, however many, holding the
    subscription's row and not the events' counter, so nobody's events wait for it; it moves the gap's start past
    them (the subscription stays disabled). The second takes the counter's row and then the subscription's, in
    the order an event's transaction takes them (:func:`fan_out` holds the counter and waits for a subscription
    whose row another transaction changed), makes the deliveries of the events since, and enables: an event still
    open meanwhile is waited for and recovered, and a later one finds the subscription enabled. The two taken in
    the other order deadlocked with events' transactions (an adversarial run: 70-108 deadlocks in 120 uploads with
    six threads disabling and enabling; operators got ``503``, publish steps were retried).
    """
    table = webhook_subscriptions.c
    recovered = 0
    with transaction(engine) as conn:
        _hold_briefly(conn)
        row = _locked_subscription(conn, subscription_id)
        if row.disabled_at is not None and row.disabled_after_event is not None:
            # an event's sequence is taken under the counter's lock until its COMMIT: the committed ones are 1..n
            up_to = conn.execute(_EVENT_COUNTER).scalar_one()
            recovered = _recover(conn, subscription_id, row, up_to)
            conn.execute(update(webhook_subscriptions).where(table.id == subscription_id)
                         .values(disabled_after_event=up_to, last_sequence=table.last_sequence + recovered))
    with transaction(engine) as conn:
        _hold_briefly(conn)
        conn.execute(_EVENT_COUNTER.with_for_update())
        row = _locked_subscription(conn, subscription_id)
        target = AUDIT_TARGET.format(subscription_id)
        if row.disabled_at is None:
            audit.record(conn, actor=actor, action="webhook.enable", target=target, reason=reason,
                         details={"already_enabled": True})
            return subscription(conn, subscription_id)
        since = None if row.disabled_after_event is None else _recover(conn, subscription_id, row, None)
        conn.execute(update(webhook_subscriptions).where(table.id == subscription_id)
                     .values(disabled_at=None, disabled_after_event=None,
                             last_sequence=table.last_sequence + (since or 0)))
        _lift_hold(conn, subscription_id)
        audit.record(conn, actor=actor, action="webhook.enable", target=target, reason=reason,
                     details={"disabled_at": row.disabled_at.isoformat(),
                              "recovered_deliveries": None if since is None else recovered + since})
        return subscription(conn, subscription_id)


# --- deliveries: born with the event ------------------------------------------------------


def fan_out(conn: Connection, event_sequence: int, kind: str, owner: str) -> int:
    """One pending delivery per live subscription that wants ``kind`` (and ``owner``'s uploads)."""
    numbered = conn.execute(
        update(webhook_subscriptions)
        .where(webhook_subscriptions.c.disabled_at.is_(None), webhook_subscriptions.c.events.contains([kind]),
               webhook_subscriptions.c.uploader.is_(None) | (webhook_subscriptions.c.uploader == owner))
        .values(last_sequence=webhook_subscriptions.c.last_sequence + 1)
        .returning(webhook_subscriptions.c.id, webhook_subscriptions.c.last_sequence)).all()
    if numbered:
        # due from the clock's now, not the transaction's start: taken after the subscription's row, so in the order
        # of its sequence, which the claim's earliest-due-first order then keeps
        conn.execute(webhook_deliveries.insert().values(next_attempt_at=func.clock_timestamp()), [
            {"subscription_id": row.id, "event_sequence": event_sequence, "sequence": row.last_sequence}
            for row in numbered])
    return len(numbered)


def _delivery_view(row) -> dict:
    return {"id": row.id, "subscription_id": str(row.subscription_id), "sequence": row.sequence,
            "event_id": row.event_id, "event_type": row.event_type, "event_sequence": row.event_sequence,
            "state": row.state, "attempts": row.attempts,
            "next_attempt_at": row.next_attempt_at.isoformat() if row.state == PENDING else None,
            "last_status": row.last_status, "last_error": row.last_error,
            "created_at": row.created_at.isoformat(),
            "delivered_at": row.delivered_at.isoformat() if row.delivered_at else None}


def _deliveries_query():
    return (select(webhook_deliveries, events.c.document["id"].astext.label("event_id"),
                   events.c.type.label("event_type"))
            .select_from(webhook_deliveries.join(events, events.c.sequence == webhook_deliveries.c.event_sequence)))


def deliveries(conn: Connection, subscription_id, *, state: str | None = None, limit: int = 100) -> list[dict]:
    subscription(conn, subscription_id)  # WebhookNotFound
    query = _deliveries_query().where(webhook_deliveries.c.subscription_id == subscription_id)
    if state is not None:
        query = query.where(webhook_deliveries.c.state == state)
    rows = conn.execute(query.order_by(webhook_deliveries.c.sequence.desc()).limit(max(1, min(limit, 1000)))).all()
    return [_delivery_view(row) for row in rows]


def failing(conn: Connection, *, limit: int = 50) -> list[dict]:
    """Deliveries that failed for good, or keep failing (pending after an unsuccessful attempt), newest first."""
    rows = conn.execute(_deliveries_query().where(
        (webhook_deliveries.c.state == FAILED)
        | ((webhook_deliveries.c.state == PENDING) & (webhook_deliveries.c.attempts > 0)))
        .order_by(webhook_deliveries.c.updated_at.desc()).limit(limit)).all()
    return [_delivery_view(row) for row in rows]


def delivery(conn: Connection, delivery_id: int) -> dict:
    row = conn.execute(_deliveries_query().where(webhook_deliveries.c.id == delivery_id)).one_or_none()
    if row is None:
        raise WebhookNotFound(f"no webhook delivery {delivery_id}")
    return _delivery_view(row)


def redeliver(conn: Connection, delivery_id: int, *, actor: str, reason: str | None) -> dict:
    """Send a delivery again with a fresh attempt budget (same event id, body and sequence); audited."""
    if reason is None or not str(reason).strip():
        raise MissingReason("a redelivery needs a reason")
    in_flight = and_(webhook_deliveries.c.state == PENDING, webhook_deliveries.c.claimed_until.is_not(None),
                     webhook_deliveries.c.claimed_until > func.now())  # NOT (.. AND NULL) would match no row
    row = conn.execute(update(webhook_deliveries).where(webhook_deliveries.c.id == delivery_id, ~in_flight)
                       .values(state=PENDING, attempts=0, next_attempt_at=func.now(), claimed_until=None,
                               updated_at=func.now())
                       .returning(webhook_deliveries.c.subscription_id, webhook_deliveries.c.sequence)).first()
    if row is None:
        # an attempt under way keeps its claim: clearing it let another thread send the delivery at the same
        # time, and the first attempt's outcome was dropped (an adversarial run)
        if conn.execute(select(webhook_deliveries.c.id).where(webhook_deliveries.c.id == delivery_id)).first():
            raise DeliveryInFlight(f"webhook delivery {delivery_id} is being sent now; redeliver it once that "
                                   "attempt has ended (or, if its sender died, once its claim has passed)")
        raise WebhookNotFound(f"no webhook delivery {delivery_id}")
    _lift_hold(conn, row.subscription_id)
    audit.record(conn, actor=actor, action="webhook.redeliver", target=AUDIT_TARGET.format(row.subscription_id),
                 reason=reason, details={"delivery_id": delivery_id, "sequence": row.sequence})
    return delivery(conn, delivery_id)


def _lift_hold(conn: Connection, subscription_id) -> None:
    """An operator's redelivery or enable sends now: a hold a throttling answer set (``resume_at``, up to 6 h) kept
    a redelivery answered "next attempt: now" from being sent, and nothing showed it or lifted it (an adversarial
    run)."""
    conn.execute(update(webhook_endpoints).where(webhook_endpoints.c.subscription_id == subscription_id,
                                                 webhook_endpoints.c.resume_at.is_not(None))
                 .values(resume_at=None))


# --- the deliverer ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DelivererConfig:
    timeout_seconds: float = 5.0
    concurrency: int = 4
    max_attempts: int = 17
    policy: RetryPolicy = RetryPolicy(initial_interval=5.0, max_interval=21600.0)
    allow_private: bool = False
    #: how long a thread goes on with one subscription's backlog while its endpoint answers 2xx, before it takes
    #: the endpoint taken longest ago instead: a quick endpoint drains its backlog at once, a slow one gives its
    #: thread back after each delivery
    follow_on_seconds: float = 1.0

    @property
    def claim_seconds(self) -> float:
        """A claim outlives any attempt (connect, send and answer, within the timeout in all), so nobody sends it twice."""
        return 3 * self.timeout_seconds + 30.0


#: each subscription's first due delivery (one in flight per subscription), the endpoint taken longest ago first
#: (``webhook_endpoints.last_claimed_at``; never taken first), none of an endpoint that asked to be left alone
#: (``resume_at``). In the order of the subscriptions' ids, those sorted first took every thread whenever they had
#: something due, and a backlog always has: four hanging endpoints sorted before a healthy one kept it from all of
#: its deliveries (an adversarial run). The order was then read from the pending deliveries' own times, which
#: forgot a hanging endpoint whose tried delivery had ended ``failed``. The claim stamps the endpoints it took. It
#: looks at each subscription once, through the pending deliveries' indexes (migration 0027): it looked at every due
#: delivery and, for each, at its subscription's every pending one, and four endpoints that never answered, 5,000
#: deliveries due each, made a claim take up to 5.5 s, one at a time (an adversarial run). A subscription's due
#: delivery is its earliest due (one index probe): the first due in sequence order walked past every delivery
#: waiting for its backoff, and 100 dead endpoints' 5,000 each made a claim take 1 s (a re-attack). A new
#: delivery is due from when it was made, in its sequence's order (``fan_out``); a retried one from its backoff.
_CLAIM = text("""
    WITH eligible AS (
        SELECT s.id, e.last_claimed_at
        FROM webhook_subscriptions s LEFT JOIN webhook_endpoints e ON e.subscription_id = s.id
        WHERE s.disabled_at IS NULL AND (e.resume_at IS NULL OR e.resume_at <= now())
          AND (CAST(:subscription AS uuid) IS NULL OR s.id = CAST(:subscription AS uuid))
          AND NOT EXISTS (SELECT 1 FROM webhook_deliveries c WHERE c.subscription_id = s.id
                          AND c.state = 'pending' AND c.claimed_until IS NOT NULL AND c.claimed_until > now())
    ), due AS (
        SELECT first_due.id FROM eligible CROSS JOIN LATERAL (
            SELECT w.id, w.next_attempt_at FROM webhook_deliveries w
            WHERE w.subscription_id = eligible.id AND w.state = 'pending' AND w.next_attempt_at <= now()
            ORDER BY w.next_attempt_at, w.sequence LIMIT 1
        ) first_due
        ORDER BY eligible.last_claimed_at NULLS FIRST, first_due.next_attempt_at
        LIMIT :n
    ), claimed AS (
        UPDATE webhook_deliveries d SET claimed_until = now() + make_interval(secs => :claim), updated_at = now()
        FROM due
        WHERE d.id = due.id AND d.state = 'pending' AND (d.claimed_until IS NULL OR d.claimed_until <= now())
        RETURNING d.id, d.subscription_id, d.sequence, d.attempts, d.event_sequence
    ), stamped AS (
        INSERT INTO webhook_endpoints (subscription_id, last_claimed_at)
        SELECT subscription_id, now() FROM claimed
        ON CONFLICT (subscription_id) DO UPDATE SET last_claimed_at = excluded.last_claimed_at
    )
    SELECT * FROM claimed
""")

#: who disables a subscription whose endpoint answered 410 Gone, in the audit log
DELIVERER_ACTOR = "attache webhooks"


class Deliverer:
    """The ``webhooks`` service of the scheduler (``scheduler/sweepers.py``)."""

    name = "webhooks"

    def __init__(self, engine: Engine, config: DelivererConfig):
        self.engine = engine
        self.config = config
        self._pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="webhook")
        self._lock = threading.Lock()
        self._claiming = threading.Lock()
        self._busy = 0
        self._done = {DELIVERED: 0, "retrying": 0, FAILED: 0}

    def run_once(self, *, wait: bool = False) -> dict[str, int]:
        """Start the due deliveries the free threads can take; ``wait``: until they (and their followers) end.

        Returns what ended since the last round (``delivered``, ``retrying``,
        ``failed``) and how many were ``started`` now.
        """
        with self._lock:
            free = self.config.concurrency - self._busy
        claimed = self._claim(free, None) if free > 0 else []
        with self._lock:
            self._busy += len(claimed)
        futures = [self._pool.submit(self._run, row) for row in claimed]
        if wait:
            for future in futures:
                future.result()
        with self._lock:
            done, self._done = self._done, {DELIVERED: 0, "retrying": 0, FAILED: 0}
        return {"started": len(claimed), **done}

    def _claim(self, n: int, subscription_id) -> list:
        """Claims of this process's threads one at a time: two that chose the same delivery at once came back, the
        later one empty, and its thread ended with its own subscription's backlog due and nobody to take it until
        the next round (a flaky test: a slow endpoint short of a delivery in 2 of 6 runs)."""
        with self._claiming, transaction(self.engine) as conn:
            return conn.execute(_CLAIM, {"claim": self.config.claim_seconds, "n": n,
                                         "subscription": str(subscription_id) if subscription_id else None}).all()

    def _run(self, row) -> None:
        """Deliver ``row``, then, while endpoints answer 2xx: the same subscription's next due delivery within
        ``follow_on_seconds`` of taking it, then (or once it has none due) the next due delivery of whichever
        endpoint was taken longest ago (``_CLAIM``'s order): a thread that had drained a quick endpoint ended while
        others had deliveries due, which then waited for the next round. It went on with the same subscription for as long as it answered 2xx: four
        endpoints answering in 2 s kept all four threads, each on its own backlog, and a fast one got 1 of 179
        deliveries in 3 minutes (an adversarial run)."""
        try:
            taken = time.monotonic()
            while row is not None:
                outcome = self.attempt(row)
                with self._lock:
                    self._done[outcome] += 1
                if outcome != DELIVERED:
                    break
                same = time.monotonic() - taken < self.config.follow_on_seconds
                following = (same and self._claim(1, row.subscription_id)) or self._claim(1, None)
                if following and following[0].subscription_id != row.subscription_id:
                    taken = time.monotonic()
                row = following[0] if following else None
        except Exception:
            log.exception("webhook delivery failed to record")
        finally:
            with self._lock:
                self._busy -= 1

    def attempt(self, row) -> str:
        """One POST of one claimed delivery and its recorded outcome: ``delivered``, ``retrying`` or ``failed``."""
        with transaction(self.engine) as conn:
            target = conn.execute(select(webhook_subscriptions.c.url, webhook_subscriptions.c.secret,
                                         events.c.document)
                                  .select_from(webhook_deliveries
                                               .join(webhook_subscriptions,
                                                     webhook_subscriptions.c.id == webhook_deliveries.c.subscription_id)
                                               .join(events, events.c.sequence == webhook_deliveries.c.event_sequence))
                                  .where(webhook_deliveries.c.id == row.id)).one()
        payload = body(delivered(target.document, row.subscription_id, row.sequence))
        headers = endpoints.sign(target.secret, target.document["id"], datetime.now(timezone.utc), payload)
        headers["webhook-sequence"] = str(row.sequence)
        try:
            answer = endpoints.post(target.url, payload, headers, timeout=self.config.timeout_seconds,
                                    allow_private=self.config.allow_private, first=row.attempts)
        except Exception as exc:  # an answer the sender could not read is an attempt like any other, counted
            log.exception("webhook delivery %s: the answer could not be read", row.id)
            answer = endpoints.Answer(None, f"the answer could not be read: {type(exc).__name__}")
        return self._record(row, answer)

    def _record(self, row, answer: endpoints.Answer) -> str:
        """The attempt's outcome, as Standard Webhooks asks: a 2xx is done; a 410 disables the subscription (its
        pending deliveries stay, unsent, as an operator's disable leaves them); a throttling answer keeps every
        delivery of the subscription back for its ``Retry-After`` (at most the policy's longest interval), or for
        the first backoff when it gave none (``resume_at``, which an operator's redelivery or enable lifts);
        anything else is tried again after the backoff, or fails once the attempts are spent."""
        attempts = row.attempts + 1
        values = {"attempts": attempts, "claimed_until": None, "last_status": answer.status,
                  "last_error": answer.error, "updated_at": func.now()}
        delay = self.config.policy.delay(attempts)
        pause = None  # a throttling answer holds the subscription back, whatever becomes of this delivery
        if answer.throttling and not answer.gone:
            # without a Retry-After, the first backoff: held for this delivery's own backoff, one event the endpoint
            # kept answering 502 held every other event back up to 6 h at a time, for the day it took to fail (an
            # adversarial run); the endpoint still gets one attempt per first backoff while it throttles them all
            pause = min(self.config.policy.max_interval,
                        answer.retry_after if answer.retry_after is not None else self.config.policy.delay(1))
        if answer.ok:
            outcome, values = DELIVERED, {**values, "state": DELIVERED, "delivered_at": func.now()}
        elif answer.gone:
            outcome, values["last_error"] = "retrying", "HTTP 410: the endpoint is gone; its subscription is disabled"
        elif attempts >= self.config.max_attempts:
            outcome, values = FAILED, {**values, "state": FAILED}
            log.warning("webhook delivery %s failed for good after %d attempts: %s", row.id, attempts, answer.error)
        else:
            outcome = "retrying"
            values["next_attempt_at"] = func.now() + interval(max(delay, pause or 0))
        with transaction(self.engine) as conn:
            recorded = conn.execute(update(webhook_deliveries)
                                    .where(and_(webhook_deliveries.c.id == row.id,
                                                webhook_deliveries.c.state == PENDING,
                                                webhook_deliveries.c.attempts == row.attempts))
                                    .values(**values)).rowcount
            if recorded and answer.gone:
                disable(conn, row.subscription_id, actor=DELIVERER_ACTOR,
                        reason="the endpoint answered 410 Gone (Standard Webhooks: stop sending to it)")
                log.warning("webhook subscription %s disabled: its endpoint answered 410 Gone", row.subscription_id)
            if recorded and pause:
                conn.execute(update(webhook_endpoints).where(webhook_endpoints.c.subscription_id == row.subscription_id)
                             .values(resume_at=func.now() + interval(pause)))
        return outcome

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
