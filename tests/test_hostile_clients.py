"""Clients that stall, processes that die mid-upload, a full temporary directory: against real gunicorn.

An adversarial review found each of these against the web process: a client
that stops sending mid-body held a thread with no deadline (enough of them
and the process answered nothing, ``/healthz`` included); a process killed
mid-upload left its spool file for ever; a full temporary directory was a
``500`` instead of a refusal worth retrying.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import threading
import time
import uuid

import pytest
import requests
from sqlalchemy import text

from app.core import pipeline
from app.errors import SpoolUnavailable
from app.web.spool import HashingSpool
from tests.conftest import OTHER_UPLOADER_TOKEN, UPLOADER_TOKEN
from tests.filesystems import small_filesystem
from tests.processes import Deployment, wait_for
from tests.test_incomplete_body import assert_nothing_stored, request_head

pytestmark = pytest.mark.processes

#: a photo whose upload is too large to be gathered on the poller (app/web/request_head.py): its body is read in a
#: thread, where the bounds under test apply
READ_IN_A_THREAD = "photos/hubble_deep_field.jpg"


@pytest.fixture
def deployment(env, tmp_path):
    temp = tmp_path / "web-tmp"
    temp.mkdir()
    deployment = Deployment({**env, "TMPDIR": str(temp)}, tmp_path)
    deployment.temp = temp
    yield deployment
    deployment.stop_all()


def spools(deployment) -> list[str]:
    return spools_in(deployment.temp)


def spools_in(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("attache-upload-"))


def answer_of(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def started_uploads(deployment, data: bytes, count: int, sockets: list) -> None:
    """Open ``count`` uploads of ``data`` that send its first 1000 bytes and no more, onto ``sockets``."""
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", deployment.port), timeout=20)
        sockets.append(sock)
        sock.sendall(request_head(deployment, "image/jpeg", length=len(data), key=str(uuid.uuid4())).encode()
                     + data[:1000])


def test_clients_silent_mid_body_are_cut_off_and_free_their_threads(deployment, data_file):
    deployment.start("web", WEB_THREADS="2", ATTACHE_BODY_IDLE_SECONDS="2")
    data = data_file("photos/chelsea.jpg").read_bytes()
    stalled = []
    try:
        started_uploads(deployment, data, 2, stalled)  # as many as the web process has threads
        for sock in stalled:  # before: no answer, ever (the socket's own 20 s timeout fails the test)
            assert answer_of(sock).split(b"\r\n")[0].split()[1] == b"400"
        assert requests.get(deployment.url + "/healthz", timeout=5).status_code == 200
        wait_for(lambda: spools(deployment) == [], timeout=10, message="the stalled uploads' spools removed")
    finally:
        for sock in stalled:
            sock.close()


def test_one_uploaders_slow_bodies_cannot_take_every_thread(deployment, data_file):
    """An adversarial run: one token sending 40 bodies a byte every 5 s (never silent for ATTACHE_BODY_IDLE_SECONDS)
    held every thread of a web process, and /healthz and another uploader's upload timed out for as long as they
    went on. An uploader's bodies now take at most ATTACHE_MAX_BODIES_PER_UPLOADER threads of a process."""
    deployment.start("web", WEB_THREADS="4", ATTACHE_MAX_BODIES_PER_UPLOADER="2")
    data = data_file(READ_IN_A_THREAD).read_bytes()
    slow = []
    try:
        started_uploads(deployment, data, 4, slow)  # as many as the web process has threads
        answered = set()  # whichever two reached the view last: the threads take them in no set order
        while len(answered) < 2:  # before: no answer (select's timeout failed the test)
            readable, _, _ = select.select([sock for sock in slow if sock not in answered], [], [], 20)
            assert readable, "two of the four are answered"
            answered.update(readable)
        answers = [answer_of(sock) for sock in answered]
        assert all(a.split(b"\r\n")[0].split()[1] == b"429" and b"too_many_uploads_at_once" in a for a in answers)
        assert requests.get(deployment.url + "/healthz", timeout=5).status_code == 200
        bob = requests.post(deployment.url + "/v1/attachments", data=data, timeout=10,
                            headers={"Authorization": f"Bearer {OTHER_UPLOADER_TOKEN}", "Content-Type": "image/jpeg"})
        assert bob.status_code == 202, bob.text
    finally:
        for sock in slow:
            sock.close()
    wait_for(lambda: deployment.upload(data_file("photos/chelsea.jpg")).status_code == 202, timeout=10,
             message="the uploader's next body taken once its slow ones went")


def test_refused_clients_that_keep_their_side_open_never_stall_the_process(deployment, data_file):
    """A second adversarial run: gunicorn closes a connection it answered before reading its body by lingering up
    to 2 s for the client's rest, on the worker's main thread. 150-300 connections that sent a bad token's headers
    and a few bytes and never closed stopped the process answering (/healthz timed out) for their 2 s each, one
    after another. No token is needed for it."""
    deployment.start("web")
    data = data_file(READ_IN_A_THREAD).read_bytes()
    head = (f"POST /v1/attachments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer not-a-token\r\n"
            f"Content-Type: image/jpeg\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    lingering = []
    try:
        for _ in range(40):  # before: 40 x 2 s of a process answering nobody
            sock = socket.create_connection(("127.0.0.1", deployment.port), timeout=20)
            sock.sendall(head + data[:1000])
            lingering.append(sock)
        for sock in lingering:
            assert sock.recv(12).split()[1] == b"401"
        began = time.monotonic()
        assert requests.get(deployment.url + "/healthz", timeout=5).status_code == 200
        assert time.monotonic() - began < 2
    finally:
        for sock in lingering:
            sock.close()


def test_a_request_head_sent_slowly_or_not_at_all_holds_no_thread_for_long(deployment):
    """A third adversarial run: connections that sent one byte of a request's head and nothing more held a thread of
    gunicorn's each for as long as they stayed open (100 of them, 100 bytes, no token: both processes answered
    nothing), and connections that sent nothing held one 5 s each. A head now has HEAD_SECONDS, and a first byte is
    awaited on the poller after FIRST_BYTE_SECONDS (app/web/request_head.py)."""
    from app.web.request_head import HEAD_SECONDS

    deployment.start("web", WEB_THREADS="2")
    silent, slow = [], []
    try:
        for _ in range(4):  # twice the threads, sending nothing: before, /healthz waited 5-10 s behind them
            silent.append(socket.create_connection(("127.0.0.1", deployment.port), timeout=20))
        began = time.monotonic()
        assert requests.get(deployment.url + "/healthz", timeout=5).status_code == 200
        assert time.monotonic() - began < 2
        for _ in range(2):  # as many as the threads, one byte each: before, nothing was answered while they stayed
            slow.append(socket.create_connection(("127.0.0.1", deployment.port), timeout=20))
            slow[-1].sendall(b"G")
        began = time.monotonic()
        for sock in slow:
            assert sock.recv(100) == b"", "closed as a client gone"
        assert time.monotonic() - began < HEAD_SECONDS + 3
        assert requests.get(deployment.url + "/healthz", timeout=5).status_code == 200
    finally:
        for sock in silent + slow:
            sock.close()


def test_heads_that_never_end_take_no_thread_however_many(deployment):
    """A head bounded in a thread (HEAD_SECONDS) still let one client hold every thread by opening connections
    faster than the deadline freed them: here 40 connections of one byte each on 2 threads, and /healthz waited
    behind them for 5 s a pair. Heads are now gathered on gunicorn's poller and a thread is given only to a whole
    one (app/web/request_head.py); one address has at most GATHERING_PER_ADDRESS being gathered, and a newer
    connection closes its oldest."""
    from app.web.request_head import GATHERING_PER_ADDRESS, HEAD_SECONDS

    deployment.start("web", WEB_THREADS="2", WEB_CONCURRENCY="1")
    slow = []
    try:
        began = time.monotonic()
        for _ in range(40):
            slow.append(socket.create_connection(("127.0.0.1", deployment.port), timeout=20))
            slow[-1].sendall(b"G")
        for _ in range(3):  # before: the first took 5 s, behind the first two
            asked = time.monotonic()
            assert requests.get(deployment.url + "/healthz", timeout=5).status_code == 200
            assert time.monotonic() - asked < 1
        assert time.monotonic() - began < HEAD_SECONDS, "the slow heads were still open while /healthz was answered"
        kept_alive = requests.Session()  # a kept-alive connection's next head is gathered too
        for _ in range(2):
            assert kept_alive.get(deployment.url + "/healthz", timeout=5).status_code == 200
        kept_alive.close()
        for sock in slow:  # each closed as a client gone once its head's time ran out
            assert sock.recv(100) == b""
        many = [socket.create_connection(("127.0.0.1", deployment.port), timeout=20)
                for _ in range(GATHERING_PER_ADDRESS + 5)]
        slow.extend(many)
        for sock in many[:5]:  # the oldest five are closed by the newest five, at once
            assert select.select([sock], [], [], 3)[0], "closed within seconds, not at the head's deadline"
            assert sock.recv(100) == b""
        many[-1].sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert answer_of(many[-1]).split(b"\r\n")[0].split()[1] == b"200"
    finally:
        for sock in slow:
            sock.close()


def test_a_head_that_does_not_end_within_its_limit_is_refused_without_a_thread(deployment):
    """A review: a head of exactly GATHER_BYTES that never ended was handed to a thread, whose parser waited
    HEAD_SECONDS for the rest (70 such every 4 s from one address: /healthz 4.8 s). Now a 431 at once."""
    from app.web.framing import GATHER_BYTES

    deployment.start("web", WEB_THREADS="2", WEB_CONCURRENCY="1")
    line = b"X-Padding: " + b"p" * 8000 + b"\r\n"
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + line * (GATHER_BYTES // len(line) + 1)
    long_heads = []
    try:
        for _ in range(4):  # twice the threads
            long_heads.append(socket.create_connection(("127.0.0.1", deployment.port), timeout=20))
            long_heads[-1].sendall(head[:GATHER_BYTES])
        for sock in long_heads:  # before: no answer; each connection closed after HEAD_SECONDS in a thread
            assert select.select([sock], [], [], 2)[0], "answered at once"
            answer = sock.recv(65536)
            assert answer.split(b"\r\n")[0].split()[1] == b"431" and b"request_head_too_large" in answer
        asked = time.monotonic()
        assert requests.get(deployment.url + "/healthz", timeout=5).status_code == 200
        assert time.monotonic() - asked < 1
        answered = requests.get(deployment.url + "/healthz", headers={"X-Padding": "p" * 8000}, timeout=5)
        assert answered.status_code == 200, "a long head within the limit is answered"
    finally:
        for sock in long_heads:
            sock.close()


def test_sign_in_forms_whose_body_never_comes_take_no_thread(deployment):
    """A review: anyone may post the sign-in forms, whose bodies are read before anyone is known; 80 posts to
    /ops/login announcing a 1000-byte body never sent held every thread for ATTACHE_BODY_IDLE_SECONDS (60 s), and
    /healthz timed out. A body that fits in GATHER_BYTES with its head is now gathered on the poller before a thread
    takes it, and a sign-in form's body is at most SIGN_IN_FORM_MAX_BYTES (one too large to gather, up to
    FORM_MAX_BYTES before, is refused before it is read)."""
    from app.web.request import FORM_MAX_BYTES

    deployment.start("web", WEB_THREADS="2", WEB_CONCURRENCY="1")
    form = "Content-Type: application/x-www-form-urlencoded\r\n"
    unsent = []
    try:
        for path in ("/ops/login", "/", "/ops/login", "/sign-out", "/ops/logout", "/ops/login"):
            unsent.append(socket.create_connection(("127.0.0.1", deployment.port), timeout=20))
            unsent[-1].sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{form}Content-Length: 1000\r\n\r\n"
                               "token=".encode())
        # a second review: framings the gatherer left to a thread, which gunicorn reads a body by
        padding = "X-Padding: " + "p" * 8000 + "\r\n"
        for framing in ("Expect: 100-continue\r\nContent-Length: 100", "Content-Length: 0000000000100",
                        "Transfer-Encoding: gzip, chunked", "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked",
                        padding * 7 + "Content-Length: 3000"):
            for _ in range(2):  # as many as the threads
                unsent.append(socket.create_connection(("127.0.0.1", deployment.port), timeout=20))
                unsent[-1].sendall(f"POST /ops/login HTTP/1.1\r\nHost: 127.0.0.1\r\n{form}{framing}\r\n\r\n".encode())
        # a third: framings read otherwise than the parser, then a byte every 0.8 s (each read's own bound was 1 s)
        chunked = f"POST /ops/login HTTP/1.1\r\nHost: 127.0.0.1\r\n{form}Transfer-Encoding: chunked\r\n\r\n"
        tricklers = []
        for start in ("\r\n" + chunked + "100\r\n", chunked + "0000000100\r\n", chunked + "100;" + "x" * 2000):
            for _ in range(2):
                tricklers.append(socket.create_connection(("127.0.0.1", deployment.port), timeout=20))
                tricklers[-1].sendall(start.encode())
        unsent.extend(tricklers)
        for _ in range(3):  # before: the first timed out behind the two held threads
            asked = time.monotonic()
            for sock in tricklers:
                with contextlib.suppress(OSError):  # the server may have refused it
                    sock.send(b"t")
            assert requests.get(deployment.url + "/healthz", timeout=5).status_code == 200
            assert time.monotonic() - asked < 1
            time.sleep(0.8)  # the tricklers' own pace is what is under test
        # a fourth: a body past what is gathered, read on in a thread, whose chunks gunicorn reads in one read
        long_chunked = socket.create_connection(("127.0.0.1", deployment.port), timeout=20)
        unsent.append(long_chunked)
        long_chunked.sendall((chunked + "1\r\na\r\n" * 12_000).encode())
        began = time.monotonic()
        while not select.select([long_chunked], [], [], 0.5)[0]:  # before: no answer while it trickled
            assert time.monotonic() - began < 4, "answered within its second, however it trickles"
            long_chunked.send(b"1\r\nb\r\n")
        assert long_chunked.recv(100).split(b"\r\n")[0].split()[1] == b"411"
        # a fifth: 64 KiB of 1-byte chunks, less than the form's limit, handed to a thread before their end, held it
        # the form's second; 120 a second from one address held every thread (an adversarial run). A sign-in form
        # must declare its length: refused at once
        for path in ("/ops/login", "/"):
            at_once = socket.create_connection(("127.0.0.1", deployment.port), timeout=20)
            unsent.append(at_once)
            at_once.sendall((chunked.replace("/ops/login", path, 1) + "1\r\na\r\n" * 11_000).encode())
            began = time.monotonic()
            assert at_once.recv(100).split(b"\r\n")[0].split()[1] == b"411"
            assert time.monotonic() - began < 0.5, "no wait for the rest of the body"
        large = socket.create_connection(("127.0.0.1", deployment.port), timeout=20)
        unsent.append(large)
        large.sendall(f"POST /ops/login HTTP/1.1\r\nHost: 127.0.0.1\r\n{form}"  # too large to gather
                      f"Content-Length: {FORM_MAX_BYTES}\r\n\r\n".encode())
        assert answer_of(large).split(b"\r\n")[0].split()[1] == b"413"  # before: a thread waited for the body
        trickled = socket.create_connection(("127.0.0.1", deployment.port), timeout=20)
        unsent.append(trickled)  # a small body sent in pieces, and a chunked one, are still answered
        body = b"token=not-a-token"
        trickled.sendall(f"POST /ops/login HTTP/1.1\r\nHost: 127.0.0.1\r\n{form}"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body[:5])
        time.sleep(1)  # the client's own pause is what is under test
        trickled.sendall(body[5:])
        assert answer_of(trickled).split(b"\r\n")[0].split()[1] == b"400"  # no CSRF token: refused, but answered
        chunked = requests.post(deployment.url + "/ops/login", data=iter([b"token=", b"x"]), timeout=5,
                                headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert chunked.status_code == 411, chunked.text
        awaiting = socket.create_connection(("127.0.0.1", deployment.port), timeout=20)
        unsent.append(awaiting)  # told to send its body once, then answered
        awaiting.sendall(f"POST /ops/login HTTP/1.1\r\nHost: 127.0.0.1\r\n{form}Expect: 100-continue\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
        assert awaiting.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        awaiting.sendall(body)
        answer = answer_of(awaiting)
        assert answer.split(b"\r\n")[0].split()[1] == b"400" and b"100 Continue" not in answer
    finally:
        for sock in unsent:
            sock.close()


def test_a_connection_opened_ahead_is_still_answered_seconds_later(deployment):
    """A review: a first byte is awaited on gunicorn's poller after 0.5 s, for its --keep-alive (2 s by default), so
    a connection opened ahead (a browser's preconnect, a pool) and used 4 s later was closed unanswered; gunicorn's own
    wait had kept it 7 s. The Procfile gives --keep-alive 5."""
    deployment.start("web")
    sock = socket.create_connection(("127.0.0.1", deployment.port), timeout=10)
    try:
        time.sleep(4)  # the client's own pause is what is under test, not a condition to poll for
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert answer_of(sock).split(b"\r\n")[0].split()[1] == b"200"
    finally:
        sock.close()


def test_a_download_nobody_reads_is_cut_off_and_frees_its_thread(deployment, tmp_path):
    """A third adversarial run: downloads of a large original that the client never read held a thread each for as
    long as the connection stayed open (gunicorn writes answers to a blocking socket with no deadline): 100 of them
    took every thread. A write that makes no progress for ATTACHE_BODY_IDLE_SECONDS now ends the connection."""
    import random

    from PIL import Image

    rng = random.Random(7)
    path = tmp_path / "noise.png"  # some 9 MB that no socket buffer holds
    Image.frombytes("RGB", (1800, 1800), rng.randbytes(1800 * 1800 * 3)).save(path, compress_level=0)
    deployment.start("web", WEB_THREADS="2", ATTACHE_BODY_IDLE_SECONDS="2")
    deployment.start("worker")
    attachment_id = deployment.upload(path).json()["id"]
    wait_for(lambda: deployment.status(attachment_id)["state"] == "ready", timeout=60, message="ready")
    stalled = []
    try:
        for _ in range(2):  # as many as the web process has threads
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", deployment.port))
            sock.sendall(f"GET /v1/attachments/{attachment_id}/original HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         f"Authorization: Bearer {deployment.token}\r\n\r\n".encode())
            stalled.append(sock)
        # before: no answer for as long as the two connections stayed open
        assert requests.get(deployment.url + "/healthz", timeout=10).status_code == 200
    finally:
        for sock in stalled:
            sock.close()


def test_answers_nobody_reads_are_cut_off_and_free_their_threads(deployment):
    """An adversarial run: anonymous connections that each sent 200 pipelined ``GET /v1/openapi.json`` (104 KB a
    public answer) and read nothing held every thread for as long as they stayed open: ``/healthz`` timed out for
    250 s. Only a download's writes had a deadline; every answer's now has ``ATTACHE_BODY_IDLE_SECONDS``."""
    deployment.start("web", WEB_THREADS="2", ATTACHE_BODY_IDLE_SECONDS="3")
    pipelined = b"GET /v1/openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 200
    stalled = []

    def healthz(timeout: float) -> bool:
        try:
            return requests.get(deployment.url + "/healthz", timeout=timeout).status_code == 200
        except requests.exceptions.Timeout:
            return False

    try:
        for _ in range(4):  # twice the threads
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", deployment.port))
            sock.sendall(pipelined)
            stalled.append(sock)
        # the answers fill the sockets' buffers, and then every thread waits to write
        wait_for(lambda: not healthz(1), timeout=20, message="the threads to be held by answers nobody reads")
        # before: no answer for as long as the connections stayed open
        assert healthz(15)
    finally:
        for sock in stalled:
            sock.close()


def test_the_spool_of_a_web_killed_mid_upload_is_removed_by_later_uploads(deployment, data_file):
    idle = {"ATTACHE_BODY_IDLE_SECONDS": "1"}  # abandoned after ten idle periods: 10 s
    deployment.start("web", **idle)
    data = data_file(READ_IN_A_THREAD).read_bytes()
    sock = socket.create_connection(("127.0.0.1", deployment.port), timeout=30)
    try:
        sock.sendall(request_head(deployment, "image/jpeg", length=len(data), key=str(uuid.uuid4())).encode()
                     + data[: len(data) // 2])
        wait_for(lambda: spools(deployment), timeout=10, message="a spool file")
        deployment.processes["web"].kill()
    finally:
        sock.close()
    [orphan] = spools(deployment)
    deployment.start("web", **idle)

    def swept():
        assert deployment.upload(data_file("photos/coffee.jpg")).status_code == 202
        return orphan not in spools(deployment)

    wait_for(swept, timeout=40, interval=1, message="the killed upload's spool removed")


def test_a_spool_leaves_its_floor_free_on_its_filesystem():
    """``ATTACHE_SPOOL_MIN_FREE_BYTES``: a spool refuses the write that would take its filesystem below the floor,
    and a body whose declared length alone would is refused before a file is made."""
    floor = 1 << 20
    with small_filesystem(4 << 20) as tmp:
        with pytest.raises(SpoolUnavailable) as refused:
            HashingSpool(100 << 20, str(tmp), min_free_bytes=floor, expected_bytes=(3 << 20) + 1)
        assert refused.value.retryable and list(tmp.iterdir()) == []
        spool = HashingSpool(100 << 20, str(tmp), min_free_bytes=floor, expected_bytes=1 << 20)
        with pytest.raises(SpoolUnavailable):
            for _ in range(64):  # 4 MiB, the whole filesystem
                spool.write(bytes(64 << 10))
        spool.flush()
        free = os.statvfs(tmp)
        assert free.f_bavail * free.f_frsize >= floor
        assert spool.size <= (3 << 20) + (64 << 10)
        spool.discard()
        assert list(tmp.iterdir()) == []


def test_uploads_leave_the_spool_floor_free_for_the_accepted_work(deployment, engine, storage_dir, data_file):
    """The web's temporary directory shares its disk with the storage on the filesystem backend. A client
    trickling a large body (or several) filled it, and held it full while it kept sending: the workers could
    write no variant of the uploads already accepted. Now a body is refused (503, retry later) where it would
    take the disk below ATTACHE_SPOOL_MIN_FREE_BYTES: before it is read, when its declared length alone would,
    else at the write that would. Before: both requests below waited for more body, and no answer came."""
    with small_filesystem(16 << 20) as tmp:
        try:
            deployment.start("web", TMPDIR=str(tmp), ATTACHE_SPOOL_MIN_FREE_BYTES=str(8 << 20))
            jpeg = b"\xff\xd8\xff\xe0"
            with socket.create_connection(("127.0.0.1", deployment.port), timeout=15) as sock:
                sock.sendall(request_head(deployment, "image/jpeg", length=12 << 20, key=str(uuid.uuid4()))
                             .encode() + jpeg)  # 12 MiB declared, 4 bytes sent: 12 MiB would leave 4 MiB free
                declared = answer_of(sock)
            with socket.create_connection(("127.0.0.1", deployment.port), timeout=15) as sock:
                body = jpeg + bytes((9 << 20) - len(jpeg))  # a read block (1 MiB) past the floor, no end in sight
                sock.sendall(request_head(deployment, "image/jpeg", length=None, key=str(uuid.uuid4())).encode()
                             + f"{len(body) + 1:x}\r\n".encode() + body)
                trickled = answer_of(sock)
            for answer in (declared, trickled):
                status, _, rest = answer.partition(b"\r\n")
                head, _, payload = rest.partition(b"\r\n\r\n")
                assert b" 503 " in status and b"retry-after" in head.lower(), answer[:500]
                assert b'"spool_unavailable"' in payload and str(tmp).encode() not in payload
            assert spools_in(tmp) == []
            assert_nothing_stored(engine, storage_dir)
            accepted = deployment.upload(data_file("photos/chelsea.jpg"))  # room for this one: taken
            assert accepted.status_code == 202, accepted.text
            assert spools_in(tmp) == []
        finally:
            deployment.stop_all()  # before the filesystem is unmounted


def test_uploads_leave_the_storage_room_for_the_variants_of_those_accepted(deployment, engine, data_file):
    """The spool's floor was kept on the temporary directory's disk alone, and counted nothing for the uploads
    accepted and not yet processed. Uploads filled the storage's disk with their staged originals while the worker
    was busy; it could then write no variant, and every upload accepted ended ``failed storage_unavailable`` (an
    adversarial run: 48 of 48, TMPDIR on another disk, as in the Docker image). An upload is now refused (503,
    retry later) unless the storage has room above the floor for the variants of every upload pending and its
    own."""
    photo = data_file("photos/astronaut_12mp_3464x3464.jpg")  # 1.0 MB; its variants take some 0.5 MB
    with small_filesystem(48 << 20) as disk:
        try:
            deployment.start("web", STORAGE_URL=f"file://{disk}", ATTACHE_SPOOL_MIN_FREE_BYTES=str(8 << 20))
            answers = [deployment.upload(photo) for _ in range(40)]
            accepted = [answer.json()["id"] for answer in answers if answer.status_code == 202]
            refused = [answer for answer in answers if answer.status_code != 202]
            specs = pipeline.get(int(deployment.env["ATTACHE_PIPELINE_VERSION"])).specs.values()
            assert 1 <= len(accepted) <= (40 << 20) // sum(spec.width * spec.height for spec in specs), len(accepted)
            assert refused and all(answer.status_code == 503 and answer.json()["error"] == "storage_unavailable"
                                   and answer.headers["Retry-After"] for answer in refused), refused[0].text
            deployment.start("worker", STORAGE_URL=f"file://{disk}", ATTACHE_STORAGE_WAIT_SECONDS="2",
                             ATTACHE_MAX_ATTEMPTS="1")
            states = {deployment.wait_state(made, timeout=120)["state"] for made in accepted}
            assert states == {"ready"}, states
            assert deployment.upload(photo).status_code == 202  # the room is back with the work done
        finally:
            deployment.stop_all()  # before the filesystem is unmounted
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM attachments")).scalar() == len(accepted) + 1


def test_resumable_parts_leave_the_storage_its_floor(deployment, engine):
    """A resumable upload's parts are stored as they come; with TMPDIR on another disk, the spool's floor was
    looked at there alone, and the parts filled the storage's disk to its last byte. A part is now refused (503,
    retry later, the upload kept where it was) where it would take the storage below the floor."""
    from tests.test_tus_api import PART, TUS

    floor, chunk = 8 << 20, 5 << 20
    with small_filesystem(32 << 20) as disk:
        try:
            deployment.start("web", STORAGE_URL=f"file://{disk}", ATTACHE_SPOOL_MIN_FREE_BYTES=str(floor))
            headers = {**TUS, "Authorization": f"Bearer {deployment.token}"}
            location = deployment.url + requests.post(deployment.url + "/v1/uploads", timeout=10, headers={
                **headers, "Upload-Length": str(45 << 20)}).headers["Location"]
            offset, answer = 0, None
            for _ in range(9):
                body = (b"\xff\xd8\xff\xe0" if not offset else b"") + os.urandom(chunk - (0 if offset else 4))
                answer = requests.patch(location, data=body, timeout=30, headers={
                    **headers, "Upload-Offset": str(offset), "Content-Type": PART})
                if answer.status_code != 204:
                    break
                offset += chunk
            assert answer.status_code == 503 and answer.json()["error"] == "storage_unavailable", answer.text
            assert answer.headers["Retry-After"] and 0 < offset < 32 << 20
            free = os.statvfs(disk)
            assert free.f_bavail * free.f_frsize >= floor
            kept = requests.head(location, headers=headers, timeout=10)
            assert kept.status_code == 200 and kept.headers["Upload-Offset"] == str(offset)
        finally:
            deployment.stop_all()  # before the filesystem is unmounted


@pytest.mark.parametrize("form", ["raw", "multipart"])
def test_a_full_temporary_directory_is_a_503_worth_retrying(deployment, engine, storage_dir, form):
    """A raw body and a multipart file part alike (no floor: the write that fails is what is refused)."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(deployment.temp)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a tiny tmpfs is needed (root): {mounted.stderr.decode().strip()}")
    try:
        deployment.start("web", ATTACHE_SPOOL_MIN_FREE_BYTES="0")
        body = b"\xff\xd8\xff\xe0" + os.urandom(1_500_000)
        if form == "raw":
            sent = dict(data=body, headers={"Content-Type": "image/jpeg", "Connection": "close"})
        else:
            sent = dict(files={"file": ("big.jpg", body)}, headers={"Connection": "close"})
        response = deployment.session.post(deployment.url + "/v1/attachments", timeout=30, **sent)
        assert response.status_code == 503, response.text
        assert response.json()["error"] == "spool_unavailable" and response.headers["Retry-After"]
        assert_nothing_stored(engine, storage_dir)
        assert spools(deployment) == []
    finally:
        deployment.stop_all()
        subprocess.run(["umount", "-l", str(deployment.temp)], capture_output=True)


def test_a_spool_whose_tail_cannot_be_written_is_discarded_without_an_error():
    """On a full disk the spool's buffered tail cannot be written when it is closed either: that ENOSPC escaped the
    request's end and gunicorn dropped the connection, in place of the 503 of the write that failed first (an
    adversarial review, several concurrent multipart uploads on a full disk)."""
    with small_filesystem(8192) as tmp:
        spool = HashingSpool(1_000_000, str(tmp))
        with pytest.raises(SpoolUnavailable):
            for _ in range(100):
                spool.write(b"x" * 1000)  # smaller than the file's buffer: the last ones wait in it
        spool.discard()
        assert list(tmp.iterdir()) == []


def test_a_spool_removed_while_its_request_was_paused_is_a_503_worth_retrying(tmp_path):
    """A web process paused for ten body-idle periods mid-upload: another process's sweep removes its spool as
    abandoned. Resumed, the request staged nothing and answered 500 (FileNotFoundError at the rename into
    staging; an adversarial helper SIGSTOPped one gunicorn worker); it is now told to retry, as a full disk is."""
    spool = HashingSpool(1_000_000, str(tmp_path))
    spool.write(b"\xff\xd8" + b"x" * 10_000)
    spool.path.unlink()  # remove_abandoned_spools, from another process
    with pytest.raises(SpoolUnavailable) as refused:
        spool.finish()
    assert refused.value.retryable
    spool.discard()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("removed", ["before the probe", "after the probe"])
def test_a_spool_removed_after_its_request_finished_it_is_a_503_worth_retrying(quiet_services, tmp_path, data_file,
                                                                               monkeypatch, removed):
    """The sweep of abandoned spools looks at a spool's age, then removes it: a request resumed between the two
    (SIGSTOP and SIGCONT of the web) passed :meth:`HashingSpool.finish`'s check, and its spool was gone at the
    probe's open or at the move into staging: ``500`` (an adversarial run, 14 of 2,589 uploads). Now ``503``."""
    from app.adapters import imaging
    from app.core import intake

    spool = HashingSpool(10_000_000, str(tmp_path))
    spool.write(data_file("photos/chelsea.jpg").read_bytes())
    received = spool.finish()
    if removed == "before the probe":
        received.path.unlink()
    else:
        probe = imaging.probe

        def probe_then_sweep(path, limits):
            info = probe(path, limits)
            path.unlink()
            return info

        monkeypatch.setattr(imaging, "probe", probe_then_sweep)
    with pytest.raises(SpoolUnavailable) as refused:
        intake.stage(quiet_services, received)
    assert refused.value.retryable and "removed" in str(refused.value)


def test_an_answer_given_before_the_body_was_read_closes_the_connection(deployment, data_file):
    """A refusal before the body is read (here ``413`` from ``Content-Length``): gunicorn drains at most 64 KiB of
    the rest and closes, yet it answered ``Connection: keep-alive``, and a client's next request on that connection
    met a reset instead of an answer (an adversarial run: 2 of 8 concurrent uploads, ``RemoteDisconnected``). Now
    the answer says ``Connection: close`` (app/web/connection.py); one whose body was read keeps the connection."""
    deployment.start("web", ATTACHE_MAX_UPLOAD_BYTES="1000000")
    head = (f"POST /v1/attachments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {deployment.token}\r\n"
            "Content-Type: image/jpeg\r\nContent-Length: 3000000\r\n\r\n")
    with socket.create_connection(("127.0.0.1", deployment.port), timeout=30) as sock:
        sock.sendall(head.encode() + b"\xff\xd8\xff\xe0" + bytes(100_000))
        answer = answer_of(sock)  # to the end: the server closes the connection
    status, _, rest = answer.partition(b"\r\n")
    headers = rest.split(b"\r\n\r\n", 1)[0].decode().lower()
    assert b" 413 " in status and "connection: close" in headers, answer[:500]
    with socket.create_connection(("127.0.0.1", deployment.port), timeout=30) as sock:  # nothing left unread
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        kept = sock.recv(65536).split(b"\r\n\r\n", 1)[0].decode().lower()
    assert " 200 " in kept and "connection: keep-alive" in kept, kept
    for form in (True, False):  # a body read to its end, multipart or raw
        photo = data_file("photos/chelsea.jpg")
        sent = deployment.upload(photo) if form else deployment.session.post(
            deployment.url + "/v1/attachments", data=photo.read_bytes(), headers={"Content-Type": "image/jpeg"},
            timeout=30)
        assert sent.status_code == 202 and sent.headers["Connection"] == "keep-alive", (form, sent.headers)


def test_what_gunicorn_cannot_parse_is_refused_in_json(deployment):
    """gunicorn answers a request it cannot parse itself, before the application sees it: a control byte in a
    header got its HTML page, where the API promises a JSON error (an adversarial run)."""
    deployment.start("web")
    for head in (b"POST /v1/attachments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\x7fb\r\nContent-Length: 0\r\n\r\n",
                 b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Anything: \x00\r\n\r\n",
                 b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", deployment.port), timeout=10) as sock:
            sock.sendall(head)
            answer = answer_of(sock)
        status, _, rest = answer.partition(b"\r\n")
        headers, _, body = rest.partition(b"\r\n\r\n")
        assert status.split()[1] in (b"400", b"414"), answer[:200]
        assert b"content-type: application/json" in headers.lower(), answer[:300]
        assert set(json.loads(body)) == {"error", "message"}, body
    # a transfer coding gunicorn does not know is its 501, which it called "Bad Request" (an adversarial run)
    with socket.create_connection(("127.0.0.1", deployment.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/attachments HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked,\r\n\r\n")
        answer = answer_of(sock)
    assert answer.startswith(b"HTTP/1.1 501 Not Implemented\r\n"), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"] == "not_implemented"
    # a Content-Length of 4,301 digits or more: int() refused it on the poller, whose ValueError ended the worker
    # process and every connection on it, no token needed (an adversarial run); and a 60,000-comma Transfer-Encoding
    workers = deployment.processes["web"].children()
    kept = socket.create_connection(("127.0.0.1", deployment.port), timeout=10)  # a connection the process serves

    def healthy() -> bool:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"}\n") and (chunk := kept.recv(65536)):
            answer += chunk
        return answer.startswith(b"HTTP/1.1 200")

    assert healthy()
    for head in (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
                 b"POST /ops/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + b"," * 60_000 + b"chunked\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", deployment.port), timeout=10) as sock:
            sock.sendall(head)
            answer = answer_of(sock)
        assert answer.split(b"\r\n")[0].split()[1] in (b"400", b"431"), answer[:200]
    assert healthy(), "the process lives on"
    kept.close()
    assert deployment.processes["web"].children() == workers
    # a header sent twice reaches the application joined with a comma (an adversarial run: two Idempotency-Keys
    # were taken as one key, "a,b")
    photo = b"\xff\xd8\xff\xd9"
    with socket.create_connection(("127.0.0.1", deployment.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/attachments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + UPLOADER_TOKEN.encode()
                     + b"\r\nContent-Type: image/jpeg\r\nIdempotency-Key: a\r\nIdempotency-Key: b\r\n"
                     + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(photo) + photo)
        answer = answer_of(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"] == "bad_idempotency_key", answer


def test_a_lingering_close_of_a_socket_closed_already_raises_nothing_in_its_thread(monkeypatch):
    """gunicorn's error path for an answer its source cut (an S3 read ended mid-download) closes the socket, then
    asks for a graceful close: the lingering thread's "Bad file descriptor" was a traceback each time (an adversarial
    run)."""
    import gunicorn.workers.gthread as gthread

    from app.web import lingering_close

    lingering_close.install()
    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    closed, other = socket.socketpair()
    closed.close()
    connection = gthread.TConn.__new__(gthread.TConn)
    connection.sock = closed
    connection.close(graceful=True)
    wait_for(lambda: lingering_close._lingering._value == lingering_close.MAX_LINGERING, timeout=5)
    other.close()
    assert raised == []
