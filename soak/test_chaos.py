"""``make soak``: a chaos run that tries to break the central promise the way the world does.

Outside ``make test`` (it takes minutes and stops servers). It runs web,
worker and scheduler against a PostgreSQL server, a RabbitMQ node and a
storage filesystem of its own, so stopping them disturbs nobody, and
uploads ``SOAK_UPLOADS`` (1,000) distinct photos through a client that
retries with its ``Idempotency-Key`` while, in turns:

* web, worker and scheduler are SIGKILLed every few seconds;
* PostgreSQL connections are terminated;
* the worker is SIGSTOPped past its lease, then resumed (late writes must change nothing);
* RabbitMQ is stopped and started;
* PostgreSQL is stopped for longer than Dramatiq's retry budget (the worker's steps wait for it);
* storage refuses writes for a while (its filesystem remounted read-only).

Then it asserts: every accepted upload ends ``ready``; every variant
downloads with the sha256 its status names; one effect per
``(attachment_id, pipeline_version, variant)``; nothing visible without a
202; ``ready`` never regresses; no job ever hit ``staging_missing``; no
message was dead-lettered (a 20 s outage of PostgreSQL sent 112-419 to
``.XQ`` before the steps waited for it); after
GC and staging cleanup with zero grace no unreferenced object is left.
It prints its figures. The run is bounded by ``SOAK_SECONDS`` (900).

``SOAK_BROKER=postgres make soak`` runs the same chaos against the
PostgreSQL broker (single-node mode's), in the private cluster's database;
the RabbitMQ restart turn is then left out (there is no RabbitMQ), and the
PostgreSQL stop stops the broker with the database.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from PIL import Image, ImageDraw
from sqlalchemy import create_engine, func, select, text

from app.adapters.postgres import db
from app.adapters.postgres.models import attachments, job_history, jobs, variants
from app.config import Settings
from app.core import pipeline
from app.services import Services
from scheduler.object_gc import ObjectGc, ObjectGcConfig
from scheduler.staging_cleanup import StagingCleanup, StagingCleanupConfig
from tests.pgcluster import PrivateCluster
from tests.processes import Deployment, wait_for
from tests.rabbitnode import PrivateRabbit

UPLOADS = int(os.environ.get("SOAK_UPLOADS", "1000"))
BOUND = float(os.environ.get("SOAK_SECONDS", "900"))
CLIENTS = int(os.environ.get("SOAK_CLIENTS", "8"))
RATE = float(os.environ.get("SOAK_RATE", "8"))  # uploads started per second, like users arriving
#: ``rabbitmq`` (a private RabbitMQ node, restarted mid-run) or ``postgres`` (the PostgreSQL broker in the
#: private cluster's database: stopping PostgreSQL stops the broker too, and no RabbitMQ node is started)
BROKER = os.environ.get("SOAK_BROKER", "rabbitmq")
LEASE = 5.0
#: the largest image made in one step here: the 480x360 photos are, the 1280x960 ones are not (see :func:`photo`)
ONE_STEP_MAX_PIXELS = 1024 * 1024
TOKEN = "soak-uploader"
OPERATOR = "soak-operator"


def photo(i: int) -> bytes:
    """A distinct JPEG per upload (deterministic).

    Three in four are 480x360, whose variants the inspect step makes itself;
    every fourth is 1280x960, above the soak's ``ATTACHE_ONE_STEP_MAX_PIXELS``
    (:data:`ONE_STEP_MAX_PIXELS`, not the default, which takes every image),
    and gets a render message per variant: the chaos meets both paths.
    """
    rng = random.Random(i)
    width, height = (1280, 960) if i % 4 == 3 else (480, 360)
    image = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x, y = rng.randrange(width), rng.randrange(height)
        draw.rectangle((x, y, x + rng.randrange(20, 200), y + rng.randrange(20, 150)),
                       fill=tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=85)
    return out.getvalue()


class Storage:
    """A filesystem of the run's own (tmpfs) that can be made to refuse writes."""

    def __init__(self):
        self.path = Path(tempfile.mkdtemp(prefix="attache-soak-storage-"))
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", str(self.path)],
                                capture_output=True)
        self.mounted = result.returncode == 0
        if not self.mounted:
            print(f"\nsoak: cannot mount a tmpfs ({result.stderr.decode().strip()}): "
                  "the storage fault runs as a read-only chmod instead (root ignores it)")

    def refuse_writes(self) -> None:
        if self.mounted:
            # a remount to read-only is refused (EBUSY) while a file is open for writing, as a worker's
            # variant is for a few milliseconds: asked again until it lands (a run failed on the first try)
            wait_for(lambda: subprocess.run(["mount", "-o", "remount,ro", str(self.path)],
                                            capture_output=True).returncode == 0,
                     timeout=30, interval=0.01, message="storage remounted read-only")
        else:
            self.path.chmod(0o555)

    def accept_writes(self) -> None:
        if self.mounted:
            subprocess.run(["mount", "-o", "remount,rw", str(self.path)], check=True)
        else:
            self.path.chmod(0o755)

    def destroy(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        subprocess.run(["rm", "-rf", str(self.path)], capture_output=True)


@pytest.fixture
def world(tmp_path):
    postgres, storage = PrivateCluster(), Storage()
    rabbit = PrivateRabbit() if BROKER == "rabbitmq" else None
    deployment = None
    try:
        postgres.start()
        if rabbit is not None:
            rabbit.start()
        database_url = postgres.url("attache")
        spools = tmp_path / "web-tmp"
        spools.mkdir()
        db.ensure_database(database_url)
        db.upgrade(database_url)
        env = {
            "DATABASE_URL": database_url, "BROKER_URL": rabbit.url if rabbit is not None else database_url,
            "STORAGE_URL": f"file://{storage.path}",
            "ATTACHE_API_TOKENS": f"{TOKEN}=soak:uploader,{OPERATOR}=ops:operator",
            "ATTACHE_PIPELINE_VERSION": "1", "ATTACHE_ONE_STEP_MAX_PIXELS": str(ONE_STEP_MAX_PIXELS),
            "ATTACHE_LEASE_SECONDS": str(LEASE), "ATTACHE_LEASE_INTERVAL_SECONDS": "0.5",
            "ATTACHE_OUTBOX_PUBLISH_AFTER_SECONDS": "1", "ATTACHE_OUTBOX_INTERVAL_SECONDS": "0.5",
            "ATTACHE_BROKER_MIN_BACKOFF_MS": "100", "ATTACHE_BROKER_RETRIES": "2",
            "ATTACHE_RECONCILE_AFTER_SECONDS": "20", "ATTACHE_RECONCILE_INTERVAL_SECONDS": "1",
            "ATTACHE_PUBLISH_TIMEOUT_SECONDS": "2", "ATTACHE_CLEANUP_INTERVAL_SECONDS": "5",
            "WORKER_THREADS": "4",
            "TMPDIR": str(spools),  # a web SIGKILLed mid-upload leaves its spool: here, not in the machine's /tmp
        }
        deployment = Deployment(env, tmp_path)
        deployment.session.headers["Authorization"] = f"Bearer {TOKEN}"
        yield deployment, postgres, rabbit, storage
    finally:
        if deployment is not None:
            deployment.stop_all()
        if rabbit is not None:
            rabbit.destroy()
        postgres.destroy()
        storage.destroy()  # unmounting drops a read-only mount too


class Client:
    """Uploads each photo until it gets a 202, retrying with the same Idempotency-Key."""

    def __init__(self, url: str, deadline: float):
        self.began = time.monotonic()
        self.url = url
        self.deadline = deadline
        self.accepted: dict[int, str] = {}
        self.statuses = Counter()
        self.refused: list[tuple[int, int, str]] = []
        self.lock = threading.Lock()

    def upload(self, i: int) -> None:
        body, key = photo(i), str(uuid.uuid4())
        time.sleep(max(0.0, self.began + i / RATE - time.monotonic()))
        session = requests.Session()
        session.headers.update({"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": key})
        pause = 0.2
        while time.monotonic() < self.deadline:
            try:
                response = session.post(self.url + "/v1/attachments", timeout=20,
                                        files={"file": (f"soak-{i}.jpg", body, "image/jpeg")})
                status = response.status_code
            except requests.RequestException as exc:
                status, response = type(exc).__name__, None
            with self.lock:
                self.statuses[status] += 1
            if status == 202:
                with self.lock:
                    self.accepted[i] = response.json()["id"]
                return
            if isinstance(status, int) and status < 500 and status not in (408, 429):
                with self.lock:
                    self.refused.append((i, status, response.text[:200]))
                return
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


class Chaos(threading.Thread):
    """Faults in turns until told to stop and every once-only fault has fired."""

    def __init__(self, deployment, postgres, rabbit, storage, client: Client):
        super().__init__(name="chaos", daemon=True)
        self.deployment, self.postgres, self.rabbit, self.storage, self.client = (
            deployment, postgres, rabbit, storage, client)
        self.done = threading.Event()
        self.figures = Counter()
        self.log: list[str] = []
        self.errors: list[BaseException] = []
        #: each fires once, every fourth turn, while kills go on in between
        self.once = [self.pause_worker, self.restart_rabbit, self.stop_postgres, self.refuse_storage]
        if rabbit is None:  # SOAK_BROKER=postgres
            self.once.remove(self.restart_rabbit)

    def note(self, what: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {what}")

    def run(self) -> None:
        turn = kills = 0
        try:
            while not (self.done.is_set() and not self.once):
                time.sleep(random.uniform(2.0, 4.0))
                turn += 1
                if turn % 4 == 0 and self.once:
                    self.once.pop(0)()
                    continue
                victim = ("web", "worker", "connections", "scheduler")[kills % 4]
                kills += 1
                if victim == "connections":
                    self.terminate_connections()
                else:
                    self.kill(victim)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def kill(self, name: str) -> None:
        process = self.deployment.processes.get(name)
        if process is not None and process.alive:
            process.kill()
            self.figures[f"SIGKILL {name}"] += 1
        self.deployment.start(name, wait=False)

    def terminate_connections(self) -> None:
        engine = create_engine(self.postgres.admin_url.replace("postgresql://", "postgresql+psycopg2://"))
        try:
            with engine.connect() as conn:
                ended = conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                          "WHERE datname = 'attache' AND pid <> pg_backend_pid()")).scalar()
            self.figures["PostgreSQL connections terminated"] += ended
            self.figures["connection-termination rounds"] += 1
        except Exception as exc:
            self.note(f"terminate failed: {exc}")
        finally:
            engine.dispose()

    def pause_worker(self) -> None:
        worker = self.deployment.processes["worker"]
        if not worker.alive:
            self.deployment.start("worker")
            worker = self.deployment.processes["worker"]
        worker.signal(signal.SIGSTOP)
        self.note("worker SIGSTOPped")
        time.sleep(LEASE * 2.5)  # past its lease: the scheduler recovers its jobs meanwhile
        worker.signal(signal.SIGCONT)
        self.note("worker resumed")
        self.figures["SIGSTOP past the lease"] += 1

    def restart_rabbit(self) -> None:
        self.rabbit.stop_app()
        self.note("RabbitMQ stopped")
        time.sleep(10)
        self.rabbit.start_app()
        self.note("RabbitMQ started")
        self.figures["RabbitMQ restarts"] += 1

    def stop_postgres(self) -> None:
        self.postgres.stop()
        began = time.monotonic()
        self.note("PostgreSQL stopped")
        try:
            time.sleep(20)  # Dramatiq's retries here last well under a second; the steps wait for PostgreSQL
        finally:
            self.postgres.start()
        self.note("PostgreSQL started")
        self.figures["PostgreSQL outage seconds"] += round(time.monotonic() - began)

    def refuse_storage(self) -> None:
        self.storage.refuse_writes()
        began = time.monotonic()
        self.note("storage read-only")
        try:
            time.sleep(10)
        finally:
            self.storage.accept_writes()
        self.note("storage writable")
        self.figures["storage read-only seconds"] += round(time.monotonic() - began)


def test_chaos_soak(world):
    deployment, postgres, rabbit, storage = world
    began = time.monotonic()
    deadline = began + BOUND
    for name in ("web", "worker", "scheduler"):
        deployment.start(name)
    client = Client(deployment.url, deadline - 120)
    chaos = Chaos(deployment, postgres, rabbit, storage, client)
    chaos.start()
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(client.upload, range(UPLOADS)))
    finally:
        chaos.done.set()  # it goes on until its once-only faults have fired
        chaos.join(timeout=300)
    upload_seconds = time.monotonic() - began
    assert not chaos.errors, chaos.errors
    assert not chaos.once, f"faults that never fired: {chaos.once}"
    for name in ("web", "worker", "scheduler"):
        process = deployment.processes.get(name)
        if process is None or not process.alive:
            deployment.start(name)
    assert deployment.processes["web"].alive

    accepted = set(client.accepted.values())
    settings = Settings.from_env({**deployment.env})
    services = Services(settings)
    engine = services.engine

    def drained():
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(jobs)
                                .where(jobs.c.state.in_(("queued", "processing")))).scalar() == 0

    wait_for(drained, timeout=max(60.0, deadline - time.monotonic()), interval=1, message="every job terminal")
    drain_seconds = time.monotonic() - began - upload_seconds

    with engine.connect() as conn:
        states = Counter(dict(conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all()))
        codes = Counter(dict(conn.execute(select(jobs.c.error_code, func.count())
                                          .where(jobs.c.state == "failed").group_by(jobs.c.error_code)).all()))
        visible = {str(a) for a in conn.execute(select(attachments.c.id)).scalars()}
        duplicates = conn.execute(text(
            "SELECT count(*) FROM (SELECT 1 FROM variants GROUP BY attachment_id, pipeline_version, variant "
            "HAVING count(*) > 1) d")).scalar()
        regressions = conn.execute(text(
            "SELECT count(*) FROM job_history h JOIN job_history r ON r.job_id = h.job_id AND r.id > h.id "
            "WHERE h.to_state = 'ready'")).scalar()
        staging_missing = conn.execute(select(func.count()).select_from(job_history)
                                       .where(job_history.c.error_code == "staging_missing")).scalar()
        history = Counter({f"{a or 'none'}->{b}" + (f" ({c})" if c else ""): n for a, b, c, n in conn.execute(text(
            "SELECT from_state, to_state, error_code, count(*) FROM job_history GROUP BY 1, 2, 3"))})
        dead = conn.execute(text("SELECT count(*) FROM dead_letters")).scalar()
        dead_by_cause = Counter({f"{actor} {code} (retries {retries}): {reason[:160]}": n for actor, code, retries,
                                 reason, n in conn.execute(text(
                                     "SELECT actor_name, error_code, retries, reason, count(*) FROM dead_letters "
                                     "GROUP BY 1, 2, 3, 4"))})

    xq = {queue: services.broker.queue_depth(f"{queue}.XQ") or 0
          for queue in ("attache.inspect", "attache.render", "attache.publish")}
    gc = ObjectGc(services.engine, services.storage, ObjectGcConfig(grace_seconds=0)).run_once()
    cleanup = StagingCleanup(services.engine, services.storage,
                             StagingCleanupConfig(grace_seconds=0, failed_retention_seconds=0)).run_once()
    with engine.connect() as conn:
        referenced = set(conn.execute(select(variants.c.storage_key)).scalars())
    stored = {info.key for info in services.storage.list_objects("")}
    unreferenced = sorted(stored - referenced)
    missing_objects = sorted(referenced - stored)

    downloads = Counter()

    def check(attachment_id: str) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {TOKEN}"
        status = session.get(f"{deployment.url}/v1/attachments/{attachment_id}", timeout=30).json()
        for name, variant in status["variants"].items():
            body = session.get(deployment.url + variant["url"], timeout=30).content
            downloads["ok" if hashlib.sha256(body).hexdigest() == variant["sha256"] else "mismatch"] += 1

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(check, sorted(accepted)))
    services.engine.dispose()
    services.broker.close()
    total = time.monotonic() - began

    figures = [
        ("uploads tried", UPLOADS), ("accepted (202)", len(accepted)),
        ("client responses", dict(client.statuses)), ("refused (4xx)", len(client.refused)),
        *sorted(chaos.figures.items()),
        ("job states", dict(states)), ("failed by code", dict(codes)),
        ("history", dict(sorted(history.items()))), ("dead letters recorded", dead),
            ("dead letters by cause", dict(dead_by_cause)), ("messages in .XQ", xq),
        ("duplicate effects", duplicates), ("ready regressions", regressions),
        ("staging_missing", staging_missing), ("visible without a 202", len(visible - accepted)),
        ("GC (grace 0)", gc), ("staging cleanup (grace 0)", cleanup),
        ("unreferenced objects left", len(unreferenced)), ("referenced objects missing", len(missing_objects)),
        ("variant downloads", dict(downloads)),
        ("upload phase s", round(upload_seconds, 1)), ("drain s", round(drain_seconds, 1)),
        ("total s", round(total, 1)),
    ]
    print("\n== attache chaos soak ==")
    for name, value in figures:
        print(f"{name:>32}: {value}")
    print("   events: " + "; ".join(chaos.log))

    assert len(accepted) == UPLOADS, f"{UPLOADS - len(accepted)} uploads never got a 202: {client.refused[:5]}"
    assert states == Counter({"ready": len(accepted)}), (states, codes)
    assert visible == accepted
    assert duplicates == 0 and regressions == 0 and staging_missing == 0
    assert dead == 0 and sum(xq.values()) == 0, (dead, xq)
    assert downloads["mismatch"] == 0 and downloads["ok"] == len(pipeline.get(1).variants) * len(accepted), downloads
    assert unreferenced == [], unreferenced[:10]
    assert missing_objects == [], missing_objects[:10]
