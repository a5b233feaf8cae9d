"""How many reads of the API and the console one client has in flight in this web process, and the limit on them.

A read is cheap one at a time, not a hundred at once: ``GET /v1/events?limit=1000`` cost 25-33 ms of the web's CPU,
and one uploader's token sent 600 of them in 3 s, each on a connection it closed at once (0.08 s of its own CPU): the
process spent 19 s of CPU on them and an honest upload's 202 took 1.7-3.3 s (worst 16 s) instead of 12-40 ms; 30
clients doing the same, 1.6-2.8 s (an adversarial review). Uploads and downloads had bounds per client; reads had
none. ``ATTACHE_MAX_READS_PER_CLIENT`` bounds the reads (``GET``, ``HEAD``) one principal (a token's, or a browser
session's) has in this process at once, on the blueprints :func:`bound` is given (the API's attachments, events and
``/v1/ops``; the ``/ops`` console), operators' included; one more is answered at once with ``429
too_many_reads_at_once`` and ``Retry-After``, before its view runs. Not counted here: uploads (POST, tus: their
bodies have ``ATTACHE_MAX_BODIES_PER_UPLOADER``), downloads (``ATTACHE_MAX_DOWNLOADS_PER_CLIENT``), and what needs no
token or is not one of these blueprints (``/healthz``, ``/readyz``, ``/v1/openapi.json``; ``/metrics`` shares one
read among its scrapes).

A read's place is taken once the blueprint's own check knows who asks (a request refused 401 or 403 takes none)
and given back when its answer is made (a streamed one: when the server closes it, sent or abandoned). An answer
that is never made (an exception, a refusal) gives it back as the request ends.
Counted in the process, as the other two bounds: the bound is on the process's own threads and CPU.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g, render_template, request

from app.errors import TooManyReadsAtOnce
from app.web.bodies_in_flight import AnswerPlace
from app.web.responses import RETRY_AFTER_SECONDS, refusal, status_of

#: the methods that read
READS = ("GET", "HEAD")
#: reads that have a bound of their own: a download holds its place among ``ATTACHE_MAX_DOWNLOADS_PER_CLIENT``
OWN_BOUND = frozenset({"attachments.download_original", "attachments.download_variant"})
#: the app's count of each principal's reads (``create_app`` makes it)
COUNTS = "attache_reads"
#: where a request keeps its place until its answer takes it (``flask.g``)
PLACE = "attache_read_place"
#: the blueprint whose refusals are HTML pages for people
CONSOLE = "console"
#: what a refused read of the console tells the person
CONSOLE_TITLE = "Too many pages at once"


def bound(blueprint: Blueprint) -> None:
    """Count ``blueprint``'s reads against each principal's bound; once per blueprint, before it is first registered
    (``create_app`` may run more than once in a process: the blueprints are the modules')."""
    if getattr(blueprint, "attache_reads_bounded", False):
        return
    blueprint.attache_reads_bounded = True
    blueprint.before_request(_take)  # after the blueprint's own checks, which say who asks
    blueprint.after_request(_hand_to_answer)
    blueprint.teardown_request(_give_back)


def counted(blueprint: Blueprint | None, endpoint: str, method: str) -> bool:
    """A request of ``method`` to ``endpoint`` counts against the client's reads in flight (the API document says
    which answer 429 for it)."""
    return bool(getattr(blueprint, "attache_reads_bounded", False)) and method.upper() in READS \
        and endpoint not in OWN_BOUND


def _who():
    """The principal the blueprint's checks found: the API's (:func:`app.web.access.protect`) or the console's."""
    found = g.get("attache_identity") or g.get("console_identity")
    return None if found is None else found.principal


def _take():
    principal = _who()
    if principal is None or not counted(current_app.blueprints.get(request.blueprint or ""), request.endpoint or "",
                                        request.method):
        return None
    try:
        setattr(g, PLACE, AnswerPlace(principal, COUNTS))
    except TooManyReadsAtOnce as exc:
        return _refused(exc)
    return None


def _refused(exc: TooManyReadsAtOnce):
    if request.blueprint == CONSOLE:  # a person's browser: a page, as the console's other refusals
        page = render_template("error.html", title=CONSOLE_TITLE,
                               message=f"{exc} Reload this page in {RETRY_AFTER_SECONDS} seconds.")
        return page, status_of(exc), {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return refusal(exc)


def _hand_to_answer(response: Response) -> Response:
    """A streamed answer keeps the place until the server closes it (sent, or its client gone); one made whole gives
    it back now: its view's work is done, and its writing is bounded as every answer's is (``request_head``). Held
    until the close, a page whose answer object nobody closed at once (a test client's, the collector's to close)
    held its place, and a client's fifth page at once was 429 (a run of the tests)."""
    place = g.pop(PLACE, None)
    if place is not None:
        if response.is_streamed:
            response.call_on_close(place.release)
        else:
            place.release()
    return response


def _give_back(error: BaseException | None) -> None:
    """A request that made no answer (an exception no handler answered) gives its place back as it ends."""
    place = g.pop(PLACE, None)
    if place is not None:
        place.release()
