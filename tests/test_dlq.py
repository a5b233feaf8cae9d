"""The dead-letter toolkit against a real RabbitMQ vhost and PostgreSQL.

Messages are dead-lettered without a worker: published to ``attache.inspect``
like the outbox does, then rejected (``requeue=False``) so RabbitMQ itself
moves them to ``attache.inspect.XQ`` with an ``x-death`` header.

With the PostgreSQL broker (the tests parametrized over ``broker_kind``) a
consumer takes them and nacks them, which marks their rows ``rejected``.

Requeue and purge act only on what the operator chose (message ids, or all
with a confirmed count) and are audited before the broker is touched.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from unittest.mock import ANY

import pika
import pytest
from dramatiq.message import Message
from sqlalchemy import create_engine, insert, select, update

from app import faults
from app.adapters.broker.dead_letter_tools import DeadLetters
from app.adapters.postgres.models import attachments, audit_log, dead_letters, jobs
from app.core import states
from app.core.steps import Step
from app.errors import BadSelection, BrokerUnavailable, MoreThanExpected
from app.observability.tracing import new_traceparent
from tests.conftest import BROKER_KINDS
from tests.processes import wait_for

XQ = "attache.inspect.XQ"
STEP_QUEUES = [step.queue for step in Step]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def broker_url(broker_url, broker_kind, database_url):
    """The URL of the broker in use (the parametrized tests run against the PostgreSQL broker as well)."""
    return broker_url if broker_kind == "rabbitmq" else database_url


def depth(broker_url, queue):
    if broker_url.startswith("postgresql"):
        from app.adapters.broker.postgres import PostgresBroker

        broker = PostgresBroker(url=broker_url)
        try:
            return broker.queue_depth(queue)
        finally:
            broker.close()
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        return connection.channel().queue_declare(queue=queue, passive=True).method.message_count
    finally:
        connection.close()


def dead_letter_three(services, broker_url, count: int = 3) -> list[str]:
    """Three (or ``count``) job messages, enqueued to attache.inspect and rejected into its XQ; their ids."""
    ids = []
    for n in range(count):
        payload = {"job_id": str(uuid.uuid4()), "step": "inspect", "attempt": 1, "n": n}
        message = Message(queue_name="attache.inspect", actor_name="inspect", args=(payload,), kwargs={},
                          options={"retries": n})
        services.broker.enqueue(message)
        ids.append(message.message_id)
    return reject(services, broker_url, ids)


def reject(services, broker_url, ids: list[str]) -> list[str]:
    """Reject the messages ``ids`` waiting in attache.inspect into its XQ; their ids."""
    if broker_url.startswith("postgresql"):  # the PostgreSQL broker: a consumer takes them and nacks them
        consumer, ours = services.broker.consume("attache.inspect", prefetch=len(ids) + 10), set(ids)
        try:
            while ours:
                message = next(consumer)
                if message is not None and message.message_id in ours:
                    ours.discard(message.message_id)
                    consumer.nack(message)
        finally:
            consumer.close()
        return ids
    before = depth(broker_url, "attache.inspect") - len(ids)
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        channel = connection.channel()
        ours = set(ids)
        while ours:  # reject ours; any other message (a requeued one) goes back, unacked until the end
            method, properties, _body = channel.basic_get("attache.inspect", auto_ack=False)
            if properties.message_id in ours:
                ours.discard(properties.message_id)
                channel.basic_reject(method.delivery_tag, requeue=False)
    finally:
        connection.close()
    assert depth(broker_url, "attache.inspect") == before
    return ids


def audit_rows(engine):
    with engine.connect() as conn:
        return conn.execute(select(audit_log).order_by(audit_log.c.id)).all()


@pytest.fixture
def dlq(services):
    return services.dead_letters


@pytest.fixture
def dead(services, broker_url, engine):
    ids = dead_letter_three(services, broker_url)
    with engine.begin() as conn:
        conn.execute(insert(dead_letters).values(
            message_id=ids[0], queue_name="attache.inspect", actor_name="inspect", job_id=None,
            error_code="invalid_message", reason="message does not match jobs.schema.json", retries=0))
    return ids


def by_queue(dlq):
    return {q["queue"]: q for q in dlq.queues()}


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_queues_lists_every_step_xq_with_missing_ones_at_zero(dlq, dead):
    queues = dlq.queues()
    assert [q["name"] for q in queues] == ["attache.inspect.XQ", "attache.render.XQ", "attache.publish.XQ"]
    assert {q["queue"]: q["messages"] for q in queues} == {
        "attache.inspect": 3, "attache.render": 0, "attache.publish": 0}


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_messages_are_decoded_and_left_in_place(dlq, dead, broker_url):
    first = dlq.messages("attache.inspect")
    assert [m["message_id"] for m in first] == dead
    for n, item in enumerate(first):
        assert item["actor_name"] == "inspect" and item["queue_name"] == "attache.inspect"
        assert item["body"]["n"] == n and item["body"]["step"] == "inspect"
        assert item["retries"] == n
        assert item["traceback"] is None
        [death] = item["death"]
        assert death["reason"] == "rejected" and death["queue"] == "attache.inspect" and death["count"] == 1
        assert death["time"]
    assert first[0]["recorded"]["error_code"] == "invalid_message"
    assert "jobs.schema.json" in first[0]["recorded"]["reason"]
    assert first[0]["recorded"]["recorded_at"] and first[0]["recorded"]["job_id"] is None
    assert first[1]["recorded"] is None and first[2]["recorded"] is None

    second = dlq.messages("attache.inspect.XQ")  # both spellings
    assert second == first, "nothing consumed, same order"
    assert depth(broker_url, XQ) == 3
    assert [m["message_id"] for m in dlq.messages(XQ, limit=2)] == dead[:2]
    assert depth(broker_url, XQ) == 3
    assert dlq.messages("attache.render") == []  # no XQ yet


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_each_dead_letter_says_where_its_job_is_now(dlq, services, broker_url, engine):
    """After an outage the reconciler finishes the jobs whose first messages died: the listing says so."""
    with engine.begin() as conn:
        attachment_id = uuid.uuid4()
        conn.execute(insert(attachments).values(
            id=attachment_id, owner="t", filename="a.jpg", content_type="image/jpeg", format="JPEG", size=1,
            sha256="0" * 64, width=1, height=1, staging_key=f"staging/{attachment_id}"))
        ready, _ = states.create_job(conn, attachment_id=attachment_id, pipeline_version=1, max_attempts=3,
                                     traceparent=new_traceparent(), tracestate=None, actor="test", room_bytes=0)
        conn.execute(update(jobs).where(jobs.c.id == ready).values(state="ready", attempt=1))
    ids = []
    for n, job_id in enumerate((ready, uuid.uuid4(), None)):
        payload = {"step": "inspect", "attempt": 1, "n": n, **({"job_id": str(job_id)} if job_id else {})}
        message = Message(queue_name="attache.inspect", actor_name="inspect", args=(payload,), kwargs={}, options={})
        services.broker.enqueue(message)
        ids.append(message.message_id)
    reject(services, broker_url, ids)
    listed = {m["body"]["n"]: m["job_state"] for m in dlq.messages("attache.inspect")}
    assert listed == {0: "ready", 1: None, 2: None}


def test_requeue_moves_the_chosen_ids_then_all_of_a_confirmed_count(dlq, dead, broker_url, engine):
    result = dlq.requeue("attache.inspect", actor="ops:alice", message_ids=[dead[1], "nope"], reason="fixed")
    assert result == {"requeued": 1, "message_ids": [dead[1]], "not_found": ["nope"]}
    assert depth(broker_url, XQ) == 2 and depth(broker_url, "attache.inspect") == 1
    assert [m["message_id"] for m in dlq.messages(XQ)] == [dead[0], dead[2]], "others kept, in order"

    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        method, properties, body = connection.channel().basic_get("attache.inspect", auto_ack=False)
        assert Message.decode(body).message_id == dead[1]
        assert properties.message_id == dead[1] and properties.delivery_mode == 2
        assert properties.headers["x-attache-requeued-by"] == "ops:alice"
        assert properties.headers["x-attache-step"] == "inspect", "original headers kept"
        assert properties.headers["x-death"][0]["reason"] == "rejected"
    finally:
        connection.close()  # back to the queue

    [row] = audit_rows(engine)
    assert (row.actor, row.action, row.target, row.reason) == ("ops:alice", "dlq.requeue", XQ, "fixed")
    assert row.details == {"status": "completed", "message_ids": [dead[1], "nope"], "depth": 3,
                           "requeued": [dead[1]], "count": 1, "not_found": ["nope"], "completed_at": ANY}

    with pytest.raises(MoreThanExpected):
        dlq.requeue(XQ, actor="ops:bob", expected=1)
    assert depth(broker_url, XQ) == 2 and len(audit_rows(engine)) == 1, "refused: nothing done, nothing audited"
    assert dlq.requeue(XQ, actor="ops:bob", expected=2) == {"requeued": 2, "message_ids": [dead[0], dead[2]],
                                                            "not_found": []}
    assert depth(broker_url, XQ) == 0 and depth(broker_url, "attache.inspect") == 3
    last = audit_rows(engine)[-1]
    assert (last.actor, last.action, last.target) == ("ops:bob", "dlq.requeue", XQ)
    assert last.details == {"status": "completed", "all": True, "expected": 2, "depth": 2,
                            "requeued": [dead[0], dead[2]], "count": 2, "completed_at": ANY}

    assert dlq.requeue(XQ, actor="ops:bob", message_ids=[dead[0]]) == {"requeued": 0, "message_ids": [],
                                                                       "not_found": [dead[0]]}


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_purge_of_the_listed_ids_spares_a_message_that_arrived_later(dlq, dead, services, broker_url, engine):
    listed = dlq.listing("attache.inspect")
    assert listed["depth"] == 3
    seen = [m["message_id"] for m in listed["messages"]]
    [late] = dead_letter_three(services, broker_url, count=1)  # dead-lettered after the operator looked
    assert depth(broker_url, XQ) == 4

    assert dlq.purge("attache.inspect.XQ", actor="ops:carol", message_ids=seen, reason="junk") == {
        "purged": 3, "message_ids": seen, "not_found": []}
    assert [m["message_id"] for m in dlq.messages(XQ)] == [late]
    [row] = audit_rows(engine)
    assert (row.actor, row.action, row.target, row.reason) == ("ops:carol", "dlq.purge", XQ, "junk")
    assert row.details == {"status": "completed", "message_ids": seen, "depth": 4, "purged": seen, "count": 3,
                           "not_found": [], "completed_at": ANY}


def test_ids_with_control_characters_are_listed_named_and_acted_on_escaped(dlq, services, broker_url, engine):
    """Anyone who may publish can put a NUL in a message id (the envelope's, or the AMQP property): the queue's
    listing failed (PostgreSQL refused the id in its query), and requeue and purge of all failed after acting, with
    their audit rows left at ``intent`` (an adversarial review). The id is shown with such characters escaped, and
    that text names it."""
    envelope = {"queue_name": "attache.inspect", "actor_name": "inspect", "args": [{"job_id": "x"}], "kwargs": {},
                "options": {}, "message_id": "\x00nul-id", "message_timestamp": 1}
    [ordinary] = dead_letter_three(services, broker_url, count=1)  # which declares the queues
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        channel = connection.channel()
        channel.basic_publish("", XQ, json.dumps(envelope).encode())
        channel.basic_publish("", XQ, b"not json", pika.BasicProperties(message_id="a\x00b\nc"))
    finally:
        connection.close()
    listed = [m["message_id"] for m in dlq.messages(XQ)]
    assert listed == [ordinary, "\\x00nul-id", "a\\x00b\\nc"]
    assert dlq.purge(XQ, actor="ops:carol", message_ids=[listed[1]], reason="junk")["purged"] == 1
    assert dlq.requeue(XQ, actor="ops:carol", expected=2, reason="all back") == {
        "requeued": 2, "message_ids": [ordinary, listed[2]], "not_found": []}
    assert [row.details["status"] for row in audit_rows(engine)] == ["completed", "completed"]
    assert depth(broker_url, XQ) == 0


def test_no_two_message_ids_are_shown_alike():
    """An id that spells an escape (``a\\x00``, published by anyone) was shown as the id with a NUL, so a requeue
    or purge that named it acted on whichever came first (an adversarial review): the backslash is escaped too."""
    from app.adapters.postgres.audit import storable

    assert storable("a\x00", printable=True) != storable("a\\x00", printable=True)
    assert storable("ok-id", printable=True) == "ok-id"


def test_a_dead_letter_with_a_nul_in_its_id_or_body_is_recorded(engine):
    """The worker's record of why a message died was lost (logged only) when its id or body held a NUL."""
    from app.adapters.broker.dead_letter_recorder import DeadLetterRecorder

    class Died:
        message_id, queue_name, actor_name, failed = "\x00id", "attache.inspect", "inspect", True
        args, options = ({"job_id": "x", "note": "a\x00b", "\x00key": ["\ud800"]},), {"retries": 2}

    DeadLetterRecorder(engine).after_process_message(None, Died(), exception=ValueError("poison"))
    with engine.connect() as conn:
        [row] = conn.execute(select(dead_letters.c.message_id, dead_letters.c.body)).all()
    assert row.message_id == "\\x00id"
    assert row.body == {"job_id": "x", "note": "a\\x00b", "\\x00key": ["\\ud800"]}


def test_a_dead_letter_declares_its_xq_again_before_the_worker_rejects_it(services, broker_url, engine):
    """An adversarial run: with ``attache.inspect.XQ`` deleted under running workers, RabbitMQ dropped every
    message the worker rejected to it (declared only with its queue, at a process's start), while its row was
    written and the dead-letter list said 0."""
    from app.adapters.broker.dead_letter_recorder import DeadLetterRecorder

    message = Message(queue_name="attache.inspect", actor_name="inspect", args=({"job_id": "x"},), kwargs={},
                      options={})
    services.broker.enqueue(message)  # the queue and its XQ declared, as a running process has them
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        connection.channel().queue_delete(XQ)
    finally:
        connection.close()

    class Died:
        message_id, queue_name, actor_name, failed = message.message_id, "attache.inspect", "inspect", True
        args, options = message.args, {}

    DeadLetterRecorder(engine).after_process_message(services.broker, Died(), exception=ValueError("poison"))
    reject(services, broker_url, [message.message_id])  # as the worker does next
    assert depth(broker_url, XQ) == 1


def test_purge_of_some_ids_hands_the_others_back_in_place_and_unchanged(dlq, dead, broker_url):
    before = dlq.messages(XQ)
    assert dlq.purge(XQ, actor="ops:carol", message_ids=[dead[1], "nope"]) == {
        "purged": 1, "message_ids": [dead[1]], "not_found": ["nope"]}
    assert dlq.messages(XQ) == [before[0], before[2]], "same order, same content, death and recorded reason"
    assert dlq.purge(XQ, actor="ops:carol", message_ids=[dead[1]]) == {"purged": 0, "message_ids": [],
                                                                       "not_found": [dead[1]]}
    assert depth(broker_url, XQ) == 2


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_purge_all_removes_nothing_when_the_queue_holds_more_than_confirmed(dlq, dead, broker_url, engine):
    with pytest.raises(MoreThanExpected) as refused:
        dlq.purge(XQ, actor="ops:carol", expected=2, reason="junk")
    assert (refused.value.depth, refused.value.expected) == (3, 2)
    assert refused.value.error_code == "more_than_expected"
    assert depth(broker_url, XQ) == 3 and audit_rows(engine) == [], "refused before anything was attempted"

    assert dlq.purge(XQ, actor="ops:carol", expected=5, reason="junk") == {"purged": 3, "message_ids": dead,
                                                                           "not_found": []}
    assert depth(broker_url, XQ) == 0
    assert by_queue(dlq)["attache.inspect"]["messages"] == 0
    [row] = audit_rows(engine)
    assert (row.actor, row.action, row.target, row.reason) == ("ops:carol", "dlq.purge", XQ, "junk")
    assert row.details == {"status": "completed", "all": True, "expected": 5, "depth": 3, "purged": dead,
                           "count": 3, "completed_at": ANY}


def test_purge_all_beside_another_operators_listing_counts_what_the_listing_holds(dlq, services, broker_url, engine,
                                                                                     monkeypatch):
    """An adversarial run: a listing holds the messages it reads unacked, and RabbitMQ counts only ready ones; a
    purge of "all, 3 expected" beside it saw 2 of 5, went ahead and took messages nobody had seen. The tools now
    act on a queue one at a time."""
    import threading

    from app.adapters.broker import dead_letter_tools

    ids = dead_letter_three(services, broker_url, count=5)
    reading, go_on = threading.Event(), threading.Event()
    describe = dead_letter_tools._describe

    def slow_describe(body, properties):  # the other operator's listing, holding its three messages for a while
        if len(seen) == 2:
            reading.set()
            go_on.wait(10)
        seen.append(1)
        return describe(body, properties)

    seen: list[int] = []
    monkeypatch.setattr(dead_letter_tools, "_describe", slow_describe)
    listed = []
    listing = threading.Thread(target=lambda: listed.append(dlq.listing(XQ, limit=3)))
    listing.start()
    assert reading.wait(10)
    threading.Timer(1.0, go_on.set).start()  # the listing ends a second later
    with pytest.raises(MoreThanExpected) as refused:
        dlq.purge(XQ, actor="ops:dan", expected=3, reason="the three I saw")
    listing.join(10)
    assert refused.value.depth == 5 and listed and listed[0]["depth"] == 5
    assert depth(broker_url, XQ) == 5 and audit_rows(engine) == [], ids


def test_a_long_action_keeps_its_lock_whatever_the_webs_idle_bound(dlq, dead, broker_url, engine):
    """A re-attack: the lock's transaction sits idle while RabbitMQ works; the web's engine ends a transaction idle
    for 120 s, so a requeue longer than that lost its lock and answered 503 with its audit row "failed" after moving
    every message."""
    import time

    bounded = create_engine(engine.url, connect_args={"options": "-c idle_in_transaction_session_timeout=500"})
    try:
        dlq.engine = bounded
        with dlq._alone(XQ):
            time.sleep(1.0)  # idle in the lock's transaction, as during a long requeue
        assert dlq.purge(XQ, actor="ops", expected=3)["purged"] == 3
    finally:
        bounded.dispose()


@pytest.mark.parametrize("choice", [{}, {"message_ids": []}, {"message_ids": [""]}, {"message_ids": ["a\x00b"]},
                                    {"message_ids": ["\udcff\udcfe-id"]}, {"expected": 0},
                                    {"expected": True}, {"expected": "3"}, {"message_ids": ["x"], "expected": 3}])
def test_nothing_chosen_is_nothing_done(dlq, dead, broker_url, engine, choice):
    for action in (dlq.requeue, dlq.purge):
        with pytest.raises(BadSelection):
            action(XQ, actor="ops", **choice)
    assert depth(broker_url, XQ) == 3 and depth(broker_url, "attache.inspect") == 0
    assert audit_rows(engine) == []


def test_the_audit_intent_is_committed_before_the_broker_is_touched(dlq, dead, broker_url, engine, monkeypatch):
    seen = []

    def point(name):  # what another connection sees between the intent and the broker action
        assert name == "dlq_after_intent"
        seen.append(([(r.action, r.details) for r in audit_rows(engine)],
                     depth(broker_url, XQ), depth(broker_url, "attache.inspect")))

    monkeypatch.setattr(faults, "point", point)
    dlq.requeue(XQ, actor="ops:alice", message_ids=[dead[0]])
    dlq.purge(XQ, actor="ops:bob", expected=2)
    requeued = {"status": "completed", "message_ids": [dead[0]], "depth": 3, "requeued": [dead[0]], "count": 1,
                "not_found": [], "completed_at": ANY}
    assert seen == [
        ([("dlq.requeue", {"status": "intent", "message_ids": [dead[0]], "depth": 3})], 3, 0),
        ([("dlq.requeue", requeued), ("dlq.purge", {"status": "intent", "all": True, "expected": 2, "depth": 2})],
         2, 1),
    ]
    assert depth(broker_url, XQ) == 0


def test_a_broker_failure_midway_leaves_the_row_failed_with_what_was_done(dlq, dead, broker_url, engine):
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        connection.channel().queue_delete("attache.inspect")  # the requeue's publish is now unroutable
    finally:
        connection.close()
    with pytest.raises(BrokerUnavailable):
        dlq.requeue(XQ, actor="ops:alice", message_ids=[dead[2], dead[0]])
    assert depth(broker_url, XQ) == 3, "nothing lost"
    [row] = audit_rows(engine)
    assert row.details == {"status": "failed", "message_ids": [dead[2], dead[0]], "depth": 3, "requeued": [],
                           "count": 0, "completed_at": ANY, "error": ANY}
    assert "BrokerUnavailable" in row.details["error"]


@pytest.mark.processes
def test_killed_between_intent_and_action_the_intent_row_says_what_was_attempted(env, dead, broker_url, engine):
    command = [sys.executable, "-m", "app.cli", "dlq", "purge", XQ, dead[1], "--yes", "--reason", "junk"]
    killed = subprocess.run(command, env={**os.environ, **env, "ATTACHE_FAULT": "dlq_after_intent"}, cwd=REPO,
                            start_new_session=True, capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert depth(broker_url, XQ) == 3, "the broker was not touched"
    [row] = audit_rows(engine)
    assert (row.action, row.target, row.reason) == ("dlq.purge", XQ, "junk") and row.actor.startswith("operator:cli:")
    assert row.details == {"status": "intent", "message_ids": [dead[1]], "depth": 3}


@pytest.mark.parametrize("name", ["attache.inspect.DQ", "attache.nope", "attache.nope.XQ", "", "amq.rabbitmq.log"])
def test_unknown_queue_is_refused(dlq, name):
    with pytest.raises(ValueError):
        dlq.messages(name)
    with pytest.raises(ValueError):
        dlq.requeue(name, actor="ops", message_ids=["x"])
    with pytest.raises(ValueError):
        dlq.purge(name, actor="ops", expected=1)


def test_only_the_queues_it_is_given_are_its_own(broker_url, engine, dead):
    dlq = DeadLetters(broker_url, engine, queues=["attache.render"], socket_timeout=5.0)
    assert [q["queue"] for q in dlq.queues()] == ["attache.render"]
    with pytest.raises(ValueError):
        dlq.messages(XQ)
    with pytest.raises(ValueError):
        dlq.purge(XQ, actor="ops", expected=3)
    assert depth(broker_url, XQ) == 3 and audit_rows(engine) == []


def test_unreachable_broker_is_broker_unavailable(engine):
    dlq = DeadLetters("amqp://guest:guest@127.0.0.1:1/%2F", engine, queues=STEP_QUEUES, socket_timeout=1.0)
    with pytest.raises(BrokerUnavailable):
        dlq.queues()
    with pytest.raises(BrokerUnavailable):
        dlq.messages("attache.inspect")
    with pytest.raises(BrokerUnavailable):
        dlq.requeue("attache.inspect", actor="ops", message_ids=["x"])
    with pytest.raises(BrokerUnavailable):
        dlq.purge("attache.inspect", actor="ops", expected=1)
    assert audit_rows(engine) == [], "nothing done, nothing audited"


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_a_requeue_whose_lock_postgresql_dropped_takes_nothing_more(dlq, services, broker_url, engine, monkeypatch):
    """PostgreSQL frees the lock of a session it lost: a requeue went on taking messages after a two-second outage
    had cut its lock's connection, while another operator's purge, which had taken the lock, took them too (an
    adversarial run: 151 requeued and 149 purged of the 300 one of them chose). Each message is taken only while the
    lock's session is still there."""
    from app.adapters.broker import dead_letter_tools
    from app.errors import DatabaseUnavailable

    dead_letter_three(services, broker_url, count=6)
    admin = create_engine(engine.url, isolation_level="AUTOCOMMIT")
    take = type(dlq)._take

    def cut_then_take(self, *args):  # the outage, between the audit row's intent and the first message taken
        with admin.connect() as conn:
            assert conn.exec_driver_sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' "
                f"AND classid = {dead_letter_tools.NAMESPACE}").scalar() == 1
        return take(self, *args)

    monkeypatch.setattr(type(dlq), "_take", cut_then_take)
    try:
        with pytest.raises(DatabaseUnavailable):
            dlq.requeue(XQ, actor="ops:alice", expected=6, reason="the database is back")
    finally:
        admin.dispose()
    assert depth(broker_url, XQ) == 6, "before: all six taken after the lock was gone"
    [row] = audit_rows(engine)
    assert row.details["status"] == "failed" and row.details["count"] == 0


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_an_action_that_lost_postgresql_completes_its_audit_row_once_postgresql_answers(services, broker_url,
                                                                                         engine, monkeypatch):
    """The audit row was written once, at once, while PostgreSQL was still away, and stayed at ``intent`` without
    the ids of the messages the action had moved (an adversarial run: 58-79 of 3,000)."""
    from app.adapters.broker import dead_letter_tools
    from app.adapters.postgres.db import make_engine
    from app.errors import DatabaseUnavailable
    from tests.tcp import Listener

    monkeypatch.setattr(dead_letter_tools, "AUDIT_COMPLETION_PAUSE_SECONDS", 0.2)
    dead_letter_three(services, broker_url, count=4)
    upstream = (engine.url.host, engine.url.port or 5432)
    proxy = [Listener(upstream)]
    through = make_engine(engine.url.set(port=proxy[0].port).render_as_string(hide_password=False))
    tools = type(services.dead_letters)(broker_url, through, queues=STEP_QUEUES)
    take = type(tools)._take
    back = threading.Timer(2.0, lambda: proxy.append(Listener(upstream, port=proxy[0].port)))

    def take_while_postgresql_is_away(self, *args):
        proxy[0].cut()  # every connection cut, and new ones refused, for two seconds
        back.start()
        return take(self, *args)

    monkeypatch.setattr(type(tools), "_take", take_while_postgresql_is_away)
    try:
        with pytest.raises(DatabaseUnavailable):
            tools.requeue(XQ, actor="ops:alice", expected=4, reason="the database is back")
    finally:
        back.join()
        through.dispose()
        for listener in proxy:
            listener.close()
    [row] = audit_rows(engine)
    assert row.details["status"] == "failed" and row.details["count"] == 0, row.details


def test_an_action_beside_another_holding_the_queue_too_long_is_busy_not_a_broker_outage(services, dead,
                                                                                          broker_url, engine):
    """The web waits 10 s for another operator's requeue to let go of the queue (its lock bound); then the console
    and the API said RabbitMQ was unavailable, RabbitMQ being fine (an adversarial run). It is ``queue_busy`` now,
    nothing done, and the operator is told to try again."""
    from sqlalchemy import text

    from app.adapters.broker.dead_letter_tools import NAMESPACE
    from app.adapters.postgres.db import make_engine
    from app.errors import QueueBusy
    from app.web.responses import status_of

    impatient = make_engine(str(engine.url.render_as_string(hide_password=False)), lock_timeout_seconds=0.5)
    tools = DeadLetters(broker_url, impatient, queues=STEP_QUEUES)
    try:
        with engine.begin() as other:  # another operator's requeue, holding the queue
            other.execute(text("SELECT pg_advisory_xact_lock(:ns, hashtext(:queue))"), {"ns": NAMESPACE, "queue": XQ})
            for act in (lambda: tools.purge(XQ, actor="ops:bob", expected=3), lambda: tools.listing(XQ)):
                with pytest.raises(QueueBusy, match="another listing, requeue or purge"):
                    act()
    finally:
        impatient.dispose()
    assert status_of(QueueBusy) == 409
    assert depth(broker_url, XQ) == 3 and audit_rows(engine) == []


class CommitAnswerLost:
    """A proxy to PostgreSQL (:class:`tests.tcp.Listener`) that lets the first ``COMMIT`` through and hangs up on its
    client before the answer comes back: the server commits, the client sees its connection drop. ``then_cut``: every
    connection cut, and new ones refused, once that COMMIT is through (nobody can look whether it landed)."""

    COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"

    def __init__(self, upstream: tuple[str, int], *, then_cut: bool = False, meanwhile=None):
        """``meanwhile``: called once the COMMIT is through, before the client's connection drops (what the world
        does while the client has not yet noticed)."""
        from tests.tcp import Listener

        proxy = self

        class Proxy(Listener):
            def _pipe(self, source, target):
                try:
                    upstream_side = target.getpeername()[1] == upstream[1]
                except OSError:  # the proxy closed this pair already (the test is over): nothing to pipe
                    return None
                if not upstream_side or proxy.fired.is_set():
                    return super()._pipe(source, target)
                try:
                    while data := source.recv(65536):
                        if proxy.COMMIT in data and not proxy.fired.is_set():
                            proxy.fired.set()
                            if meanwhile is not None:  # the answer swallowed while the world goes on
                                self.frozen.set()
                                target.sendall(data)
                                meanwhile()
                                self.frozen.clear()
                                source.shutdown(socket.SHUT_RDWR)
                                return
                            source.shutdown(socket.SHUT_RDWR)  # the client's connection drops first...
                            target.sendall(data)  # ...then PostgreSQL gets the COMMIT
                            if then_cut:
                                self.cut()
                            return
                        target.sendall(data)
                except OSError:
                    pass

        self.fired = threading.Event()
        self.listener = Proxy(upstream)
        self.port = self.listener.port

    def close(self):
        self.listener.close()


@pytest.mark.parametrize("verb", ["purge", "requeue"])
@pytest.mark.parametrize("broker_kind", ["postgres"])
def test_a_pg_action_whose_commit_went_unanswered_and_landed_is_done(services, broker_url, engine, verb):
    """The PostgreSQL broker moves the chosen dead letters in one transaction. Its COMMIT's answer lost, the call
    answered ``503 broker_unavailable`` with an audit row ``failed``, ``count: 0``, "what is listed was done, the
    rest is still in the queue", after the server had purged (or requeued) them all (an adversarial run)."""
    from app.adapters.broker.postgres_dead_letters import PostgresDeadLetters

    ids = dead_letter_three(services, broker_url, count=4)
    proxy = CommitAnswerLost((engine.url.host, engine.url.port or 5432))
    through = engine.url.set(port=proxy.port).render_as_string(hide_password=False)
    tools = PostgresDeadLetters(through, engine, queues=STEP_QUEUES, socket_timeout=2.0)
    try:
        result = getattr(tools, verb)(XQ, actor="ops:olga", expected=4, reason="db is back")
    finally:
        tools.close()
        proxy.close()
    assert proxy.fired.is_set(), "the COMMIT's answer was lost"
    assert result == {f"{verb}d": 4, "message_ids": ids, "not_found": []}
    assert depth(broker_url, XQ) == 0 and depth(broker_url, "attache.inspect") == (4 if verb == "requeue" else 0)
    [row] = audit_rows(engine)
    assert row.details == {"status": "completed", "all": True, "expected": 4, "depth": 4, f"{verb}d": ids,
                           "count": 4, "completed_at": ANY}


@pytest.mark.parametrize("broker_kind", ["postgres"])
def test_a_pg_purge_whose_commit_went_unanswered_and_cannot_be_checked_says_it_may_have_been_done(
        services, broker_url, engine):
    """Not "nothing was done" (``failed``, ``purged: []``) for messages that may have been purged."""
    from app.adapters.broker.postgres_dead_letters import PostgresDeadLetters
    from app.errors import OutcomeUnknown
    from app.web.responses import status_of

    ids = dead_letter_three(services, broker_url, count=4)
    proxy = CommitAnswerLost((engine.url.host, engine.url.port or 5432), then_cut=True)
    through = engine.url.set(port=proxy.port).render_as_string(hide_password=False)
    tools = PostgresDeadLetters(through, engine, queues=STEP_QUEUES, socket_timeout=1.0)
    try:
        with pytest.raises(OutcomeUnknown, match="may have been requeued or purged") as raised:
            tools.purge(XQ, actor="ops:olga", message_ids=ids, reason="poison")
    finally:
        tools.close()
        proxy.close()
    assert proxy.fired.is_set(), "the COMMIT's answer was lost"
    assert raised.value.error_code == "outcome_unknown" and status_of(raised.value) == 503
    assert depth(broker_url, XQ) in (0, 4), "one transaction: all or none"
    [row] = audit_rows(engine)
    assert row.details == {"status": "unknown", "message_ids": ids, "depth": 4, "purged": [], "count": 0,
                           "unknown": ids, "completed_at": ANY, "error": ANY}


class AckLost:
    """A proxy to RabbitMQ (:class:`tests.tcp.Listener`) that hangs up on both sides as the first ``basic.ack`` after
    it is armed passes toward the broker (a consumer's ack), which never gets it; or, ``toward_broker=False``,
    toward the client (a publisher confirm), which never gets it."""

    ACK = b"\x00\x3c\x00\x50"  # a method frame's class and method: basic (60), ack (80)

    def __init__(self, upstream: tuple[str, int], *, toward_broker: bool = True):
        from tests.tcp import Listener

        proxy = self

        class Proxy(Listener):
            def _pipe(self, source, target):
                if (target.getpeername()[1] == upstream[1]) != toward_broker:
                    return super()._pipe(source, target)
                try:
                    while data := source.recv(65536):
                        if proxy.armed.is_set() and proxy.ACK in data and not proxy.fired.is_set():
                            proxy.fired.set()
                            self.cut()
                            return
                        target.sendall(data)
                except OSError:
                    pass

        self.armed, self.fired = threading.Event(), threading.Event()
        self.listener = Proxy(upstream)
        self.port = self.listener.port

    def close(self):
        self.listener.close()


def acted_as_an_ack_is_lost(services, broker_url, engine, verb: str, *, toward_broker: bool) -> None:
    """``verb`` all three dead letters of :data:`XQ` through an :class:`AckLost` proxy, which fails the call."""
    host, port = services.settings.broker_url.split("@", 1)[1].split("/", 1)[0].split(":")
    proxy = AckLost((host, int(port)), toward_broker=toward_broker)
    through = broker_url.replace(f"@{host}:{port}/", f"@127.0.0.1:{proxy.port}/")
    tools = DeadLetters(through, engine, queues=STEP_QUEUES, socket_timeout=2.0)
    proxy.armed.set()
    try:
        with pytest.raises(BrokerUnavailable):
            getattr(tools, verb)(XQ, actor="ops:olga", expected=3, reason="the test's")
    finally:
        tools.close()
        proxy.close()
    assert proxy.fired.is_set(), "the ack was lost"


def test_a_rabbitmq_purge_whose_connection_dropped_as_it_acked_does_not_call_that_message_purged(
        services, broker_url, engine):
    """An ack gets no answer: the audit row listed as purged a message whose ack the broker never got, and which was
    still in the queue (status failed: "what is listed was done"; an adversarial run)."""
    ids = dead_letter_three(services, broker_url)
    acted_as_an_ack_is_lost(services, broker_url, engine, "purge", toward_broker=True)
    assert depth(broker_url, XQ) == 3, "nothing was purged"
    [row] = audit_rows(engine)
    assert (row.details["status"], row.details["purged"], row.details["count"]) == ("failed", [], 0), row.details
    assert row.details["unknown"] == ids[:1]


@pytest.mark.parametrize("broker_kind", ["postgres"])
def test_a_pg_requeue_that_landed_and_came_back_before_the_look_is_done(services, broker_url, engine):
    """A re-attack: the requeue's COMMIT landed, a worker ran the messages and dead-lettered them again before the
    client noticed its connection was gone, and the look, judging by their state alone, found them all dead letters
    and audited the requeue ``failed``, nothing done."""
    from app.adapters.broker.postgres_dead_letters import PostgresDeadLetters

    ids = dead_letter_three(services, broker_url, count=4)

    def run_and_dead_letter_again():
        wait_for(lambda: depth(broker_url, "attache.inspect") == 4, timeout=10, message="the requeue landed")
        reject(services, broker_url, ids)

    proxy = CommitAnswerLost((engine.url.host, engine.url.port or 5432), meanwhile=run_and_dead_letter_again)
    through = engine.url.set(port=proxy.port).render_as_string(hide_password=False)
    tools = PostgresDeadLetters(through, engine, queues=STEP_QUEUES, socket_timeout=2.0)
    try:
        result = tools.requeue(XQ, actor="ops:olga", expected=4, reason="decoder fixed")
    finally:
        tools.close()
        proxy.close()
    assert proxy.fired.is_set(), "the COMMIT's answer was lost"
    assert result["requeued"] == 4 and depth(broker_url, XQ) == 4, "dead letters again, after a requeue that landed"
    [row] = audit_rows(engine)
    assert (row.details["status"], row.details["requeued"]) == ("completed", ids), row.details


def test_a_rabbitmq_requeue_cut_while_its_publish_awaited_the_confirm_names_that_message(services, broker_url, engine):
    """A re-attack: the publish went through and its confirm was lost with the connection; the message was in the
    step queue and still a dead letter, and the audit row named it neither requeued nor unknown."""
    ids = dead_letter_three(services, broker_url)
    acted_as_an_ack_is_lost(services, broker_url, engine, "requeue", toward_broker=False)
    assert depth(broker_url, "attache.inspect") == 1 and depth(broker_url, XQ) == 3, "published, and still there"
    [row] = audit_rows(engine)
    assert (row.details["status"], row.details["requeued"], row.details["unknown"]) == ("failed", [], ids[:1])
