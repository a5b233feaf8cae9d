"""``/v1/attachments``: upload, status and downloads."""

from __future__ import annotations

import logging
import re
import uuid
from typing import Annotated, Literal
from urllib.parse import quote

from flask import Blueprint, Response, current_app, g, request, url_for
from pydantic import Field
from sqlalchemy import select
from werkzeug.http import parse_options_header

from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import JobState, attachments, jobs, variants
from app.core import filenames, intake, pending
from app.errors import (
    AttacheError,
    DatabaseUnavailable,
    EffectMissing,
    IncompleteBody,
    ObjectNotFound,
    OutcomeUnknown,
    PermanentError,
    StorageUnavailable,
    TooManyDownloadsAtOnce,
    UploadRejected,
)
from app.observability.logs import bound
from app.observability.tracing import accept_traceparent, accept_tracestate, trace_id
from app.web import bodies_in_flight, multipart
from app.web.access import identity, protect
from app.web.body import refuse_content_coding
from app.web.connection import client_waits
from app.web.contract import (
    Header,
    in_header,
    in_path,
    in_query,
    ok,
    operation,
    raw,
    refused,
)
from app.web.idempotency import idempotency_key
from app.web.responses import answer, refusal
from app.web.responses import error as _error
from app.web.schemas import AttachmentStatus, UploadAccepted, Variant, VersionState
from app.web.spool import HashingSpool, spool_stream, verify_digests

log = logging.getLogger("attache.downloads")
bp = Blueprint("attachments", __name__, url_prefix="/v1/attachments")

#: a download URL pinned with ``?version=N``: its bytes never change
PINNED_CACHE_CONTROL = "private, max-age=31536000, immutable"
#: a download URL without ``?version``: it follows the newest ready version, so caches revalidate (ETag)
UNPINNED_CACHE_CONTROL = "private, no-cache"


def _services():
    return current_app.extensions["attache"]


protect(bp)


def _owner() -> str:
    return identity().principal


def _visible(attachment) -> bool:
    """An uploader sees only its own attachments; an operator sees all."""
    return identity().is_operator or attachment.owner == identity().principal


_RAW = {"schema": {"type": "string", "format": "binary"}}


@bp.post("")
@operation(
    "uploadAttachment", "Upload a photo", tag="attachments",
    description="Streams the body to disk while hashing it, checks the digests, probes the image header, stages "
                "the original and records the job, its history and its first message in one transaction. `202` "
                "means the work can no longer be lost (RabbitMQ being down is not a refusal: the outbox keeps the "
                "message). Any answer other than `202` leaves nothing behind, but `503 outcome_unknown` (see "
                "below). Send the file as multipart field `file`, or as the raw body with its content type (any "
                "type but `application/x-www-form-urlencoded` is taken as raw bytes, no Content-Type is refused; "
                "the format is always sniffed from the bytes).",
    parameters=[
        in_header("Content-Digest", "RFC 9530, e.g. `sha-256=:<base64>:`; `sha-256` is verified against the file's "
                                 "bytes: the raw body's, or the `file` part's of a multipart body (not the whole "
                                 "multipart message's, as RFC 9530 would have it: the file is what is stored)."),
        in_header("Repr-Digest", "RFC 9530: the file's whole digest, verified as `Content-Digest` is (the file "
                                 "is stored as sent, without a content coding)."),
        in_header("Content-MD5", "Base64 MD5 of the file's bytes (as `Content-Digest`), verified."),
        in_header("Idempotency-Key", "1-255 printable ASCII characters but the comma, the quote and the backslash "
                                  "(surrounding quotes are dropped), sent once: a list (the header sent twice) is "
                                  "refused (400). "
                                  "A retry of the same content by the same principal while the key is remembered "
                                  "returns the first attachment with `Idempotent-Replayed: true`; the same key with "
                                  "other content is refused (422). Keys beginning with `tus:` are resumable uploads' "
                                  "own (400)."),
        in_header("traceparent", "W3C trace context, kept with the job and carried to the workers; an invalid one is "
                              "replaced by a fresh trace."),
        in_header("tracestate", "W3C vendor trace state, kept with the job."),
        in_header("Content-Disposition", "For a raw body: `attachment; filename=\"...\"` (or `filename*=`) gives the "
                                      "display name, sanitized."),
    ],
    body={
        "multipart/form-data": {
            "schema": {"type": "object", "required": ["file"],
                       "properties": {"file": {"type": "string", "format": "binary",
                                               "description": "The photo; the part's filename is the display "
                                                              "name, sanitized."}}},
            "encoding": {"file": {"contentType": "application/octet-stream, image/*"}},
        },
        "image/*": _RAW,
        "application/octet-stream": _RAW,
    },
    answers={
        202: ok("Accepted: staged, recorded and queued (or an idempotent replay).", UploadAccepted, headers={
            "Location": Header("The attachment's status URL, `/v1/attachments/{id}`.", required=True),
            "Idempotent-Replayed": Header("`true` when this answers a retry with the same Idempotency-Key (nothing "
                                          "new was created).", Literal["true"]),
        }),
        400: refused("Malformed request: no `file` part, an unusable content type, an empty body, a bad "
                     "Idempotency-Key or digest header, or the client went away mid-body (`incomplete_body`: fewer "
                     "bytes than `Content-Length`, or a broken chunked framing; nothing is stored and the "
                     "Idempotency-Key stays unused). `client_gone`: the client closed its connection, or its "
                     "sending side, before the upload was committed (it had given up; nothing is stored).",
                     "missing_file", "bad_content_type", "empty_body", "incomplete_body", "client_gone",
                     "bad_idempotency_key",
                     "bad_digest_header", "unsupported_digest", "bad_request", "http_error"),
        413: refused("Too large: more bytes than the upload limit, or the image declares too many pixels, too long "
                     "a side, or would need more memory to render than the decode budget.",
                     "too_large", "decompression_bomb", "image_too_large"),
        415: refused("Not an image format attache processes, or a corrupt header; or a body in a content coding "
                     "(`Content-Encoding`: the file's bytes are stored as sent, none is decoded).",
                     "unsupported_format", "corrupt_image", "unsupported_content_encoding"),
        422: refused("A digest header does not match the bytes, or the Idempotency-Key was used for other content.",
                     "digest_mismatch", "idempotency_key_reused"),
        429: refused("The uploader already has `ATTACHE_MAX_PENDING_PER_UPLOADER` uploads accepted and not yet ready "
                     "or failed; retry once some are (nothing of this request is kept). For `Retry-After` seconds after "
                     "such a refusal the uploader's next bodies without an Idempotency-Key are refused before they "
                     "are read. The uploader is already sending `ATTACHE_MAX_BODIES_PER_UPLOADER` bodies to this "
                     "web process (`too_many_uploads_at_once`): refused before the body is read; send it when one "
                     "of them is done.", "too_many_pending", "too_many_uploads_at_once", retry_after=True),
        503: refused("PostgreSQL or storage is down, or the web's temporary directory cannot hold the upload; retry "
                     "later. `outcome_unknown`: the upload's COMMIT reached PostgreSQL and its answer was lost, so the "
                     "upload may have been accepted (the one answer but `202` that may leave it behind, to be "
                     "processed as any other): retry with the same Idempotency-Key, which answers the first "
                     "attachment if it was; a retry without one may make a second.",
                     "database_unavailable", "storage_unavailable", "spool_unavailable", "outcome_unknown",
                     retry_after=True),
    },
)
def upload():
    services = _services()
    try:  # the request removes its spool files when it ends (app.web.request)
        with bodies_in_flight.held(_owner()):
            accepted, received = _accept(services)
    except (UploadRejected, PermanentError, OutcomeUnknown) as exc:
        return refusal(exc)
    except (DatabaseUnavailable, StorageUnavailable) as exc:
        return refusal(exc, "the service cannot accept uploads right now; retry later")
    headers = {"Location": url_for("attachments.status", attachment_id=accepted.attachment_id)}
    if accepted.replayed:
        headers["Idempotent-Replayed"] = "true"
    return answer(UploadAccepted(id=accepted.attachment_id, job_id=accepted.job_id,
                                 state=_state_of(accepted.job_id) if accepted.replayed else JobState.QUEUED,
                                 pipeline_version=accepted.pipeline_version, size=received.size,
                                 sha256=received.sha256), 202, **headers)


def _accept(services) -> tuple[intake.Accepted, intake.Received]:
    if request.headers.get("Idempotency-Key") is None:  # a retry with a key may be of an upload accepted already
        pending.admit_before_the_body(services.engine, _owner(), services.settings.max_pending_per_uploader)
    spool = _receive_body()
    received = spool.finish()
    verify_digests(received, content_digest=request.headers.get("Content-Digest"),
                   content_md5=request.headers.get("Content-MD5"), repr_digest=request.headers.get("Repr-Digest"))
    traceparent = accept_traceparent(request.headers.get("traceparent"))
    with bound(trace_id=trace_id(traceparent), principal=_owner()):
        accepted = intake.accept(services, received, filename=_display_name(), owner=_owner(),
                                 traceparent=traceparent, tracestate=accept_tracestate(request.headers.get("tracestate")),
                                 idempotency_key=idempotency_key(request.headers),
                                 client_waits=lambda: client_waits(request.environ))
    return accepted, received


def _state_of(job_id) -> str:
    with transaction(_services().engine) as conn:
        return conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar_one()


def _refuse_incomplete_body() -> None:
    """A body cut short is refused whole: its bytes are not the upload the client meant."""
    if request.body_incomplete():
        stream = request.stream
        if stream.declared_length is None:  # chunked: gunicorn drops the chunks it held when the framing breaks, so
            # a count of the bytes that reached the view said "0 bytes" of a body cut at its middle
            raise IncompleteBody("the chunked request body ended before its last chunk; send it again",
                                 error_code="incomplete_body")
        raise IncompleteBody(f"the request body ended after {stream.received} bytes of the {stream.declared_length} "
                             "declared; send it again", error_code="incomplete_body")


def _receive_body() -> HashingSpool:
    refuse_content_coding(request.headers)
    mimetype = request.mimetype
    if mimetype == "multipart/form-data":
        try:
            part = multipart.receive_file(request.stream, request.mimetype_params.get("boundary"), request.spool)
        except UploadRejected:
            _refuse_incomplete_body()  # a body cut short is said to be so, whatever the parser made of it
            raise
        _refuse_incomplete_body()
        if part is None:
            raise UploadRejected("multipart upload has no 'file' field", error_code="missing_file")
        request.__dict__["attache_filename"] = part.filename
        return part.spool
    if mimetype in ("application/x-www-form-urlencoded", ""):
        raise UploadRejected("send the file as multipart/form-data field 'file' or as a raw body with a "
                             "Content-Type", error_code="bad_content_type")
    spool = request.spool()
    spool_stream(request.stream, spool)
    _refuse_incomplete_body()
    if spool.size == 0:
        raise UploadRejected("the upload is empty", error_code="empty_body")
    return spool


def _display_name() -> str:
    if "attache_filename" in request.__dict__:
        return filenames.sanitize(request.__dict__["attache_filename"])
    disposition = request.headers.get("Content-Disposition")
    if disposition:
        _, options = parse_options_header(disposition)
        return filenames.sanitize(options.get("filename"))
    return filenames.sanitize(None)


# --- status -------------------------------------------------------------------


def _load(attachment_id: uuid.UUID, version: int | None):
    with transaction(_services().engine) as conn:
        attachment = conn.execute(select(attachments).where(attachments.c.id == attachment_id)).one_or_none()
        if attachment is None or not _visible(attachment):
            return None, None, []
        query = select(jobs).where(jobs.c.attachment_id == attachment_id)
        if version is not None:
            job = conn.execute(query.where(jobs.c.pipeline_version == version)).one_or_none()
        else:
            # the newest version with a ready job, else the newest job
            candidates = conn.execute(query.order_by(jobs.c.pipeline_version.desc())).all()
            job = next((j for j in candidates if j.state == JobState.READY), candidates[0] if candidates else None)
        published = [] if job is None else conn.execute(select(variants).where(
            variants.c.job_id == job.id, variants.c.published_at.is_not(None), variants.c.retired_at.is_(None),
        ).order_by(variants.c.id)).all()
        versions = conn.execute(select(jobs.c.pipeline_version, jobs.c.state).where(
            jobs.c.attachment_id == attachment_id).order_by(jobs.c.pipeline_version)).all()
    g.attache_versions = [VersionState(pipeline_version=v, state=s) for v, s in versions]
    return attachment, job, published


ATTACHMENT_ID = in_path("attachment_id")
VERSION = in_query("version", "A pipeline version. Without it: the newest version with a `ready` job, else the newest "
                           "job. Anything but ASCII digits (at most 9) is `400`.", int)


def _asked_version() -> int | None:
    """The ``version`` asked for, or None; :class:`ValueError` for one that is not ASCII digits (at most 9). werkzeug's
    ``type=int`` left ``abc`` unasked (the newest version answered, as if none had been asked) and read ``1_000``
    and `` 2`` as numbers (an adversarial run)."""
    value = request.args.get("version")
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 9):
        raise ValueError("version must be a pipeline version: ASCII digits, at most 9")
    return int(value)
PROVENANCE = in_query("provenance", "`1`: each variant carries its provenance record (source sha256, pipeline "
                                    "fingerprint, spec, library versions, encoder settings, stripped metadata).",
                      Literal["0", "1"])


@bp.get("/<uuid:attachment_id>")
@operation(
    "getAttachment", "An attachment's state, variants and versions", tag="attachments",
    description="An uploader sees only its own attachments (others answer 404); an operator sees all.",
    parameters=[ATTACHMENT_ID, VERSION, PROVENANCE],
    answers={200: ok("The status document.", AttachmentStatus),
             400: refused("`version` is not ASCII digits (at most 9).", "bad_request"),
             404: refused("No such attachment (or not yours), or no job at the asked version.", "not_found")},
)
def status(attachment_id: uuid.UUID):
    try:
        version = _asked_version()
    except ValueError as exc:
        return _error(400, "bad_request", str(exc))
    with_provenance = request.args.get("provenance") == "1"
    attachment, job, published = _load(attachment_id, version)
    if attachment is None or job is None:
        return _error(404, "not_found", "no such attachment" + (f" at version {version}" if version else ""))
    return answer(AttachmentStatus(
        id=attachment.id, job_id=job.id, state=job.state, filename=attachment.filename,
        content_type=attachment.content_type, size=attachment.size, sha256=attachment.sha256,
        width=attachment.width, height=attachment.height, pipeline_version=job.pipeline_version,
        attempt=job.attempt, error_code=job.error_code, error_reason=job.error_reason,
        variants={row.variant: Variant(
            url=url_for("attachments.download_variant", attachment_id=attachment.id, name=row.variant,
                        **({"version": job.pipeline_version} if version else {})),
            content_type=row.content_type, width=row.width, height=row.height, size=row.size, sha256=row.sha256,
            provenance=row.provenance if with_provenance else None,
        ) for row in published},
        created_at=attachment.created_at, ready_at=job.ready_at, versions=g.attache_versions,
    ))


# --- downloads --------------------------------------------------------------------


_IMAGE = {"image/*": _RAW}
_DOWNLOAD_HEADERS = {
    "ETag": Header("`\"<sha256>\"` of the whole object."),
    "Cache-Control": Header(f"With `?version=N`, `{PINNED_CACHE_CONTROL}`: the bytes behind a pinned URL never "
                            f"change. Without it, `{UNPINNED_CACHE_CONTROL}`: the URL follows the newest ready "
                            "version, so a cache revalidates with `If-None-Match`."),
    "Content-Disposition": Header("`attachment; filename=\"...\"; filename*=UTF-8''...`"),
    "Accept-Ranges": Header("`bytes`"),
    "X-Content-Type-Options": Header("`nosniff`"),
    "Content-Security-Policy": Header("`default-src 'none'; sandbox`"),
}


def _download(operation_id: str, summary: str, *parameters):
    """The operation of the two download routes (one serves the other)."""
    return operation(
        operation_id, summary, tag="attachments",
        description="Only published objects are served. With presigned downloads configured (S3 storage and "
                    "`ATTACHE_PRESIGN_SECONDS` > 0) the answer is a redirect to the object store; otherwise the "
                    "bytes stream through the web, with single-range support.",
        parameters=[ATTACHMENT_ID, *parameters, VERSION,
                    in_header("Range", "One `bytes=first-last`, `bytes=first-` or `bytes=-suffix` range; several "
                                    "ranges or a malformed one are answered with the whole object."),
                    in_header("If-Range", "The ETag; if it differs, the Range is ignored."),
                    in_header("If-None-Match", "An ETag list; a match answers 304.")],
        answers={
            200: raw("The whole object, with the content type it was published with.", _IMAGE,
                     {**_DOWNLOAD_HEADERS, "Content-Length": Header("Bytes.")}),
            206: raw("The requested range.", _IMAGE,
                     {**_DOWNLOAD_HEADERS, "Content-Range": Header("`bytes first-last/size`", required=True),
                      "Content-Length": Header("Bytes in the range.")}),
            302: raw("Presigned downloads: the object store's URL.", None, {
                "Location": Header("A presigned URL, valid for `ATTACHE_PRESIGN_SECONDS`.", required=True),
                "Cache-Control": Header("`no-store`")}),
            304: raw("Not modified: `If-None-Match` names the ETag. No body.", None, _DOWNLOAD_HEADERS),
            400: refused("`version` is not ASCII digits (at most 9).", "bad_request"),
            404: refused("No such attachment (or not yours), no job at the asked version, or no such variant in a "
                         "ready job.", "not_found"),
            409: refused("The job is not ready yet (or failed): nothing is published.", "not_ready"),
            416: raw("Range not satisfiable. No body.", None, {
                "Content-Range": Header("`bytes */size`", required=True), "ETag": _DOWNLOAD_HEADERS["ETag"]}),
            429: refused("The client is already being sent `ATTACHE_MAX_DOWNLOADS_PER_CLIENT` downloads by this web "
                         "process at once; ask again when one of them is done.", "too_many_downloads_at_once",
                         retry_after=True),
            500: refused("The published object is missing from storage (`effect_missing`: reported, never hidden).",
                         "effect_missing"),
            503: refused("Storage or PostgreSQL is unavailable; retry later.",
                         "storage_unavailable", "database_unavailable", retry_after=True),
        },
    )


@bp.get("/<uuid:attachment_id>/original")
@_download("downloadOriginal", "Download the original (as uploaded)")
def download_original(attachment_id: uuid.UUID):
    return download_variant(attachment_id, "original")


@bp.get("/<uuid:attachment_id>/variants/<name>")
@_download("downloadVariant", "Download a variant",
           in_path("name", "A variant name as listed in the status document (`original` is one too).",
                Annotated[str, Field(pattern="^[a-z][a-z0-9_]{0,31}$",
                                     examples=["thumbnail", "crop", "optimized", "original"])]))
def download_variant(attachment_id: uuid.UUID, name: str):
    try:
        version = _asked_version()
    except ValueError as exc:
        return _error(400, "bad_request", str(exc))
    attachment, job, published = _load(attachment_id, version)
    if attachment is None or job is None:
        return _error(404, "not_found", "no such attachment")
    row = next((r for r in published if r.variant == name), None)
    if row is None:
        if job.state != JobState.READY:
            return _error(409, "not_ready", f"the attachment is {job.state}, not ready")
        return _error(404, "not_found", f"no variant {name!r}")
    etag = f'"{row.sha256}"'
    headers = {
        "ETag": etag,
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "Cache-Control": PINNED_CACHE_CONTROL if version is not None else UNPINNED_CACHE_CONTROL,
        "Content-Disposition": _disposition(attachment.filename, name, row.content_type),
        "Accept-Ranges": "bytes",
    }
    if request.if_none_match.star_tag or request.if_none_match.contains_weak(row.sha256):
        return _no_body(304, headers)
    try:
        place = bodies_in_flight.AnswerPlace(identity().principal)  # before storage is asked anything
    except TooManyDownloadsAtOnce as exc:
        return refusal(exc)
    streaming = False
    try:
        answer, streaming = _stored(attachment_id, row, headers, etag, place)
    finally:
        if not streaming:  # a redirect or a refusal: the place is given back now, else when the answer is sent
            place.release()
    return answer


def _stored(attachment_id: uuid.UUID, row, headers: dict, etag: str, place) -> tuple[Response, bool]:
    """The download's answer, and whether it streams the object's bytes (they then hold ``place``): a redirect to
    the object store, a refusal, or the bytes."""
    storage = _services().storage
    lifetime = _services().settings.presign_seconds
    try:
        # the object store answers with the same name and type as the web would
        redirect_to = storage.presigned_url(row.storage_key, lifetime, content_type=row.content_type,
                                            content_disposition=headers["Content-Disposition"]) if lifetime else None
    except AttacheError:
        redirect_to = None
    if redirect_to:
        return Response(status=302, headers={"Location": redirect_to, "Cache-Control": "no-store",
                                             "X-Content-Type-Options": "nosniff"}), False
    byte_range = _requested_range(row.size, etag)
    if byte_range == "unsatisfiable":
        return _no_body(416, {**headers, "Content-Range": f"bytes */{row.size}"}), False
    start, length = byte_range or (0, row.size)
    try:
        stream = storage.open_stream(row.storage_key, start=start, length=length)
        first = next(stream, b"")
    except ObjectNotFound:  # a published object is gone: the effect is incomplete
        log.error("a published object is missing from storage: %s", row.storage_key,
                  extra={"attachment_id": str(attachment_id), "variant": row.variant})
        return refusal(EffectMissing("the published object is missing; operators have been told")), False
    except AttacheError:
        return refusal(StorageUnavailable("storage is unavailable; retry later")), False

    def body():
        yield first
        yield from stream

    request.bound_silence()
    chunks = bodies_in_flight.HeldAnswer(body(), place, source=stream)
    headers["Content-Length"] = str(length)
    status = 200
    if byte_range is not None:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{row.size}"
    return Response(chunks, status=status, mimetype=row.content_type, headers=headers), True


def _no_body(status: int, headers: dict) -> Response:
    """An answer without a body (``304``, ``416``), with no ``Content-Type`` to describe one: werkzeug gives every
    answer its default, and an empty ``416`` came as ``text/html`` (an adversarial run)."""
    response = Response(status=status, headers=headers)
    del response.headers["Content-Type"]
    return response


_RANGE_SPEC = re.compile(r"(\d*)-(\d*)")
#: a range's number of more digits than this is past the end of any object (and ``int()`` refuses one of 4,301
#: digits or more: such a range answered 500, an adversarial run)
_RANGE_DIGITS = 18


def _position(digits: str) -> int:
    """A range's byte position: its digits' value, or one past any object's end when they are too many."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _RANGE_DIGITS else 10 ** _RANGE_DIGITS


def _requested_range(size: int, etag: str):
    """One ``Range: bytes=…`` range as (start, length), None for the whole, or "unsatisfiable".

    Multiple ranges are answered with the whole body (allowed by RFC 9110).
    """
    header = request.headers.get("Range")
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    if request.headers.get("If-Range") and request.headers.get("If-Range") != etag:
        return None
    spec = _RANGE_SPEC.fullmatch(header[len("bytes="):].strip())
    if spec is None:  # not a range RFC 9110 knows: the header is ignored
        return None
    first, last = spec.groups()
    if first == last == "":
        return None
    if first == "":
        suffix = _position(last)
        if suffix <= 0:
            return "unsatisfiable"
        start = max(0, size - suffix)
        end = size - 1
    else:
        start = _position(first)
        end = _position(last) if last else size - 1
        if last and end < start:  # an invalid range-spec (RFC 9110 14.1.1): ignored, not refused
            return None
    if start >= size:
        return "unsatisfiable"
    end = min(end, size - 1)
    return start, end - start + 1


def _disposition(display_name: str, variant: str, content_type: str) -> str:
    name = filenames.download_name(display_name, variant, content_type)
    fallback = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "_" for ch in name) or "download"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"
