"""The request gatherer's reading of heads and small bodies (app/web/framing.py, app/web/request_head.py),
without a server.

What it reads runs on gunicorn's main thread, the one that accepts every
connection: a request sent a byte at a time must cost it no more than one
sent whole, and its deadlines must not grow with the packets."""

from __future__ import annotations

from app.web.framing import GATHER_BYTES, TOO_LARGE, WAIT, WHOLE, PartialRequest
from app.web.request_head import _Heads


class CountingBuffer(bytearray):
    """A bytearray that counts the bytes its ``find`` calls scan."""

    scanned = 0

    def find(self, sub, start=0, *args):
        found = super().find(sub, start, *args)
        CountingBuffer.scanned += (found if found >= 0 else len(self)) - start
        return found


def trickled(payload: bytes) -> tuple[str, int]:
    """Feed ``payload`` a byte at a time; what the gatherer said last, and the bytes its searches scanned."""
    CountingBuffer.scanned = 0
    head = PartialRequest(CountingBuffer(), 0.0, "client")
    verdict = WAIT
    for at in range(len(payload)):
        head.buffer += payload[at:at + 1]
        verdict = head.whole()
        if verdict != WAIT:
            break
    return verdict, CountingBuffer.scanned


CHUNKED = b"POST /ops/login HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_request_sent_a_byte_at_a_time_is_read_once():
    """A review: the trailers of a chunked body were read again from their first line at every packet, some 10^9
    bytes scanned on the accepting thread for a 60 KB body of short trailer lines sent a byte at a time."""
    for payload in (b"GET / HTTP/1.1\r\n" + b"a: b\r\n" * 8000 + b"\r\n", b"\r\n" * 30000 + b"GET / HTTP/1.1\r\n\r\n",
                    CHUNKED + b"1\r\nx\r\n" * 9000 + b"0\r\n\r\n",
                    CHUNKED + b"0\r\n" + b"a:\r\n" * 15000 + b"\r\n"):
        verdict, scanned = trickled(payload)
        assert verdict == WHOLE
        assert scanned < 10 * len(payload)  # each byte looked at a few times, not once a packet


def test_what_is_gathered_and_what_a_thread_reads():
    """A body is gathered as gunicorn will read it. A review found five framings the gatherer left to a thread
    that gunicorn reads a body by, each a sign-in form's thread held 60 s with no token: a client awaiting
    100 Continue, a length with leading zeros, ``gzip, chunked``, two Transfer-Encoding fields, and a long head
    leaving less than the form's limit for its body."""
    def verdict(data: bytes) -> str:
        return PartialRequest(bytearray(data), 0.0, "client").whole()

    head = b"POST /ops/login HTTP/1.1\r\nHost: x\r\n"
    assert verdict(head) == WAIT
    assert verdict(head + b"\r\n") == WHOLE  # no body
    assert verdict(head + b"Content-Length: 0\r\n\r\n") == WHOLE
    assert verdict(head + b"Content-Length: 5\r\n\r\nabc") == WAIT  # a small body: gathered whole
    assert verdict(head + b"Content-Length: 5\r\n\r\nabcde") == WHOLE
    assert verdict(head + f"Content-Length: {GATHER_BYTES}\r\n\r\n".encode()) == WHOLE  # too large: a thread reads
    assert verdict(head + b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n") == WAIT  # told to send it here
    assert verdict(head + b"Content-Length: 0000000000005\r\n\r\n") == WAIT
    assert verdict(head + b"Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n") == WAIT
    assert verdict(head + b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\n") == WAIT
    padded = head + b"".join(b"X-Pad: " + b"p" * 7991 + b"\r\n" for _ in range((GATHER_BYTES - 2000) // 8000))
    assert verdict(padded + b"Content-Length: 3000\r\n\r\n" + b"t" * 2999) == WAIT  # a form's limit always fits
    assert verdict(padded + b"Content-Length: 3000\r\n\r\n" + b"t" * 3000) == WHOLE
    for refused in (b"Content-Length: 5\r\nContent-Length: 5\r\n", b"Content-Length: +5\r\n",
                    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"Transfer-Encoding: chunked, gzip\r\n",
                    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"):
        assert verdict(head + refused + b"\r\n") == WHOLE, refused  # the parser refuses these before any body
    assert verdict(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n") == WHOLE
    # what int() refuses (4,301 digits or more) ended the worker process on the poller; a field past gunicorn's
    # limit, split here into 60,001 codings, cost its main thread 11 ms (adversarial runs): the parser refuses both
    assert verdict(head + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n") == WHOLE
    assert verdict(head + b"Content-Length: " + b"0" * 5000 + b"5\r\n\r\n") == WAIT
    assert verdict(head + b"Transfer-Encoding: " + b"," * 60_000 + b"chunked\r\n\r\n") == WHOLE
    # a re-attack: the same commas over fields under gunicorn's limit, and 15,000 tiny fields, cost it 3-4 ms a head
    import time

    for heavy in (head + (b"Transfer-Encoding: " + b"," * 7500 + b"\r\n") * 8 + b"Transfer-Encoding: chunked\r\n\r\n",
                  head + b"a:\r\n" * 15_000 + b"\r\n"):
        began = time.process_time()
        assert verdict(heavy) == WHOLE
        assert time.process_time() - began < 0.001 * 20, "not read field by field"  # under 1 ms, with margin
    assert verdict(head + b"X: y\r\n" * 98 + b"Content-Length: 3\r\n\r\nab") == WAIT, "100 fields are read"
    assert verdict(CHUNKED + b"3;ext=1\r\nabc\r\n") == WAIT
    assert verdict(CHUNKED + b"3\r\nabc\r\n0\r\nTrailer: t\r\n") == WAIT
    assert verdict(CHUNKED + b"3\r\nabc\r\n0\r\nTrailer: t\r\n\r\n") == WHOLE
    assert verdict(CHUNKED + b"A\r\n0123456789\r\n0\r\n\r\n") == WHOLE
    assert verdict(CHUNKED + b"zz\r\n") == WHOLE  # broken framing: the parser refuses it
    # a third review: framings gunicorn reads a body by, which the gatherer took for broken or for HTTP/1.0
    assert verdict(CHUNKED + b"0000000003\r\nabc\r\n") == WAIT
    assert verdict(CHUNKED + b"1;" + b"x" * 2000 + b"\r\n") == WAIT
    assert verdict(b"\r\n" + CHUNKED + b"3\r\nabc\r\n") == WAIT
    assert verdict(b"\r\n" + head + b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n") == WAIT
    assert verdict(b"\r\n\r\n") == WAIT
    assert verdict(b"GET / HTTP/1.1\r\n" + b"a" * GATHER_BYTES) == TOO_LARGE


def test_a_deadline_moved_at_every_packet_keeps_one_entry():
    """A review: every packet of a body pushed its new deadline, and 128 connections sending a byte at a time grew
    the heap by an entry a byte until their first deadline came (some 80 bytes each)."""
    heads = _Heads()
    heads.add("conn", PartialRequest(bytearray(), 10.0, "client"))
    for second in range(10_000):
        heads.due("conn", 10.0 + second)
    assert len(heads.deadlines) == 1
    assert heads.expired(100.0) == [] and len(heads.deadlines) == 1  # queued again for its latest deadline
    assert heads.expired(10_010.0) == ["conn"]
