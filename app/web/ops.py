"""``/v1/ops``: the operator API (role ``operator``)."""

from __future__ import annotations

import uuid

from flask import Blueprint, current_app, jsonify, request
from werkzeug.exceptions import BadRequest

from app.adapters.broker.dead_letter_tools import MAX_EXPECTED, MAX_MESSAGE_IDS
from app.core import operations
from app.core.steps import Step
from app.errors import BrokerUnavailable, JobConflict, JobNotFound, MissingReason, MoreThanExpected, UnknownQueue
from app.web.access import identity, protect
from app.web.responses import answer
from app.web.responses import error as _error

bp = Blueprint("ops", __name__, url_prefix="/v1/ops")
protect(bp, role="operator")


def _services():
    return current_app.extensions["attache"]


@bp.errorhandler(JobNotFound)
@bp.errorhandler(JobConflict)
@bp.errorhandler(MissingReason)
@bp.errorhandler(UnknownQueue)
@bp.errorhandler(MoreThanExpected)
def refused(exc):
    return answer(exc)


@bp.errorhandler(BrokerUnavailable)
def broker_down(exc):
    return answer(exc, "RabbitMQ is unavailable; retry later")


@bp.errorhandler(BadRequest)
def bad_request(exc):
    return _error(400, "bad_request", exc.description)


@bp.get("/jobs")
def jobs():
    try:
        listed = operations.list_jobs(_services(), state=request.args.get("state") or None,
                                      pipeline_version=request.args.get("pipeline_version", type=int),
                                      limit=request.args.get("limit", 100, type=int))
    except ValueError as exc:
        return _error(400, "bad_request", str(exc))
    return jsonify(jobs=listed)


@bp.get("/jobs/<uuid:job_id>")
def job(job_id: uuid.UUID):
    return jsonify(operations.show_job(_services(), job_id))


@bp.post("/jobs/<uuid:job_id>/replay")
def replay(job_id: uuid.UUID):
    body = request.get_json(silent=True) or {}
    reason = body.get("reason") if isinstance(body, dict) else None
    if not isinstance(reason, (str, type(None))):
        return _error(400, "bad_request", "reason must be a string")
    return jsonify(operations.replay(_services(), job_id, operator=identity().principal, reason=reason))


@bp.get("/outbox")
def outbox():
    return jsonify(operations.outbox_status(_services()))


@bp.get("/leases")
def leases():
    return jsonify(operations.lease_status(_services()))


# --- dead letters ---------------------------------------------------------------


def _dead_letters():
    from app.adapters.broker.dead_letter_tools import DeadLetters

    settings = _services().settings
    return DeadLetters(settings.broker_url, _services().engine, queues=[step.queue for step in Step],
                       socket_timeout=settings.publish_timeout_seconds)


def _reason(body) -> str | None:
    """The optional ``reason`` of an audited action: a string, or absent."""
    reason = body.get("reason") if isinstance(body, dict) else None
    if reason is not None and not isinstance(reason, str):
        raise BadRequest("reason must be a string")
    return reason


@bp.get("/dlq")
def dlq_queues():
    return jsonify(queues=_dead_letters().queues())


@bp.get("/dlq/<queue>/messages")
def dlq_messages(queue: str):
    limit = request.args.get("limit", 50, type=int)
    listing = _dead_letters().listing(queue, limit=max(1, min(limit, 500)))
    return jsonify(queue=queue, depth=listing["depth"], messages=listing["messages"])


def _chosen(body) -> dict:
    """``{"message_ids": [...]}`` or ``{"all": true, "expected": N}``: the keyword arguments of the action."""
    if not isinstance(body, dict):
        raise BadRequest("send a JSON object naming message_ids, or all with expected")
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
    return {"message_ids": ids}


@bp.post("/dlq/<queue>/requeue")
def dlq_requeue(queue: str):
    body = request.get_json(silent=True)
    reason = _reason(body)
    return jsonify(_dead_letters().requeue(queue, actor=f"operator:{identity().principal}", reason=reason,
                                           **_chosen(body)))


@bp.post("/dlq/<queue>/purge")
def dlq_purge(queue: str):
    body = request.get_json(silent=True)
    reason = _reason(body)
    return jsonify(_dead_letters().purge(queue, actor=f"operator:{identity().principal}", reason=reason,
                                         **_chosen(body)))


# --- pipeline versions ----------------------------------------------------------------


@bp.post("/pipelines/<int:version>/backfill")
def backfill(version: int):
    from app.core import backfill as backfill_module
    from app.core import pipeline

    body = request.get_json(silent=True) or {}
    if not isinstance(body, dict):
        return _error(400, "bad_request", "send a JSON object")
    try:
        pipeline.get(version)
    except LookupError as exc:
        return _error(404, "not_found", str(exc))
    batch = body.get("batch", 100)
    if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= 10_000:
        return _error(400, "bad_request", "batch must be an integer between 1 and 10000")
    estimate = backfill_module.estimate(_services(), version).as_dict()
    if body.get("dry_run"):
        return jsonify(dry_run=True, **estimate)
    result = backfill_module.run(_services(), version, batch=batch, actor=f"backfill:operator:{identity().principal}")
    return jsonify(dry_run=False, to_version=version, **result)
