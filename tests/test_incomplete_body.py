"""A body that ends before its declared length (or chunked framing) is refused, against real gunicorn.

A client whose connection drops mid-upload sends fewer bytes than its
``Content-Length``; gunicorn then hands the application a short stream, not
an error. The upload must answer ``400 incomplete_body``, store nothing and
leave the Idempotency-Key unused, so the client's retry with all the bytes
is accepted.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest
from sqlalchemy import func, select

from app.adapters.postgres.models import attachments, idempotency_keys, jobs, outbox
from tests.processes import Deployment, wait_for

pytestmark = pytest.mark.processes

BOUNDARY = "attache-test-boundary"



def send_truncated(port: int, head: str, body: bytes, sent: int, *, shut_write: bool = True) -> tuple[int, dict]:
    """Send ``head`` and the first ``sent`` bytes of ``body``, close the write side, read the answer. A client that
    closes its sending side is taken to have given up (``shut_write=False`` for one that waits for the answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + body[:sent])
        if shut_write:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, payload = rest.partition(b"\r\n\r\n")
    status = int(status_line.split()[1])
    return status, json.loads(payload) if b"application/json" in headers.lower() else {}


def request_head(web: Deployment, content_type: str, *, length: int | None, key: str) -> str:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"POST /v1/attachments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {web.token}\r\n"
            f"Idempotency-Key: {key}\r\nContent-Type: {content_type}\r\n{framing}\r\nConnection: close\r\n\r\n")


def multipart(data: bytes, filename: str) -> bytes:
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n"
            f"Content-Type: image/jpeg\r\n\r\n").encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def _counts(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t.name: conn.execute(select(func.count()).select_from(t)).scalar()
                for t in (attachments, jobs, outbox, idempotency_keys)}


def assert_nothing_stored(engine, storage_dir):
    counts = _counts(engine)
    assert counts == {"attachments": 0, "jobs": 0, "outbox": 0, "idempotency_keys": 0}
    assert [p for p in storage_dir.rglob("*") if p.is_file()] == [], "no staged object is left"


def test_raw_body_cut_short_is_400_and_the_key_stays_unused(web, engine, storage_dir, data_file):
    data = data_file("photos/chelsea.jpg").read_bytes()
    status, body = send_truncated(web.port, request_head(web, "image/jpeg", length=len(data), key="cut-1"),
                                  data, len(data) // 3)
    assert (status, body.get("error")) == (400, "incomplete_body"), body
    assert_nothing_stored(engine, storage_dir)
    retry = web.session.post(web.url + "/v1/attachments", data=data, timeout=30,
                             headers={"Content-Type": "image/jpeg", "Idempotency-Key": "cut-1"})
    assert retry.status_code == 202, retry.text
    assert retry.json()["size"] == len(data) and "Idempotent-Replayed" not in retry.headers


def test_multipart_body_cut_short_is_400(web, engine, storage_dir, data_file):
    data = data_file("photos/chelsea.jpg").read_bytes()
    payload = multipart(data, "chelsea.jpg")
    head = request_head(web, f"multipart/form-data; boundary={BOUNDARY}", length=len(payload), key="cut-2")
    status, body = send_truncated(web.port, head, payload, len(payload) // 3)
    assert (status, body.get("error")) == (400, "incomplete_body"), body
    assert_nothing_stored(engine, storage_dir)


def test_multipart_cut_after_the_file_part_is_400(web, engine, storage_dir, data_file):
    """The whole file part arrived, but not the closing boundary: still not the body that was declared."""
    data = data_file("photos/chelsea.jpg").read_bytes()
    payload = multipart(data, "chelsea.jpg")
    head = request_head(web, f"multipart/form-data; boundary={BOUNDARY}", length=len(payload), key="cut-3")
    status, body = send_truncated(web.port, head, payload, len(payload) - 4)
    assert (status, body.get("error")) == (400, "incomplete_body"), body
    assert_nothing_stored(engine, storage_dir)


def test_chunked_body_cut_short_is_400(web, engine, storage_dir, data_file):
    data = data_file("photos/chelsea.jpg").read_bytes()
    chunked = f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    status, body = send_truncated(web.port, request_head(web, "image/jpeg", length=None, key="cut-4"),
                                  chunked, len(chunked) // 3)
    assert (status, body.get("error")) == (400, "incomplete_body"), body
    assert "before its last chunk" in body["message"], "it said the body ended after 0 bytes"
    assert_nothing_stored(engine, storage_dir)
    whole = send_truncated(web.port, request_head(web, "image/jpeg", length=None, key="cut-4"), chunked,
                           len(chunked), shut_write=False)
    assert whole[0] == 202, whole


def _stopped_in(process) -> list[int]:
    """The processes of ``process``'s group stopped (``SIGSTOP``, state ``T``)."""
    stopped = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "T" and int(fields[2]) == process.popen.pid:
            stopped.append(int(stat.parent.name))
    return stopped


def _closed_by_its_peer(server_port: int, client_port: int) -> bool:
    """The server's end of a loopback connection has its peer's FIN (``CLOSE_WAIT`` in ``/proc/net/tcp``): the
    FIN is taken in asynchronously, after the client's ``shutdown`` or ``close`` has returned."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            return state == "08"
    return False


@pytest.mark.parametrize("gives_up", ["closes", "shuts_its_sending_side"])
def test_a_client_gone_before_the_commit_leaves_nothing(env, tmp_path, engine, storage_dir, data_file, gives_up):
    """A client that gave up while the web was slow to commit (a store or a database outlasting its timeout; here
    the web paused between the upload's last statement and its COMMIT) had its upload committed and processed all
    the same: visible without a ``202``, and a retry without an Idempotency-Key made a second attachment (carried
    from an adversarial run). The web asks whether its client still waits just before the COMMIT."""
    deployment = Deployment(env, tmp_path)
    try:
        web = deployment.start("web", ATTACHE_FAULT="before_upload_commit")
        data = data_file("photos/chelsea.jpg").read_bytes()
        head = request_head(deployment, "image/jpeg", length=len(data), key="gone-1").replace(
            "Connection: close\r\n", "")
        with socket.create_connection(("127.0.0.1", deployment.port), timeout=30) as sock:
            sock.sendall(head.encode() + data)
            wait_for(lambda: _stopped_in(web), timeout=30, message="the web paused before the upload's COMMIT")
            assert [p.parent.name for p in storage_dir.rglob("*") if p.is_file()] == ["staging"]
            client_port = sock.getsockname()[1]
            if gives_up == "shuts_its_sending_side":
                sock.shutdown(socket.SHUT_WR)
                wait_for(lambda: _closed_by_its_peer(deployment.port, client_port), timeout=10,
                         message="the server's side saw the client's FIN")
                web.signal(signal.SIGCONT)
                assert sock.recv(65536).startswith(b"HTTP/1.1 400"), "a client still reading is told"
        if gives_up == "closes":
            wait_for(lambda: _closed_by_its_peer(deployment.port, client_port), timeout=10,
                     message="the server's side saw the client's FIN")
            web.signal(signal.SIGCONT)
        wait_for(lambda: "client_gone" in web.output() or _counts(engine)["jobs"], timeout=30,
                 message="the upload answered or committed")
        wait_for(lambda: not any(p.is_file() for p in storage_dir.rglob("*")), timeout=10,
                 message="the staged bytes removed")
        assert_nothing_stored(engine, storage_dir)
        retry = deployment.session.post(deployment.url + "/v1/attachments", data=data, timeout=30,
                                        headers={"Content-Type": "image/jpeg", "Idempotency-Key": "gone-1"})
        assert retry.status_code == 202 and "Idempotent-Replayed" not in retry.headers, retry.text
    finally:
        deployment.stop_all()
