"""A request's head, and a small body, gathered on the worker's poller without a thread, within deadlines.

gunicorn 27's gthread worker gives a new connection a thread, waits up to
5 s there for its first byte (``DEFAULT_WORKER_DATA_TIMEOUT``), then reads
the request's head from a blocking socket with no deadline. An adversarial
run: 100 connections that each sent one byte (``G``) and nothing more held
every thread of both web processes for as long as they stayed open, no
token needed, and 100 connections that sent nothing, reopened as the server
closed them, held threads 5 s each. Bounding the head by a deadline in the
thread (the eleventh session) left one client able to take every thread by
opening connections faster than the deadline freed them: some 64 every 5 s
for two processes of 32 threads.

:func:`install` gathers a request on the poller instead, as an event-loop
server does: a new connection, and a kept-alive one whose next request
begins, gets a thread only once its head has arrived whole (up to the blank
line that ends it), and with it a body small enough to fit in
:data:`~app.web.framing.GATHER_BYTES` with its head, or in
:data:`~app.web.framing.BODY_BYTES_GATHERED`
whatever the head's length, framed as gunicorn will read it (a
``Content-Length``, or a ``Transfer-Encoding`` ending in ``chunked``; a
client awaiting ``100 Continue`` is told to send it from here). Until then
its bytes are read as they come, without blocking, by the worker's main
thread, each byte looked at a few times at most, however it is split
(``app/web/framing.py`` reads them). A
head that has not ended within ``GATHER_BYTES`` is answered ``431``
there and then (a review: one of exactly that size, handed to a thread,
held it for the head's deadline); a larger body is read in a thread, where
its route refuses it before reading (``413``, ``401``) or bounds it per
uploader (``app/web/bodies_in_flight.py``); the sign-in forms, which anyone
may post, take at most ``BODY_BYTES_GATHERED`` and wait 1 s in all
(2 s at most) in a thread for a body not gathered, within gunicorn's own
reads too (:func:`read_by`, ``app/web/request.py``; reviews found eight
framings read otherwise than gunicorn's parser, and a chunked body gunicorn
read in one read while its client trickled, each holding a thread for 60 s
or as long as the client liked). A new connection
has gunicorn's ``--keep-alive`` plus :data:`FIRST_BYTE_SECONDS` for its
first byte (5 s in the Procfile: a connection opened ahead, as browsers and
pools do, and used 3 s later is answered; a review), and
:data:`HEAD_SECONDS` from that byte for the rest of its head, or it is
closed as a client gone. A small body may be silent for
``ATTACHE_BODY_IDLE_SECONDS``, as in a thread; then a thread takes it with
what came and its connection's reading side shut, and answers it as a body
cut short (``400 incomplete_body``) without waiting.
One address has at most :data:`GATHERING_PER_ADDRESS` requests being
gathered in a process; a newer connection from it closes its oldest, so one
address cannot fill gunicorn's ``--worker-connections`` (1000) and keep
others from being accepted. In the thread the parser keeps
:data:`HEAD_SECONDS` for what it still reads of a head itself.

What is left: many addresses at once can still fill ``--worker-connections``
with heads never finished, each for seconds, and a request gathered holds
up to 80 KiB (some 80 MiB a process at 1000 connections); clients behind a
balancer that does not buffer, or a NAT, share one address's 128; before clients you do not
trust, a buffering proxy with per-client limits belongs in front
(``docs/deploy.md``). TLS served by gunicorn itself and HTTP/2 with prior
knowledge (neither in the default setup) keep gunicorn's own handling,
with the head's deadline in the thread. Under another server or worker
class this does nothing.
"""

from __future__ import annotations

import heapq
import itertools
import selectors
import socket
import sys
import time
import weakref
from collections import defaultdict, deque

from app.web import expect_continue
from app.web.framing import GATHER_BYTES, TOO_LARGE, WAIT, PartialRequest

#: seconds a request's head has, from its connection's turn in a thread: a client sends it in one or two packets
HEAD_SECONDS = 5.0
#: seconds a new connection has for its first byte beyond gunicorn's ``--keep-alive`` (gunicorn's own thread wait
#: was 5, ours 0.5 before heads were gathered on the poller); a thread's drain of an unread body has as long
FIRST_BYTE_SECONDS = 0.5
#: heads gathered at once from one address, per process; one more closes the oldest
GATHERING_PER_ADDRESS = 128
_TOO_LARGE_MESSAGE = (b'{"error":"request_head_too_large","message":"a request\'s head (its request line and '
                      b'headers) is at most ' + str(GATHER_BYTES).encode() + b' bytes here"}')
#: the answer to a head that has not ended within GATHER_BYTES, given without a thread
HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: " + str(len(_TOO_LARGE_MESSAGE)).encode() + b"\r\n\r\n"
                  + _TOO_LARGE_MESSAGE)


#: a connection's socket -> when reads for its current request end: its head's (HEAD_SECONDS), then its body's if
#: one was set (:func:`read_by`)
_read_deadlines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def read_by(sock, deadline: float) -> None:
    """Reads on ``sock`` (the ``gunicorn.socket`` of the request being served) end by ``deadline``
    (``time.monotonic()``), however the client paces its bytes: each read waits until then at most and none
    starts after, and the body then ends cut short. For bodies read before anyone is known, the sign-in forms':
    gunicorn reads a chunked body's chunks in one read of the application's, which a client sending a byte a
    second kept going for as long as it liked (a fourth review). Under another server it does nothing."""
    _read_deadlines[sock] = deadline


def install(body_idle_seconds: float) -> bool:
    """Patch gunicorn's HTTP/1 parser and gthread worker, if this process is one of its gthread workers.

    ``body_idle_seconds`` (``ATTACHE_BODY_IDLE_SECONDS``) is how long a body being gathered may be silent, as one
    read in a thread may: then the request goes to a thread with what came, its connection's reading side shut,
    and is answered as one cut short (``400 incomplete_body`` on the upload) without waiting."""
    gthread = sys.modules.get("gunicorn.workers.gthread")
    if gthread is None or not hasattr(gthread, "DEFAULT_WORKER_DATA_TIMEOUT"):
        return False
    from gunicorn.http import errors, parser, unreader

    if getattr(parser.Parser.__next__, "attache_reads_by", False):
        return False
    next_request, receive = parser.Parser.__next__, unreader.SocketUnreader.chunk

    def next_within_deadline(self):
        reader = self.unreader
        if not isinstance(reader, unreader.SocketUnreader):
            return next_request(self)
        _read_deadlines[reader.sock] = time.monotonic() + HEAD_SECONDS  # not the previous request's body's
        expect_continue.forgive(reader.sock)
        try:
            request = next_request(self)
            if getattr(reader, "attache_continued", False):  # the gatherer said 100 Continue (and got the body)
                reader.attache_continued = False
                request._expected_100_continue = False
            elif request._expected_100_continue:  # said when the application reads the body, not before it runs
                request._expected_100_continue = False
                expect_continue.owe(reader.sock)
            return request
        finally:
            _read_deadlines.pop(reader.sock, None)
            try:  # blocking again, as gthread reads and writes the rest, each within the body's idle bound
                reader.sock.settimeout(body_idle_seconds)
            except OSError:
                pass

    def chunk(self, size_hint=None):
        deadline = _read_deadlines.get(self.sock)
        if deadline is None:
            return receive(self, size_hint)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise errors.NoMoreData(b"")  # gthread closes it quietly, as a client gone; a body ends cut short
        previous = self.sock.gettimeout()
        self.sock.settimeout(remaining)
        try:
            return receive(self, size_hint)
        except socket.timeout:
            raise errors.NoMoreData(b"") from None
        finally:
            self.sock.settimeout(previous)

    next_within_deadline.attache_reads_by = True
    parser.Parser.__next__ = parser.Parser.next = next_within_deadline
    unreader.SocketUnreader.chunk = chunk
    gthread.DEFAULT_WORKER_DATA_TIMEOUT = min(gthread.DEFAULT_WORKER_DATA_TIMEOUT, FIRST_BYTE_SECONDS)
    _gather_heads_on_the_poller(gthread, body_idle_seconds)
    return True


class _Heads:
    """One worker's requests being gathered: by connection, by deadline, by address.

    The deadlines are a heap with one live entry per connection: a deadline
    moved later is pushed again only when its entry comes up (a body's
    every packet moves it), so a body sent a byte at a time does not grow
    the heap; entries of connections gone are skipped, and the heap is
    rebuilt when they outnumber the live ones."""

    def __init__(self):
        self.by_conn: dict = {}
        self.deadlines: list = []
        self.by_address: dict = defaultdict(deque)
        self.order = itertools.count()

    def add(self, conn, head: PartialRequest) -> None:
        self.by_conn[conn] = head
        self.due(conn, head.deadline)
        self.by_address[head.address].append(conn)

    def due(self, conn, deadline: float) -> None:
        head = self.by_conn[conn]
        head.deadline = deadline
        if deadline < head.queued:
            head.queued = deadline
            heapq.heappush(self.deadlines, (deadline, next(self.order), conn))
            if len(self.deadlines) > 2 * len(self.by_conn) + 1024:
                self.deadlines = [(h.queued, next(self.order), c) for c, h in self.by_conn.items()]
                heapq.heapify(self.deadlines)

    def remove(self, conn) -> PartialRequest | None:
        head = self.by_conn.pop(conn, None)
        if head is not None:
            waiting = self.by_address[head.address]
            waiting.remove(conn)  # at most GATHERING_PER_ADDRESS long
            if not waiting:
                del self.by_address[head.address]
        return head

    def oldest_beyond(self, address, most: int):
        """The oldest connection of ``address`` once it has ``most`` being gathered, else None."""
        waiting = self.by_address.get(address)
        return waiting[0] if waiting is not None and len(waiting) >= most else None

    def expired(self, now: float) -> list:
        out = []
        while self.deadlines and self.deadlines[0][0] <= now:
            queued, _, conn = heapq.heappop(self.deadlines)
            head = self.by_conn.get(conn)
            if head is None or queued != head.queued:  # gone, or queued again earlier
                continue
            if head.deadline > now:  # moved later meanwhile: queued again for then
                head.queued = head.deadline
                heapq.heappush(self.deadlines, (head.deadline, next(self.order), conn))
                continue
            out.append(conn)
        return out


def _gather_heads_on_the_poller(gthread, body_idle_seconds: float) -> None:
    worker = gthread.ThreadWorker
    enqueue, handle, murder_pending = worker.enqueue_req, worker.handle, worker.murder_pending

    def gatherable(self, conn) -> bool:
        if self.cfg.is_ssl or conn.is_http2:
            return False
        return conn.parser is not None or not gthread.negotiation.prior_knowledge_allowed(self.cfg, conn.client)

    def heads(self) -> _Heads:
        found = self.__dict__.get("attache_heads")
        if found is None:
            found = self.__dict__["attache_heads"] = _Heads()
        return found

    def enqueue_req(self, conn):
        """Main thread: a connection whose (next) request is to be read goes to a thread once it is here whole."""
        if getattr(conn, "attache_head", None) is not None or not gatherable(self, conn):
            return enqueue(self, conn)
        held = conn.parser.unreader.take_buffered() if conn.parser is not None else b""  # a drain's read-ahead
        now = time.monotonic()
        # a kept-alive connection comes here readable; a new one may not have sent a byte yet
        wait = HEAD_SECONDS if held or conn.parser is not None else self.cfg.keepalive + FIRST_BYTE_SECONDS
        address = conn.client[0] if isinstance(conn.client, tuple) else conn.client
        head = PartialRequest(bytearray(held), now + wait, address)
        if held and (verdict := head.whole()) != WAIT:
            return settle(self, conn, head, verdict)
        pending = heads(self)
        oldest = pending.oldest_beyond(address, GATHERING_PER_ADDRESS)
        if oldest is not None:
            drop(self, oldest)
        try:
            conn.sock.setblocking(False)
            self.poller.register(conn.sock, selectors.EVENT_READ, lambda sock: gather(self, conn))
        except (OSError, ValueError):
            self.nr_conns -= 1
            conn.close()
            return None
        pending.add(conn, head)
        if head.end is not None:  # a body on its way already
            pending.due(conn, now + body_idle_seconds)
            invite(conn, head)
        return None

    def gather(self, conn) -> None:
        pending = heads(self)
        head = pending.by_conn.get(conn)
        if head is None:
            return
        try:
            data = conn.sock.recv(head.limit - len(head.buffer))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client closed its side, or went away, before its request was whole
            forget(self, conn)
            if head.end is None:  # before its head: closed as a client gone
                self.nr_conns -= 1
                conn.close()
            else:  # mid-body: a thread answers it as a body cut short (its reads end at once)
                dispatch(self, conn, bytes(head.buffer))
            return
        now = time.monotonic()
        if not head.buffer and conn.parser is None:  # a new connection's first bytes: the rest within HEAD_SECONDS
            pending.due(conn, now + HEAD_SECONDS)
        head.buffer += data
        verdict = head.whole()
        if verdict != WAIT:
            forget(self, conn)
            settle(self, conn, head, verdict)
        elif head.end is not None:  # a small body: silent for body_idle_seconds at most, as in a thread
            pending.due(conn, now + body_idle_seconds)
            invite(conn, head)

    def invite(conn, head: PartialRequest) -> None:
        """A client that awaits ``100 Continue`` before a body gathered here is told to send it from here (gunicorn
        tells it in the thread, which would wait for the body there)."""
        if head.awaits:
            head.awaits = False
            try:
                conn.sock.send(expect_continue.CONTINUE)  # 25 bytes into an empty send buffer: never blocks
            except OSError:
                return
            conn.attache_continued = True

    def settle(self, conn, head: PartialRequest, verdict: str):
        if verdict == TOO_LARGE:
            try:
                conn.sock.send(HEAD_TOO_LARGE)  # a few hundred bytes into an empty send buffer: never blocks
            except OSError:
                pass
            self.nr_conns -= 1
            conn.close()
            return None
        return dispatch(self, conn, bytes(head.buffer))

    def forget(self, conn) -> None:
        heads(self).remove(conn)
        try:
            self.poller.unregister(conn.sock)
        except (OSError, KeyError, ValueError):
            pass

    def drop(self, conn) -> None:
        forget(self, conn)
        self.nr_conns -= 1
        conn.close()

    def dispatch(self, conn, head: bytes):
        conn.attache_head = head
        conn.data_ready = True  # no wait for a first byte in the thread: it is here
        return enqueue(self, conn)

    def handle_gathered(self, conn):
        """A thread: the gathered head given back to the connection's parser before gunicorn reads the request."""
        head = getattr(conn, "attache_head", None)
        if head is not None:
            conn.attache_head = None
            conn.sock.settimeout(body_idle_seconds)  # blocking, each read and write within a bound (above)
            if conn.parser is None:
                conn.init()  # an HTTP/1 parser (TLS and HTTP/2 prior knowledge are never gathered)
            if head:
                conn.parser.unreader.unread(head)
            if getattr(conn, "attache_continued", False):  # gunicorn must not send a second one
                conn.attache_continued = False
                conn.parser.unreader.attache_continued = True
        return handle(self, conn)

    def murder_pending_and_heads(self):
        murder_pending(self)
        pending = heads(self)
        for conn in pending.expired(time.monotonic()):
            head = pending.by_conn[conn]
            if head.end is None:  # a head that did not come: closed as a client gone
                drop(self, conn)
                continue
            forget(self, conn)  # a body that went silent: answered as one cut short, by a thread that need not wait
            try:
                conn.sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass
            dispatch(self, conn, bytes(head.buffer))

    worker.enqueue_req = enqueue_req
    worker.handle = handle_gathered
    worker.murder_pending = murder_pending_and_heads
