"""Every JSON body of the HTTP API, each shape defined once as a pydantic model.

The views build their answers from these models (:func:`app.web.responses.answer`),
and :mod:`app.web.contract` writes the OpenAPI document's schemas from the same
models, so the document cannot drift from what the routes return.

Conventions:

* an answer model is closed (``extra="forbid"``) and every field is required:
  attache always sends every field, ``null`` when it has no value;
* timestamps are written with :meth:`datetime.isoformat` (``+00:00``, not ``Z``);
* a request model describes a valid body; the views check bodies themselves,
  so that each refusal keeps its own message, with the limits named here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    RootModel,
    TypeAdapter,
    WithJsonSchema,
)

from app.adapters.broker.dead_letter_tools import (
    MAX_EXPECTED,
    MAX_MESSAGE_IDS,
    TRACEBACK_CHARS,
)
from app.adapters.postgres.models import JobState
from app.core import search

#: the largest ``batch`` of a backfill request
MAX_BACKFILL_BATCH = 10_000
DEFAULT_BACKFILL_BATCH = 100

#: a job's state as the API writes it (the values of :class:`~app.adapters.postgres.models.JobState`)
StateName = Literal[tuple(state.value for state in JobState)]
Timestamp = Annotated[datetime, PlainSerializer(datetime.isoformat, return_type=str),
                      WithJsonSchema({"type": "string", "format": "date-time"})]
Sha256 = Annotated[str, Field(pattern="^[0-9a-f]{64}$", description="SHA-256 of the bytes, lowercase hex.")]
Count = Annotated[int, Field(ge=0)]


def as_found(documented: Any) -> Any:
    """A value copied from a message as it came: documented as ``documented``, passed through unchecked.

    A malformed dead letter must still be listed, or it could not be purged.
    """
    return Annotated[Any, WithJsonSchema(TypeAdapter(documented).json_schema())]


FoundText = as_found(str | None)
FoundCount = as_found(int | None)
FoundInt = as_found(int)


class Body(BaseModel):
    """An answer's body: closed, every field sent."""

    model_config = ConfigDict(extra="forbid")


# --- every refusal ---------------------------------------------------------------


class Error(Body):
    """Every refusal and error answer of the API."""

    error: str = Field(description="A stable, machine-readable code.")
    message: str = Field(description="A short human explanation.")


# --- attachments -----------------------------------------------------------------


class UploadAccepted(Body):
    """The upload is durable: staged, recorded and queued."""

    id: UUID = Field(description="The attachment id.")
    job_id: UUID
    state: StateName = Field(description="`queued` for a new upload; for an idempotent replay "
                                        "(`Idempotent-Replayed: true`) the job's current state.")
    pipeline_version: int
    size: int = Field(ge=1, description="Bytes received.")
    sha256: Sha256


class Source(Body):
    sha256: Sha256
    content_type: str
    size: int


class PipelineRef(Body):
    version: int
    fingerprint: str = Field(description="SHA-256 of the version's definition (`app/core/pipeline.py`).")


class Stripped(Body):
    """What the source carried that the derivative does not keep (null: the header could not be read again)."""

    exif_tags: list[str] | None = Field(description="The EXIF tags of the source, by name.")
    gps: bool | None = Field(description="The source carried a GPS position.")
    xmp: bool | None
    comment: bool | None
    icc_profile: bool | None = Field(description="The source carried an ICC profile.")
    icc_converted: bool | None = Field(description="The pixels were converted from it to sRGB.")


class Provenance(Body):
    """What made a variant; written with it and never changed once published."""

    source: Source
    pipeline: PipelineRef
    spec: dict[str, Any] | None = Field(description="The variant's definition; null for `original`.")
    copy_: str | None = Field(alias="copy", description="For `original`: the uploaded bytes, unchanged.")
    renderer: str | None
    libraries: dict[str, str | None] | None = Field(description="Pillow and the codec libraries (libjpeg, "
                                                                "libwebp, libavif, libheif, ...) by name.")
    encoder: dict[str, Any] | None = Field(description="The encoder and the settings it was called with.")
    stripped: Stripped | None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Variant(Body):
    """A published variant."""

    url: str = Field(json_schema_extra={"format": "uri-reference"},
                     description="Where to download it (relative; carries `?version=` when the status was "
                                 "asked for a version).")
    content_type: str
    width: int
    height: int
    size: int
    sha256: Sha256
    provenance: Provenance | None = Field(description="With `?provenance=1`: what made it (null without, and for "
                                                      "variants published before provenance was recorded).")


class VersionState(Body):
    pipeline_version: int
    state: StateName


class AttachmentStatus(Body):
    """An attachment's state, published variants and versions."""

    id: UUID
    job_id: UUID = Field(description="The job shown: the asked version's, else the newest ready one, else the newest.")
    state: StateName
    filename: str = Field(description="The sanitized display name (`upload` when none).")
    content_type: str = Field(description="Sniffed from the bytes, not taken from the client.")
    size: int
    sha256: Sha256
    width: int
    height: int
    pipeline_version: int
    attempt: Count
    error_code: str | None
    error_reason: str | None
    variants: dict[str, Variant] = Field(description="The published variants of the job shown, by name "
                                                     "(`original`, `thumbnail`, ...); empty until the job is "
                                                     "`ready`.")
    created_at: Timestamp
    ready_at: Timestamp | None
    versions: list[VersionState] = Field(description="Every pipeline version this attachment has a job at.")


# --- /v1/ops: jobs -------------------------------------------------------------------


class JobSummary(Body):
    """A job as listed."""

    job_id: UUID
    attachment_id: UUID
    pipeline_version: int
    state: StateName
    attempt: Count = Field(description="Managed attempts used so far.")
    max_attempts: int
    error_code: str | None
    error_reason: str | None
    lease_owner: str | None = Field(description="The worker whose running step holds the job; null while a "
                                                 "`processing` job waits between steps for its next message.")
    lease_expires_at: Timestamp | None
    next_attempt_at: Timestamp | None
    created_at: Timestamp
    updated_at: Timestamp
    ready_at: Timestamp | None


class JobList(Body):
    """A page of jobs, newest created first."""

    jobs: list[JobSummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last.")


class FoundJob(Body):
    """One pipeline version's job of a found attachment."""

    job_id: UUID
    pipeline_version: int
    state: StateName
    error_code: str | None


class Found(Body):
    """An attachment a search found."""

    attachment_id: UUID
    filename: str
    uploader: str
    size: Count
    content_type: str
    sha256: Sha256
    created_at: Timestamp
    matched_by: list[Literal[search.ATTACHMENT_ID, search.JOB_ID, search.SHA256, search.UPLOADER, search.FILENAME]]
    matched_job_ids: list[UUID] = Field(description="The jobs whose id matched.")
    jobs: list[FoundJob] = Field(description="Every pipeline version's job.")


class SearchResult(Body):
    """What a search found: one match is the attachment to open; several are listed."""

    query: str = Field(description="What was searched for, trimmed.")
    matches: list[Found] = Field(description="Newest first; an id match before the others.")
    more: bool = Field(description="Other attachments match too: type more of it.")


class Trace(Body):
    """The W3C trace context the job was created with."""

    traceparent: str
    tracestate: str | None


class Transition(Body):
    """One entry of a job's history."""

    at: Timestamp
    from_: str | None = Field(alias="from", description="null for the creation of the job.")
    to: JobState
    attempt: int
    who: str = Field(description="The actor: `web:<principal>`, a worker, the scheduler, `operator:<principal>`, ...")
    error_code: str | None
    reason: str | None


class AuditEntry(Body):
    """One audited action on the job."""

    at: Timestamp
    actor: str
    action: str = Field(examples=["job.replay"])
    reason: str | None
    details: Any = Field(description="Action-specific JSON (an object for the actions attache records).")


class JobVariant(Body):
    """A variant the job recorded (published or waiting for the publish step), with its provenance."""

    variant: str
    published: bool
    content_type: str
    width: int
    height: int
    size: int
    sha256: Sha256
    provenance: Provenance | None


class Job(JobSummary):
    """A job with its transitions, trace context, audit trail and recorded variants."""

    trace: Trace
    history: list[Transition]
    audit: list[AuditEntry]
    variants: list[JobVariant]


class ReplayRequest(BaseModel):
    """Why the job is replayed."""

    reason: str = Field(min_length=1, pattern=r"\S", description="Why; required, kept in the job's history and "
                                                                   "the audit log (first 1000 characters).")


class OutboxStatus(Body):
    pending: Count = Field(description="Messages not yet published.")
    oldest_created_at: Timestamp | None
    oldest_age_seconds: float = Field(description="0 when nothing is pending.")


class LeaseStatus(Body):
    processing: Count
    expired: Count = Field(description="Processing jobs whose lease has expired (the scheduler requeues them).")
    next_expiry: Timestamp | None


# --- /v1/ops: dead letters -------------------------------------------------------------


class DeadLetterQueue(Body):
    name: str = Field(description="The dead-letter queue (`<queue>.XQ`).")
    queue: str = Field(description="The step queue it belongs to.")
    messages: Count = Field(description="Ready messages (0 if it does not exist yet).")


class DeadLetterQueues(Body):
    queues: list[DeadLetterQueue]


class Death(Body):
    """One entry of RabbitMQ's ``x-death`` header, as RabbitMQ wrote it."""

    reason: FoundText
    queue: FoundText
    count: FoundCount
    time: FoundText


class RecordedDeath(Body):
    """Why it died, as the worker recorded it."""

    error_code: str
    reason: str
    recorded_at: Timestamp
    job_id: UUID | None


class DeadLetter(Body):
    """A dead letter, decoded from its Dramatiq envelope."""

    message_id: str | None
    actor_name: FoundText = Field(description="From the Dramatiq envelope, else the AMQP `type` property.")
    queue_name: FoundText = Field(description="From the Dramatiq envelope.")
    body: Any = Field(description="The job message (`args[0]` of the envelope), or the whole body when it is not a "
                                  "Dramatiq envelope (decoded JSON, else text).")
    retries: FoundInt = Field(description="Dramatiq retries (only when PostgreSQL was down).")
    death: list[Death] = Field(description="RabbitMQ's `x-death` header.")
    recorded: RecordedDeath | None = Field(description="Why it died, as the worker recorded it; null if not "
                                                       "recorded.")
    job_state: StateName | None = Field(description="The current state of the job the message names (null: it "
                                                       "names none, or no such job). A dead letter whose job is "
                                                       "`ready` or `failed` has nothing left to do.")
    traceback: Annotated[str, Field(max_length=TRACEBACK_CHARS)] | None


class DeadLetterMessages(Body):
    queue: str = Field(description="The queue name as given in the path.")
    depth: Count = Field(description="Messages in the queue, counted while the listed ones were held: the "
                                     "`expected` to confirm for an `all` requeue or purge.")
    messages: list[DeadLetter] = Field(description="Looked at, not consumed: they stay in the queue, in order.")


AuditReason = Annotated[str | None, Field(description="Recorded in the audit log.")]


class ChosenMessages(BaseModel):
    """The chosen dead letters, by id."""

    model_config = ConfigDict(extra="forbid")

    message_ids: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, max_length=MAX_MESSAGE_IDS,
        description="The dead letters to act on, as listed (printable text); no other message is touched.")
    reason: AuditReason = None


class AllMessages(BaseModel):
    """Every message of the queue, confirmed by count."""

    model_config = ConfigDict(extra="forbid")

    all: Literal[True] = Field(description="Every message of the queue...")
    expected: int = Field(ge=1, le=MAX_EXPECTED,
                          description="...of which the operator saw this many (the listing's `depth`). A queue "
                                      "holding more is refused with 409 and nothing is done; never more than the "
                                      "depth at the start is taken.")
    reason: AuditReason = None


class DeadLetterChoice(RootModel[ChosenMessages | AllMessages]):
    """What to act on: the chosen message ids, or all with the count the operator confirms."""


class RequeueResult(Body):
    requeued: Count
    message_ids: list[str | None] = Field(description="The ids requeued, oldest first (null: a message without an "
                                                      "id, with `all`).")
    not_found: list[str] = Field(description="Chosen ids that were not in the queue (always empty with `all`).")


class PurgeResult(Body):
    purged: Count
    message_ids: list[str | None] = Field(description="The ids deleted, oldest first (null: a message without an "
                                                      "id, with `all`).")
    not_found: list[str] = Field(description="Chosen ids that were not in the queue (always empty with `all`).")


# --- /v1/ops: pipeline versions ----------------------------------------------------------


class BackfillRequest(BaseModel):
    """A backfill, or only its estimate."""

    model_config = ConfigDict(extra="forbid")

    dry_run: bool = Field(False, description="Only estimate; create nothing (`true` or `false`: any "
                                                 "other value is refused).")
    batch: int = Field(DEFAULT_BACKFILL_BATCH, ge=1, le=MAX_BACKFILL_BATCH,
                       description="Jobs created per transaction.")
    reason: AuditReason = Field(None, description="Why; kept in the audit log and each new job's history "
                                                  "(else \"backfill to version N\").")


class BackfillEstimate(Body):
    """The dry run: what a backfill would create."""

    dry_run: Literal[True]
    to_version: int
    candidates: Count = Field(description="Attachments ready at an older version with no job at this one.")
    renders: Count
    seconds_per_job: float | None = Field(description="The steps' time per job (`step_runs`), averaged over the "
                                                      "last 200 ready jobs; null if none.")
    estimated_worker_seconds: float | None


class BackfillResult(Body):
    """What a backfill created."""

    dry_run: Literal[False]
    to_version: int
    created: Count = Field(description="Jobs created.")
    published: Count = Field(description="Of which published now; the scheduler publishes the rest.")


# --- probes and this document ---------------------------------------------------------------

CheckResult = Annotated[str, Field(pattern="^(ok|unavailable: .+)$")]


class Liveness(Body):
    status: Literal["ok"]


class Checks(Body):
    database: CheckResult
    broker: CheckResult
    storage: CheckResult
    #: the web's temporary directory, where upload bodies are spooled
    spool: CheckResult


class Readiness(Body):
    status: Literal["ready", "unavailable"]
    checks: Checks


class ApiDocument(BaseModel):
    """The OpenAPI 3.1 document."""

    model_config = ConfigDict(extra="allow")

    openapi: str


# --- webhooks and events ------------------------------------------------------------------

EventType = Literal["attachment.ready", "attachment.failed", "version.ready"]
DeliveryState = Literal["pending", "delivered", "failed"]


class WebhookRequest(BaseModel):
    """A webhook endpoint to register."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2000, json_schema_extra={"format": "uri"},
                     description="http(s); every address its host resolves to must be public unless "
                                 "`ATTACHE_WEBHOOK_ALLOW_PRIVATE=1` (else 422).")
    events: list[EventType] = Field(min_length=1)
    uploader: str | None = Field(default=None, description="Only this uploader's attachments (default: all).")


class DeliveryCounts(Body):
    pending: Count
    delivered: Count
    failed: Count


class WebhookSubscription(Body):
    """A registered endpoint (its secret is shown only when it is registered)."""

    id: UUID
    url: str
    events: list[EventType]
    uploader: str | None
    created_by: str
    created_at: Timestamp
    disabled_at: Timestamp | None
    last_sequence: Count = Field(description="The `webhook-sequence` of its latest delivery (gapless from 1).")
    deliveries: DeliveryCounts


class WebhookCreated(WebhookSubscription):
    secret: str = Field(pattern="^whsec_", description="The signing secret (Standard Webhooks `whsec_` form); "
                                                       "shown this once.")


class WebhookList(Body):
    webhooks: list[WebhookSubscription]


class WebhookDelivery(Body):
    """One event for one subscription, and how its delivery goes."""

    id: int
    subscription_id: UUID
    sequence: int = Field(description="Per subscription, gapless; sent as `webhook-sequence`.")
    event_id: str = Field(description="Sent as `webhook-id`; the same on every attempt.")
    event_type: EventType
    event_sequence: int = Field(description="The event's place in `GET /v1/events`.")
    state: DeliveryState
    attempts: Count
    next_attempt_at: Timestamp | None = Field(description="When a pending delivery is tried next.")
    last_status: int | None = Field(description="The HTTP status of the last attempt (null: no answer).")
    last_error: str | None
    created_at: Timestamp
    delivered_at: Timestamp | None


class WebhookDeliveries(Body):
    deliveries: list[WebhookDelivery]


class RedeliverRequest(BaseModel):
    """Why the delivery is sent again."""

    reason: str = Field(min_length=1, pattern=r"\S", description="Why; required, kept in the audit log.")


class OptionalReason(BaseModel):
    """Why (optional, kept in the audit log): the body of a webhook subscription's disable and enable."""

    reason: AuditReason = None


class EventData(Body):
    attachment_id: UUID
    job_id: UUID
    pipeline_version: int
    state: StateName
    error_code: str | None
    uploader: str
    attachment_url: str = Field(json_schema_extra={"format": "uri-reference"})


class Event(Body):
    """A completion event: exactly the body a webhook delivers (the Standard Webhooks payload form)."""

    id: str = Field(description="Stable; the `webhook-id` of its deliveries.")
    sequence: int = Field(description="Global, gapless, in commit order: the replay cursor.")
    type: EventType
    timestamp: str = Field(description="When the transition committed (ISO 8601, UTC).")
    data: EventData


class EventPage(Body):
    events: list[Event]
    next_after: int = Field(description="Pass as `after` for the next page (the last event's sequence, or `after`).")
    more: bool = Field(description="The page is full: ask again with `next_after`.")
