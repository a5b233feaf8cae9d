"""Webhook endpoints on the network: where a URL points (SSRF), signing, and one POST.

* :func:`check_target` resolves a URL's host and refuses it unless EVERY
  address is a public one (not loopback, private, link-local, CGNAT,
  multicast, reserved, unspecified; an IPv4-mapped IPv6 address is judged
  as its IPv4), unless private targets are allowed. It runs at
  registration and again before every delivery, and the delivery connects
  to the address it checked (so a DNS answer that changes in between, DNS
  rebinding, cannot point the POST elsewhere).
* :func:`sign` - the Standard Webhooks headers (``webhook-id``,
  ``webhook-timestamp``, ``webhook-signature: v1,<base64>``), made by the
  ``standardwebhooks`` package from a ``whsec_`` secret.
* :func:`post` - one POST, connected, sent and answered within a short
  timeout in all (a slow drip is cut like a hang); a redirect is an answer
  like any other (never followed). The :class:`Answer` says what Standard
  Webhooks asks a sender to do with it: done (2xx), gone (410: disable the
  endpoint), throttling (429, 502, 503, 504, or a ``Retry-After``).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import email.utils
import http.client
import ipaddress
import secrets
import socket
import ssl
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import urlsplit

from standardwebhooks.webhooks import Webhook

from app.errors import InvalidWebhook, WebhookTargetRefused

SECRET_PREFIX = "whsec_"
MAX_URL_LENGTH = 2000
USER_AGENT = "attache-webhooks/1"


def new_secret() -> str:
    """A fresh signing secret: ``whsec_`` and 32 random bytes in base64 (the Standard Webhooks form)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # with the query


def parse(url: str) -> Target:
    """An http(s) URL with a host and no credentials, or :class:`InvalidWebhook`."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH or not url.isprintable() or " " in url:
        raise InvalidWebhook(f"url must be an http(s) URL of at most {MAX_URL_LENGTH} characters")
    if not url.isascii():  # accepted, and then no request could be sent: 17 attempts over 29 h (an adversarial run)
        raise InvalidWebhook("url must be ASCII: percent-encode its path and query, and give its host in punycode")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidWebhook("url is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidWebhook("url must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidWebhook("url must not carry credentials; the signature authenticates attache")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path)


#: special-purpose blocks the IANA registries mark not globally reachable, which Python's ``ipaddress`` takes for
#: global in some of the versions attache runs on (3.11.7: all of 192.0.0.0/24 but its /29 and .170/31; an
#: adversarial run registered the old cloud metadata address http://192.0.0.192/ as a webhook). The whole of
#: 192.0.0.0/24 is refused, its two anycast service addresses (.9, .10) with it.
NOT_GLOBAL = tuple(ipaddress.ip_network(block) for block in (
    "192.0.0.0/24",  # IETF protocol assignments
    "192.88.99.0/24",  # 6to4 relay anycast, deprecated (RFC 7526): a relay router, never a receiver
    "3fff::/20",  # documentation (RFC 9637)
    "64:ff9b:1::/48",  # local-use IPv4/IPv6 translation (RFC 8215)
    "5f00::/16",  # segment routing (SRv6) SIDs
))


#: NAT64's well-known prefix (RFC 6052): on an IPv6-only network, DNS64 answers an IPv4-only host's name with its
#: address under it, which Python counts as reserved (``::/8``), so every IPv4-only endpoint was refused there (an
#: adversarial run); the address inside is judged instead
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def is_public(address: str) -> bool:
    """A globally routable unicast address; an IPv6 address that carries an IPv4 one (mapped, 6to4,
    Teredo, NAT64's well-known prefix) only if that one is too (a 6to4 relay would otherwise reach
    ``2002:7f00:1::`` = 127.0.0.1); never a site-local IPv6 one (``fec0::/10``: deprecated, still routed inside the
    sites that use it, and not private to Python's ``ipaddress``), nor one of :data:`NOT_GLOBAL`."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if any(ip in block for block in NOT_GLOBAL if block.version == ip.version):
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = (ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
                    or (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in NAT64 else None))
        if embedded is not None:
            return is_public(str(embedded))
        if ip.is_site_local:
            return False
    return ip.is_global and not (ip.is_multicast or ip.is_private or ip.is_loopback or ip.is_link_local
                                 or ip.is_reserved or ip.is_unspecified)


#: how long a host's name may take to resolve, at most (an attempt's timeout counts it too)
RESOLVE_SECONDS = 5.0
#: the threads names are resolved in: ``getaddrinfo`` cannot be cut short, so a resolver that does not answer costs
#: one of them for its own timeouts (glibc's: 5 s a try, 2 tries a name server), never an attempt's caller; while all
#: are busy, a name waits its turn within its deadline. A name is looked up on the threads of its standing: ``answered``
#: (its last lookup ended within :data:`RESOLVE_SECONDS`), ``silent`` (it did not), ``new`` (not looked up yet in this
#: process). 32 silent names at once held every thread of one pool, and every endpoint's name waited out its deadline
#: (an adversarial run); now they hold the silent threads, and the new ones until their first lookup ends.
_RESOLVERS = {"answered": ThreadPoolExecutor(16, thread_name_prefix="webhook-resolve-answered"),
              "new": ThreadPoolExecutor(16, thread_name_prefix="webhook-resolve-new"),
              "silent": ThreadPoolExecutor(8, thread_name_prefix="webhook-resolve-silent")}
#: each name's standing, by (host, port), the names least recently looked up forgotten past this many
_STANDINGS_KEPT = 10_000
_STANDINGS: collections.OrderedDict[tuple[str, int], str] = collections.OrderedDict()
_STANDINGS_LOCK = threading.Lock()
#: the lookups under way, by (host, port): an attempt on a name being looked up waits for that lookup, never queues
#: another. Each attempt on a name whose server did not answer queued one more lookup behind those it had given up
#: on; they kept every resolver thread, and healthy endpoints' names, IP literals among them, waited out their
#: deadline (an adversarial run: 7-12 of 17-23 healthy attempts failed). A silent name now holds one thread at most.
_LOOKUPS: dict[tuple[str, int], Future] = {}
_LOOKUPS_LOCK = threading.Lock()


def _lookup(host: str, port: int) -> Future:
    """The lookup of ``host`` under way, or a new one; an IP literal is its own answer (no resolver needed)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        done: Future = Future()
        done.set_result(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST))
        return done
    key = (host, port)
    with _LOOKUPS_LOCK:
        lookup = _LOOKUPS.get(key)
        made = lookup is None
        if made:
            with _STANDINGS_LOCK:
                standing = _STANDINGS.get(key, "new")
            lookup = _LOOKUPS[key] = _RESOLVERS[standing].submit(_timed_lookup, key)
    if made:  # outside the lock: a lookup done already runs its callback here, at once, and the callback takes the
        # lock (registered under it, a quick lookup deadlocked every later one of the process: a re-attack)
        lookup.add_done_callback(lambda _: _forget_lookup(key, lookup))
    return lookup


def _timed_lookup(key: tuple[str, int]):
    """``getaddrinfo`` of the name, its standing set by how long it took (an error is an answer too, if quick)."""
    began = time.monotonic()
    try:
        return socket.getaddrinfo(*key, type=socket.SOCK_STREAM)
    finally:
        standing = "answered" if time.monotonic() - began <= RESOLVE_SECONDS else "silent"
        with _STANDINGS_LOCK:
            _STANDINGS[key] = standing
            _STANDINGS.move_to_end(key)
            if len(_STANDINGS) > _STANDINGS_KEPT:
                _STANDINGS.popitem(last=False)


def _forget_lookup(key: tuple[str, int], lookup: Future) -> None:
    with _LOOKUPS_LOCK:
        if _LOOKUPS.get(key) is lookup:
            del _LOOKUPS[key]


def check_target(url: str, *, allow_private: bool, within: float = RESOLVE_SECONDS) -> tuple[Target, list[str]]:
    """The parsed URL and the addresses its host resolves to within ``within`` seconds, every one of them allowed.
    A name that took longer held a delivery's thread for the resolver's own timeouts, outside the attempt's (read
    from the code by an adversarial review)."""
    target = parse(url)
    try:
        infos = _lookup(target.host, target.port).result(timeout=within)
    except FutureTimeout:
        raise WebhookTargetRefused(f"{target.host} did not resolve within {within:g} s") from None
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookTargetRefused(f"{target.host} does not resolve: {exc}") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not addresses:
        raise WebhookTargetRefused(f"{target.host} does not resolve")
    if not allow_private:
        internal = [address for address in addresses if not is_public(address)]
        if internal:
            raise WebhookTargetRefused(
                f"{target.host} resolves to {', '.join(internal)}: loopback, private, link-local and other "
                "internal addresses are refused (ATTACHE_WEBHOOK_ALLOW_PRIVATE=1 allows them)")
    return target, addresses


def sign(secret: str, message_id: str, at: datetime, body: str) -> dict[str, str]:
    """The Standard Webhooks headers of one delivery attempt."""
    at = at.astimezone(timezone.utc)
    return {"webhook-id": message_id, "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": Webhook(secret).sign(message_id, at, body)}


#: the longest answer body read (to end the connection cleanly); a chunked one is never read: Python 3.11's
#: http.client reads a chunk declared ``-1`` to the connection's end, whatever amount it is asked for, and a
#: receiver sending one held 3-4.7 GB of the scheduler, and its thread past the deadline (an adversarial run)
ANSWER_READ_BYTES = 64 * 1024


class _Lines:
    """The answer's socket file, noting a line that the connection's end cut short (or an empty read: the end)."""

    def __init__(self, fp):
        self._fp = fp
        self.cut = False

    def readline(self, limit: int = -1) -> bytes:
        line = self._fp.readline(limit)
        if not line.endswith(b"\n") and (limit < 0 or len(line) < limit):
            self.cut = True
        return line

    def __getattr__(self, name: str):
        return getattr(self._fp, name)


class _Answer(http.client.HTTPResponse):
    """An answer whose interim ``1xx`` answers (``102``, ``103`` Early Hints) are skipped, as ``100`` is by
    http.client: a ``103`` before the ``200`` was taken for the answer, a failure, and the delivery sent again
    up to 17 times (an adversarial run).

    An answer whose head the connection's end cut short is no answer: http.client takes the end for the blank line
    that ends the headers, and a receiver that closed (or crashed) after ``HTTP/1.1 200 OK\r\n`` was counted as
    having taken the delivery, never sent again (an adversarial run)."""

    def __init__(self, sock, *args, **kwargs):
        super().__init__(sock, *args, **kwargs)
        self.fp = self._lines = _Lines(self.fp)

    def begin(self):
        super().begin()
        if self._lines.cut:
            raise http.client.IncompleteRead(b"", None)

    def _read_status(self):
        while True:
            version, status, reason = super()._read_status()
            if not (100 < status < 200 and status != 101):
                return version, status, reason
            http.client.parse_headers(self.fp)  # the interim answer's headers (100 at most, as any answer's)


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the address that was checked, while ``Host`` names the URL's host.

    ``expired``: set by :func:`_cut` when the attempt's deadline passes. The
    cut shuts down the socket it finds; one that passed while there was none
    yet (the TCP connect under way) is found here, once the socket is there.
    """

    response_class = _Answer

    def __init__(self, host: str, port: int, addresses: list[str], timeout: float, expired: threading.Event):
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses
        self._expired = expired
        self._until = time.monotonic() + timeout

    def connect(self):
        """The checked addresses in turn, within the attempt's deadline, each given an equal share of what is left
        of it: only the first was tried, and a dual-stack endpoint whose first address does not answer (a broken
        IPv6 route) failed every attempt (an adversarial run); then the first, silent, took all of it (a
        re-attack)."""
        for number, address in enumerate(self._addresses):
            left = self._until - time.monotonic()
            if left <= 0:
                raise TimeoutError("cut")
            try:
                self.sock = socket.create_connection((address, self.port), left / (len(self._addresses) - number))
                # the share was the connect's: kept as the socket's timeout, it bounded the handshake, the request
                # and the answer too, and an endpoint of four addresses answering in 1.25-5 s failed every attempt
                # (a re-attack); the attempt's deadline bounds them (post's timer)
                self.sock.settimeout(self.timeout)
                break
            except OSError:
                if number == len(self._addresses) - 1:
                    raise
        self._in_time()

    def _in_time(self) -> None:
        if self._expired.is_set():  # the cut came before this socket: nothing shut it down
            raise TimeoutError("cut")


class _PinnedHTTPS(_PinnedHTTP):
    """TLS, its handshake made on a socket :func:`_cut` finds: the socket was set once the handshake was done, so
    a deadline that passed during the TCP connect or the handshake cut nothing, and an endpoint that then dripped
    its answer held the delivery's thread for ever (an adversarial run: every thread, within minutes)."""

    def __init__(self, host: str, port: int, addresses: list[str], timeout: float, expired: threading.Event):
        super().__init__(host, port, addresses, timeout, expired)
        self._context = ssl.create_default_context()

    def connect(self):
        super().connect()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host, do_handshake_on_connect=False)
        self._in_time()
        self.sock.do_handshake()
        self._in_time()


#: answers that mean "send less" (Standard Webhooks: throttle on 429, 502 and 504; 503 is the server's own "not now")
THROTTLING = frozenset({429, 502, 503, 504})
#: the answer by which an endpoint says it wants no more deliveries (Standard Webhooks: disable the endpoint)
GONE = 410


@dataclass(frozen=True)
class Answer:
    status: int | None
    error: str | None
    #: the seconds the endpoint's ``Retry-After`` asked for (delta-seconds or an HTTP date), when it sent one
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def gone(self) -> bool:
        return self.status == GONE

    @property
    def throttling(self) -> bool:
        return self.status in THROTTLING or self.retry_after is not None


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` (RFC 9110: delta-seconds or an HTTP date) as seconds from now; ``None`` when absent or not
    one of the two forms."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # str.isdigit() is also True for "²": float() would raise
        return float(value)
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if at.tzinfo is None:  # an HTTP date is GMT; parsedate_to_datetime leaves "-0000" naive
        at = at.replace(tzinfo=timezone.utc)
    return max(0.0, (at - (now or datetime.now(timezone.utc))).total_seconds())


def _cut(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    """Ends an attempt that outlived its deadline: a blocked read returns at once. ``expired`` is set before the
    socket is looked at, and the connection looks at ``expired`` after it sets its socket, so one of the two sees
    the other (:class:`_PinnedHTTP`)."""
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def post(url: str, body: str, headers: dict[str, str], *, timeout: float, allow_private: bool,
         first: int = 0) -> Answer:
    """POST ``body`` to ``url`` (checked again now): connected, sent and answered within ``timeout`` in all.

    ``first``: the attempt's number; the host's addresses, sorted, are tried in turn from the one after as many as
    it says (in the resolver's order, a resolver that rotates its answers, round-robin DNS, undid the turn: every
    attempt began at the same address, a re-attack).
    An address that takes the connection and then resets it, or never answers, ends the attempt (the request may
    have reached the endpoint: it is not sent twice in one attempt), and each attempt began at the same address: an
    endpoint of two addresses, one broken so, failed every delivery (an adversarial run).

    Each socket operation has the timeout, and a timer cuts the connection
    when the whole attempt has taken it: an endpoint that drips its answer a
    byte at a time (every read quick, the answer never done) is cut like
    one that hangs.
    """
    began = time.monotonic()
    try:
        target, addresses = check_target(url, allow_private=allow_private, within=timeout)
    except (WebhookTargetRefused, InvalidWebhook) as exc:
        return Answer(None, str(exc))
    turn = first % len(addresses)
    addresses = sorted(addresses)  # an order of their own: a resolver that rotates its answers undid the turn
    addresses = addresses[turn:] + addresses[:turn]
    left = max(0.001, timeout - (time.monotonic() - began))  # the name's time counts
    kind = _PinnedHTTPS if target.scheme == "https" else _PinnedHTTP
    expired = threading.Event()
    connection = kind(target.host, target.port, addresses, left, expired)
    deadline = threading.Timer(left, _cut, (connection, expired))
    deadline.daemon = True
    deadline.start()
    status = None
    try:
        connection.request("POST", target.path, body=body.encode(), headers={
            **headers, "content-type": "application/json", "user-agent": USER_AGENT})
        response = connection.getresponse()
        if expired.is_set():
            raise TimeoutError("cut")
        status = response.status
        if not response.chunked and response.length is not None and response.length <= ANSWER_READ_BYTES:
            response.read()  # a short answer, read so the connection ends cleanly; any other is dropped unread
    except (OSError, http.client.HTTPException) as exc:
        if status is None:  # no complete status line and headers: no answer
            if expired.is_set():
                return Answer(None, f"no answer within {timeout:g} s (timed out)")
            return Answer(None, f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__)
    finally:
        deadline.cancel()
        connection.close()
    if 300 <= status < 400:
        return Answer(status, f"redirect to {response.getheader('location', '?')[:200]} not followed")
    if 200 <= status < 300:
        return Answer(status, None)
    return Answer(status, f"HTTP {status}", retry_after_seconds(response.getheader("retry-after")))
