"""The OpenAPI 3.1 document of attache's JSON/HTTP API, served at ``GET /v1/openapi.json``.

Written by hand from the code of :mod:`app.web` (not generated from it), and
kept true by ``tests/test_openapi.py``: the document must validate as
OpenAPI 3.1, name exactly the Flask routes under ``/v1`` plus ``/healthz``,
``/readyz`` and ``/metrics``, and hold when Schemathesis runs against the
live web process (no 5xx; every status, content type, header and body as
documented).

The HTML pages (``/`` and the ``/ops`` console) are not part of the API and
are not described here.

Conventions:

* every refusal is a JSON ``Error`` object ``{"error": code, "message": text}``;
  each response lists the ``error`` codes it can carry;
* a few enums are taken from the code (job states, dead-letter queues) so
  the document cannot drift from them.
"""

from __future__ import annotations

import copy
from importlib import metadata
from typing import Any

from app.adapters.broker.dead_letter_tools import MAX_EXPECTED, MAX_MESSAGE_IDS
from app.adapters.postgres.models import JobState
from app.core.steps import Step
from app.web.request import FORM_MAX_BYTES

JSON = "application/json"
BEARER = [{"bearer": []}]
PUBLIC: list = []  # no security requirement


def _ref(kind: str, name: str) -> dict:
    return {"$ref": f"#/components/{kind}/{name}"}


def _schema(name: str) -> dict:
    return _ref("schemas", name)


def _nullable(schema_type: str, **extra: Any) -> dict:
    return {"type": [schema_type, "null"], **extra}


def _json(schema: dict) -> dict:
    return {JSON: {"schema": schema}}


def _error(description: str, codes: list[str], headers: dict | None = None) -> dict:
    """A refusal: the Error object, with the ``error`` codes this response can carry."""
    response: dict[str, Any] = {
        "description": description.rstrip(".") + " (`error`: " + ", ".join(f"`{c}`" for c in codes) + ").",
        "content": _json({"allOf": [_schema("Error"), {"properties": {"error": {"enum": codes}}}]}),
    }
    if headers:
        response["headers"] = headers
    return response


def _ok(description: str, schema: dict, headers: dict | None = None) -> dict:
    response: dict[str, Any] = {"description": description, "content": _json(schema)}
    if headers:
        response["headers"] = headers
    return response


def _object(properties: dict, *, required: list[str] | None = None, closed: bool = True, **extra: Any) -> dict:
    """A JSON object; ``required`` defaults to every property (attache always sends them all, maybe null)."""
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "required": list(properties) if required is None else required}
    if closed:
        schema["additionalProperties"] = False
    schema.update(extra)
    return schema


def _header(description: str, schema: dict | None = None) -> dict:
    return {"description": description, "schema": schema or {"type": "string"}}


RETRY_AFTER = {"Retry-After": _header("Seconds to wait before retrying (always `5`).", {"type": "string",
                                                                                       "pattern": "^[0-9]+$"})}

#: the answers every protected operation can give before its view runs (app.web.access.protect)
UNAUTHORIZED = {"401": _ref("responses", "Unauthorized")}
OPERATOR_ONLY = {"401": _ref("responses", "Unauthorized"), "403": _ref("responses", "Forbidden")}
#: PostgreSQL unreachable: the app-wide handler answers 503 `database_unavailable` with Retry-After
SERVER_ERROR = {"503": _ref("responses", "DatabaseUnavailable")}
#: every route but the upload refuses a body above FORM_MAX_BYTES when its view reads it (app.web.request)
TOO_LARGE_BODY = {"413": _error(f"The request body is larger than {FORM_MAX_BYTES // (1024 * 1024)} MiB.",
                                ["too_large"])}


# --- components -----------------------------------------------------------------


def _schemas() -> dict:
    job_state = {"type": "string", "enum": [state.value for state in JobState]}
    date_time = {"type": "string", "format": "date-time"}
    nullable_date_time = _nullable("string", format="date-time")
    sha256 = {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "SHA-256 of the bytes, lowercase hex."}
    job_summary_properties = {
        "job_id": {"type": "string", "format": "uuid"},
        "attachment_id": {"type": "string", "format": "uuid"},
        "pipeline_version": {"type": "integer"},
        "state": job_state,
        "attempt": {"type": "integer", "minimum": 0, "description": "Managed attempts used so far."},
        "max_attempts": {"type": "integer"},
        "error_code": _nullable("string"),
        "error_reason": _nullable("string"),
        "lease_owner": _nullable("string", description="The worker whose running step holds the job; null "
                                 "while a `processing` job waits between steps for its next message."),
        "lease_expires_at": nullable_date_time,
        "next_attempt_at": nullable_date_time,
        "created_at": date_time,
        "updated_at": date_time,
        "ready_at": nullable_date_time,
    }
    return {
        "Error": _object({
            "error": {"type": "string", "description": "A stable, machine-readable code."},
            "message": {"type": "string", "description": "A short human explanation."},
        }, description="Every refusal and error answer of the API."),
        "UploadAccepted": _object({
            "id": {"type": "string", "format": "uuid", "description": "The attachment id."},
            "job_id": {"type": "string", "format": "uuid"},
            "state": {**job_state, "description": "`queued` for a new upload; for an idempotent replay "
                                                  "(`Idempotent-Replayed: true`) the job's current state."},
            "pipeline_version": {"type": "integer"},
            "size": {"type": "integer", "minimum": 1, "description": "Bytes received."},
            "sha256": sha256,
        }, description="The upload is durable: staged, recorded and queued."),
        "Variant": _object({
            "url": {"type": "string", "format": "uri-reference",
                    "description": "Where to download it (relative; carries `?version=` when the status was "
                                   "asked for a version)."},
            "content_type": {"type": "string"},
            "width": {"type": "integer"},
            "height": {"type": "integer"},
            "size": {"type": "integer"},
            "sha256": sha256,
        }),
        "AttachmentStatus": _object({
            "id": {"type": "string", "format": "uuid"},
            "job_id": {"type": "string", "format": "uuid",
                       "description": "The job shown: the asked version's, else the newest ready one, "
                                      "else the newest."},
            "state": job_state,
            "filename": {"type": "string", "description": "The sanitized display name (`upload` when none)."},
            "content_type": {"type": "string", "description": "Sniffed from the bytes, not taken from the client."},
            "size": {"type": "integer"},
            "sha256": sha256,
            "width": {"type": "integer"},
            "height": {"type": "integer"},
            "pipeline_version": {"type": "integer"},
            "attempt": {"type": "integer", "minimum": 0},
            "error_code": _nullable("string"),
            "error_reason": _nullable("string"),
            "variants": {"type": "object", "additionalProperties": _schema("Variant"),
                         "description": "The published variants of the job shown, by name (`original`, "
                                        "`thumbnail`, ...); empty until the job is `ready`."},
            "created_at": date_time,
            "ready_at": nullable_date_time,
            "versions": {"type": "array", "description": "Every pipeline version this attachment has a job at.",
                         "items": _object({"pipeline_version": {"type": "integer"}, "state": job_state})},
        }),
        "JobSummary": _object(job_summary_properties),
        "JobList": _object({"jobs": {"type": "array", "items": _schema("JobSummary")}}),
        "Job": _object({
            **job_summary_properties,
            "trace": _object({"traceparent": {"type": "string"}, "tracestate": _nullable("string")},
                             description="The W3C trace context the job was created with."),
            "history": {"type": "array", "items": _object({
                "at": date_time,
                "from": _nullable("string", description="null for the creation of the job."),
                "to": job_state,
                "attempt": {"type": "integer"},
                "who": {"type": "string", "description": "The actor: `web:<principal>`, a worker, the scheduler, "
                                                         "`operator:<principal>`, ..."},
                "error_code": _nullable("string"),
                "reason": _nullable("string"),
            })},
            "audit": {"type": "array", "items": _object({
                "at": date_time,
                "actor": {"type": "string"},
                "action": {"type": "string", "examples": ["job.replay"]},
                "reason": _nullable("string"),
                "details": {"description": "Action-specific JSON (an object for the actions attache records)."},
            })},
        }, description="A job with its transitions, trace context and audit trail."),
        "OutboxStatus": _object({
            "pending": {"type": "integer", "minimum": 0, "description": "Messages not yet published."},
            "oldest_created_at": nullable_date_time,
            "oldest_age_seconds": {"type": "number", "description": "0 when nothing is pending."},
        }),
        "LeaseStatus": _object({
            "processing": {"type": "integer", "minimum": 0},
            "expired": {"type": "integer", "minimum": 0,
                        "description": "Processing jobs whose lease has expired (the scheduler requeues them)."},
            "next_expiry": nullable_date_time,
        }),
        "DeadLetterQueues": _object({"queues": {"type": "array", "items": _object({
            "name": {"type": "string", "description": "The dead-letter queue (`<queue>.XQ`)."},
            "queue": {"type": "string", "description": "The step queue it belongs to."},
            "messages": {"type": "integer", "minimum": 0, "description": "Ready messages (0 if it does not "
                                                                         "exist yet)."},
        })}}),
        "DeadLetter": _object({
            "message_id": _nullable("string"),
            "actor_name": {"description": "From the Dramatiq envelope, else the AMQP `type` property.",
                           "type": ["string", "null"]},
            "queue_name": {"description": "From the Dramatiq envelope.", "type": ["string", "null"]},
            "body": {"description": "The job message (`args[0]` of the envelope), or the whole body when it is "
                                    "not a Dramatiq envelope (decoded JSON, else text)."},
            "retries": {"type": "integer", "description": "Dramatiq retries (only when PostgreSQL was down)."},
            "death": {"type": "array", "description": "RabbitMQ's `x-death` header.", "items": _object({
                "reason": _nullable("string"), "queue": _nullable("string"), "count": _nullable("integer"),
                "time": _nullable("string"),
            })},
            "recorded": {"description": "Why it died, as the worker recorded it; null if not recorded.",
                         "oneOf": [{"type": "null"}, _object({
                             "error_code": {"type": "string"},
                             "reason": {"type": "string"},
                             "recorded_at": date_time,
                             "job_id": _nullable("string", format="uuid"),
                         })]},
            "traceback": _nullable("string", maxLength=2000),
        }),
        "DeadLetterMessages": _object({
            "queue": {"type": "string", "description": "The queue name as given in the path."},
            "depth": {"type": "integer", "minimum": 0,
                      "description": "Messages in the queue, counted while the listed ones were held: the "
                                     "`expected` to confirm for an `all` requeue or purge."},
            "messages": {"type": "array", "items": _schema("DeadLetter"),
                         "description": "Looked at, not consumed: they stay in the queue, in order."},
        }),
        "ReplayRequest": _object({
            "reason": {"type": "string", "minLength": 1, "pattern": "\\S",
                       "description": "Why; required, kept in the job's history and the audit log "
                                      "(first 1000 characters)."},
        }, closed=False),
        "DeadLetterChoice": {"oneOf": [
            _object({
                "message_ids": {"type": "array", "minItems": 1, "maxItems": MAX_MESSAGE_IDS,
                                "items": {"type": "string", "minLength": 1},
                                "description": "The dead letters to act on, as listed; no other message is "
                                               "touched."},
                "reason": {"type": "string", "description": "Recorded in the audit log."},
            }, required=["message_ids"]),
            _object({
                "all": {"const": True, "description": "Every message of the queue..."},
                "expected": {"type": "integer", "minimum": 1, "maximum": MAX_EXPECTED,
                             "description": "...of which the operator saw this many (the listing's `depth`). "
                                            "A queue holding more is refused with 409 and nothing is done; "
                                            "never more than the depth at the start is taken."},
                "reason": {"type": "string", "description": "Recorded in the audit log."},
            }, required=["all", "expected"]),
        ], "description": "What to act on: the chosen message ids, or all with the count the operator confirms."},
        "RequeueResult": _object({
            "requeued": {"type": "integer", "minimum": 0},
            "message_ids": {"type": "array", "items": _nullable("string"),
                            "description": "The ids requeued, oldest first (null: a message without an id, "
                                           "with `all`)."},
            "not_found": {"type": "array", "items": {"type": "string"},
                          "description": "Chosen ids that were not in the queue (always empty with `all`)."},
        }),
        "PurgeResult": _object({
            "purged": {"type": "integer", "minimum": 0},
            "message_ids": {"type": "array", "items": _nullable("string"),
                            "description": "The ids deleted, oldest first (null: a message without an id, "
                                           "with `all`)."},
            "not_found": {"type": "array", "items": {"type": "string"},
                          "description": "Chosen ids that were not in the queue (always empty with `all`)."},
        }),
        "BackfillRequest": _object({
            "dry_run": {"type": "boolean", "default": False,
                        "description": "Only estimate; create nothing (any truthy JSON value counts)."},
            "batch": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 100,
                      "description": "Jobs created per transaction."},
        }, required=[], closed=False),
        "BackfillEstimate": _object({
            "dry_run": {"const": True},
            "to_version": {"type": "integer"},
            "candidates": {"type": "integer", "minimum": 0,
                           "description": "Attachments ready at an older version with no job at this one."},
            "renders": {"type": "integer", "minimum": 0},
            "seconds_per_job": _nullable("number", description="Average of recent ready jobs; null if none."),
            "estimated_worker_seconds": _nullable("number"),
        }),
        "BackfillResult": _object({
            "dry_run": {"const": False},
            "to_version": {"type": "integer"},
            "created": {"type": "integer", "minimum": 0, "description": "Jobs created."},
            "published": {"type": "integer", "minimum": 0,
                          "description": "Of which published now; the scheduler publishes the rest."},
        }),
        "Readiness": _object({
            "status": {"type": "string", "enum": ["ready", "unavailable"]},
            "checks": _object({name: {"type": "string", "pattern": "^(ok|unavailable: .+)$"}
                               for name in ("database", "broker", "storage")}),
        }),
    }


def _responses() -> dict:
    return {
        "Unauthorized": {
            "description": "No `Authorization: Bearer` header, or an unknown token (`error`: `unauthorized`).",
            "headers": {"WWW-Authenticate": _header("`Bearer realm=\"attache\"`")},
            "content": _json({"allOf": [_schema("Error"), {"properties": {"error": {"const": "unauthorized"}}}]}),
        },
        "DatabaseUnavailable": {
            "description": "PostgreSQL is unreachable (`error`: `database_unavailable`); retry after the delay.",
            "headers": RETRY_AFTER,
            "content": _json({"allOf": [_schema("Error"),
                                        {"properties": {"error": {"const": "database_unavailable"}}}]}),
        },
        "Forbidden": {
            "description": "The token is valid but lacks the `operator` role (`error`: `forbidden`).",
            "content": _json({"allOf": [_schema("Error"), {"properties": {"error": {"const": "forbidden"}}}]}),
        },
    }


def _parameters() -> dict:
    return {
        "AttachmentId": {"name": "attachment_id", "in": "path", "required": True,
                         "schema": {"type": "string", "format": "uuid"}},
        "JobId": {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}},
        "Version": {"name": "version", "in": "query", "required": False,
                    "description": "A pipeline version. Without it: the newest version with a `ready` job, else "
                                   "the newest job. A value that is not an integer is ignored.",
                    "schema": {"type": "integer"}},
        "Queue": {"name": "queue", "in": "path", "required": True,
                  "description": "A step queue or its dead-letter queue (both name the same `.XQ`); any other "
                                 "name answers 404.",
                  "schema": {"type": "string", "enum": _dead_letter_queue_names()}},
    }


def _dead_letter_queue_names() -> list[str]:
    names = [step.queue for step in Step]
    return names + [f"{name}.XQ" for name in names]


# --- paths ----------------------------------------------------------------------


def _upload() -> dict:
    def header(name: str, description: str) -> dict:
        return {"name": name, "in": "header", "required": False, "description": description,
                "schema": {"type": "string"}}

    raw = {"schema": {"type": "string", "format": "binary"}}
    return {"post": {
        "operationId": "uploadAttachment",
        "tags": ["attachments"],
        "summary": "Upload a photo",
        "description": "Streams the body to disk while hashing it, checks the digests, probes the image header, "
                       "stages the original and records the job, its history and its first message in one "
                       "transaction. `202` means the work can no longer be lost (RabbitMQ being down is not a "
                       "refusal: the outbox keeps the message). Any answer other than `202` leaves nothing "
                       "behind. Send the file as multipart field `file`, or as the raw body with its content "
                       "type (any type but `application/x-www-form-urlencoded` is taken as raw bytes, no "
                       "Content-Type is refused; the format is always sniffed from the bytes).",
        "security": BEARER,
        "parameters": [
            header("Content-Digest", "RFC 9530, e.g. `sha-256=:<base64>:`; `sha-256` is verified against the "
                                     "bytes received."),
            header("Content-MD5", "Base64 MD5 of the bytes, verified."),
            header("Idempotency-Key", "1-255 printable characters (surrounding quotes are dropped). A retry "
                                      "of the same content by the same principal while the key is remembered "
                                      "returns the first attachment with `Idempotent-Replayed: true`; the same key "
                                      "with other content is refused (422)."),
            header("traceparent", "W3C trace context, kept with the job and carried to the workers; an invalid "
                                  "one is replaced by a fresh trace."),
            header("tracestate", "W3C vendor trace state, kept with the job."),
            header("Content-Disposition", "For a raw body: `attachment; filename=\"...\"` (or `filename*=`) gives "
                                          "the display name, sanitized."),
        ],
        "requestBody": {"required": True, "content": {
            "multipart/form-data": {
                "schema": {"type": "object", "required": ["file"],
                           "properties": {"file": {"type": "string", "format": "binary",
                                                   "description": "The photo; the part's filename is the "
                                                                  "display name, sanitized."}}},
                "encoding": {"file": {"contentType": "application/octet-stream, image/*"}},
            },
            "image/*": raw,
            "application/octet-stream": raw,
        }},
        "responses": {
            "202": _ok("Accepted: staged, recorded and queued (or an idempotent replay).", _schema("UploadAccepted"), {
                "Location": {**_header("The attachment's status URL, `/v1/attachments/{id}`."), "required": True},
                "Idempotent-Replayed": _header("`true` when this answers a retry with the same Idempotency-Key "
                                               "(nothing new was created).", {"type": "string", "const": "true"}),
            }),
            "400": _error("Malformed request: no `file` part, an unusable content type, an empty body, a bad "
                          "Idempotency-Key or digest header, or the client went away mid-body (`incomplete_body`: fewer "
                          "bytes than `Content-Length`, or a broken chunked framing; nothing is stored and the "
                          "Idempotency-Key stays unused).",
                          ["missing_file", "bad_content_type", "empty_body", "incomplete_body", "bad_idempotency_key",
                           "bad_digest_header", "unsupported_digest", "bad_request", "http_error"]),
            **UNAUTHORIZED,
            "413": _error("Too large: more bytes than the upload limit, or the image declares too many pixels, "
                          "too long a side, or would need more memory to render than the decode budget.",
                          ["too_large", "decompression_bomb", "image_too_large"]),
            "415": _error("Not an image format attache processes, or a corrupt header.",
                          ["unsupported_format", "corrupt_image"]),
            "422": _error("A digest header does not match the bytes, or the Idempotency-Key was used for other "
                          "content.", ["digest_mismatch", "idempotency_key_reused"]),
            "503": _error("PostgreSQL or storage is down, or the web's temporary directory cannot hold the "
                          "upload; retry later.", ["database_unavailable", "storage_unavailable",
                                                   "spool_unavailable"], RETRY_AFTER),
        },
    }}


def _status() -> dict:
    return {"get": {
        "operationId": "getAttachment",
        "tags": ["attachments"],
        "summary": "An attachment's state, variants and versions",
        "description": "An uploader sees only its own attachments (others answer 404); an operator sees all.",
        "security": BEARER,
        "parameters": [_ref("parameters", "AttachmentId"), _ref("parameters", "Version")],
        "responses": {
            "200": _ok("The status document.", _schema("AttachmentStatus")),
            **UNAUTHORIZED,
            "404": _error("No such attachment (or not yours), or no job at the asked version.", ["not_found"]),
            **SERVER_ERROR,
        },
    }}


def _download(operation_id: str, summary: str, extra_parameters: list) -> dict:
    binary = {"image/*": {"schema": {"type": "string", "format": "binary"}}}
    common_headers = {
        "ETag": _header("`\"<sha256>\"` of the whole object."),
        "Cache-Control": _header("With `?version=N`, `private, max-age=31536000, immutable`: the bytes behind a "
                                 "pinned URL never change. Without it, `private, no-cache`: the URL follows the "
                                 "newest ready version, so a cache revalidates with `If-None-Match`."),
        "Content-Disposition": _header("`attachment; filename=\"...\"; filename*=UTF-8''...`"),
        "Accept-Ranges": _header("`bytes`"),
        "X-Content-Type-Options": _header("`nosniff`"),
        "Content-Security-Policy": _header("`default-src 'none'; sandbox`"),
    }
    return {"get": {
        "operationId": operation_id,
        "tags": ["attachments"],
        "summary": summary,
        "description": "Only published objects are served. With presigned downloads configured (S3 storage and "
                       "`ATTACHE_PRESIGN_SECONDS` > 0) the answer is a redirect to the object store; otherwise "
                       "the bytes stream through the web, with single-range support.",
        "security": BEARER,
        "parameters": [
            _ref("parameters", "AttachmentId"),
            *extra_parameters,
            _ref("parameters", "Version"),
            {"name": "Range", "in": "header", "required": False,
             "description": "One `bytes=first-last`, `bytes=first-` or `bytes=-suffix` range; several ranges or a "
                            "malformed one are answered with the whole object.",
             "schema": {"type": "string"}},
            {"name": "If-Range", "in": "header", "required": False,
             "description": "The ETag; if it differs, the Range is ignored.", "schema": {"type": "string"}},
            {"name": "If-None-Match", "in": "header", "required": False,
             "description": "An ETag list; a match answers 304.", "schema": {"type": "string"}},
        ],
        "responses": {
            "200": {"description": "The whole object, with the content type it was published with.",
                    "headers": {**common_headers, "Content-Length": _header("Bytes.", {"type": "string"})},
                    "content": binary},
            "206": {"description": "The requested range.",
                    "headers": {**common_headers,
                                "Content-Range": {**_header("`bytes first-last/size`"), "required": True},
                                "Content-Length": _header("Bytes in the range.")},
                    "content": binary},
            "302": {"description": "Presigned downloads: the object store's URL.",
                    "headers": {"Location": {**_header("A presigned URL, valid for `ATTACHE_PRESIGN_SECONDS`."),
                                             "required": True},
                                "Cache-Control": _header("`no-store`")}},
            "304": {"description": "Not modified: `If-None-Match` names the ETag. No body.",
                    "headers": common_headers},
            **UNAUTHORIZED,
            "404": _error("No such attachment (or not yours), no job at the asked version, or no such variant in "
                          "a ready job.", ["not_found"]),
            "409": _error("The job is not ready yet (or failed): nothing is published.", ["not_ready"]),
            "416": {"description": "Range not satisfiable. No body.",
                    "headers": {"Content-Range": {**_header("`bytes */size`"), "required": True},
                                "ETag": common_headers["ETag"]}},
            "500": _error("The published object is missing from storage (`effect_missing`: reported, never "
                          "hidden).", ["effect_missing"]),
            "503": _error("Storage or PostgreSQL is unavailable; retry later.",
                          ["storage_unavailable", "database_unavailable"], RETRY_AFTER),
        },
    }}


def _ops_get(operation_id: str, summary: str, schema: dict, *, parameters: list | None = None,
             errors: dict | None = None, description: str | None = None, database: bool = True) -> dict:
    operation: dict[str, Any] = {"operationId": operation_id, "tags": ["ops"], "summary": summary,
                                 "security": BEARER}
    if description:
        operation["description"] = description
    if parameters:
        operation["parameters"] = parameters
    operation["responses"] = {"200": _ok("OK.", schema), **OPERATOR_ONLY, **_with_database(errors or {}, database)}
    return {"get": operation}


def _with_database(errors: dict, database: bool = True) -> dict:
    """Add PostgreSQL's 503; where RabbitMQ's 503 is there too, one 503 names both codes."""
    if not database:
        return errors
    if "503" not in errors:
        return {**errors, **SERVER_ERROR}
    return {**errors, "503": _error("RabbitMQ or PostgreSQL is unavailable; retry later.",
                                    ["broker_unavailable", "database_unavailable"], RETRY_AFTER)}


def _ops_post(operation_id: str, summary: str, description: str, body: dict, ok: dict, *, parameters: list,
              errors: dict, body_required: bool = False) -> dict:
    return {"post": {
        "operationId": operation_id, "tags": ["ops"], "summary": summary, "description": description,
        "security": BEARER, "parameters": parameters,
        "requestBody": {"required": body_required, "content": _json(body)},
        "responses": {"200": ok, **OPERATOR_ONLY, **TOO_LARGE_BODY, **_with_database(errors)},
    }}


BROKER_DOWN = {"503": _error("RabbitMQ is unavailable; retry later.", ["broker_unavailable"], RETRY_AFTER)}
NO_SUCH_QUEUE = {"404": _error("Not an attache step queue or dead-letter queue.", ["not_found"])}
DEAD_LETTER_ACTION_ERRORS = {
    "400": _error("The body does not name `message_ids`, or `all` with `expected` (see the request schema), or "
                  "`reason` is not a string.", ["bad_request"]),
    **NO_SUCH_QUEUE,
    "409": _error("`all`: the queue holds more messages than `expected`; nothing was done.", ["more_than_expected"]),
    **BROKER_DOWN,
}
DEAD_LETTER_AUDIT = ("The `audit_log` row is committed before RabbitMQ is touched (`details.status`: `intent`) and "
                     "completed afterwards (`completed` with what was done, or `failed`).")


def _paths() -> dict:
    queue = _ref("parameters", "Queue")
    job_id = _ref("parameters", "JobId")
    return {
        "/v1/attachments": _upload(),
        "/v1/attachments/{attachment_id}": _status(),
        "/v1/attachments/{attachment_id}/original": _download(
            "downloadOriginal", "Download the original (as uploaded)", []),
        "/v1/attachments/{attachment_id}/variants/{name}": _download(
            "downloadVariant", "Download a variant", [{
                "name": "name", "in": "path", "required": True,
                "description": "A variant name as listed in the status document (`original` is one too).",
                "schema": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,31}$",
                           "examples": ["thumbnail", "crop", "optimized", "original"]}}]),
        "/v1/openapi.json": {"get": {
            "operationId": "getOpenAPI", "tags": ["meta"], "summary": "This document", "security": PUBLIC,
            "responses": {"200": _ok("The OpenAPI 3.1 document.", {"type": "object", "required": ["openapi"]})},
        }},
        "/v1/ops/jobs": _ops_get(
            "listJobs", "Jobs, most recently updated first", _schema("JobList"),
            parameters=[
                {"name": "state", "in": "query", "required": False,
                 "description": "Only jobs in this state (an empty value means all).",
                 "schema": {"type": "string", "enum": [state.value for state in JobState]}},
                {"name": "pipeline_version", "in": "query", "required": False,
                 "description": "Only jobs of this version (not an integer: ignored).", "schema": {"type": "integer"}},
                {"name": "limit", "in": "query", "required": False,
                 "description": "At most this many, clamped to 1..1000 (not an integer: 100).",
                 "schema": {"type": "integer", "default": 100}},
            ],
            errors={"400": _error("`state` is not a job state.", ["bad_request"])}),
        "/v1/ops/jobs/{job_id}": _ops_get(
            "getJob", "A job with its history, trace context and audit trail", _schema("Job"),
            parameters=[job_id], errors={"404": _error("No such job.", ["not_found"])}),
        "/v1/ops/jobs/{job_id}/replay": _ops_post(
            "replayJob", "Replay a failed job",
            "`failed` -> `queued` with a fresh attempt budget; the history and the audit log name the operator "
            "and the reason. Recorded variants stay, so the job resumes at its first unfinished step.",
            _schema("ReplayRequest"), _ok("The replayed job, now `queued`.", _schema("Job")),
            parameters=[job_id], body_required=True,
            errors={
                "400": _error("`reason` is missing, blank or not a string.", ["reason_required", "bad_request"]),
                "404": _error("No such job.", ["not_found"]),
                "409": _error("The job is not `failed`.", ["conflict"]),
            }),
        "/v1/ops/outbox": _ops_get("getOutbox", "Unpublished outbox messages", _schema("OutboxStatus")),
        "/v1/ops/leases": _ops_get("getLeases", "Leases of processing jobs", _schema("LeaseStatus")),
        "/v1/ops/dlq": _ops_get("listDeadLetterQueues", "Depth of every dead-letter queue",
                                _schema("DeadLetterQueues"), errors=BROKER_DOWN, database=False),
        "/v1/ops/dlq/{queue}/messages": _ops_get(
            "listDeadLetters", "Look at dead letters without consuming them", _schema("DeadLetterMessages"),
            description="Each message is decoded from its Dramatiq envelope and joined with the reason the worker "
                        "recorded. Messages held by a concurrent call are not seen.",
            parameters=[queue, {"name": "limit", "in": "query", "required": False,
                                "description": "At most this many, clamped to 1..500 (not an integer: 50).",
                                "schema": {"type": "integer", "default": 50}}],
            errors={**NO_SUCH_QUEUE, **BROKER_DOWN}),
        "/v1/ops/dlq/{queue}/requeue": _ops_post(
            "requeueDeadLetters", "Move chosen dead letters back to their step queue",
            "Publishes each chosen message to the step queue (with confirms) before acking the dead letter. "
            "A message not chosen is handed back in its place, unchanged. " + DEAD_LETTER_AUDIT,
            _schema("DeadLetterChoice"), _ok("Done.", _schema("RequeueResult")),
            parameters=[queue], body_required=True, errors=DEAD_LETTER_ACTION_ERRORS),
        "/v1/ops/dlq/{queue}/purge": _ops_post(
            "purgeDeadLetters", "Delete chosen dead letters for good",
            "Deletes each chosen message (one by one, never a queue purge). A message not chosen, or "
            "dead-lettered after the count was confirmed, is not touched. " + DEAD_LETTER_AUDIT,
            _schema("DeadLetterChoice"), _ok("Done.", _schema("PurgeResult")),
            parameters=[queue], body_required=True, errors=DEAD_LETTER_ACTION_ERRORS),
        "/v1/ops/pipelines/{version}/backfill": _ops_post(
            "backfillPipeline", "Reprocess existing attachments into a pipeline version",
            "Creates a job at `version` for every attachment that is ready at an older version and has none at "
            "this one, in batches, through the outbox. Safe to run again or twice at once. With `dry_run` it "
            "only estimates.",
            _schema("BackfillRequest"),
            {"description": "The estimate (dry run) or what was created.",
             "content": _json({"oneOf": [_schema("BackfillEstimate"), _schema("BackfillResult")]})},
            parameters=[{"name": "version", "in": "path", "required": True, "description": "The target version.",
                         "schema": {"type": "integer", "minimum": 0}}],
            errors={"400": _error("The body is JSON but not an object (`[]`, `0`, `\"\"`, `false` and `null` "
                                  "count as `{}`), or `batch` is not an integer in 1..10000 (`1.0` is refused).",
                                  ["bad_request"]),
                    "404": _error("The pipeline version is not registered.", ["not_found"])}),
        "/healthz": {"get": {
            "operationId": "healthz", "tags": ["meta"], "summary": "Liveness: the process answers",
            "security": PUBLIC,
            "responses": {"200": _ok("Alive.", _object({"status": {"const": "ok"}}))},
        }},
        "/readyz": {"get": {
            "operationId": "readyz", "tags": ["meta"], "summary": "Readiness: PostgreSQL, RabbitMQ and storage answer",
            "security": PUBLIC,
            "responses": {"200": _ok("Every dependency answers.", _schema("Readiness")),
                          "503": _ok("At least one dependency does not answer (no Retry-After).",
                                     _schema("Readiness"))},
        }},
        "/metrics": {"get": {
            "operationId": "metrics", "tags": ["meta"], "summary": "Prometheus metrics (operator token)",
            "security": BEARER,
            "responses": {"200": {"description": "The Prometheus text exposition format.",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}},
                          **OPERATOR_ONLY, **SERVER_ERROR},
        }},
    }


def _version() -> str:
    try:
        return metadata.version("attache")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout without install
        return "0.0.0"


def _sorted_responses(paths: dict) -> dict:
    for item in paths.values():
        for operation in item.values():
            operation["responses"] = dict(sorted(operation["responses"].items()))
    return paths


def document() -> dict:
    """The whole OpenAPI 3.1.0 document (a fresh dict on every call)."""
    return copy.deepcopy({
        "openapi": "3.1.0",
        "info": {
            "title": "attache",
            "version": _version(),
            "summary": "A durable photo-upload pipeline.",
            "description": "Upload photos, follow their processing, download the derivatives; operators inspect "
                           "and repair the pipeline under `/v1/ops`. Every operation but `/healthz`, `/readyz` "
                           "and this document needs `Authorization: Bearer <token>`; roles are `uploader` (its own "
                           "attachments only) and `operator` (everything, and `/v1/ops` and `/metrics`). Every "
                           "error body is an `Error` object.",
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "tags": [
            {"name": "attachments", "description": "Upload, status and downloads."},
            {"name": "ops", "description": "The operator API (role `operator`)."},
            {"name": "meta", "description": "Probes, metrics and this document."},
        ],
        "security": BEARER,
        "paths": _sorted_responses(_paths()),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "A token from `ATTACHE_API_TOKENS`."}},
            "schemas": _schemas(),
            "responses": _responses(),
            "parameters": _parameters(),
        },
    })
