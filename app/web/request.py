"""The Flask request class: where a request's body goes, and what is left of it afterwards.

* Only the upload views spool: the upload's ``file`` part
  (:mod:`app.web.multipart`) and raw bodies stream into
  :class:`~app.web.spool.HashingSpool` files (``attache-upload-*`` in the
  temporary directory). A file part met by werkzeug's form parsing
  (``request.form`` of any route) is read and dropped (:class:`DroppedPart`):
  nothing reaches the disk, nothing is kept.
* The body limit is per route: the upload limit plus 1 MiB of multipart
  framing on the upload route, the upload limit on the raw-body routes of
  resumable uploads, :data:`FORM_MAX_BYTES` everywhere else
  (sign-in and console forms, the JSON of ``/v1/ops``). More is ``413``;
  a body of exactly the limit is taken.
* Nothing outlives the request: every spool is removed when the request
  closes (Flask closes it when the request ends, whatever happened). A
  process killed mid-upload cannot do that; its spool, untouched for ten
  ``ATTACHE_BODY_IDLE_SECONDS`` periods, is removed by later uploads
  (:class:`AbandonedSpools`).
* A client silent for ``ATTACHE_BODY_IDLE_SECONDS`` mid-body is cut off.
* The body is read through a :class:`~app.web.body.BodyStream`, so a body
  cut short is noticed (:meth:`UploadRequest.body_incomplete`).
"""

from __future__ import annotations

import io
import tempfile
import threading
import time
from typing import Callable

from flask import Request, current_app
from werkzeug.exceptions import LengthRequired, RequestEntityTooLarge
from werkzeug.utils import cached_property
from werkzeug.wsgi import get_input_stream

from app.adapters.storage import FilesystemStorage
from app.core import pipeline, room
from app.web.body import READ_BLOCK_BYTES, BodyStream
from app.web.framing import BODY_BYTES_GATHERED
from app.web.request_head import read_by
from app.web.spool import HashingSpool, remove_abandoned_spools, same_disk

#: the one view that receives files
UPLOAD_ENDPOINT = "attachments.upload"
#: the views that take an upload's bytes as a raw body (tus creation and PATCH, app.web.tus)
RAW_UPLOAD_ENDPOINTS = ("tus.create", "tus.patch")
#: the body limit of every route but the upload and the sign-in forms
FORM_MAX_BYTES = 1024 * 1024
#: the forms anyone may post, signed in or not (their bodies are read before anyone is known)
SIGN_IN_ENDPOINTS = ("console.login", "page.sign_in", "page.sign_out")
#: their body limit: a token and a CSRF field. What gunicorn's poller always gathers with a head
#: (app.web.request_head), so such a body is here whole, or refused, before a thread reads it: with 1 MiB allowed,
#: 80 posts announcing a body never sent held every thread for ATTACHE_BODY_IDLE_SECONDS (an adversarial review)
SIGN_IN_FORM_MAX_BYTES = BODY_BYTES_GATHERED
#: seconds a sign-in form's body may keep a thread waiting in all, where gunicorn's poller did not gather it
#: (reviews found framings it read otherwise than the parser, each holding a thread 60 s, no token needed); each
#: read waits as long at most, so a thread waits twice that at most
SIGN_IN_BODY_SECONDS = 1.0
#: multipart framing around the file part, on top of the upload limit
MULTIPART_HEADROOM_BYTES = 1024 * 1024


class AbandonedSpools:
    """Spools left by a process killed mid-upload, removed by the next uploads (at most once per idle period)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next = 0.0

    def sweep(self, idle_seconds: float) -> int:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                return 0
            self._next = now + idle_seconds
        return remove_abandoned_spools(ABANDONED_AFTER_IDLE_PERIODS * idle_seconds)


#: a spool untouched for this many body-idle periods belongs to no request
ABANDONED_AFTER_IDLE_PERIODS = 10
ABANDONED_SPOOLS = AbandonedSpools()


def _room_held(services, *, read: bool) -> Callable[[], int] | None:
    """What a spool leaves free beyond the floor: on the file storage's filesystem, the room the unfinished jobs
    hold there, as this process read it last (:func:`app.core.room.held_lately`, asked on each write); elsewhere
    (S3, TMPDIR on another disk) nothing. Read first (``read``) when this process has not read it in
    :data:`~app.core.room.SPOOL_READ_AFTER_SECONDS`: one query, before the body. Only a request's first spool
    reads: a tus PATCH's second, its parts' join, is made in the transaction that just checked the room (a second
    connection there could wait on a pool its own threads hold)."""
    storage = services.storage
    if not isinstance(storage, FilesystemStorage) or not same_disk(tempfile.gettempdir(), storage.root):
        return None
    database = services.engine.url
    if read and room.held_lately(database, within=room.SPOOL_READ_AFTER_SECONDS) is None:
        room.read_held(services.engine, pipeline.get(services.settings.pipeline_version))
    asked = [0.0, 0]  # when, and what

    def held() -> int:
        now = time.monotonic()
        if now - asked[0] >= HELD_ASKED_EVERY_SECONDS:
            asked[:] = now, room.held_lately(database) or 0
        return asked[1]

    return held


#: a spool's writes ask the room held (:func:`app.core.room.held_lately`) at most this often: the ask hashes the
#: database's URL (4.5 us), 80 times for a 5 MB body's 64 KiB writes; a trickled body's writes, seconds apart, each ask
HELD_ASKED_EVERY_SECONDS = 0.05


class DroppedPart(io.BytesIO):
    """A file part sent to a route that takes no files: read off the wire and dropped."""

    def write(self, data) -> int:
        return len(data)


class UploadRequest(Request):
    @property
    def max_content_length(self) -> int | None:
        if self._max_content_length is not None:
            return self._max_content_length
        if self.endpoint == UPLOAD_ENDPOINT:
            return current_app.extensions["attache"].settings.max_upload_bytes + MULTIPART_HEADROOM_BYTES
        if self.endpoint in RAW_UPLOAD_ENDPOINTS:
            return current_app.extensions["attache"].settings.max_upload_bytes
        if self.endpoint in SIGN_IN_ENDPOINTS:
            return SIGN_IN_FORM_MAX_BYTES
        return FORM_MAX_BYTES

    @max_content_length.setter
    def max_content_length(self, value: int | None) -> None:
        self._max_content_length = value

    @cached_property
    def stream(self) -> BodyStream:
        """The body, limited to :attr:`max_content_length` by the :class:`BodyStream` (a body of exactly the
        limit is whole); read in blocks but on the raw-body routes of resumable uploads, which keep the bytes
        of a body cut short (see :mod:`app.web.body`)."""
        sign_in = self.endpoint in SIGN_IN_ENDPOINTS
        if sign_in and self.content_length is None and self.has_body:
            # chunked: 64 KiB of 1-byte chunks carry less than the form's limit and are handed to a thread before
            # their end, which then waited its second for the rest; 120 such posts a second from one address, no
            # token needed, held every thread (an adversarial run). Browsers declare a form's length
            raise LengthRequired("a sign-in form must declare its Content-Length")
        self.bound_silence(SIGN_IN_BODY_SECONDS if sign_in else None)
        deadline = time.monotonic() + SIGN_IN_BODY_SECONDS if sign_in else None
        if deadline is not None and self.environ.get("gunicorn.socket") is not None:
            read_by(self.environ["gunicorn.socket"], deadline)  # within gunicorn's reads too
        limit = self.max_content_length
        if limit is not None and self.content_length is not None and self.content_length > limit:
            raise RequestEntityTooLarge()  # before reading a byte
        block = 0 if self.endpoint in RAW_UPLOAD_ENDPOINTS else READ_BLOCK_BYTES
        return BodyStream(get_input_stream(self.environ), self.content_length, max_length=limit, block_bytes=block,
                          deadline=deadline)

    def bound_silence(self, seconds: float | None = None) -> None:
        """A client that stops sending mid-body, or stops reading an answer, must not hold a thread for ever.

        gunicorn's gthread worker reads a body from, and writes an answer to,
        a blocking socket with no deadline, and its ``--timeout`` does not see
        a thread stuck there (100 downloads never read held every thread: an
        adversarial run). With a socket timeout a silent client's read fails
        after ``ATTACHE_BODY_IDLE_SECONDS`` and the body ends incomplete
        (``400 incomplete_body``), and a write that makes no progress for as
        long ends the connection. The body's stream sets it; a download, as it
        answers. ``seconds`` instead of the setting: the sign-in forms' shorter bound.
        """
        sock = self.environ.get("gunicorn.socket")
        if sock is not None:
            sock.settimeout(seconds or current_app.extensions["attache"].settings.body_idle_seconds)

    @property
    def has_body(self) -> bool:
        """A body was sent: a ``Content-Length`` above 0, or chunked (``Transfer-Encoding`` is case-insensitive, as
        gunicorn reads it: a tus creation sent ``Chunked`` had its body ignored, an adversarial run)."""
        return bool(self.content_length) or "chunked" in self.headers.get("Transfer-Encoding", "").lower()

    def body_unread(self) -> bool:
        """A body was sent (:attr:`has_body`) and not read to its end: an answer given before it (a refusal)
        leaves the rest on the connection."""
        if not self.has_body:
            return False
        stream = self.__dict__.get("stream")
        if not isinstance(stream, BodyStream):
            return True
        return not (stream.ended or (stream.declared_length is not None and stream.received >= stream.declared_length))

    def body_incomplete(self) -> bool:
        """The body was read to its end, and that end came before the declared length."""
        stream = self.__dict__.get("stream")
        return isinstance(stream, BodyStream) and stream.incomplete

    def spool(self, max_bytes: int | None = None) -> HashingSpool:
        """A new spool file that belongs to this request: it is removed when the request closes.

        It holds at most ``max_bytes`` (by default the upload limit), never takes its filesystem below
        ``ATTACHE_SPOOL_MIN_FREE_BYTES`` free (a body whose declared length would is refused before it is
        read), nor, on the file storage's filesystem, into the room the unfinished jobs hold
        (:func:`_room_held`), and computes an MD5 only when the request sends a ``Content-MD5`` to check.
        """
        services = current_app.extensions["attache"]
        settings = services.settings
        ABANDONED_SPOOLS.sweep(settings.body_idle_seconds)
        first = "attache_spools" not in self.__dict__
        spool = HashingSpool(settings.max_upload_bytes if max_bytes is None else max_bytes,
                             md5="Content-MD5" in self.headers, min_free_bytes=settings.spool_min_free_bytes,
                             expected_bytes=self.content_length or 0,
                             held=_room_held(services, read=first) if settings.spool_min_free_bytes else None)
        self.__dict__.setdefault("attache_spools", []).append(spool)
        return spool

    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        return DroppedPart()  # the upload reads its file part itself (app.web.multipart)

    def discard_spools(self) -> None:
        for spool in self.__dict__.get("attache_spools", []):
            spool.discard()

    def close(self) -> None:
        try:
            self.discard_spools()
        finally:
            super().close()
