"""One exception tree for attache.

Every error that can end up in a job's history or an HTTP answer derives
from :class:`AttacheError` and carries a stable, machine-readable
``error_code``. Two branches matter to the workflow:

* :class:`PermanentError` - retrying cannot help (the bytes are what they
  are). A step that raises one moves its job to ``failed`` with the code.
* :class:`TransientError` - the world may be better later (a service is
  down, a timeout). A step that raises one moves its job back to
  ``queued`` with a backoff, until its attempts are spent.

Each class says whether it is worth retrying (:attr:`AttacheError.retryable`);
the workflow and the Dramatiq actors decide by that attribute alone.

Vendor exceptions (botocore/minio, psycopg2, pika, Pillow) are translated
into this tree at the edge of the module that talks to the vendor, so the
rest of the code never imports a vendor exception type. Every error class
of attache is defined here, whichever layer raises it
(``tests/test_errors.py`` checks it).
"""

from __future__ import annotations


class AttacheError(Exception):
    """Base of every attache error."""

    error_code = "internal_error"
    #: may the same work succeed if it is tried again later? A step whose error is retryable
    #: runs again after a backoff while its job has attempts left; any other ends the job
    #: ``failed``, or, raised past the workflow, is dead-lettered at once. An error we did not
    #: foresee (this base class, any other exception) is assumed to heal.
    retryable = True

    def __init__(self, message: str = "", *, error_code: str | None = None):
        super().__init__(message or self.__class__.__doc__ or self.error_code)
        if error_code is not None:
            self.error_code = error_code

    @property
    def reason(self) -> str:
        """A short human text, safe to store and show (no secrets)."""
        return str(self)


class ConfigError(AttacheError):
    """A setting is missing or invalid; the message names the variable."""

    error_code = "config_error"
    retryable = False


# --- permanent: the input is the problem ---------------------------------


class PermanentError(AttacheError):
    """Retrying cannot help; the job ends ``failed``."""

    error_code = "permanent_error"
    retryable = False


class UnsupportedFormat(PermanentError):
    """The bytes are not an image format attache processes."""

    error_code = "unsupported_format"


class CorruptImage(PermanentError):
    """The image claims a supported format but cannot be decoded."""

    error_code = "corrupt_image"


class DecompressionBomb(PermanentError):
    """The image declares more pixels than the configured limit."""

    error_code = "decompression_bomb"


class ImageTooLarge(PermanentError):
    """One side of the image is longer than the configured limit."""

    error_code = "image_too_large"


class StagingMissing(PermanentError):
    """The staged original is gone, so the job can never be processed."""

    error_code = "staging_missing"


class OriginalCorrupted(PermanentError):
    """The stored original no longer has the SHA-256 taken at upload: storage damaged its bytes."""

    error_code = "original_corrupted"


class PipelineChanged(AttacheError):
    """A registered pipeline version was edited in place."""

    error_code = "pipeline_changed"
    retryable = False


# --- transient: the world is the problem ---------------------------------


class TransientError(AttacheError):
    """A dependency failed in a way that may heal; retry later."""

    error_code = "transient_error"
    retryable = True


class StorageError(AttacheError):
    """Base of object-storage errors (translated from the vendor).

    ``where`` names the store (``file:///srv/attache``, ``s3://bucket``): the
    text says it, for the logs and the operator; the :attr:`reason`, stored
    on a job and shown to its uploader, says ``storage`` instead (a server
    path or a bucket is not theirs to see: an adversarial run read
    ``file:///srv/...: put ... failed: No space left on device`` in an
    attachment's ``error_reason``).
    """

    error_code = "storage_error"

    def __init__(self, message: str = "", *, where: str | None = None, error_code: str | None = None):
        self.where = where
        self.detail = message
        super().__init__(message if where is None else f"{where}: {message}", error_code=error_code)

    @property
    def reason(self) -> str:
        return str(self) if self.where is None else f"storage: {self.detail}"


class StorageUnavailable(StorageError, TransientError):
    """Object storage cannot be reached or answered with a server error."""

    error_code = "storage_unavailable"


class StorageWaitInterrupted(StorageUnavailable):
    """The worker began to shut down while a step waited for storage: the step's message goes back to the broker
    (Dramatiq's retry, as after a PostgreSQL outage), and the job is not charged an attempt."""


class ObjectNotFound(StorageError):
    """The key does not exist in object storage."""

    error_code = "object_not_found"


class RemovalUnderWay(TransientError):
    """A job's claim met the object GC removing one of its attachment's objects (``app/core/objects.py``): the
    step runs again when the removal is done; the job is not charged an attempt."""

    error_code = "removal_under_way"


class VersionUnknownHere(TransientError):
    """A message names a pipeline version this worker's release does not register: a newer release made the job
    (an upgrade under way, workers last; or a rollback). The message goes back to the broker (Dramatiq's retry, as
    after a PostgreSQL outage) for a worker that knows the version, and the job is neither claimed nor charged an
    attempt: before, its attempts were spent within 30 s and the job of an upload answered ``202`` ended ``failed
    internal_error`` (an adversarial run)."""

    error_code = "pipeline_version_unknown"


class DatabaseUnavailable(TransientError):
    """PostgreSQL cannot be reached."""

    error_code = "database_unavailable"


class OutcomeUnknown(DatabaseUnavailable):
    """An upload's COMMIT reached PostgreSQL and its answer was lost: the upload may have been accepted. Not a clean
    refusal (which leaves nothing behind): a retry without an Idempotency-Key may make a second attachment. Its
    own code, so a client can tell (it was the generic ``database_unavailable``, "retry later": an adversarial run
    retried as told and got two attachments of one upload)."""

    error_code = "outcome_unknown"


class MadeUnread(DatabaseUnavailable):
    """An operator's action was made, and audited, and reading its result back failed: look before doing it again
    (it was the generic ``database_unavailable``, "retry later", for replays that had been made: an adversarial
    run)."""

    error_code = "made_unread"


class BrokerUnavailable(TransientError):
    """RabbitMQ cannot be reached or did not confirm a publish."""

    error_code = "broker_unavailable"


class StepTimedOut(TransientError):
    """A step ran longer than its time limit (``ATTACHE_STEP_TIME_LIMIT_SECONDS``): its heartbeat stops renewing
    the lease and records this as the attempt's outcome (``Workflow._lease_kept``). Retried as a lost worker is: the
    limit is wall-clock time, which a loaded or paused machine also spends. A render that never returns from C
    holds its thread until its worker process exits for it (``app.services.exit_stuck_worker``)."""

    error_code = "step_timeout"


# --- messages -------------------------------------------------------------


class PoisonMessage(AttacheError):
    """A message that must never be processed: it is dead-lettered at once."""

    error_code = "poison_message"
    retryable = False


class InvalidMessage(PoisonMessage):
    """The message body does not validate against ``jobs.schema.json``."""

    error_code = "invalid_message"


class UnknownJob(PoisonMessage):
    """The message names a job that does not exist in PostgreSQL."""

    error_code = "unknown_job"


class EffectMissing(AttacheError):
    """A ``ready`` job's published effect is not all there (reported, never hidden)."""

    error_code = "effect_missing"
    retryable = False


# --- operators' queries ---------------------------------------------------


class QueryTimeout(AttacheError):
    """A query ran longer than the time it was given and was cancelled."""

    error_code = "query_timeout"


class SearchTooBroad(QueryTimeout):
    """A search matched too much to finish in its time: type more of it."""

    error_code = "search_too_broad"


# --- upload refusals ------------------------------------------------------


class UploadRejected(AttacheError):
    """An upload was refused (the HTTP status of each refusal: ``app/web/responses.py``)."""

    error_code = "bad_request"
    retryable = False


class SpoolUnavailable(UploadRejected):
    """The web's temporary directory cannot take the upload (full, out of files): retry later."""

    error_code = "spool_unavailable"
    retryable = True


class TooManyPending(UploadRejected):
    """The uploader already has as many uploads waiting to be processed as it may (``429``): retry later.

    A bound on what one uploader can put ahead of everyone else in the queues
    (``ATTACHE_MAX_PENDING_PER_UPLOADER``).
    """

    error_code = "too_many_pending"
    retryable = True


class TooManyOpenUploads(UploadRejected):
    """The uploader already has as many unfinished resumable uploads, or declared bytes in them, as it may (``429``):
    finish or terminate some, or wait for them to expire.

    A bound on the rows and partial bytes one uploader can hold for a day
    (``ATTACHE_MAX_OPEN_UPLOADS_PER_UPLOADER``,
    ``ATTACHE_MAX_OPEN_UPLOAD_BYTES_PER_UPLOADER``).
    """

    error_code = "too_many_open_uploads"
    retryable = True


class TooManyUploadsAtOnce(UploadRejected):
    """The uploader is already sending as many bodies to this web process as it may at once (``429``): send this one
    when one of them is done (``ATTACHE_MAX_BODIES_PER_UPLOADER``)."""

    error_code = "too_many_uploads_at_once"
    retryable = True


class TooManyDownloadsAtOnce(AttacheError):
    """The client is already being sent as many downloads by this web process as it may at once (``429``): ask again
    when one of them is done (``ATTACHE_MAX_DOWNLOADS_PER_CLIENT``)."""

    error_code = "too_many_downloads_at_once"
    retryable = True


class TooManyReadsAtOnce(AttacheError):
    """The client already has as many reads (API and console ``GET``s) in flight in this web process as it may
    (``429``): ask again when one of them is done (``ATTACHE_MAX_READS_PER_CLIENT``). One token's 600 pages of 1000
    events in 3 s took 19 s of a process's CPU, and honest uploads waited seconds for their 202 (an adversarial
    review)."""

    error_code = "too_many_reads_at_once"
    retryable = True


class TooManyParts(UploadRejected):
    """A resumable upload already has as many parts as one may (``ATTACHE_MAX_PARTS_PER_UPLOAD``): its rest must come
    in one PATCH, which is always taken. The upload stays where it was.

    Each PATCH's bytes are a part of their own, a file on the filesystem: 1,000 PATCHes of one byte took 4 MiB of
    disk, and the last PATCH joined 2,000 parts in 5.7 s under the upload's lock (an adversarial run), while the
    uploader's open bytes, which its limits count, were a few kilobytes."""

    error_code = "too_many_parts"


class UploadTooLarge(UploadRejected):
    """The body is larger than the configured upload limit."""

    error_code = "too_large"


class IncompleteBody(UploadRejected):
    """The request body ended before its declared length (the client went away mid-body)."""

    error_code = "incomplete_body"


class ClientGone(UploadRejected):
    """The client closed its connection, or its sending side, before the upload was committed: it no longer waits
    for the answer, so nothing of the upload is kept (no ``202`` could reach it)."""

    error_code = "client_gone"


class DigestMismatch(UploadRejected):
    """A digest header does not match the bytes received."""

    error_code = "digest_mismatch"


class IdempotencyKeyReused(UploadRejected):
    """The Idempotency-Key was used for different content."""

    error_code = "idempotency_key_reused"


# --- operator actions (``/v1/ops``, the console, the ``attache`` command) ---------


class JobNotFound(AttacheError):
    """No such job."""

    error_code = "not_found"
    retryable = False


class AttachmentNotFound(AttacheError):
    """No such attachment."""

    error_code = "not_found"
    retryable = False


class AmbiguousId(AttacheError):
    """An id prefix starts more than one id; nothing was done."""

    error_code = "ambiguous_id"
    retryable = False

    def __init__(self, typed: str, what: str, candidates: list[str], more: bool):
        named = "".join(f"\n  {candidate}" for candidate in candidates) + ("\n  …" if more else "")
        super().__init__(f"{typed!r} starts {'more than ' if more else ''}{len(candidates)} {what} ids; "
                         f"type more of it:{named}")
        self.candidates = candidates


class JobConflict(AttacheError):
    """The job is not in a state that allows this."""

    error_code = "conflict"
    retryable = False


class MissingReason(AttacheError):
    """An audited action needs a reason."""

    error_code = "reason_required"
    retryable = False


class UnknownQueue(AttacheError, ValueError):
    """A queue name that is not one of attache's dead-letter queues."""

    error_code = "not_found"
    retryable = False


class BadSelection(AttacheError, ValueError):
    """Requeue or purge without a valid choice: message ids, or all with the expected count."""

    error_code = "bad_selection"
    retryable = False


class MoreThanExpected(AttacheError):
    """The queue holds more dead letters than the operator confirmed; nothing was done."""

    error_code = "more_than_expected"
    retryable = False

    def __init__(self, xq: str, depth: int, expected: int):
        super().__init__(f"{xq} holds {depth} message(s), more than the {expected} confirmed; nothing was done. "
                         "Look at the queue again and confirm what it holds now, or name the message ids.")
        self.xq, self.depth, self.expected = xq, depth, expected


class QueueBusy(AttacheError):
    """Another listing, requeue or purge of the dead-letter queue held it for longer than the caller waits (the
    web's lock bound); nothing was done. It was answered as RabbitMQ being down (an adversarial run)."""

    error_code = "queue_busy"
    retryable = False


# --- resumable uploads (tus, app.core.resumable) -------------------------------------


class UnsupportedMediaType(UploadRejected):
    """The request body's ``Content-Type`` is not what the route reads."""

    error_code = "bad_content_type"


class UnsupportedContentEncoding(UnsupportedMediaType):
    """The body comes in a content coding (``Content-Encoding: gzip``): attache stores the bytes it is sent and
    decodes none. A gzipped JPEG was refused ``415 unsupported_format``, as if the file were no image (an
    adversarial run)."""

    error_code = "unsupported_content_encoding"


class UploadNotFound(UploadRejected):
    """No resumable upload with this id belongs to the caller (or it was terminated or forgotten)."""

    error_code = "not_found"


class UploadExpired(UploadRejected):
    """The resumable upload expired: its partial bytes are gone or about to go."""

    error_code = "upload_expired"


class OffsetMismatch(UploadRejected):
    """A PATCH's ``Upload-Offset`` is not where the upload stands (a lost answer, or a concurrent PATCH)."""

    error_code = "offset_mismatch"


class UploadLocked(UploadRejected):
    """Another request is writing this resumable upload right now (tus's 423): retry after a moment."""

    error_code = "upload_locked"
    retryable = True


class ChecksumMismatch(UploadRejected):
    """The PATCH body does not match its ``Upload-Checksum`` (tus's 460); nothing of it was kept."""

    error_code = "checksum_mismatch"


class PartsMissing(UploadRejected):
    """The partial bytes of an upload are not all in storage: it cannot finish, and is terminated."""

    error_code = "upload_lost"


# --- webhooks (app.core.webhooks) ------------------------------------------------------


class InvalidWebhook(AttacheError, ValueError):
    """A webhook subscription that cannot be registered as sent: no http(s) URL, or unknown events."""

    error_code = "bad_request"
    retryable = False


class WebhookTargetRefused(AttacheError):
    """The webhook URL resolves to a loopback, private, link-local or otherwise internal address (SSRF)."""

    error_code = "webhook_target_refused"
    retryable = False


class WebhookNotFound(AttacheError):
    """No such webhook subscription or delivery."""

    error_code = "not_found"
    retryable = False


class DeliveryInFlight(AttacheError):
    """The webhook delivery is being sent right now; it can be sent again once that attempt has ended (within the
    deliverer's timeout). A redelivery cleared the attempt's claim and another thread sent it at the same time (an
    adversarial run)."""

    error_code = "delivery_in_flight"
    retryable = True


def error_code(error: BaseException) -> str:
    return error.error_code if isinstance(error, AttacheError) else "internal_error"


def retryable(error: BaseException) -> bool:
    """What the error's class says (:attr:`AttacheError.retryable`); any other exception: yes."""
    return error.retryable if isinstance(error, AttacheError) else True


class _NotRetryable:
    """``isinstance(error, NOT_RETRYABLE)`` is true when ``retryable(error)`` is false.

    For an API that takes exception types and checks them with ``isinstance``,
    such as a Dramatiq actor's ``throws``. It is not a class: ``except`` refuses it.
    """

    def __instancecheck__(self, error: object) -> bool:
        return isinstance(error, BaseException) and not retryable(error)

    def __repr__(self) -> str:
        return "NOT_RETRYABLE"


NOT_RETRYABLE = _NotRetryable()


def sanitized_reason(error: BaseException) -> str:
    """A reason safe to store and show: attache's own message, or only the type name.

    Vendor exception texts can carry URLs with credentials, file paths or
    SQL; they are never stored. Our own errors are written to be safe.
    """
    if isinstance(error, AttacheError):
        text = error.reason
    else:
        text = f"unexpected {type(error).__name__}"
    return text.replace("\n", " ")[:500]
