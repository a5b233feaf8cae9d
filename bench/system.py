"""Figures through the real processes: end to end, idle latency, ingest; each beside a reference.

A scratch deployment (its own database, migrated then dropped, its own
RabbitMQ vhost, a temporary storage directory, default settings, pipeline
v2) is started from the ``Procfile``'s own command lines by
``tests.processes.Deployment``, as the process tests do. Clients upload
over HTTP; readiness is read from the ``jobs`` table (``ready_at``, the
publish transaction's time), so polling costs the machine nearly nothing.

Every upload is a new original: a JPEG comment carrying a number is put
after the SOI marker, so the pixels are the photo's and the SHA-256 is the
upload's own (no render is spared by :mod:`app.adapters.imaging.shared`
because the same photo came earlier).

1. **End to end at saturation**: ``SATURATION_UPLOADS`` 12 MP photos sent
   by ``CLIENTS`` clients at once, images/s from the first request to the
   last ``ready``, with 1, 2 and 4 worker processes (``WORKER_PROCESSES``,
   4 threads each). Reference: the same files rendered (every variant, by
   :func:`~app.adapters.imaging.render`) by a plain loop in one process
   per core, run just before and just after each configuration; the
   reference is the mean of the two (the speed of this kind of machine
   drifts by 10 % or more over a minute, and both runs are printed).
   Beside it: the CPU seconds per image of the worker's and the web's
   processes, and of the raw loop. Once, between the first configuration's
   two raw loops, the **ceiling** (:func:`raw_uploads_rendered`): the same
   uploads from the same clients to :mod:`bench.raw_ingest`, each rendered
   by the raw loop as its ``202`` arrives. The raw loop receives no upload;
   on the same cores the bytes must be received, so no pipeline reaches the
   raw loop's figure, and the ceiling says how near one can come.
2. **Idle upload -> ready** of a 512x512 JPEG, one upload at a time, with
   the mean time of each step from ``step_runs``.
3. **Ingest** (worker stopped, so the figure is the web's): 5 MB uploads
   from ``CLIENTS`` clients, MB/s until the last ``202``, against the same
   requests to :mod:`bench.raw_ingest` under the same gunicorn command
   line, sent in halves in the order raw, attache, attache, raw; then the
   ``202`` latency of 1 MB uploads, one at a time, beside what an fsync
   costs on this disk.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Iterator

import requests
from PIL import Image
from sqlalchemy import create_engine, text

from bench.figures import Figure, percentile

REPO = Path(__file__).resolve().parents[1]
PHOTOS = REPO / "tests" / "data" / "photos"
ADMIN_URL = os.environ.get("ATTACHE_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP_HOST = os.environ.get("ATTACHE_BENCH_AMQP", "guest:guest@127.0.0.1:5672")
SATURATION_UPLOADS = int(os.environ.get("ATTACHE_BENCH_UPLOADS", "32"))
WORKER_PROCESSES = (1, 2, 4)
CLIENTS = 4
#: a p99 of 60 uploads is the slowest one (percentile() interpolates between the two slowest); of 200, the third
SMALL_UPLOADS = int(os.environ.get("ATTACHE_BENCH_SMALL_UPLOADS", "200"))
ONE_MB_UPLOADS = 200
FIVE_MB_UPLOADS = 96
TOKEN = "bench-uploader-token"


# --- files -----------------------------------------------------------------


def unique_jpeg(source: Path | bytes, dest: Path, number: int) -> Path:
    """*source* with a JPEG comment naming *number* right after SOI: same pixels, new bytes."""
    data = source if isinstance(source, bytes) else source.read_bytes()
    assert data[:2] == b"\xff\xd8", "not a JPEG"
    comment = f"attache bench upload {number}".encode()
    dest.write_bytes(data[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + data[2:])
    return dest


def five_mb_jpeg() -> bytes:
    """The 24 MP photo re-encoded at a quality that makes it about 5 MB."""
    with Image.open(PHOTOS / "coffee_24mp_6000x4000.jpg") as img:
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=98, subsampling=0)
    return buf.getvalue()


# --- a scratch deployment ----------------------------------------------------


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


class Stack:
    """A database, a vhost, a storage directory and ``tests.processes.Deployment`` over them."""

    def __init__(self, root: Path):
        from app.adapters.postgres import db
        from tests.processes import Deployment

        self.name = f"attache_bench_{uuid.uuid4().hex[:8]}"
        self.admin = create_engine(ADMIN_URL.replace("postgresql://", "postgresql+psycopg2://"),
                                   isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self.name}"')
        url = ADMIN_URL.rsplit("/", 1)[0] + "/" + self.name
        self.engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://"))
        self.deployment = None
        try:
            db.upgrade(url)
            _rabbitmqctl("add_vhost", self.name)
            _rabbitmqctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")
        except BaseException:
            self.close()
            raise
        (root / "storage").mkdir()
        (root / "logs").mkdir()
        self.deployment = Deployment({
            "DATABASE_URL": url,
            "BROKER_URL": f"amqp://{AMQP_HOST}/{self.name}",
            "STORAGE_URL": f"file://{root / 'storage'}",
            "ATTACHE_API_TOKENS": f"{TOKEN}=bench:uploader",
            "WEB_CONCURRENCY": "2",  # the Procfile's default (Deployment's own is 1)
        }, root / "logs")
        self.deployment.token = TOKEN
        self.deployment.session.headers["Authorization"] = f"Bearer {TOKEN}"

    def close(self) -> None:
        if self.deployment is not None:
            self.deployment.stop_all()
        self.engine.dispose()
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self.admin.dispose()
        with contextlib.suppress(subprocess.SubprocessError):
            _rabbitmqctl("delete_vhost", self.name)

    def start_worker(self, processes: int):
        worker = self.deployment.start("worker", wait=False, WORKER_PROCESSES=str(processes))
        deadline = time.monotonic() + 60
        while worker.output().count("Worker process is ready") < processes:
            if not worker.alive or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start: {worker.output()[-3000:]}")
            time.sleep(0.1)
        return worker

    def upload(self, path: Path) -> str:
        response = self.deployment.upload(path)
        if response.status_code != 202:
            raise RuntimeError(f"upload of {path.name}: {response.status_code} {response.text[:300]}")
        return response.json()["id"]

    def wait_ready(self, ids: list[str], timeout: float = 300, interval: float = 0.05) -> float:
        """Poll the jobs table until every upload is ready; the last ``ready_at`` as a Unix time."""
        deadline = time.monotonic() + timeout
        query = text("SELECT count(*) FILTER (WHERE state = 'ready'), count(*) FILTER (WHERE state = 'failed'), "
                     "extract(epoch FROM max(ready_at)) FROM jobs WHERE attachment_id = ANY(CAST(:ids AS uuid[]))")
        while True:
            with self.engine.connect() as conn:
                ready, failed, last = conn.execute(query, {"ids": ids}).one()
            if failed:
                raise RuntimeError(f"{failed} bench job(s) failed; logs:\n{self.deployment.logs()}")
            if ready == len(ids):
                return float(last)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{ready}/{len(ids)} ready after {timeout} s; logs:\n{self.deployment.logs()}")
            time.sleep(interval)


@contextlib.contextmanager
def stack() -> Iterator[tuple[Stack, Path]]:
    with tempfile.TemporaryDirectory(prefix="attache-bench-") as tmp:
        root = Path(tmp)
        made = Stack(root)
        try:
            yield made, root
        finally:
            made.close()


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of the live processes of a process group (a Deployment process and its children)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if int(fields[2]) == pgid:  # field 5 of stat, after the command in parentheses
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def step_seconds(made: "Stack", ids: list[str]) -> str:
    """Mean seconds of each step (``step_runs``) over these uploads' jobs, in ms."""
    query = text("SELECT step || coalesce(':' || variant, ''), avg(seconds) * 1000 FROM step_runs "
                 "WHERE job_id IN (SELECT id FROM jobs WHERE attachment_id = ANY(CAST(:ids AS uuid[]))) "
                 "GROUP BY 1 ORDER BY min(finished_at)")
    with made.engine.connect() as conn:
        return ", ".join(f"{name} {ms:.0f}" for name, ms in conn.execute(query, {"ids": ids}))


def fsync_latency(directory: Path, samples: int = 40) -> tuple[float, float]:
    """p50 and p99 in ms of writing 4 KB to a new file and fsyncing it and its directory (what a commit waits for)."""
    times = []
    for i in range(samples):
        path = directory / f"fsync-{i}"
        began = time.perf_counter()
        with open(path, "wb") as fh:
            fh.write(os.urandom(4096))
            fh.flush()
            os.fsync(fh.fileno())
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        times.append((time.perf_counter() - began) * 1000)
        path.unlink()
    return percentile(times, 50), percentile(times, 99)


# --- references ------------------------------------------------------------


def _render_job(path: str) -> float:
    """Every variant of the newest pipeline, as a worker renders them (the raw loop's unit of work); CPU seconds."""
    from app.adapters.imaging import Limits, render
    from app.adapters.imaging.shared import content_key
    from app.core import pipeline

    began = time.process_time()
    digest = content_key(path)  # the worker has it from the attachment's row
    for spec in pipeline.get(pipeline.NEWEST).specs.values():
        render(path, spec, Limits(), sha256=digest)
    return time.process_time() - began


def _warm(_: int) -> None:
    from app.adapters import imaging
    from app.core import pipeline  # noqa: F401  (imports Pillow and the renderer)

    imaging.load_codecs()  # as a worker process does at boot


def raw_render_loop(files: list[Path]) -> tuple[float, float]:
    """Images/s of a plain loop, one process per core, over the same files; and CPU seconds per image."""
    cores = len(os.sched_getaffinity(0))
    with ProcessPoolExecutor(cores, mp_context=get_context("spawn")) as pool:
        list(pool.map(_warm, range(cores * 2)))
        began = time.perf_counter()
        cpu = sum(pool.map(_render_job, [str(f) for f in files]))
        return len(files) / (time.perf_counter() - began), cpu / len(files)


def raw_uploads_rendered(files: list[Path], url: str) -> float:
    """Images/s of the raw loop fed by uploads: ``CLIENTS`` clients post the files to the raw ingest server as
    attache's clients do, and each file goes to the loop's pool when its ``202`` arrives. What a pipeline without
    a database, a broker or a staged copy reaches on the same cores: the ceiling of end to end."""
    cores = len(os.sched_getaffinity(0))
    post = raw_poster(url)
    with ProcessPoolExecutor(cores, mp_context=get_context("spawn")) as pool:
        list(pool.map(_warm, range(cores * 2)))
        began = time.perf_counter()

        def upload_then_render(path: Path):
            post(path)
            return pool.submit(_render_job, str(path))

        for rendered in _send_all(upload_then_render, files, CLIENTS):
            rendered.result()
        return len(files) / (time.perf_counter() - began)


def raw_poster(url: str):
    """A function that posts a file to the raw ingest server as attache's clients post theirs (a multipart form,
    a session per client thread)."""
    session = threading.local()

    def post(path: Path) -> None:
        if not hasattr(session, "http"):
            session.http = requests.Session()
        with open(path, "rb") as fh:
            response = session.http.post(url, files={"file": (path.name, fh)}, timeout=60)
        assert response.status_code == 202, response.status_code
    return post


@contextlib.contextmanager
def raw_ingest_server(root: Path) -> Iterator[tuple[str, int]]:
    """:mod:`bench.raw_ingest` under the ``web`` entry of the Procfile, with its defaults: its URL and process
    group."""
    from tests.processes import free_port, procfile, wait_for

    port = free_port()
    command = procfile()["web"].replace("'app.web:create_app()'", "bench.raw_ingest:app")
    env = {**os.environ, "PORT": str(port), "BIND": "127.0.0.1", "BENCH_RAW_DIR": str(root),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    with open(root / "raw-ingest.log", "wb") as log:
        server = subprocess.Popen(["/bin/sh", "-c", f"exec {command}"], cwd=REPO, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: requests.post(f"http://127.0.0.1:{port}/", data=b"x", timeout=2).status_code == 202,
                 timeout=30, message="raw ingest server")
        yield f"http://127.0.0.1:{port}/", server.pid
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


# --- the figures -------------------------------------------------------------


def _send_all(post, files: list[Path], clients: int) -> list:
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(post, files))


def saturation(made: Stack, root: Path, worker_processes: tuple[int, ...] = WORKER_PROCESSES,
               with_ceiling: bool = True) -> list[Figure]:
    photos = sorted(PHOTOS.glob("*_12mp_*.jpg"))
    figures = []
    web = made.deployment.processes["web"].popen.pid
    cores = len(os.sched_getaffinity(0))
    before = None
    for processes in worker_processes:
        folder = root / f"saturation-{processes}"
        folder.mkdir()
        files = [unique_jpeg(photos[i % len(photos)], folder / f"{i}.jpg", processes * 10_000 + i)
                 for i in range(SATURATION_UPLOADS)]
        if before is None:
            before = raw_render_loop(files)
        worker = made.start_worker(processes)
        try:
            worker_cpu, web_cpu = group_cpu_seconds(worker.popen.pid), group_cpu_seconds(web)
            began = time.time()
            ids = _send_all(made.upload, files, CLIENTS)
            # the figure is read from ready_at, not from when a poll saw it; polling seldom leaves the cores
            # to the stack under test
            rate = len(files) / (made.wait_ready(ids, interval=0.5) - began)
            worker_cpu = (group_cpu_seconds(worker.popen.pid) - worker_cpu) / len(files)
            web_cpu = (group_cpu_seconds(web) - web_cpu) / len(files)
        finally:
            worker.stop()
        ceiling = None
        if with_ceiling and not figures:  # once, between the first configuration's two raw loops
            with raw_ingest_server(folder) as (url, _):
                raw_poster(url)(files[0])  # warm
                ceiling = raw_uploads_rendered(files, url)
        after = raw_render_loop(files)
        reference, raw_cpu = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
        figures.append(Figure(f"end to end, {SATURATION_UPLOADS} x 12 MP, v2, {CLIENTS} clients, "
                              f"{processes} worker process{'es' if processes > 1 else ''} x 4 threads",
                              rate, "img/s", f"raw render loop, {cores} processes, just before and after", reference,
                              at_least=0.9,
                              note=f"raw loop {before[0]:.2f} and {after[0]:.2f} img/s; CPU s per image: worker "
                                   f"{worker_cpu:.2f}, web {web_cpu:.2f}, raw loop {raw_cpu:.2f}"
                                   + (f"; {rate / ceiling:.2f} of the ceiling below" if ceiling else "")))
        if ceiling:
            figures.append(Figure(f"ceiling of end to end: the same {SATURATION_UPLOADS} uploads from {CLIENTS} "
                                  "clients to a raw server (file + fsync, no database, broker or staged copy), each "
                                  "rendered by the raw loop as its 202 arrives", ceiling, "img/s",
                                  "raw render loop, the same two runs", reference))
        before = after
    return figures


def small_photo_latency(made: Stack, root: Path) -> list[Figure]:
    folder = root / "small"
    folder.mkdir()
    source = (PHOTOS / "astronaut.jpg").read_bytes()  # 512x512 JPEG
    worker = made.start_worker(1)
    latencies, ids = [], []
    try:
        for i in range(SMALL_UPLOADS + 3):  # the first three warm the processes up and are not counted
            path = unique_jpeg(source, folder / f"{i}.jpg", i)
            began = time.time()
            attachment_id = made.upload(path)
            ready_at = made.wait_ready([attachment_id], interval=0.005)
            if i >= 3:
                latencies.append((ready_at - began) * 1000)
                ids.append(attachment_id)
    finally:
        worker.stop()
    note = (f"{SMALL_UPLOADS} uploads, one at a time, v2, 1 worker process; mean ms per step: "
            f"{step_seconds(made, ids)}")
    return [Figure("idle upload -> ready, 512x512 JPEG, p50", percentile(latencies, 50), "ms", "the target",
                   at_most=60, note=note),
            Figure("idle upload -> ready, 512x512 JPEG, p99", percentile(latencies, 99), "ms", "the target",
                   at_most=150, note=note)]


def ingest(made: Stack, root: Path) -> list[Figure]:
    folder = root / "ingest"
    folder.mkdir()
    big = five_mb_jpeg()
    files = [unique_jpeg(big, folder / f"big-{i}.jpg", i) for i in range(FIVE_MB_UPLOADS)]
    megabytes = sum(f.stat().st_size for f in files) / 1e6

    made.upload(unique_jpeg(big, folder / "warm.jpg", 10**6))
    half = len(files) // 2
    seconds = {"raw": 0.0, "ours": 0.0, "discard": 0.0}
    cpu = {"raw": 0.0, "ours": 0.0, "discard": 0.0}
    web = made.deployment.processes["web"].popen.pid
    with raw_ingest_server(root) as (url, server):
        raw_poster(url)(files[0])  # warm
        # raw, ours, ours, raw: a machine whose speed drifts over the minute weighs on both alike; then the raw
        # server deleting each file after its fsync, the reference before the third session of 2026-12-03
        for side, batch in (("raw", files[:half]), ("ours", files[:half]), ("ours", files[half:]),
                            ("raw", files[half:]), ("discard", files)):
            send = {"raw": raw_poster(url), "discard": raw_poster(url + "discard"), "ours": made.upload}[side]
            group = web if side == "ours" else server
            cpu[side] -= group_cpu_seconds(group)
            began = time.perf_counter()
            _send_all(send, batch, CLIENTS)
            seconds[side] += time.perf_counter() - began
            cpu[side] += group_cpu_seconds(group)
    raw, ours, discard = (megabytes / seconds[side] for side in ("raw", "ours", "discard"))
    per_upload = {side: cpu[side] / len(files) * 1000 for side in cpu}

    source = (PHOTOS / "astronaut_12mp_3464x3464.jpg").read_bytes()  # 1.0 MB
    latencies = []
    for i in range(ONE_MB_UPLOADS):
        path = unique_jpeg(source, folder / f"one-{i}.jpg", i)
        began = time.perf_counter()
        made.upload(path)
        latencies.append((time.perf_counter() - began) * 1000)
    size = len(big) / 1e6
    fsync_p50, fsync_p99 = fsync_latency(folder)
    return [Figure(f"ingest, {FIVE_MB_UPLOADS} x {size:.1f} MB uploads, {CLIENTS} clients, to 202", ours, "MB/s",
                   "raw streaming to a file + fsync, kept, same gunicorn", raw, at_least=0.6,
                   note=f"server CPU ms per upload: attache's web {per_upload['ours']:.1f}, raw "
                        f"{per_upload['raw']:.1f}; the raw server deleting each file after its fsync: "
                        f"{discard:.0f} MB/s (ratio {ours / discard:.2f}), {per_upload['discard']:.1f} ms"),
            Figure("202 of a 1 MB upload, p99", percentile(latencies, 99), "ms", "the target", at_most=50,
                   note=f"{ONE_MB_UPLOADS} uploads, one at a time, p50 {percentile(latencies, 50):.1f} ms; "
                        f"a 4 KB write + fsync of file and directory here: p50 {fsync_p50:.1f} ms, "
                        f"p99 {fsync_p99:.1f} ms")]


def main() -> list[Figure]:
    with stack() as (made, root):
        made.deployment.start("web")
        made.deployment.start("scheduler")
        figures = small_photo_latency(made, root)
        figures = saturation(made, root) + figures
        figures += ingest(made, root)  # last: its jobs stay queued, no worker runs
    return figures


if __name__ == "__main__":
    from bench.figures import table

    print(table(main()))
