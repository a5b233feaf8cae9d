"""``/v1/uploads``: resumable uploads over tus 1.0 (https://tus.io/protocols/resumable-upload).

The core protocol plus the creation, creation-with-upload, termination,
checksum (``sha1``, ``sha256``) and expiration extensions. This module
speaks the protocol's headers and status codes; what an upload is, where
its partial bytes live and how it ends is :mod:`app.core.resumable`.

* ``OPTIONS /v1/uploads`` (public, like any tus server's discovery): the
  version, extensions, ``Tus-Max-Size`` (the upload limit) and checksum
  algorithms.
* ``POST /v1/uploads`` with ``Upload-Length`` (checked against the upload
  limit here, before any byte is sent) and ``Upload-Metadata`` (its
  ``filename``, or Uppy's ``name``, is the display name): ``201`` and
  ``Location``. With a body (``Content-Type: application/offset+octet-stream``)
  its bytes are the first PATCH; a body cut short is ``400 incomplete_body``
  with the made upload's ``Location`` and ``Upload-Offset``, to resume it.
* ``HEAD /v1/uploads/{id}``: ``Upload-Offset`` says where to resume.
* ``PATCH /v1/uploads/{id}`` with ``Upload-Offset`` and optionally
  ``Upload-Checksum``: ``204`` and the new ``Upload-Offset``; ``409`` when
  the offset is not the upload's; ``423`` while another request writes the
  upload (tus clients retry it); ``460`` on a checksum mismatch (nothing
  of that body is kept). A body cut short without a checksum keeps what
  arrived (``400 incomplete_body`` with the ``Upload-Offset`` to resume at),
  so the client resumes after it; a body whose framing broke after the
  upload's last byte keeps nothing, as it would have ended the upload.
* ``DELETE /v1/uploads/{id}``: termination.
* ``X-HTTP-Method-Override: PATCH`` (or ``DELETE``) on a ``POST`` is taken as
  that method (:class:`MethodOverride`), for clients behind proxies that
  only pass GET and POST.

When the last byte has arrived the upload becomes an attachment through the
same durable handoff as ``POST /v1/attachments``; the final PATCH and every
later HEAD carry ``Attachment-Id``. Every request but ``OPTIONS`` needs the
API's bearer token or the browser session (PATCH, POST and DELETE from a
session with its CSRF token), and ``Tus-Resumable: 1.0.0`` (else ``412``).
An upload is its owner's only: anyone else gets ``404``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re

from flask import Blueprint, Response, current_app, request, url_for
from werkzeug.http import http_date

from app.core import filenames, resumable
from app.errors import (
    AttacheError,
    ChecksumMismatch,
    DatabaseUnavailable,
    IncompleteBody,
    OffsetMismatch,
    PermanentError,
    StorageUnavailable,
    UnsupportedMediaType,
    UploadLocked,
    UploadNotFound,
    UploadRejected,
    UploadTooLarge,
)
from app.observability.logs import bound
from app.observability.tracing import accept_traceparent, accept_tracestate, trace_id
from app.web import bodies_in_flight
from app.web.access import identity, protect
from app.web.body import refuse_content_coding
from app.web.idempotency import idempotency_key
from app.web.responses import error, refusal
from app.web.spool import sha256_of, spool_stream

log = logging.getLogger("attache.tus")

bp = Blueprint("tus", __name__, url_prefix="/v1/uploads")
#: OPTIONS only, without a token: what a client may ask before it has one
discovery = Blueprint("tus_discovery", __name__, url_prefix="/v1/uploads")
protect(bp)

TUS_VERSION = "1.0.0"
EXTENSIONS = ("creation", "creation-with-upload", "termination", "checksum", "expiration")
CHECKSUM_ALGORITHMS = ("sha1", "sha256")
PART_TYPE = "application/offset+octet-stream"
#: the longest ``Upload-Metadata`` kept (it is echoed on every HEAD)
MAX_METADATA_CHARS = 4096
#: metadata keys that name the file: tus-js-client's convention, then Uppy's
FILENAME_KEYS = ("filename", "name")
ATTACHMENT_ID = "Attachment-Id"

_METADATA_KEY = re.compile(r"[!-~]+")  # printable ASCII, no space (commas are split on before)
_DIGITS = re.compile(r"[0-9]{1,19}")


def _services():
    return current_app.extensions["attache"]


class MethodOverride:
    """WSGI middleware: a ``POST`` under ``/v1/uploads/`` with ``X-HTTP-Method-Override`` is routed as that method.

    The tus core protocol requires it; anywhere else the header is ignored.
    """

    METHODS = ("PATCH", "DELETE", "HEAD")

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        wanted = environ.get("HTTP_X_HTTP_METHOD_OVERRIDE", "").strip().upper()
        if wanted in self.METHODS and environ.get("REQUEST_METHOD") == "POST" \
                and environ.get("PATH_INFO", "").startswith(bp.url_prefix + "/"):
            environ["REQUEST_METHOD"] = wanted
        return self.wsgi_app(environ, start_response)


@bp.before_request
def _speaks_tus():
    if request.headers.get("Tus-Resumable") != TUS_VERSION:
        return error(412, "tus_version", f"send Tus-Resumable: {TUS_VERSION}", **{"Tus-Version": TUS_VERSION})
    return None


@bp.after_request
@discovery.after_request
def _tus_headers(response):
    response.headers["Tus-Resumable"] = TUS_VERSION
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.errorhandler(PermanentError)
def _refused(exc: PermanentError):
    """The last byte arrived, and the handoff refused the image (the upload is terminated)."""
    return refusal(exc)


@bp.errorhandler(StorageUnavailable)
def _storage_down(exc: StorageUnavailable):
    return refusal(exc, "the service cannot accept uploads right now; retry later")


@discovery.route("", methods=["OPTIONS"])
def options():
    return Response(status=204, headers={
        "Tus-Version": TUS_VERSION,
        "Tus-Extension": ",".join(EXTENSIONS),
        "Tus-Max-Size": str(_services().settings.max_upload_bytes),
        "Tus-Checksum-Algorithm": ",".join(CHECKSUM_ALGORITHMS),
    })


@bp.post("", provide_automatic_options=False)
def create():
    if "Upload-Defer-Length" in request.headers:
        raise UploadRejected("Upload-Defer-Length is not supported: send Upload-Length",
                             error_code="bad_upload_length")
    length = _number("Upload-Length")
    metadata, filename = _metadata(request.headers.get("Upload-Metadata"))
    with_body = request.has_body
    if with_body and request.mimetype != PART_TYPE:
        raise UnsupportedMediaType(f"a body sent with the creation needs Content-Type: {PART_TYPE}")
    if with_body:
        refuse_content_coding(request.headers)
    services = _services()
    digest = request.headers.get("Repr-Digest")
    upload, replayed = resumable.create(
        services, owner=identity().principal, length=length, filename=filename, metadata=metadata,
        expected_sha256=sha256_of(digest, "Repr-Digest") if digest else None, key=idempotency_key(request.headers))
    headers = {"Location": url_for("tus.head", upload_id=upload.id)}
    if replayed:  # made by the creation this one repeats: where it stands (a body sent again is not read)
        return Response(status=201, headers={**headers, **_where(upload), "Idempotent-Replayed": "true"})
    if with_body:
        try:
            upload = _append(upload, 0)
        except IncompleteBody as exc:  # the upload was made: without its Location the client could not resume it
            try:
                upload = resumable.find(_services(), upload.id, upload.owner)
            except DatabaseUnavailable as lost:  # kept and named, as below: HEAD says where to resume
                return _named(lost, headers)
            except Exception:
                _forget(upload)
                raise
            return _named(exc, {**headers, **_where(upload)})
        except DatabaseUnavailable as exc:  # the upload is kept, and named: its COMMIT may have landed unseen
            # (the answer lost, the database gone a while), and an upload cancelled then, or answered without its
            # Location, left an attachment the client could never learn of, and its retry made a second (an
            # adversarial run). HEAD on the Location says where the upload stands, and what it made.
            return _named(exc, headers)
        except Exception as exc:
            # a refusal carries no Location: nobody could reach the upload again, unless a replay of this creation
            # handed it out and another request wrote it; that upload is kept, and the refusal names it
            kept = _forget(upload)
            if kept is None or not isinstance(exc, AttacheError):
                raise
            return _named(exc, {**headers, **_where(kept)})
        headers.update(_where(upload))
    return Response(status=201, headers={**headers, **_state(upload)})


@bp.route("/<uuid:upload_id>", methods=["HEAD"])
def head(upload_id):
    upload = resumable.find(_services(), upload_id, identity().principal)
    headers = {**_where(upload), "Upload-Length": str(upload.length)}
    if upload.metadata:
        headers["Upload-Metadata"] = upload.metadata
    return Response(status=200, headers=headers)


@bp.patch("/<uuid:upload_id>")
def patch(upload_id):
    offset = _number("Upload-Offset", minimum=0)
    if request.mimetype != PART_TYPE:
        raise UnsupportedMediaType(f"a PATCH needs Content-Type: {PART_TYPE}")
    refuse_content_coding(request.headers)
    upload = resumable.find(_services(), upload_id, identity().principal)
    if offset != upload.offset:
        raise OffsetMismatch(f"the upload is at offset {upload.offset}, not {offset}")  # before reading the body
    try:
        upload = _append(upload, offset)
    except IncompleteBody as exc:  # where to resume, in a header as a creation cut short says it: it was only words
        return _named(exc, _where(resumable.find(_services(), upload_id, identity().principal)))
    return Response(status=204, headers=_where(upload))


@bp.delete("/<uuid:upload_id>")
def terminate(upload_id):
    resumable.terminate(_services(), upload_id, identity().principal)
    return Response(status=204)


# --- inside ---------------------------------------------------------------------------


def _append(upload: resumable.Upload, offset: int) -> resumable.Upload:
    """Receive this request's body and append it at ``offset``; a body cut short keeps what arrived."""
    checksum = _checksum(request.headers.get("Upload-Checksum"))
    remaining = upload.length - offset
    past = UploadTooLarge(f"the body goes past Upload-Length {upload.length}: {remaining} bytes remain from "
                          f"Upload-Offset {offset}")
    if (request.content_length or 0) > remaining:
        raise past
    with bodies_in_flight.held(upload.owner):
        spool = request.spool(max_bytes=remaining)
        try:
            spool_stream(request.stream, spool)
        except UploadTooLarge:  # the spool's own words named the bytes remaining as the upload limit
            raise past from None
        cut_short = request.body_incomplete()
        part = spool.finish()
    if cut_short and part.size >= remaining:
        # every byte the upload lacked arrived, but the body's framing broke after them: a chunked PATCH cut before
        # its terminating chunk, or in a chunk that declared more. Completed, the upload went ready while the PATCH
        # was answered 400 (an adversarial run); completed and answered 204, a body that meant to go past
        # Upload-Length (413 when it arrives whole) was taken cut at it (a re-attack). A cut body never ends an
        # upload: nothing of it is kept, and the client's resume sends it again
        raise IncompleteBody(f"the body ended early, after the upload's last byte, its framing broken; nothing was "
                             f"kept, as it would have ended the upload: resume at Upload-Offset {offset}")
    if checksum is not None:
        algorithm, expected = checksum
        if cut_short:
            raise IncompleteBody("the body ended early, so its Upload-Checksum cannot match; nothing was kept")
        with open(part.path, "rb") as fh:
            if hashlib.file_digest(fh, algorithm).digest() != expected:
                raise ChecksumMismatch(f"the body does not match its Upload-Checksum ({algorithm})")
    traceparent = accept_traceparent(request.headers.get("traceparent"))
    with bound(trace_id=trace_id(traceparent), principal=upload.owner, upload_id=str(upload.id)):
        upload = resumable.append(_services(), upload.id, owner=upload.owner, offset=offset, part=part,
                                  spool=request.spool, traceparent=traceparent,
                                  tracestate=accept_tracestate(request.headers.get("tracestate")))
    if cut_short:
        raise IncompleteBody(f"the body ended early; the {part.size} bytes that arrived were kept: resume at "
                             f"Upload-Offset {upload.offset}")
    return upload


def _where(upload: resumable.Upload) -> dict[str, str]:
    """Where an upload stands: its offset, and its expiry or what it made."""
    return {"Upload-Offset": str(upload.offset), **_state(upload)}


def _named(exc, headers: dict[str, str]) -> Response:
    """The refusal of a request whose upload is kept, with the headers that name it and say where it stands."""
    response = refusal(exc)
    response.headers.update(headers)
    return response


def _forget(upload: resumable.Upload) -> resumable.Upload | None:
    """Terminate an upload whose creation is refused, as far as that can be done now: one left behind counted
    against its uploader until it expired (the refusals of the hand-off terminate it themselves). An upload another
    request reached meanwhile, through a replay of the creation, is kept
    (:func:`resumable.terminate`, ``untouched_only``):
    returned as it stands."""
    try:
        return resumable.terminate(_services(), upload.id, upload.owner, untouched_only=True)
    except UploadNotFound:
        return None
    except UploadLocked:  # another request is writing it: it keeps it
        try:
            return resumable.find(_services(), upload.id, upload.owner)
        except Exception:
            return upload
    except Exception as exc:  # the refusal being answered matters more; expiry removes the upload later
        log.warning("upload %s of a refused creation not terminated (%s): it expires", upload.id, exc)
        return None


def _state(upload: resumable.Upload) -> dict[str, str]:
    """The headers every answer about an upload carries: when it expires, and what it made."""
    headers = {"Upload-Expires": http_date(upload.expires_at)}
    if upload.complete:
        headers[ATTACHMENT_ID] = str(upload.attachment_id)
    return headers


def _number(header: str, *, minimum: int = 1) -> int:
    raw = request.headers.get(header, "").strip()
    if not _DIGITS.fullmatch(raw) or int(raw) < minimum:
        raise UploadRejected(f"{header} must be an integer >= {minimum}",
                             error_code=f"bad_{header.lower().replace('-', '_')}")
    return int(raw)


def _metadata(raw: str | None) -> tuple[str | None, str]:
    """``Upload-Metadata`` as kept (None when empty) and the display name it carries."""
    raw = (raw or "").strip()
    if not raw:
        return None, filenames.sanitize(None)
    if len(raw) > MAX_METADATA_CHARS:
        raise UploadRejected(f"Upload-Metadata is longer than {MAX_METADATA_CHARS} characters",
                             error_code="bad_metadata")
    pairs: dict[str, bytes] = {}
    for item in raw.split(","):
        key, _, value = item.strip().partition(" ")
        if not _METADATA_KEY.fullmatch(key) or key in pairs:
            raise UploadRejected("Upload-Metadata: each pair is a unique key and a base64 value",
                                 error_code="bad_metadata")
        try:
            pairs[key] = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise UploadRejected(f"Upload-Metadata: the value of {key!r} is not base64",
                                 error_code="bad_metadata") from None
    name = next((pairs[k] for k in FILENAME_KEYS if k in pairs), None)
    try:
        display = filenames.sanitize(name.decode("utf-8") if name is not None else None)
    except UnicodeDecodeError:
        raise UploadRejected("Upload-Metadata: the filename is not UTF-8", error_code="bad_metadata") from None
    return raw, display


def _checksum(raw: str | None) -> tuple[str, bytes] | None:
    """``Upload-Checksum: <algorithm> <base64 digest>`` as (hashlib name, digest), or None."""
    if raw is None:
        return None
    algorithm, _, value = raw.strip().partition(" ")
    if algorithm not in CHECKSUM_ALGORITHMS:
        raise UploadRejected(f"Upload-Checksum: supported algorithms are {', '.join(CHECKSUM_ALGORITHMS)}",
                             error_code="unsupported_checksum")
    try:
        digest = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise UploadRejected("Upload-Checksum: the digest is not base64", error_code="bad_checksum") from None
    if len(digest) != hashlib.new(algorithm).digest_size:
        raise UploadRejected(f"Upload-Checksum: not a {algorithm} digest", error_code="bad_checksum")
    return algorithm, digest
