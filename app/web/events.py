"""``GET /v1/events``: the completion events in order, a replay cursor (uploaders: their own; operators: all)."""

from __future__ import annotations

from flask import Blueprint, current_app, request

from app.adapters.postgres.db import transaction
from app.core import events
from app.web.access import identity, protect
from app.web.contract import in_query, ok, operation, refused
from app.web.responses import error as _error
from app.web.schemas import EventPage

bp = Blueprint("events", __name__, url_prefix="/v1/events")
protect(bp)


@bp.get("")
@operation(
    "listEvents", "Completion events after a cursor, oldest first", tag="events",
    description="The same documents webhooks deliver, in the order their transitions committed (`sequence` is "
                "global and gapless). An uploader sees the events of its own attachments, an operator all. An "
                "application that was down asks from the last `sequence` it handled and catches up without "
                "relying on deliveries.",
    parameters=[in_query("after", "Only events with a larger `sequence` (default 0: from the start).", int, default=0),
                in_query("limit", f"At most this many, clamped to 1..{events.MAX_PAGE} (default 100).", int,
                         default=100)],
    answers={200: ok("OK.", EventPage), 400: refused("`after` or `limit` is not a non-negative integer.",
                                                     "bad_request")},
)
def listing():
    after, limit = request.args.get("after", "0"), request.args.get("limit", "100")
    # ASCII only: str.isdigit() also accepts superscripts and other scripts' digits, which int() refuses
    if not all(value.isascii() and value.isdigit() and len(value) <= 18 for value in (after, limit)):
        return _error(400, "bad_request", "after and limit must be non-negative integers")
    who = identity()
    with transaction(current_app.extensions["attache"].engine) as conn:
        found = events.page(conn, after=int(after), limit=int(limit),
                            owner=None if who.is_operator else who.principal)
    # the events' texts joined as they are (EventPage describes the page): built through the model, a page of 1000
    # cost the web 25-33 ms of CPU (an adversarial run; events.page)
    body = (f'{{"events":[{",".join(found["events"])}],"more":{"true" if found["more"] else "false"},'
            f'"next_after":{int(found["next_after"])}}}\n')
    return current_app.response_class(body, mimetype="application/json")
