"""A PostgreSQL that goes silent (no answer, no reset) is found in seconds, not in the kernel's hours.

The client runs on a second host (``tests/netns.py``) and reaches the
shared PostgreSQL through a proxy on this side; cutting the cable leaves
its connections open with nothing behind them. Before ``liveness.py`` a
query waiting for its answer waited for the kernel's first keepalive (2 h),
and a pooled connection's ping for the retransmissions (about 15 min).
"""

from __future__ import annotations

import re
import select
import time
from urllib.parse import urlsplit

import pytest
from sqlalchemy import create_engine

from app.adapters.broker.postgres import make_pool
from app.adapters.postgres import db
from app.adapters.postgres.liveness import LIVENESS
from tests.conftest import BROKER_KINDS
from tests.netns import SecondHost
from tests.pgcluster import PrivateCluster
from tests.processes import Deployment, wait_for
from tests.tcp import Listener

#: a silent server must be found within this many seconds of the cut (the settings give about 10-15)
FOUND_WITHIN = 25

IN_FLIGHT = """
import sys, time
from app.adapters.postgres.db import make_engine, transaction
from app.errors import DatabaseUnavailable
engine = make_engine(sys.argv[1], process="silence in-flight")
print("querying")
try:
    with transaction(engine) as conn:
        conn.exec_driver_sql("SELECT pg_sleep(120)")
    print("answered")
except DatabaseUnavailable:
    print("unavailable")
"""

POOLED = """
import sys
from app.adapters.postgres.db import make_engine, transaction
from app.errors import DatabaseUnavailable
engine = make_engine(sys.argv[1], process="silence pooled")
with transaction(engine) as conn:
    conn.exec_driver_sql("SELECT 1")
print("pooled")
sys.stdin.readline()
try:
    with transaction(engine) as conn:
        conn.exec_driver_sql("SELECT 1")
    print("answered")
except DatabaseUnavailable:
    print("unavailable")
"""

BROKER_POOL = """
import sys
from psycopg import OperationalError
from app.adapters.broker.postgres import make_pool
pool = make_pool(sys.argv[1], timeout=5)
print("querying")
try:
    with pool.connection() as conn:
        conn.execute("SELECT pg_sleep(120)")
    print("answered")
except OperationalError:
    print("unavailable")
"""


HOLDER = """
import sys
from sqlalchemy import text
from app.adapters.postgres.db import make_engine
engine = make_engine(sys.argv[1], process="silence holder")  # as the web's and the scheduler's: no idle limit
with engine.connect() as conn:
    conn.execute(text("SELECT pg_advisory_lock(4242)"))  # a scheduler's cleanup round holds one for its round
    conn.execute(text("SELECT id FROM outbox_like FOR UPDATE"))  # as the relay holds the rows it publishes
    print("locked")
    sys.stdin.readline()
"""


def _line(child, seconds: float) -> str | None:
    ready, _, _ = select.select([child.stdout], [], [], max(0.0, seconds))
    return child.stdout.readline().strip() if ready else None


def _sleeping(admin, application_name: str) -> bool:
    with admin.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state = 'active'"
            " AND query LIKE %s", (application_name, "%pg_sleep%")).scalar() > 0


def test_a_silent_database_is_found_in_seconds(database_url):
    admin = create_engine(database_url.replace("postgresql://", "postgresql+psycopg2://"),
                          isolation_level="AUTOCOMMIT")
    target = urlsplit(database_url)
    host = SecondHost()
    proxy = Listener((target.hostname, target.port or 5432), host=host.here)
    children = {}
    try:
        url = f"postgresql://postgres@{host.here}:{proxy.port}{target.path}"
        children["in-flight"] = host.python(IN_FLIGHT, url)
        children["pooled"] = host.python(POOLED, url)
        children["broker pool"] = host.python(BROKER_POOL, url + "?application_name=silence+broker")
        assert _line(children["in-flight"], 30) == "querying"
        assert _line(children["broker pool"], 30) == "querying"
        assert _line(children["pooled"], 30) == "pooled", children["pooled"].stderr.read()
        deadline = time.monotonic() + 30
        while not (_sleeping(admin, "attache silence in-flight") and _sleeping(admin, "silence broker")):
            assert time.monotonic() < deadline, "the queries never reached PostgreSQL"
            time.sleep(0.1)

        host.cut()
        cut_at = time.monotonic()
        children["pooled"].stdin.write("go\n")
        children["pooled"].stdin.flush()

        found = {}
        for name, child in children.items():
            line = _line(child, cut_at + FOUND_WITHIN + 20 - time.monotonic())
            found[name] = (line, round(time.monotonic() - cut_at, 1))
        print("after the cut:", found)
        for name, (line, seconds) in found.items():
            assert line == "unavailable", f"{name}: {line or 'still waiting'} after {seconds} s"
            assert seconds <= FOUND_WITHIN, f"{name}: found after {seconds} s"
    finally:
        for child in children.values():
            child.kill()
            child.wait()
        proxy.close()
        host.remove()
        with admin.connect() as conn:
            conn.exec_driver_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                 " WHERE application_name LIKE %s", ("%silence%",))
        admin.dispose()


def _effective(dsn_parameters: dict) -> dict:
    return {name: dsn_parameters.get(name) for name in LIVENESS}


def test_each_connection_carries_the_settings_and_the_url_wins(database_url):
    engine = db.make_engine(database_url)
    with engine.connect() as conn:
        assert _effective(conn.connection.dbapi_connection.get_dsn_parameters()) == dict(LIVENESS)
    engine.dispose()
    engine = db.make_engine(database_url + "?keepalives_idle=30&tcp_user_timeout=60000")
    with engine.connect() as conn:
        given = conn.connection.dbapi_connection.get_dsn_parameters()
    engine.dispose()
    assert (given["keepalives_idle"], given["tcp_user_timeout"], given["keepalives_count"]) == ("30", "60000", "3")

    pool = make_pool(database_url + "?keepalives_interval=7", timeout=5)
    try:
        with pool.connection() as conn:
            dsn = dict(re.findall(r"(\w+)=(\S+)", conn.info.dsn))
    finally:
        pool.close()
    assert (dsn["keepalives_interval"], dsn["keepalives_idle"], dsn["tcp_user_timeout"]) == ("7", "5", "10000")


SHOW_SERVER = ("SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'), "
               "current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout'), "
               "current_setting('idle_in_transaction_session_timeout'), current_setting('statement_timeout')")


def test_the_server_is_asked_for_the_same_on_its_side_and_the_url_wins(database_url):
    engine = db.make_engine(database_url, idle_in_transaction_seconds=6)
    with engine.connect() as conn:
        assert conn.exec_driver_sql(SHOW_SERVER).one() == ("5", "2", "3", "10000", "6s", "0")
    engine.dispose()
    own = "?keepalives_idle=30&tcp_user_timeout=60000&options=-c%20statement_timeout%3D1234"
    engine = db.make_engine(database_url + own)
    with engine.connect() as conn:
        assert conn.exec_driver_sql(SHOW_SERVER).one() == ("30", "2", "3", "60000", "0", "1234ms")
    engine.dispose()

    pool = make_pool(database_url + "?keepalives_interval=7", timeout=5)
    try:
        with pool.connection() as conn:
            assert conn.execute(SHOW_SERVER).fetchone() == ("5", "7", "3", "10000", "10s", "0")
    finally:
        pool.close()


#: the silent client's URL asks for these (the URL's own win on both sides): its session is ended in about 3 s
FAST = "keepalives_idle=1&keepalives_interval=1&keepalives_count=2&tcp_user_timeout=3000"
#: PostgreSQL ends the session of a client gone silent within this many seconds
FREED_WITHIN = 10


def test_the_server_ends_the_session_of_a_client_gone_silent_and_frees_its_locks():
    """A scheduler's machine freezes or its network goes silent while it holds locks: an advisory lock (a cleanup
    round) and rows (``FOR UPDATE SKIP LOCKED``: outbox rows it publishes, jobs it recovers). The server side of
    its connection waited on the kernel's keepalives (over two hours), and every other process passed those rows
    over: an upload's message unpublished, a dead worker's job not recovered. The client connects straight to a
    PostgreSQL of the test's own that listens on the cable (a proxy on this side would answer for it)."""
    host = SecondHost()
    cluster = PrivateCluster(listen=(host.here,))
    holder = None
    try:
        cluster.start()
        admin = create_engine(cluster.admin_url.replace("postgresql://", "postgresql+psycopg2://"),
                              isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE outbox_like (id int)")
            conn.exec_driver_sql("INSERT INTO outbox_like VALUES (1)")
        holder = host.python(HOLDER, f"postgresql://postgres@{host.here}:{cluster.port}/postgres?{FAST}")
        assert _line(holder, 30) == "locked", holder.stderr.read()

        def free() -> bool:
            with admin.connect() as conn:
                rows = conn.exec_driver_sql("SELECT id FROM outbox_like FOR UPDATE SKIP LOCKED").all()
                advisory = conn.exec_driver_sql("SELECT pg_try_advisory_lock(4242)").scalar()
                if advisory:
                    conn.exec_driver_sql("SELECT pg_advisory_unlock(4242)")
            return bool(rows) and advisory

        assert not free()
        host.cut()
        cut_at = time.monotonic()
        deadline = cut_at + 45
        while not free():
            assert time.monotonic() < deadline, "the silent client's locks are still held"
            time.sleep(0.5)
        freed_after = time.monotonic() - cut_at
        print(f"the silent client's locks freed {freed_after:.1f} s after the cut")
        assert freed_after <= FREED_WITHIN
        admin.dispose()
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        host.remove()
        cluster.destroy()


def test_the_web_answers_503_soon_when_a_proxy_before_postgresql_swallows_every_byte(env, tmp_path, data_file):
    """An adversarial run: a pooler or proxy whose backend went silent still acknowledges every byte, so TCP never
    finds the server gone; an upload talking to the database waited for as long as the outage lasted (60 and 150
    s, longer than gunicorn's --timeout), and held its uploader's body slots meanwhile. Now the web waits
    ATTACHE_DATABASE_ANSWER_SECONDS for the server's next byte, then answers 503."""
    target = urlsplit(env["DATABASE_URL"])
    proxy = Listener(upstream=(target.hostname, target.port or 5432))
    deployment = Deployment({**env, "DATABASE_URL": env["DATABASE_URL"].replace(
        target.netloc, f"{target.username}@127.0.0.1:{proxy.port}"), "ATTACHE_DATABASE_ANSWER_SECONDS": "12"},
        tmp_path)
    try:
        deployment.start("web")
        assert deployment.upload(data_file("photos/chelsea.jpg")).status_code == 202
        proxy.frozen.set()  # bytes vanish both ways; connections stay open, new ones are taken
        for _ in range(2):  # a pooled connection's ping (cut after 12 s), then another's or a new one's
            began = time.monotonic()
            refused = deployment.upload(data_file("photos/coffee.jpg"))
            assert refused.status_code == 503 and refused.headers.get("Retry-After"), refused.text
            assert time.monotonic() - began < 12 + 5 + 3, time.monotonic() - began  # the cut, then a reconnect
        assert "PostgreSQL sent no answer for 12 s (ATTACHE_DATABASE_ANSWER_SECONDS)" in deployment.logs()
        proxy.frozen.clear()
        wait_for(lambda: deployment.upload(data_file("photos/coffee.jpg")).status_code == 202, timeout=30,
                 message="uploads accepted again once the proxy forwards")
    finally:
        deployment.stop_all()
        proxy.close()


@pytest.mark.parametrize("broker_kind", BROKER_KINDS)
def test_a_worker_and_a_scheduler_whose_answers_vanish_behind_a_proxy_carry_on(env, tmp_path, data_file,
                                                                                broker_kind):
    """An adversarial run: behind a proxy whose backend went silent and lost the bytes sent meanwhile, a worker's
    thread and the scheduler's rounds (lease recovery, the outbox relay among them) waited for an answer for good,
    and so did the PostgreSQL broker's claims: uploads accepted by a web that reached PostgreSQL stayed queued
    until worker and scheduler were restarted. Now each connection waits ATTACHE_BACKGROUND_ANSWER_SECONDS (here
    12) at most, and the step, the claim or the round runs again."""
    target = urlsplit(env["DATABASE_URL"])
    proxies = {name: Listener(upstream=(target.hostname, target.port or 5432)) for name in ("worker", "scheduler")}
    deployment = Deployment({**env, "ATTACHE_BACKGROUND_ANSWER_SECONDS": "12"}, tmp_path)
    try:
        deployment.start("web")  # straight to PostgreSQL: it accepts uploads throughout
        for name, proxy in proxies.items():
            through = env["DATABASE_URL"].replace(target.netloc, f"{target.username}@127.0.0.1:{proxy.port}")
            deployment.start(name, DATABASE_URL=through,
                             BROKER_URL=through if broker_kind == "postgres" else env["BROKER_URL"])
        assert deployment.wait_state(deployment.upload(data_file("photos/chelsea.jpg")).json()["id"],
                                     timeout=60)["state"] == "ready"
        for proxy in proxies.values():
            proxy.frozen.set()  # bytes vanish both ways; connections stay open
        accepted = deployment.upload(data_file("photos/coffee.jpg"))
        assert accepted.status_code == 202, accepted.text
        wait_for(lambda: all(proxy.swallowed for proxy in proxies.values()), timeout=30,
                 message="the worker and the scheduler each sent something that vanished")
        thawed = time.monotonic()
        for proxy in proxies.values():
            proxy.frozen.clear()  # what was lost stays lost: its answer never comes
        assert deployment.wait_state(accepted.json()["id"], timeout=60)["state"] == "ready", \
            "before: stuck queued or processing for as long as worker and scheduler lived"
        assert time.monotonic() - thawed < 12 + 40
        if broker_kind == "rabbitmq":  # the PostgreSQL broker's waits are polls of 2 s or claims, not always cut
            wait_for(lambda: "PostgreSQL sent no answer for 12 s (ATTACHE_BACKGROUND_ANSWER_SECONDS)"
                     in deployment.logs(), timeout=30, message="the lost answers' connections cut")
        assert deployment.wait_state(deployment.upload(data_file("photos/chelsea.jpg")).json()["id"],
                                     timeout=60)["state"] == "ready", "and the next upload goes through"
    finally:
        deployment.stop_all()
        for proxy in proxies.values():
            proxy.close()


def test_the_postgresql_brokers_wait_for_a_lost_answer_is_cut(database_url):
    """Behind a proxy whose backend went silent and lost the bytes sent meanwhile, the PostgreSQL broker's claims
    and heartbeats (psycopg 3, outside the engine) waited for good: the worker took no message until it was
    restarted (an adversarial run). Its connections' waits are watched as the engine's are."""
    import threading

    from psycopg import OperationalError

    from app.adapters.broker.postgres import cursor
    from app.adapters.postgres.liveness import AnswerWatch

    target = urlsplit(database_url)
    proxy = Listener(upstream=(target.hostname, target.port or 5432))
    pool = make_pool(database_url.replace(target.netloc, f"{target.username}@127.0.0.1:{proxy.port}"), timeout=5,
                     answer=AnswerWatch(None, 2, "the test's deadline"))
    outcome = []

    def claim():
        try:
            with cursor(pool) as curs:
                proxy.frozen.set()  # the statement's bytes vanish; its answer never comes
                curs.execute("SELECT 1")
            outcome.append("answered")
        except OperationalError as exc:
            outcome.append(exc)

    try:
        began = time.monotonic()
        waiting = threading.Thread(target=claim, daemon=True)
        waiting.start()
        waiting.join(15)
        assert outcome and isinstance(outcome[0], OperationalError), f"before: still waiting ({outcome})"
        assert time.monotonic() - began < 2 + 3
    finally:
        proxy.frozen.clear()
        pool.close()
        proxy.close()


@pytest.mark.parametrize("library", ["engine", "broker"])
def test_a_wait_cut_by_the_answer_watch_ends_on_the_server_too(database_url, library):
    """A re-attack: a statement waiting on the server (for a lock a CREATE INDEX holds) was cut on the client's
    side only; its session went on waiting there, holding its transaction's locks and a connection slot, and the
    thread's next try made another: 22 sessions after 150 s for one worker process of two threads. Now the server
    looks for its client every CLIENT_CHECK_MILLISECONDS (5 s) while a statement runs."""
    from sqlalchemy import text

    from app.adapters.broker.postgres import cursor
    from app.adapters.postgres.liveness import AnswerWatch

    holder = create_engine(database_url)
    watched = db.make_engine(database_url, process="watched") if library == "engine" else None
    watch = AnswerWatch(watched, 2, "the test's deadline")
    pool = make_pool(database_url, timeout=5, answer=watch) if library == "broker" else None

    def waiting_sessions() -> int:
        with holder.connect() as conn:
            return conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = "
                "'Lock' AND pid <> pg_backend_pid()")).scalar()

    try:
        with holder.connect() as held:
            held.execute(text("SELECT pg_advisory_lock(727001)"))
            with pytest.raises(Exception):  # noqa: B017 - cut: a lost connection, as each library says it
                if watched is not None:
                    with watched.connect() as conn:
                        conn.execute(text("SELECT pg_advisory_lock(727001)"))
                else:
                    with cursor(pool) as curs:
                        curs.execute("SELECT pg_advisory_lock(727001)")
            cut = time.monotonic()
            wait_for(lambda: waiting_sessions() == 0, timeout=15,
                     message="before: the cut statement's session still waits on the server for the lock")
            assert time.monotonic() - cut < 5 + 3
            held.execute(text("SELECT pg_advisory_unlock_all()"))
    finally:
        holder.dispose()
        if watched is not None:
            watched.dispose()
        if pool is not None:
            pool.close()


def test_the_web_still_moves_on_to_the_next_host_of_its_url_when_the_first_is_silent(env, tmp_path, data_file):
    """A re-attack of the fix above, first made with psycopg2's "green" mode: connects no longer kept libpq's
    connect_timeout (30 s, not 5, to a 503) nor its failover to the URL's next host (every upload refused while a
    healthy host was listed)."""
    target = urlsplit(env["DATABASE_URL"])
    silent = Listener()  # accepts, never answers
    url = f"postgresql://{target.username}@{target.path}?host=127.0.0.1,{target.hostname}" \
          f"&port={silent.port},{target.port or 5432}"
    deployment = Deployment({**env, "DATABASE_URL": url}, tmp_path)
    try:
        deployment.start("web")
        began = time.monotonic()
        assert deployment.upload(data_file("photos/chelsea.jpg")).status_code == 202
        assert time.monotonic() - began < 15
    finally:
        deployment.stop_all()
        silent.close()
