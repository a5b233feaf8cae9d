"""A body that ends before its declared length (or chunked framing) is refused, against real gunicorn.

A client whose connection drops mid-upload sends fewer bytes than its
``Content-Length``; gunicorn then hands the application a short stream, not
an error. The upload must answer ``400 incomplete_body``, store nothing and
leave the Idempotency-Key unused, so the client's retry with all the bytes
is accepted.
"""

from __future__ import annotations

import json
import socket

import pytest
from sqlalchemy import func, select

from app.adapters.postgres.models import attachments, idempotency_keys, jobs, outbox
from tests.processes import Deployment

pytestmark = pytest.mark.processes

BOUNDARY = "attache-test-boundary"



def send_truncated(port: int, head: str, body: bytes, sent: int) -> tuple[int, dict]:
    """Send ``head`` and the first ``sent`` bytes of ``body``, close the write side, read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + body[:sent])
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


def assert_nothing_stored(engine, storage_dir):
    with engine.connect() as conn:
        counts = {t.name: conn.execute(select(func.count()).select_from(t)).scalar()
                  for t in (attachments, jobs, outbox, idempotency_keys)}
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
    assert_nothing_stored(engine, storage_dir)
    whole = send_truncated(web.port, request_head(web, "image/jpeg", length=None, key="cut-4"), chunked,
                           len(chunked))
    assert whole[0] == 202, whole
