"""A request's head gathered on the worker's poller, without a thread, and read within a deadline.

gunicorn 27's gthread worker gives a new connection a thread, waits up to
5 s there for its first byte (``DEFAULT_WORKER_DATA_TIMEOUT``), then reads
the request's head from a blocking socket with no deadline. An adversarial
run: 100 connections that each sent one byte (``G``) and nothing more held
every thread of both web processes for as long as they stayed open, no
token needed, and 100 connections that sent nothing, reopened as the server
closed them, held threads 5 s each. Bounding the head by a deadline in the
thread (the eleventh session) left one client able to take every thread by
opening connections faster than the deadline freed them: some 64 every 5 s
for two processes of 32 threads (the twelfth session's test sent 50).

:func:`install` gathers a head on the poller instead, as an event-loop
server does: a new connection, and a kept-alive one whose next request
begins, gets a thread only once its head has arrived whole (up to the blank
line that ends it) or :data:`GATHER_BYTES` of it have. Until then its bytes
are read as they come, without blocking, by the worker's main thread. It
has gunicorn's ``--keep-alive`` plus :data:`FIRST_BYTE_SECONDS` for its
first byte (5 s in the Procfile: a connection opened ahead, as browsers and
pools do, and used 3 s later is answered; a review), and :data:`HEAD_SECONDS`
from that byte for the rest, or it is closed as a client gone. One address
has at most :data:`GATHERING_PER_ADDRESS` heads being gathered in a process;
a newer connection from it closes its oldest, so one address cannot fill
gunicorn's ``--worker-connections`` (1000) and keep others from being
accepted. In the thread the parser still has :data:`HEAD_SECONDS` for what
it reads of a head itself (one longer than :data:`GATHER_BYTES`).

What is left: many addresses at once can still fill ``--worker-connections``
with heads never finished, each for seconds; before clients you do not
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
from collections import defaultdict, deque

#: seconds a request's head has, from its connection's turn in a thread: a client sends it in one or two packets
HEAD_SECONDS = 5.0
#: seconds a new connection has for its first byte beyond gunicorn's ``--keep-alive`` (gunicorn's own thread wait
#: was 5, ours 0.5 before heads were gathered on the poller); a thread's drain of an unread body has as long
FIRST_BYTE_SECONDS = 0.5
#: bytes of a head gathered on the poller at most: a longer one (gunicorn allows some 800 KB) is read on in a thread
GATHER_BYTES = 64 * 1024
#: heads gathered at once from one address, per process; one more closes the oldest
GATHERING_PER_ADDRESS = 128


def install() -> bool:
    """Patch gunicorn's HTTP/1 parser and gthread worker, if this process is one of its gthread workers."""
    gthread = sys.modules.get("gunicorn.workers.gthread")
    if gthread is None or not hasattr(gthread, "DEFAULT_WORKER_DATA_TIMEOUT"):
        return False
    from gunicorn.http import errors, parser, unreader

    if getattr(parser.Parser.__next__, "attache_head_deadline", False):
        return False
    next_request, receive = parser.Parser.__next__, unreader.SocketUnreader.chunk

    def next_within_deadline(self):
        reader = self.unreader
        if not isinstance(reader, unreader.SocketUnreader):
            return next_request(self)
        reader.attache_head_deadline = time.monotonic() + HEAD_SECONDS
        try:
            return next_request(self)
        finally:
            reader.attache_head_deadline = None
            try:
                reader.sock.settimeout(None)  # blocking again, as gthread reads and writes the rest
            except OSError:
                pass

    def chunk(self, size_hint=None):
        deadline = getattr(self, "attache_head_deadline", None)
        if deadline is None:
            return receive(self, size_hint)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise errors.NoMoreData(b"")  # gthread closes it quietly, as a client gone
        self.sock.settimeout(remaining)
        try:
            return receive(self, size_hint)
        except socket.timeout:
            raise errors.NoMoreData(b"") from None

    next_within_deadline.attache_head_deadline = True
    parser.Parser.__next__ = parser.Parser.next = next_within_deadline
    unreader.SocketUnreader.chunk = chunk
    gthread.DEFAULT_WORKER_DATA_TIMEOUT = min(gthread.DEFAULT_WORKER_DATA_TIMEOUT, FIRST_BYTE_SECONDS)
    _gather_heads_on_the_poller(gthread)
    return True


def _head_ends(data, start: int = 0) -> bool:
    """Whether ``data`` holds a blank line after ``start``: a head's end (a bare LF's, for the parser to judge)."""
    return data.find(b"\r\n\r\n", start) >= 0 or data.find(b"\n\n", start) >= 0


class _Head:
    """A connection's head being gathered: its bytes so far, and when it is given up."""

    __slots__ = ("buffer", "deadline", "address")

    def __init__(self, buffer: bytearray, deadline: float, address):
        self.buffer = buffer
        self.deadline = deadline
        self.address = address


class _Heads:
    """One worker's heads being gathered: by connection, by deadline (a heap, stale entries skipped), by address."""

    def __init__(self):
        self.by_conn: dict = {}
        self.deadlines: list = []
        self.by_address: dict = defaultdict(deque)
        self.order = itertools.count()

    def add(self, conn, head: _Head) -> None:
        self.by_conn[conn] = head
        self.due(conn, head.deadline)
        self.by_address[head.address].append(conn)

    def due(self, conn, deadline: float) -> None:
        self.by_conn[conn].deadline = deadline
        heapq.heappush(self.deadlines, (deadline, next(self.order), conn))

    def remove(self, conn) -> _Head | None:
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
            deadline, _, conn = heapq.heappop(self.deadlines)
            head = self.by_conn.get(conn)
            if head is not None and head.deadline == deadline:
                out.append(conn)
        return out


def _gather_heads_on_the_poller(gthread) -> None:
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
        """Main thread: a connection whose (next) request is to be read goes to a thread once its head is here."""
        if getattr(conn, "attache_head", None) is not None or not gatherable(self, conn):
            return enqueue(self, conn)
        held = conn.parser.unreader.take_buffered() if conn.parser is not None else b""  # a drain's read-ahead
        if _head_ends(held):
            return dispatch(self, conn, held)
        address = conn.client[0] if isinstance(conn.client, tuple) else conn.client
        pending = heads(self)
        oldest = pending.oldest_beyond(address, GATHERING_PER_ADDRESS)
        if oldest is not None:
            drop(self, oldest)
        now = time.monotonic()
        # a kept-alive connection comes here readable; a new one may not have sent a byte yet
        wait = HEAD_SECONDS if held or conn.parser is not None else self.cfg.keepalive + FIRST_BYTE_SECONDS
        try:
            conn.sock.setblocking(False)
            self.poller.register(conn.sock, selectors.EVENT_READ, lambda sock: gather(self, conn))
        except (OSError, ValueError):
            self.nr_conns -= 1
            conn.close()
            return None
        pending.add(conn, _Head(bytearray(held), now + wait, address))
        return None

    def gather(self, conn) -> None:
        head = heads(self).by_conn.get(conn)
        if head is None:
            return
        try:
            data = conn.sock.recv(GATHER_BYTES - len(head.buffer))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away (or reset) before its head was whole
            drop(self, conn)
            return
        if not head.buffer and conn.parser is None:  # a new connection's first bytes: the rest within HEAD_SECONDS
            heads(self).due(conn, time.monotonic() + HEAD_SECONDS)
        start = max(0, len(head.buffer) - 3)
        head.buffer += data
        if _head_ends(head.buffer, start) or len(head.buffer) >= GATHER_BYTES:
            forget(self, conn)
            dispatch(self, conn, bytes(head.buffer))

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
            conn.sock.setblocking(True)
            if conn.parser is None:
                conn.init()  # an HTTP/1 parser (TLS and HTTP/2 prior knowledge are never gathered)
            if head:
                conn.parser.unreader.unread(head)
        return handle(self, conn)

    def murder_pending_and_heads(self):
        murder_pending(self)
        for conn in heads(self).expired(time.monotonic()):
            drop(self, conn)

    worker.enqueue_req = enqueue_req
    worker.handle = handle_gathered
    worker.murder_pending = murder_pending_and_heads
