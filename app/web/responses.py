"""JSON answers, each serialized from its model in :mod:`app.web.schemas`, and the one map from the error tree to HTTP.

Every refusal has one shape, :class:`~app.web.schemas.Error`: ``{"error": code, "message": text}``
(:func:`error`). An error of the tree (:mod:`app.errors`) is answered with :func:`refusal`:
its status from :data:`STATUS`, its own ``error_code``, and ``Retry-After`` on a ``503`` or ``429``. The
console's HTML pages take their statuses from :func:`status_of` too, so each error class maps to
HTTP here and nowhere else.
"""

from __future__ import annotations

from flask import Response, jsonify
from pydantic import BaseModel

from app.errors import (
    AmbiguousId,
    AttacheError,
    AttachmentNotFound,
    BadSelection,
    ChecksumMismatch,
    DecompressionBomb,
    DeliveryInFlight,
    DigestMismatch,
    EffectMissing,
    IdempotencyKeyReused,
    ImageTooLarge,
    InvalidWebhook,
    JobConflict,
    JobNotFound,
    MissingReason,
    MoreThanExpected,
    OffsetMismatch,
    PartsMissing,
    PermanentError,
    QueryTimeout,
    QueueBusy,
    SpoolUnavailable,
    TooManyDownloadsAtOnce,
    TooManyOpenUploads,
    TooManyParts,
    TooManyPending,
    TooManyReadsAtOnce,
    TooManyUploadsAtOnce,
    TransientError,
    UnknownQueue,
    UnsupportedMediaType,
    UploadExpired,
    UploadLocked,
    UploadNotFound,
    UploadRejected,
    UploadTooLarge,
    WebhookNotFound,
    WebhookTargetRefused,
)
from app.web.schemas import Error

#: the HTTP status of each error class; a class not listed answers as its nearest listed ancestor (else 500)
STATUS: dict[type[AttacheError], int] = {
    # upload refusals (IncompleteBody and the malformed requests: 400)
    UploadRejected: 400,
    UploadTooLarge: 413,
    DigestMismatch: 422,
    IdempotencyKeyReused: 422,
    SpoolUnavailable: 503,
    TooManyPending: 429,
    TooManyOpenUploads: 429,
    TooManyUploadsAtOnce: 429,
    TooManyDownloadsAtOnce: 429,
    TooManyReadsAtOnce: 429,
    # the probe's refusals: the bytes are the problem (UnsupportedFormat, CorruptImage: 415)
    PermanentError: 415,
    DecompressionBomb: 413,
    ImageTooLarge: 413,
    # a dependency is down: database, storage, RabbitMQ
    TransientError: 503,
    # a published object is gone
    EffectMissing: 500,
    # operator actions
    JobNotFound: 404,
    AttachmentNotFound: 404,
    AmbiguousId: 409,
    UnknownQueue: 404,
    MissingReason: 400,
    BadSelection: 400,
    JobConflict: 409,
    MoreThanExpected: 409,
    QueueBusy: 409,
    QueryTimeout: 400,
    # resumable uploads (tus)
    UnsupportedMediaType: 415,
    UploadNotFound: 404,
    UploadExpired: 410,
    PartsMissing: 410,
    OffsetMismatch: 409,
    TooManyParts: 400,
    UploadLocked: 423,
    ChecksumMismatch: 460,
    # webhooks
    InvalidWebhook: 400,
    WebhookTargetRefused: 422,
    WebhookNotFound: 404,
    DeliveryInFlight: 409,
}
#: how long a ``503`` or a ``429`` asks the client to wait before it tries again
RETRY_AFTER_SECONDS = 5
#: the statuses that say "not now": they carry ``Retry-After``
RETRY_LATER = (429, 503)


def status_of(error: AttacheError | type[AttacheError]) -> int:
    """The HTTP status of an error (or error class) of the tree."""
    cls = error if isinstance(error, type) else type(error)
    return next((STATUS[c] for c in cls.__mro__ if c in STATUS), 500)


def answer(body: BaseModel, status: int = 200, **headers: str) -> Response:
    """``body`` as the JSON of the response (keys sorted, as Flask writes every JSON answer)."""
    response = jsonify(body.model_dump(mode="json", by_alias=True))
    response.status_code = status
    response.headers.update(headers)
    return response


def error(status: int, code: str, message: str, **headers: str) -> Response:
    return answer(Error(error=code, message=message), status, **headers)


def refusal(exc: AttacheError, message: str | None = None) -> Response:
    """``exc`` as its JSON answer; ``message`` replaces its text where that would say too much or too little."""
    status = status_of(exc)
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status in RETRY_LATER else {}
    return error(status, exc.error_code, str(exc) if message is None else message, **headers)
