"""``/v1/attachments``: upload, status and downloads."""

from __future__ import annotations

import re
import uuid
from urllib.parse import quote

from flask import Blueprint, Response, current_app, g, jsonify, request, url_for
from sqlalchemy import select
from werkzeug.http import parse_options_header

from app.adapters.postgres.db import transaction
from app.adapters.postgres.models import JobState, attachments, jobs, variants
from app.core import filenames, intake
from app.errors import (
    AttacheError,
    DatabaseUnavailable,
    EffectMissing,
    IncompleteBody,
    ObjectNotFound,
    PermanentError,
    StorageUnavailable,
    UploadRejected,
)
from app.observability.logs import bound
from app.observability.tracing import accept_traceparent, accept_tracestate, trace_id
from app.web.access import identity, protect
from app.web.responses import answer
from app.web.responses import error as _error
from app.web.spool import HashingSpool, spool_stream, verify_digests

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


@bp.post("")
def upload():
    services = _services()
    try:  # the request removes its spool files when it ends (app.web.request)
        spool = _receive_body()
        received = spool.finish()
        verify_digests(received, content_digest=request.headers.get("Content-Digest"),
                       content_md5=request.headers.get("Content-MD5"))
        traceparent = accept_traceparent(request.headers.get("traceparent"))
        with bound(trace_id=trace_id(traceparent), principal=_owner()):
            accepted = intake.accept(services, received, filename=_display_name(), owner=_owner(),
                                     traceparent=traceparent,
                                     tracestate=accept_tracestate(request.headers.get("tracestate")),
                                     idempotency_key=_idempotency_key())
    except (UploadRejected, PermanentError) as exc:
        return answer(exc)
    except (DatabaseUnavailable, StorageUnavailable) as exc:
        return answer(exc, "the service cannot accept uploads right now; retry later")
    location = url_for("attachments.status", attachment_id=accepted.attachment_id)
    body = {"id": str(accepted.attachment_id), "job_id": str(accepted.job_id), "state": JobState.QUEUED.value,
            "pipeline_version": accepted.pipeline_version, "size": received.size, "sha256": received.sha256}
    headers = {"Location": location}
    if accepted.replayed:
        headers["Idempotent-Replayed"] = "true"
        body["state"] = _state_of(accepted.job_id)
    return jsonify(body), 202, headers


def _idempotency_key() -> str | None:
    raw = request.headers.get("Idempotency-Key")
    if raw is None:
        return None
    key = raw.strip().strip('"')
    if not key or len(key) > 255 or not key.isprintable():
        raise UploadRejected("Idempotency-Key must be 1-255 printable characters", error_code="bad_idempotency_key")
    return key


def _state_of(job_id) -> str:
    with transaction(_services().engine) as conn:
        return conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar_one()


def _refuse_incomplete_body() -> None:
    """A body cut short is refused whole: its bytes are not the upload the client meant."""
    if request.body_incomplete():
        stream = request.stream
        declared = f" of the {stream.declared_length} declared" if stream.declared_length is not None else ""
        raise IncompleteBody(f"the request body ended after {stream.received} bytes{declared}; "
                             "send it again", error_code="incomplete_body")


def _receive_body() -> HashingSpool:
    mimetype = request.mimetype
    if mimetype == "multipart/form-data":
        storage = request.files.get("file")
        _refuse_incomplete_body()
        if storage is None:
            raise UploadRejected("multipart upload has no 'file' field", error_code="missing_file")
        spool = storage.stream
        if not isinstance(spool, HashingSpool):  # pragma: no cover - werkzeug keeps small parts in memory otherwise
            raise UploadRejected("unexpected upload stream")
        request.discard_spools(keep=spool)
        request.__dict__["attache_filename"] = storage.filename
        return spool
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
    g.attache_versions = [{"pipeline_version": v, "state": s} for v, s in versions]
    return attachment, job, published


def _iso(value):
    return value.isoformat() if value is not None else None


@bp.get("/<uuid:attachment_id>")
def status(attachment_id: uuid.UUID):
    version = request.args.get("version", type=int)
    attachment, job, published = _load(attachment_id, version)
    if attachment is None or job is None:
        return _error(404, "not_found", "no such attachment" + (f" at version {version}" if version else ""))
    body = {
        "id": str(attachment.id),
        "job_id": str(job.id),
        "state": job.state,
        "filename": attachment.filename,
        "content_type": attachment.content_type,
        "size": attachment.size,
        "sha256": attachment.sha256,
        "width": attachment.width,
        "height": attachment.height,
        "pipeline_version": job.pipeline_version,
        "attempt": job.attempt,
        "error_code": job.error_code,
        "error_reason": job.error_reason,
        "variants": {
            row.variant: {
                "url": url_for("attachments.download_variant", attachment_id=attachment.id, name=row.variant,
                               **({"version": job.pipeline_version} if version else {})),
                "content_type": row.content_type, "width": row.width, "height": row.height,
                "size": row.size, "sha256": row.sha256,
            }
            for row in published
        },
        "created_at": _iso(attachment.created_at),
        "ready_at": _iso(job.ready_at),
        "versions": g.attache_versions,
    }
    return jsonify(body)


# --- downloads --------------------------------------------------------------------


@bp.get("/<uuid:attachment_id>/original")
def download_original(attachment_id: uuid.UUID):
    return download_variant(attachment_id, "original")


@bp.get("/<uuid:attachment_id>/variants/<name>")
def download_variant(attachment_id: uuid.UUID, name: str):
    version = request.args.get("version", type=int)
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
        return Response(status=304, headers=headers)
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
                                             "X-Content-Type-Options": "nosniff"})
    byte_range = _requested_range(row.size, etag)
    if byte_range == "unsatisfiable":
        return Response(status=416, headers={**headers, "Content-Range": f"bytes */{row.size}"})
    start, length = byte_range or (0, row.size)
    try:
        stream = storage.open_stream(row.storage_key, start=start, length=length)
        first = next(stream, b"")
    except ObjectNotFound:  # a published object is gone: the effect is incomplete
        return answer(EffectMissing("the published object is missing; operators have been told"))
    except AttacheError:
        return answer(StorageUnavailable("storage is unavailable; retry later"))

    def body():
        yield first
        yield from stream

    headers["Content-Length"] = str(length)
    status = 200
    if byte_range is not None:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{row.size}"
    return Response(body(), status=status, mimetype=row.content_type, headers=headers)


_RANGE_SPEC = re.compile(r"(\d*)-(\d*)")


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
        suffix = int(last)
        if suffix <= 0:
            return "unsatisfiable"
        start = max(0, size - suffix)
        end = size - 1
    else:
        start = int(first)
        end = int(last) if last else size - 1
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
