"""``/v1/ops``: the operator API (role ``operator``)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Literal

from flask import Blueprint, current_app, request
from werkzeug.exceptions import BadRequest

from app.adapters.broker.dead_letter_tools import MAX_EXPECTED, MAX_MESSAGE_IDS
from app.core import id_prefixes, operations
from app.core import search as finder
from app.core.steps import Step
from app.errors import (
    BrokerUnavailable,
    DeliveryInFlight,
    InvalidWebhook,
    JobConflict,
    JobNotFound,
    MissingReason,
    MoreThanExpected,
    QueueBusy,
    SearchTooBroad,
    UnknownQueue,
    WebhookNotFound,
    WebhookTargetRefused,
)
from app.web.access import identity, protect
from app.web.contract import in_path, in_query, ok, operation, refused
from app.web.responses import answer, refusal
from app.web.responses import error as _error
from app.web.schemas import (
    DEFAULT_BACKFILL_BATCH,
    MAX_BACKFILL_BATCH,
    AllMessages,
    BackfillEstimate,
    BackfillRequest,
    BackfillResult,
    ChosenMessages,
    DeadLetterChoice,
    DeadLetterMessages,
    DeadLetterQueues,
    Job,
    JobList,
    LeaseStatus,
    OptionalReason,
    OutboxStatus,
    PurgeResult,
    RedeliverRequest,
    ReplayRequest,
    RequeueResult,
    SearchResult,
    StateName,
    WebhookCreated,
    WebhookDeliveries,
    WebhookDelivery,
    WebhookList,
    WebhookRequest,
    WebhookSubscription,
)

bp = Blueprint("ops", __name__, url_prefix="/v1/ops")
protect(bp, role="operator")


def _services():
    return current_app.extensions["attache"]


@bp.errorhandler(JobNotFound)
@bp.errorhandler(JobConflict)
@bp.errorhandler(MissingReason)
@bp.errorhandler(UnknownQueue)
@bp.errorhandler(MoreThanExpected)
@bp.errorhandler(QueueBusy)
@bp.errorhandler(InvalidWebhook)
@bp.errorhandler(WebhookTargetRefused)
@bp.errorhandler(WebhookNotFound)
@bp.errorhandler(DeliveryInFlight)
def refuse(exc):
    return refusal(exc)


@bp.errorhandler(BrokerUnavailable)
def broker_down(exc):
    return refusal(exc, "RabbitMQ is unavailable; retry later")


@bp.errorhandler(BadRequest)
def bad_request(exc):
    return _error(400, "bad_request", exc.description)


NO_SUCH_JOB = refused("No such job.", "not_found")


@bp.get("/jobs")
@operation(
    "listJobs", "Jobs, newest first, a page at a time", tag="ops",
    description="Filters combine (and). Keyset-paginated: each page ends where the last job's "
                "`(created_at, id)` is, so jobs that change state or arrive meanwhile neither repeat nor skip a page.",
    parameters=[
        in_query("state", "Only jobs in this state (empty: any).", StateName),
        in_query("pipeline_version", "Only jobs of this version.", int),
        in_query("uploader", "Only the jobs of this uploader's attachments.", str),
        in_query("error_code", "Only jobs with this error code (failed, or waiting to retry).", str),
        in_query("since", "Created at or after this time (ISO 8601; without a zone, UTC).", datetime),
        in_query("until", "Created before this time.", datetime),
        in_query("cursor", "The `next_cursor` of the previous page.", str),
        in_query("limit", "At most this many, clamped to 1..1000 (not an integer: 100).", int, default=100),
    ],
    answers={200: ok("OK.", JobList),
             400: refused("A filter or the cursor is not valid; the message names it.", "bad_request")},
)
def jobs():
    try:
        page = operations.find_jobs(_services().engine, operations.JobFilter.parse(request.args),
                                    cursor=request.args.get("cursor") or None,
                                    limit=request.args.get("limit", 100, type=int))
    except ValueError as exc:
        return _error(400, "bad_request", str(exc))
    return answer(JobList.model_validate(page))


@bp.get("/search")
@operation(
    "searchAttachments", "Find an upload by id, job id, a unique start of either, sha256, uploader or filename",
    tag="ops",
    description=f"Tried as each at once: an attachment or job id or its start ({id_prefixes.MIN_PREFIX}+ hex "
                f"digits), a sha256 or its first {finder.MIN_SHA256_PREFIX}+ hex digits, an uploader (exactly), "
                f"a part of the filename ({finder.MIN_FRAGMENT}+ characters, any case; one of {finder.MIN_FRAGMENT}+ "
                f"characters with fewer than {finder.MIN_FRAGMENT} letters or digits is `400`). One match is the "
                "attachment to open; several are listed.",
    parameters=[
        in_query("q", "What to look for.", str),
        in_query("limit", f"At most this many, clamped to 1..{finder.MAX_MATCHES} (not an integer: "
                          f"{finder.MAX_MATCHES}).", int, default=finder.MAX_MATCHES),
    ],
    answers={200: ok("OK.", SearchResult),
             400: refused("`q` is missing, blank, too long or has control characters, or a filename part with "
                          "too few letters or digits; or the search matched "
                          f"too much to finish in {finder.TIME_LIMIT_SECONDS:g} s.", "bad_request", "search_too_broad")},
)
def search():
    try:
        found = finder.search(_services().engine, request.args.get("q", ""),
                              limit=request.args.get("limit", finder.MAX_MATCHES, type=int))
    except ValueError as exc:
        return _error(400, "bad_request", str(exc))
    except SearchTooBroad as exc:
        return _error(400, exc.error_code, str(exc))
    return answer(SearchResult.model_validate(found))


@bp.get("/jobs/<uuid:job_id>")
@operation("getJob", "A job with its history, trace context and audit trail", tag="ops",
           answers={200: ok("OK.", Job), 404: NO_SUCH_JOB})
def job(job_id: uuid.UUID):
    return answer(Job.model_validate(operations.show_job(_services(), job_id)))


@bp.post("/jobs/<uuid:job_id>/replay")
@operation(
    "replayJob", "Replay a failed job", tag="ops",
    description="`failed` -> `queued` with a fresh attempt budget; the history and the audit log name the operator "
                "and the reason. Recorded variants stay, so the job resumes at its first unfinished step.",
    body=ReplayRequest,
    answers={200: ok("The replayed job, now `queued`.", Job),
             400: refused("The body is neither empty nor a JSON object sent as `application/json`, or `reason` is "
                          "missing, blank or not a string.", "reason_required", "bad_request"),
             404: NO_SUCH_JOB,
             409: refused("The job is not `failed`, or its original is gone (kept "
                          "`ATTACHE_FAILED_RETENTION_SECONDS` after a failure).", "conflict"),
             503: refused("Storage is unavailable, or its disk has no room for what the job will write beside the "
                          "work not yet done; retry later. `outcome_unknown`: the replay's COMMIT was sent and its "
                          "answer lost, and it may have been made: look at the job before replaying it again. "
                          "`made_unread`: it was made, and audited, and the job could not be read back.",
                          "storage_unavailable", "database_unavailable", "outcome_unknown", "made_unread",
                          retry_after=True)},
)
def replay(job_id: uuid.UUID):
    reason = _optional_reason()
    return answer(Job.model_validate(operations.replay(_services(), job_id, operator=identity().principal,
                                                       reason=reason)))


@bp.get("/outbox")
@operation("getOutbox", "Unpublished outbox messages", tag="ops", answers={200: ok("OK.", OutboxStatus)})
def outbox():
    return answer(OutboxStatus.model_validate(operations.outbox_status(_services())))


@bp.get("/leases")
@operation("getLeases", "Leases of processing jobs", tag="ops", answers={200: ok("OK.", LeaseStatus)})
def leases():
    return answer(LeaseStatus.model_validate(operations.lease_status(_services())))


# --- dead letters ---------------------------------------------------------------


def _dead_letters():
    return _services().dead_letters


def _reason(body) -> str | None:
    """The optional ``reason`` of an audited action: a string, or absent."""
    reason = body.get("reason") if isinstance(body, dict) else None
    if reason is not None and not isinstance(reason, str):
        raise BadRequest("reason must be a string")
    return reason


def _optional_object() -> dict:
    """The JSON object an action's optional body holds: no body, ``{}``; any other body that is not a JSON object
    sent as ``application/json`` (not JSON, a form, an array) is refused. Read leniently (``get_json(silent=True)
    or {}``), a dry run's body sent as a form, or with a trailing comma, was taken for no body, and the backfill
    it asked to estimate ran (an adversarial run); a reason was dropped the same way."""
    if request.args:  # `?dry_run=true` was not read, and the backfill ran (a re-attack)
        raise BadRequest(f"this action takes no query parameters ({', '.join(sorted(request.args))}): send them as "
                         "fields of its JSON body")
    data = request.get_data(cache=True)
    if not data:
        return {}
    repeated: list[str] = []  # `{"dry_run": true, "dry_run": false}`: the last one won, and the backfill ran

    def fields_once(pairs: list[tuple[str, object]]) -> dict:
        names = [name for name, _ in pairs]
        repeated.extend(name for name in names if names.count(name) > 1)
        return dict(pairs)

    try:
        body = json.loads(data, object_pairs_hook=fields_once) if request.is_json else None
    except ValueError:
        body = None
    if repeated:
        raise BadRequest(f"the field {repeated[0]!r} is given more than once")
    if not isinstance(body, dict):
        raise BadRequest('the body must be a JSON object sent as application/json, such as {"reason": "..."}, '
                         'or empty')
    return body


def _optional_reason() -> str | None:
    """The ``reason`` of an audited action whose JSON body is optional (:func:`_optional_object`)."""
    return _reason(_optional_object())


BROKER_DOWN = refused("RabbitMQ is unavailable; retry later.", "broker_unavailable", retry_after=True)
BROKER_OR_DATABASE_DOWN = refused("RabbitMQ or PostgreSQL is unavailable; retry later.",
                                  "broker_unavailable", "database_unavailable", retry_after=True)
NO_SUCH_QUEUE = refused("Not an attache step queue or dead-letter queue.", "not_found")
_STEP_QUEUES = tuple(step.queue for step in Step)
QUEUE = in_path("queue", "A step queue or its dead-letter queue (both name the same `.XQ`); any other name "
                         "answers 404.", Literal[_STEP_QUEUES + tuple(f"{name}.XQ" for name in _STEP_QUEUES)])


@bp.get("/dlq")
@operation("listDeadLetterQueues", "Depth of every dead-letter queue", tag="ops", database=False,
           answers={200: ok("OK.", DeadLetterQueues), 503: BROKER_DOWN})
def dlq_queues():
    return answer(DeadLetterQueues(queues=_dead_letters().queues()))


@bp.get("/dlq/<queue>/messages")
@operation(
    "listDeadLetters", "Look at dead letters without consuming them", tag="ops",
    description="Each message is decoded from its Dramatiq envelope and joined with the reason the worker "
                "recorded. Messages held by a concurrent call are not seen.",
    parameters=[QUEUE,
                in_query("limit", "At most this many, clamped to 1..500 (not an integer: 50).", int, default=50)],
    answers={200: ok("OK.", DeadLetterMessages), 404: NO_SUCH_QUEUE,
             409: refused("Another requeue or purge of the queue held it for longer than the web waits for its "
                          "lock.", "queue_busy"),
             503: BROKER_OR_DATABASE_DOWN},
)
def dlq_messages(queue: str):
    limit = request.args.get("limit", 50, type=int)
    listing = _dead_letters().listing(queue, limit=max(1, min(limit, 500)))
    return answer(DeadLetterMessages(queue=queue, depth=listing["depth"], messages=listing["messages"]))


#: the fields of a dead-letter action's body, as its request schema names them
CHOICE_FIELDS = tuple(dict.fromkeys([*ChosenMessages.model_fields, *AllMessages.model_fields]))


def _chosen(body) -> dict:
    """``{"message_ids": [...]}`` or ``{"all": true, "expected": N}``: the keyword arguments of the action. Another
    field is refused: a purge, which cannot be undone, was done with a ``dry_run`` the endpoint does not take (a
    re-attack)."""
    if not isinstance(body, dict) or not body:
        raise BadRequest("send a JSON object naming message_ids, or all with expected")
    unknown = sorted(set(body) - set(CHOICE_FIELDS))
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}; the fields are {', '.join(CHOICE_FIELDS)}")
    ids, everything, expected = body.get("message_ids"), body.get("all", False), body.get("expected")
    if everything is True:
        if ids is not None:
            raise BadRequest("name message_ids or all, not both")
        if isinstance(expected, bool) or not isinstance(expected, int) or not 1 <= expected <= MAX_EXPECTED:
            raise BadRequest(f"all needs expected: the count you saw, an integer in 1..{MAX_EXPECTED}; "
                             "a queue holding more is refused")
        return {"expected": expected}
    if everything is not False:
        raise BadRequest("all must be true or false")
    if expected is not None:
        raise BadRequest("expected goes with all")
    if not (isinstance(ids, list) and 1 <= len(ids) <= MAX_MESSAGE_IDS
            and all(isinstance(i, str) and i for i in ids)):
        raise BadRequest(f"message_ids must be a list of 1..{MAX_MESSAGE_IDS} non-empty strings "
                         "(or send all with expected)")
    if not all(i.isprintable() for i in ids):  # the audit log (JSONB) cannot hold a NUL or a lone surrogate
        raise BadRequest("message ids are printable text: no control characters")
    return {"message_ids": ids}


DEAD_LETTER_ACTION_ANSWERS = {
    400: refused("The body does not name `message_ids`, or `all` with `expected` (see the request schema), has "
                 "a field it does not take or one given twice, or `reason` is not a string.", "bad_request"),
    404: NO_SUCH_QUEUE,
    409: refused("`all`: the queue holds more messages than `expected` (`more_than_expected`), or another "
                 "listing, requeue or purge of the queue held it for longer than the web waits for its lock "
                 "(`queue_busy`); nothing was done.", "more_than_expected", "queue_busy"),
    503: refused("RabbitMQ or PostgreSQL is unavailable; retry later. `outcome_unknown` (the PostgreSQL broker): "
                 "the move's COMMIT got no answer, and whether it landed cannot be told: the chosen messages were "
                 "all moved or none were; list the queue before acting again.",
                 "broker_unavailable", "database_unavailable", "outcome_unknown", retry_after=True),
}
DEAD_LETTER_AUDIT = ("The `audit_log` row is committed before RabbitMQ is touched (`details.status`: `intent`) and "
                     "completed afterwards (`completed` with what was done, `failed`, or `unknown` naming what may "
                     "have been done).")


@bp.post("/dlq/<queue>/requeue")
@operation(
    "requeueDeadLetters", "Move chosen dead letters back to their step queue", tag="ops",
    description="Publishes each chosen message to the step queue (with confirms) before acking the dead letter. A "
                "message not chosen is handed back in its place, unchanged. " + DEAD_LETTER_AUDIT,
    parameters=[QUEUE], body=DeadLetterChoice,
    answers={200: ok("Done.", RequeueResult), **DEAD_LETTER_ACTION_ANSWERS},
)
def dlq_requeue(queue: str):
    body = _optional_object()  # a field given twice (`"all": false, "all": true`) took the last (a re-attack)
    reason = _reason(body)
    return answer(RequeueResult.model_validate(
        _dead_letters().requeue(queue, actor=f"operator:{identity().principal}", reason=reason, **_chosen(body))))


@bp.post("/dlq/<queue>/purge")
@operation(
    "purgeDeadLetters", "Delete chosen dead letters for good", tag="ops",
    description="Deletes each chosen message (one by one, never a queue purge). A message not chosen, or "
                "dead-lettered after the count was confirmed, is not touched. " + DEAD_LETTER_AUDIT,
    parameters=[QUEUE], body=DeadLetterChoice,
    answers={200: ok("Done.", PurgeResult), **DEAD_LETTER_ACTION_ANSWERS},
)
def dlq_purge(queue: str):
    body = _optional_object()  # a field given twice (`"all": false, "all": true`) took the last (a re-attack)
    reason = _reason(body)
    return answer(PurgeResult.model_validate(
        _dead_letters().purge(queue, actor=f"operator:{identity().principal}", reason=reason, **_chosen(body))))


# --- pipeline versions ----------------------------------------------------------------


@bp.post("/pipelines/<int:version>/backfill")
@operation(
    "backfillPipeline", "Reprocess existing attachments into a pipeline version", tag="ops",
    description="Creates a job at `version` for every attachment that is ready at an older version and has none at "
                "this one, in batches, through the outbox. Safe to run again or twice at once. With `dry_run` it "
                "only estimates.",
    parameters=[in_path("version", "The target version.")], body=BackfillRequest,
    answers={
        200: ok("The estimate (dry run) or what was created.", BackfillEstimate, BackfillResult),
        400: refused("The body is neither empty nor a JSON object sent as `application/json` (a form, an array, "
                     "JSON with a trailing comma, a field given twice), the request has query parameters, "
                     "`dry_run` is not `true` or `false`, or "
                     f"`batch` is not an integer in 1..{MAX_BACKFILL_BATCH} (`1.0` is refused), `reason` is not a "
                     "string, or a field is not one of these (a mistyped `dryRun` would otherwise run the "
                     "backfill).", "bad_request"),
        404: refused("The pipeline version is not registered.", "not_found"),
    },
)
def backfill(version: int):
    from app.core import backfill as backfill_module
    from app.core import pipeline

    body = _optional_object()
    unknown = sorted(set(body) - set(BackfillRequest.model_fields))
    if unknown:  # a mistyped "dryRun" ran the whole backfill (an adversarial run)
        return _error(400, "bad_request", f"unknown field(s) {', '.join(unknown)}; the fields are "
                                          f"{', '.join(BackfillRequest.model_fields)}")
    try:
        pipeline.get(version)
    except LookupError as exc:
        return _error(404, "not_found", str(exc))
    batch = body.get("batch", DEFAULT_BACKFILL_BATCH)
    if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= MAX_BACKFILL_BATCH:
        return _error(400, "bad_request", f"batch must be an integer between 1 and {MAX_BACKFILL_BATCH}")
    reason = _reason(body)
    if not isinstance(body.get("dry_run", False), bool):  # `null` and `{}` were taken for false: it ran (a re-attack)
        return _error(400, "bad_request", "dry_run must be true or false")
    estimate = backfill_module.estimate(_services(), version).as_dict()
    if body.get("dry_run"):
        return answer(BackfillEstimate(dry_run=True, **estimate))
    result = backfill_module.run(_services(), version, batch=batch, actor=f"backfill:operator:{identity().principal}",
                                 reason=reason)
    return answer(BackfillResult(dry_run=False, to_version=version, **result))


# --- webhooks -------------------------------------------------------------------------


def _webhook_conn():
    from app.adapters.postgres.db import transaction

    return transaction(_services().engine)


NO_SUCH_WEBHOOK = refused("No such webhook subscription.", "not_found")


@bp.post("/webhooks")
@operation(
    "registerWebhook", "Register a webhook endpoint", tag="webhooks",
    description="Deliveries are signed per the Standard Webhooks specification with the `secret` answered here, "
                "shown this once. The URL's host is resolved and every address must be public (not loopback, "
                "private, link-local, ...) unless `ATTACHE_WEBHOOK_ALLOW_PRIVATE=1`; it is checked again before "
                "each delivery. Audited (`webhook.register`).",
    body=WebhookRequest,
    answers={201: ok("Registered.", WebhookCreated),
             400: refused("The body is not an object with an http(s) `url` and a non-empty list of known "
                          "`events` (or `uploader` is not a name).", "bad_request"),
             422: refused("The URL's host resolves to an internal address, or does not resolve.",
                          "webhook_target_refused")},
)
def register_webhook():
    from app.core import webhooks

    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise InvalidWebhook("send a JSON object with url and events")
    unknown = sorted(set(body) - {"url", "events", "uploader"})
    if unknown:
        raise InvalidWebhook(f"unknown field(s): {', '.join(unknown)}")
    with _webhook_conn() as conn:
        created = webhooks.register(conn, url=body.get("url"), kinds=body.get("events"),
                                    uploader=body.get("uploader"), actor=f"operator:{identity().principal}",
                                    allow_private=_services().settings.webhook_allow_private)
    return answer(WebhookCreated.model_validate(created), 201)


@bp.get("/webhooks")
@operation("listWebhooks", "Webhook subscriptions with their delivery counts", tag="webhooks",
           answers={200: ok("OK.", WebhookList)})
def list_webhooks():
    from app.core import webhooks

    with _webhook_conn() as conn:
        return answer(WebhookList(webhooks=webhooks.subscriptions(conn)))


@bp.post("/webhooks/<uuid:subscription_id>/disable")
@operation("disableWebhook", "Stop delivering to a webhook endpoint", tag="webhooks",
           description="No new deliveries are made for it and pending ones are no longer sent. Audited "
                       "(`webhook.disable`).",
           body=OptionalReason,
           answers={200: ok("The subscription, disabled.", WebhookSubscription), 404: NO_SUCH_WEBHOOK,
                    400: refused("The body is not a JSON object, or its `reason` is not a string.", "bad_request")})
def disable_webhook(subscription_id: uuid.UUID):
    from app.core import webhooks

    reason = _optional_reason()
    with _webhook_conn() as conn:
        return answer(WebhookSubscription.model_validate(webhooks.disable(
            conn, subscription_id, actor=f"operator:{identity().principal}", reason=reason)))


@bp.post("/webhooks/<uuid:subscription_id>/enable")
@operation("enableWebhook", "Deliver to a disabled webhook endpoint again", tag="webhooks",
           description="Undoes a disable (an operator's, or the one a `410 Gone` answer makes): its pending "
                       "deliveries are sent, and the events it missed while disabled get their deliveries, numbered "
                       "on from its last one, in event order. Enabling an enabled subscription changes nothing. "
                       "Audited (`webhook.enable`, with the number of deliveries recovered; an enable that changed "
                       "nothing too).",
           body=OptionalReason,
           answers={200: ok("The subscription, enabled.", WebhookSubscription), 404: NO_SUCH_WEBHOOK,
                    400: refused("The body is not a JSON object, or its `reason` is not a string.", "bad_request")})
def enable_webhook(subscription_id: uuid.UUID):
    from app.core import webhooks

    reason = _optional_reason()
    return answer(WebhookSubscription.model_validate(webhooks.enable(
        _services().engine, subscription_id, actor=f"operator:{identity().principal}", reason=reason)))


@bp.get("/webhooks/<uuid:subscription_id>/deliveries")
@operation("listWebhookDeliveries", "A subscription's deliveries, newest first", tag="webhooks",
           parameters=[in_query("state", "Only deliveries in this state.", Literal["pending", "delivered", "failed"]),
                       in_query("limit", "At most this many, clamped to 1..1000 (default 100).", int, default=100)],
           answers={200: ok("OK.", WebhookDeliveries), 404: NO_SUCH_WEBHOOK,
                    400: refused("`state` is not a delivery state.", "bad_request")})
def webhook_deliveries(subscription_id: uuid.UUID):
    from app.core import webhooks

    state = request.args.get("state") or None
    if state not in (None, "pending", "delivered", "failed"):
        return _error(400, "bad_request", "state must be pending, delivered or failed")
    with _webhook_conn() as conn:
        return answer(WebhookDeliveries(deliveries=webhooks.deliveries(
            conn, subscription_id, state=state, limit=request.args.get("limit", 100, type=int))))


@bp.get("/webhooks/failing")
@operation("listFailingDeliveries", "Deliveries that failed for good or keep failing", tag="webhooks",
           description="`failed` deliveries, and `pending` ones whose last attempt did not succeed, most recently "
                       "tried first.",
           answers={200: ok("OK.", WebhookDeliveries)})
def failing_deliveries():
    from app.core import webhooks

    with _webhook_conn() as conn:
        return answer(WebhookDeliveries(deliveries=webhooks.failing(conn)))


@bp.post("/webhooks/deliveries/<int:delivery_id>/redeliver")
@operation("redeliverWebhook", "Send a delivery again", tag="webhooks",
           description="`pending` again with a fresh attempt budget: same event id, body and sequence, so a "
                       "receiver that already has it deduplicates it. Audited (`webhook.redeliver`).",
           body=RedeliverRequest,
           answers={200: ok("The delivery, pending.", WebhookDelivery),
                    400: refused("The body is neither empty nor a JSON object sent as `application/json`, or "
                                 "`reason` is missing, blank or not a string.", "reason_required", "bad_request"),
                    404: refused("No such delivery.", "not_found"),
                    409: refused("The delivery is being sent right now; redeliver it once that attempt has ended "
                                 "(within the deliverer's timeout).", "delivery_in_flight")})
def redeliver_webhook(delivery_id: int):
    from app.core import webhooks

    reason = _optional_reason()
    with _webhook_conn() as conn:
        return answer(WebhookDelivery.model_validate(webhooks.redeliver(
            conn, delivery_id, actor=f"operator:{identity().principal}", reason=reason)))
