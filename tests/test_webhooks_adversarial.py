"""Webhooks and the replay cursor against what the world sends: odd query strings, slow endpoints, races.

Each test here once failed against the code it guards (found by an adversarial review).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
from sqlalchemy import text

from app.adapters import webhooks as webhook_endpoints
from app.errors import WebhookTargetRefused
from tests.conftest import OPERATOR_TOKEN, authed
from tests.processes import wait_for
from tests.test_webhooks import make_app


@pytest.fixture
def broker_kind() -> str:
    return "postgres"  # no vhost needed: these tests never publish


@pytest.fixture
def app(env):
    app = make_app(env, ATTACHE_WEBHOOK_ALLOW_PRIVATE="1")
    yield app
    app.extensions["attache"].close()


def test_a_cursor_that_is_not_an_ascii_integer_is_400_never_500(app):
    ops = authed(app, OPERATOR_TOKEN)
    # str.isdigit() is true for superscripts and other Unicode digits that int() refuses
    for query in ("after=%C2%B2", "limit=%C2%B9", "after=%E2%91%A0", "after=%EF%BC%91", "after=%D9%A1",
                  "after=1.5", "after=", "limit=0x10", "after=+1", "after=%201"):
        response = ops.get(f"/v1/events?{query}")
        assert response.status_code == 400, (query, response.status_code)
        assert response.json["error"] == "bad_request"
    assert ops.get("/v1/events?after=0&limit=5").status_code == 200


class AnsweringEndpoint:
    """Answers one request with ``answer``, then sends ``forever`` again and again, every ``every`` seconds, until
    the connection ends."""

    def __init__(self, answer: bytes, forever: bytes = b"", every: float = 0.0):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.answer, self.forever, self.every, self.sent = answer, forever, every, 0
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"

    def _serve(self):
        with contextlib.suppress(OSError):
            client, _ = self.listener.accept()
            with client:
                _read_request(client)
                client.sendall(self.answer)
                while self.forever and not self.stop.wait(self.every):
                    client.sendall(self.forever)
                    self.sent += len(self.forever)

    def close(self):
        self.stop.set()
        self.listener.close()


def _read_request(client: socket.socket) -> None:
    """The whole request (its head, then as many bytes as its ``Content-Length`` says): a close with bytes unread
    is a reset, which the client may see before the answer."""
    seen = b""
    while b"\r\n\r\n" not in seen:
        seen += client.recv(65536) or b"\r\n\r\n"
    head, _, body = seen.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += client.recv(65536) or b" " * length


def dripping_endpoint(every: float) -> AnsweringEndpoint:
    """Answers ``200`` and then a header byte every ``every`` seconds, forever: each read is quick, the answer never
    ends."""
    return AnsweringEndpoint(b"HTTP/1.1 200 OK\r\nX-Drip: ", b"a", every)


def test_an_endpoint_that_drips_its_answer_is_cut_at_the_timeout():
    """A per-read timeout alone lets a slow-drip answer hold a delivery thread (and outlive its claim) forever."""
    endpoint = dripping_endpoint(every=0.1)
    outcome = []
    try:
        began = time.monotonic()
        worker = threading.Thread(target=lambda: outcome.append(webhook_endpoints.post(
            endpoint.url, "{}", {}, timeout=0.5, allow_private=True)), daemon=True)
        worker.start()
        worker.join(3)
        assert not worker.is_alive(), "the attempt is still reading a dripping answer after 3 s"
        assert time.monotonic() - began < 1.5
        assert not outcome[0].ok and "0.5" in outcome[0].error
    finally:
        endpoint.close()


def test_a_url_that_no_request_could_carry_is_refused(app):
    """An adversarial run: ``http://host/hook/é`` was registered (201), and every delivery to it failed before a byte
    was sent (``UnicodeEncodeError``, 17 attempts over 29 h, then ``failed``): a URL is ASCII, or it is a 400."""
    ops = authed(app, OPERATOR_TOKEN)
    for url in ("http://127.0.0.1/hook/\u00e9", "http://127.0.0.1/hook?q=\u00fc", "http://b\u00fccher.example/hook"):
        answer = ops.post("/v1/ops/webhooks", json={"url": url, "events": ["attachment.ready"]})
        assert (answer.status_code, answer.json["error"]) == (400, "bad_request"), (url, answer.json)
    assert ops.post("/v1/ops/webhooks", json={"url": "http://127.0.0.1/hook/%C3%A9?q=%C3%BC",
                                              "events": ["attachment.ready"]}).status_code == 201


def test_a_name_that_does_not_resolve_in_time_costs_the_attempt_its_timeout_only(monkeypatch):
    """Resolving the endpoint's name was outside the attempt's deadline: a resolver that did not answer held the
    delivery's thread for its own timeouts (an adversarial review). The name's time now counts in the attempt's."""
    import socket

    real, stalled = socket.getaddrinfo, threading.Event()

    def slow_resolver(host, *args, **kwargs):
        if host == "slow.example":
            stalled.wait(10)
        return real("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_resolver)
    try:
        began = time.monotonic()
        answer = webhook_endpoints.post("http://slow.example/hook", "{}", {}, timeout=0.5, allow_private=True)
        assert time.monotonic() - began < 1.5
        assert answer.status is None and "did not resolve within 0.5 s" in answer.error
    finally:
        stalled.set()


class SlowToConnectTLSEndpoint:
    """A TLS endpoint whose TCP connect takes about a second (its accept queue is full when the sender's first SYN
    comes, so the kernel drops it and the sender sends it again after its initial retransmission timeout, 1 s, as
    a dropped SYN on a lossy link or the endpoint's own firewall makes it), whose handshake ends just after the
    sender's deadline and before the handshake's own, and which then drips its answer for ever."""

    def __init__(self, tmp_path, deadline: float):
        import ssl
        import subprocess

        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out",
                        str(cert)], check=True, capture_output=True, timeout=60)
        self.cert = cert
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.filler = socket.create_connection(self.listener.getsockname())  # the accept queue is full
        self.deadline = deadline
        self.stop = threading.Event()
        self.connected_after: float | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.listener.getsockname()[1]}/hook"

    def serve(self, began: float):
        with contextlib.suppress(OSError):
            time.sleep(0.3)  # the sender's first SYN was dropped meanwhile
            self.listener.accept()[0].close()  # the filler's: room for the SYN sent again
            client, _ = self.listener.accept()
            self.connected_after = time.monotonic() - began
            time.sleep(max(0.0, began + self.deadline + 0.3 - time.monotonic()))
            with self.context.wrap_socket(client, server_side=True) as tls:
                tls.recv(65536)
                tls.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
                while not self.stop.wait(0.2):
                    tls.sendall(b"a")

    def close(self):
        self.stop.set()
        self.filler.close()
        self.listener.close()


def test_a_tls_endpoint_whose_handshake_ends_after_the_deadline_is_cut_all_the_same(tmp_path, monkeypatch):
    """The deadline's cut shut down the socket it found, and a TLS connection's was set only once its handshake
    was done: a deadline that passed during a slow TCP connect, with the handshake ending after it, cut nothing,
    and an endpoint that then dripped its answer held the delivery's thread for ever. An adversarial run took every
    thread of the deliverer so within minutes, and healthy endpoints got nothing more."""
    deadline = 2.0
    endpoint = SlowToConnectTLSEndpoint(tmp_path, deadline)
    monkeypatch.setenv("SSL_CERT_FILE", str(endpoint.cert))  # a certificate the sender trusts, as a public one
    outcome = []
    try:
        began = time.monotonic()
        threading.Thread(target=endpoint.serve, args=(began,), daemon=True).start()
        worker = threading.Thread(target=lambda: outcome.append(webhook_endpoints.post(
            endpoint.url, "{}", {}, timeout=deadline, allow_private=True)), daemon=True)
        worker.start()
        worker.join(deadline + 3)
        assert endpoint.connected_after is not None and endpoint.connected_after > 0.8, \
            f"the TCP connect was not slowed by a dropped SYN ({endpoint.connected_after}): the test proves nothing"
        assert not worker.is_alive(), f"the attempt is still reading a dripping answer after {deadline + 3} s"
        assert time.monotonic() - began < deadline + 1
        assert outcome[0].status is None and f"{deadline:g}" in outcome[0].error, outcome
    finally:
        endpoint.close()


def test_a_delivery_being_sent_is_not_redelivered_alongside_its_attempt(app, engine, data_file):
    """A redelivery cleared the claim of an attempt under way: another thread sent the delivery at the same time
    (two POSTs of one delivery at once), and the first attempt's outcome was dropped (an adversarial run)."""
    from app.core.webhooks import Deliverer, DelivererConfig
    from tests.test_webhooks import NOW, register, upload_and_process
    from tests.webhook_receivers import Receiver

    slow = Receiver(delay=1.5)
    deliverer = Deliverer(engine, DelivererConfig(policy=NOW, timeout_seconds=5, concurrency=2, allow_private=True))
    try:
        register(app, slow.url, events=["attachment.ready"])
        upload_and_process(app, engine, data_file("photos/chelsea.jpg"))
        assert deliverer.run_once()["started"] == 1
        wait_for(lambda: slow.calls, timeout=10, message="the attempt under way")
        ops = authed(app, OPERATOR_TOKEN)
        with engine.connect() as conn:
            delivery_id = conn.execute(text("SELECT id FROM webhook_deliveries")).scalar_one()
        again = ops.post(f"/v1/ops/webhooks/deliveries/{delivery_id}/redeliver", json={"reason": "resend"})
        assert (again.status_code, again.json["error"]) == (409, "delivery_in_flight"), again.json
        assert deliverer.run_once()["started"] == 0
        wait_for(lambda: deliverer.run_once()["delivered"], timeout=10, message="the attempt's outcome")
        assert len(slow.calls) == 1
        assert ops.post(f"/v1/ops/webhooks/deliveries/{delivery_id}/redeliver",
                        json={"reason": "resend"}).status_code == 200  # once it has ended
        # a delivery waiting for its next attempt (no claim: NULL) is not in flight (a re-attack: it was refused)
        with engine.begin() as conn:
            conn.execute(text("UPDATE webhook_deliveries SET state = 'pending', attempts = 3, claimed_until = NULL, "
                              "next_attempt_at = now() + interval '1 hour'"))
        again = ops.post(f"/v1/ops/webhooks/deliveries/{delivery_id}/redeliver", json={"reason": "resend"})
        assert again.status_code == 200 and again.json["attempts"] == 0, again.json
    finally:
        deliverer.close()
        slow.close()


def test_each_address_of_the_endpoints_name_is_tried_within_the_deadline(monkeypatch):
    """Only the first address a name resolved to was tried: a dual-stack endpoint whose first address does not
    answer (a broken IPv6 route) failed every attempt, where any HTTP client tries the next (an adversarial run)."""
    from tests.webhook_receivers import Receiver

    receiver = Receiver()
    port = receiver.server.server_address[1]
    real = socket.getaddrinfo

    silent = socket.socket()  # an address that drops connection attempts: a full accept queue on 127.0.0.3
    silent.bind(("127.0.0.3", port))
    silent.listen(0)
    filler = socket.create_connection(("127.0.0.3", port))

    def addresses(host, *args, **kwargs):
        if host == "refusing.example":  # the first refuses: nothing listens on 127.0.0.2
            return real("127.0.0.2", *args, **kwargs) + real("127.0.0.1", *args, **kwargs)
        if host == "silent.example":  # the first drops the SYN: it would take all the time there is (a re-attack)
            return real("127.0.0.3", *args, **kwargs) + real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", addresses)
    try:
        for name in ("refusing.example", "silent.example"):
            began = time.monotonic()
            answer = webhook_endpoints.post(f"http://{name}:{port}/hook", "{}", {}, timeout=2, allow_private=True)
            assert answer.ok, (name, answer)
            assert time.monotonic() - began < 2
        assert len(receiver.calls) == 2
    finally:
        filler.close()
        silent.close()
        receiver.close()


def test_an_endpoint_of_several_addresses_has_the_whole_deadline_for_its_answer(monkeypatch):
    """Each address's share of the deadline was its connect's, and stayed the socket's timeout: an endpoint of
    four addresses whose first answered in 1.25-5 s failed every attempt, 17 POSTs it answered (a re-attack)."""
    from tests.webhook_receivers import Receiver

    receiver = Receiver(delay=1.0)
    port = receiver.server.server_address[1]
    real = socket.getaddrinfo

    def four(host, *args, **kwargs):
        if host == "four.example":
            return [info for n in (1, 2, 3, 4) for info in real(f"127.0.0.{n}", *args, **kwargs)]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", four)
    try:
        answer = webhook_endpoints.post(f"http://four.example:{port}/hook", "{}", {}, timeout=2, allow_private=True)
        assert answer.ok, answer
    finally:
        receiver.close()


def test_an_answer_chunked_without_end_is_not_read_into_memory():
    """A chunk declared ``-1``: Python 3.11's http.client reads it to the connection's end, whatever it is asked
    for. A receiver that sent one took 3-4.7 GB of the scheduler, and its thread 3.5-4.5 times its deadline (an
    adversarial run)."""
    endpoint = AnsweringEndpoint(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", b"x" * 65536)
    try:
        began = time.monotonic()
        answer = webhook_endpoints.post(endpoint.url, "{}", {}, timeout=3, allow_private=True)
        assert answer.ok, answer
        assert time.monotonic() - began < 1.5
        assert endpoint.sent < 64 * 1024 * 1024
    finally:
        endpoint.close()


def test_interim_answers_before_the_answer_are_skipped():
    """``103 Early Hints`` (or ``102``) before the ``204`` was taken for the answer: a failure, and the delivery
    was sent again up to 17 times (an adversarial run)."""
    endpoint = AnsweringEndpoint(b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
                                 b"HTTP/1.1 204 No Content\r\n\r\n")
    try:
        answer = webhook_endpoints.post(endpoint.url, "{}", {}, timeout=3, allow_private=True)
        assert (answer.status, answer.ok) == (204, True), answer
    finally:
        endpoint.close()


def test_names_whose_server_never_answers_take_one_resolver_each_and_leave_the_rest_to_others(monkeypatch):
    """Each attempt on a name whose server did not answer queued another lookup behind those it gave up on; they
    kept every resolver thread, and the names of healthy endpoints (IP literals too) waited out their deadline:
    7-12 of 17-23 healthy attempts failed (an adversarial run)."""
    real, silence = socket.getaddrinfo, threading.Event()

    def resolver(host, *args, **kwargs):
        if host.startswith("silent"):
            silence.wait(30)
        return real("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    try:
        for _ in range(10):  # three silent names, each attempted ten times
            for name in ("silent-a.example", "silent-b.example", "silent-c.example"):
                with pytest.raises(WebhookTargetRefused, match="did not resolve"):
                    webhook_endpoints.check_target(f"http://{name}/", allow_private=True, within=0.01)
        for url in ("http://healthy.example/", "http://127.0.0.1/"):
            _, addresses = webhook_endpoints.check_target(url, allow_private=True, within=1)
            assert addresses == ["127.0.0.1"]
    finally:
        silence.set()


def test_many_silent_names_leave_threads_to_the_names_that_answer(monkeypatch):
    """Each silent name holds a resolver thread for its resolver's timeouts, and 32 of them at once held them all:
    every endpoint's name then waited out its deadline, healthy ones included (an adversarial run). A name that
    answered before is looked up on threads of its own, and one that outlived the resolving bound once on threads
    apart: silent names keep threads from the names looked up for the first time only on their own first lookup."""
    real, silence, looked_up = socket.getaddrinfo, threading.Event(), set()
    monkeypatch.setattr(webhook_endpoints, "RESOLVE_SECONDS", 0.2)

    def resolver(host, *args, **kwargs):
        if host.startswith("silent"):
            if host in looked_up:
                silence.wait(30)
            else:
                looked_up.add(host)
                time.sleep(0.3)  # past the bound: a silent name from now on
        return real("127.0.0.1", *args, **kwargs)

    def attempt_each(names):
        for name in names:
            with contextlib.suppress(WebhookTargetRefused):
                webhook_endpoints.check_target(f"http://{name}/", allow_private=True, within=0.001)

    def resolves_at_once(name) -> None:
        began = time.monotonic()
        _, addresses = webhook_endpoints.check_target(f"http://{name}/", allow_private=True, within=2)
        assert addresses == ["127.0.0.1"] and time.monotonic() - began < 1, name

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    silent = [f"silent-{number}.example" for number in range(64)]
    try:
        resolves_at_once("answered-before.example")
        attempt_each(silent)  # each takes 0.3 s: the pool of new names is theirs meanwhile
        wait_for(lambda: all(webhook_endpoints._STANDINGS.get((name, 80)) == "silent" for name in silent),
                 timeout=10, message="every silent name's first lookup ends")
        for _ in range(3):  # now each holds a thread until the test ends
            attempt_each(silent)
        resolves_at_once("answered-before.example")
        resolves_at_once("looked-up-first-now.example")
    finally:
        silence.set()


def test_a_lookup_done_before_it_is_registered_leaves_the_next_ones_free(monkeypatch):
    """A lookup can end before ``submit`` returns (a new resolver thread, a quick name); its callback then ran at
    once, under the lock it takes, and the process's every later lookup waited on that lock for ever (a
    re-attack: 5-6 of 30 fresh processes stuck on their first lookup, webhooks dead until a restart)."""
    from concurrent.futures import Future

    class Done:  # an executor whose lookups have ended by the time submit returns
        def submit(self, fn, *args, **kwargs):
            done = Future()
            done.set_result(fn(*args, **kwargs))
            return done

    monkeypatch.setattr(webhook_endpoints, "_RESOLVERS",
                        {standing: Done() for standing in ("answered", "new", "silent")})
    answers = []
    looking = threading.Thread(target=lambda: answers.extend(
        webhook_endpoints.check_target(f"http://localhost:{port}/", allow_private=True, within=1)[1]
        for port in (80, 80, 81)), daemon=True)
    looking.start()
    looking.join(5)
    assert not looking.is_alive(), "the lookups are stuck on their own lock"
    assert len(answers) == 3 and all("127.0.0.1" in addresses for addresses in answers), answers


@pytest.mark.parametrize("head", [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 204 No Content\r\nServer: x",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"])
def test_an_answer_whose_head_the_connection_cut_is_no_answer(head):
    """http.client takes the connection's end for the blank line that ends an answer's headers: a receiver that
    closed (or crashed) after ``HTTP/1.1 200 OK\\r\\n`` was counted as having taken the delivery, and it was never
    sent again (an adversarial run)."""
    endpoint = AnsweringEndpoint(head)
    try:
        answer = webhook_endpoints.post(endpoint.url, "{}", {}, timeout=3, allow_private=True)
        assert (answer.status, answer.ok) == (None, False), answer
        assert "IncompleteRead" in answer.error
    finally:
        endpoint.close()


def test_a_whole_head_with_no_body_is_still_an_answer():
    """The connection's end after the blank line (no length: the body runs to the end) is a whole answer."""
    for head in (b"HTTP/1.1 200 OK\r\n\r\n", b"HTTP/1.0 204 No Content\r\nServer: x\r\n\r\n", b"HTTP/1.1 200 OK\n\n"):
        endpoint = AnsweringEndpoint(head)
        try:
            answer = webhook_endpoints.post(endpoint.url, "{}", {}, timeout=3, allow_private=True)
            assert answer.ok, (head, answer)
        finally:
            endpoint.close()
